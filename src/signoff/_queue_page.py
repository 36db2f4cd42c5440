"""One page of the queue as of now (`Runtime.pending_page`) and, for a listing that shows a
total, how many requests the store's listing holds in all, read in the same snapshot as the
page: a request closing or opening meanwhile cannot set the total and the page apart."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from ._deadlines import after_deadline, is_due
from ._mirrors import followed
from ._types import InputRequest
from .stores import PendingFilter, Store
from .stores._pending import cursor_past

if TYPE_CHECKING:
    from ._work import Workers

__all__ = ["counted_listing", "counted_page", "keyed_page", "queue_page"]

T = TypeVar("T")
Read = Callable[[PendingFilter], Awaitable[tuple[list[InputRequest], T]]]


async def queue_page(rt: Workers, flt: PendingFilter) -> tuple[list[InputRequest], bool]:
    """The page `Runtime.pending_page` shows, and whether the store may hold more past it."""
    shown, listed, _ = await _page(rt, flt, partial(_uncounted, rt.store), None)
    return shown, len(listed) >= flt.limit


async def keyed_page(
    rt: Workers, flt: PendingFilter
) -> tuple[list[InputRequest], tuple[float, str] | None]:
    """`queue_page`, and the `PendingFilter.after` of the next page (None after the last): the
    last request the store listed, shown or not. Unlike an offset, it shifts no request out of
    the next page when one on this page or an earlier one closes before that page is read."""
    shown, listed, _ = await _page(rt, flt, partial(_uncounted, rt.store), None)
    if len(listed) < flt.limit or not listed:
        return shown, None
    return shown, cursor_past(listed[-1], flt.after)


async def counted_page(rt: Workers, flt: PendingFilter) -> tuple[list[InputRequest], bool, int]:
    """`queue_page`, and the total of the store's listing in the snapshot the page came from.
    It counts what the page would show only when `flt.excluded` leaves out what the queue does
    not show (`_unlisted.unlisted`), as the server's listings and `signoff pending` do: the
    page is then judged at `flt.live_at`, the moment those were read at, so a deadline passing
    since does not leave out of the page a request its total counts."""
    shown, listed, total = await _page(rt, flt, partial(counted_listing, rt.store), flt.live_at)
    return shown, len(listed) >= flt.limit, total


async def counted_listing(store: Store, flt: PendingFilter) -> tuple[list[InputRequest], int]:
    """`store.pending(flt)` and `store.count_pending(flt)` of one snapshot (the store's
    `pending_counted`; a store without it is read twice, so a commit between the two reads can
    set them apart by a request)."""
    both = getattr(store, "pending_counted", None)
    if both is None:
        return await store.pending(flt), await store.count_pending(flt)
    page, total = await both(flt)
    return page, total


async def _uncounted(store: Store, flt: PendingFilter) -> tuple[list[InputRequest], None]:
    return await store.pending(flt), None


async def _page(
    rt: Workers, flt: PendingFilter, read: Read[T], at: float | None
) -> tuple[list[InputRequest], list[InputRequest], T]:
    """The page as of `at` (else now), as shown and as the store listed it: passed deadlines
    it holds are applied first, then the page (and its total) read again."""
    page, total = await read(flt)
    now = rt.now() if at is None else at
    due = [r for r in page if is_due(r, now)]
    if due and await rt._apply_deadlines(due, listing=True):
        page, total = await read(flt)
    # A mirror shows its subagent's request's votes, escalation and deadline, which that
    # deadline then leaves as it leaves the subagent's request; and once that subagent's
    # session passed its TTL, it shows as expired (it takes no answer): left out too.
    followed_page = page
    if flt.status == "pending":
        followed_page = [r for r in await followed(rt.store, page, now) if r.status == "pending"]
    shown = [a for r in followed_page if (a := after_deadline(r, now)) is not None]
    return shown, page, total
