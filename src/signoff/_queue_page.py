"""One page of the queue as of now (`Runtime.pending_page`) and, for a listing that shows a
total, how many requests the store's listing holds in all, read in the same snapshot as the
page: a request closing or opening meanwhile cannot set the total and the page apart."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._deadlines import after_deadline, is_due
from ._mirrors import followed
from ._types import InputRequest
from .stores import PendingFilter, Store

if TYPE_CHECKING:
    from ._work import Workers

__all__ = ["listing", "queue_page"]


async def queue_page(
    rt: Workers, flt: PendingFilter, *, counted: bool = False
) -> tuple[list[InputRequest], bool, int | None]:
    """The page `Runtime.pending_page` shows, whether the store may hold more past it, and with
    `counted` the total of the store's listing in the snapshot the page came from (None
    without). Passed deadlines the page holds are applied first, then the page (and its total)
    read again. The total counts what the page would show only when `flt.excluded` leaves out
    what the queue does not show (`_unlisted.unlisted`), as the server's listings do."""
    page, total = await listing(rt.store, flt, counted)
    now = rt.now()
    due = [r for r in page if is_due(r, now)]
    if due and await rt._apply_deadlines(due, listing=True):
        page, total = await listing(rt.store, flt, counted)
    # A mirror shows its subagent's request's votes, escalation and deadline, which that
    # deadline then leaves as it leaves the subagent's request; and once that subagent's
    # session passed its TTL, it shows as expired (it takes no answer): left out too.
    followed_page = page
    if flt.status == "pending":
        followed_page = [r for r in await followed(rt.store, page, now) if r.status == "pending"]
    shown = [a for r in followed_page if (a := after_deadline(r, now)) is not None]
    return shown, len(page) >= flt.limit, total


async def listing(
    store: Store, flt: PendingFilter, counted: bool
) -> tuple[list[InputRequest], int | None]:
    """`store.pending(flt)`, and with `counted` `store.count_pending(flt)` of the same snapshot
    (the store's `pending_counted`; a store without it is read twice, so a commit between the
    two reads can set them apart by a request)."""
    if not counted:
        return await store.pending(flt), None
    both = getattr(store, "pending_counted", None)
    if both is None:
        return await store.pending(flt), await store.count_pending(flt)
    page, total = await both(flt)
    return page, total
