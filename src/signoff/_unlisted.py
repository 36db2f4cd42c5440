"""The open requests a listing of the queue leaves out though the store still holds them open:
one past its deadline that nothing recorded yet (its agent runs in another process, no sweep
came by, the store is read-only), and a mirror whose subagent's request passed its deadline so
or whose subagent's session passed its TTL. A listing and its count exclude the same ones
(`PendingFilter.excluded`), so a total is what paging through the listing to its end returns."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

from ._deadlines import after_deadline
from ._queue_page import readable_followed
from ._types import InputRequest
from .stores import PendingFilter, Store
from .stores._pending import cursor_past, first_seen

__all__ = ["unlisted"]

_SCAN = 500  # open requests read at a time

Read = Callable[
    [PendingFilter], Awaitable[tuple[list[InputRequest], tuple[int, tuple[float, str] | None]]]
]
"""A page's read for a listing people read (`_queue_page.readable_pending`): the requests it
could read, how many rows the store listed and the cursor past them."""


async def unlisted(
    store: Store, flt: PendingFilter, now: float, read: Read | None = None
) -> list[str]:
    """The ids of the open requests `flt` matches that the queue does not show at `now`
    (`Runtime.pending_page` leaves them out). Read from the index of deadlines, and of mirrors
    only those in the sessions the store names above a lapsed subagent session or a passed
    deadline (`lapsed_ancestors`): two queries while nothing is past either. A store without
    `lapsed_ancestors` has the mirrors of its whole queue read. `read`: how a page is read
    (a row that does not read back left out), else the store's own listing."""
    if flt.status != "pending":
        return []
    hidden: list[str] = []
    due = replace(flt, due_by=now, excluded=())
    async for page in _pages(store, due, read):
        # A mirror has no deadline of its own (its subagent's shows): left to the next reading.
        hidden += [r.id for r in page if r.child is None and after_deadline(r, now) is None]
    query = getattr(store, "lapsed_ancestors", None)
    if query is None:
        scopes = [flt]
    else:
        above: list[str] = await query(now)
        scopes = [replace(flt, session_id=sid) for sid in above if flt.session_id in (None, sid)]
    for scope in scopes:
        async for page in _pages(store, replace(scope, excluded=()), read):
            mirrors = [r for r in page if r.child is not None]
            # Each on its own: one whose subagent's request does not read back is logged and
            # left to the page, which leaves it out too.
            for shown in await readable_followed(store, mirrors, now):
                if shown.status != "pending" or after_deadline(shown, now) is None:
                    hidden.append(shown.id)
    return hidden


async def _pages(
    store: Store, flt: PendingFilter, read: Read | None
) -> AsyncIterator[list[InputRequest]]:
    """Every request `flt` matches, page after page by keyset (not `flt`'s offset): one closed
    meanwhile on an earlier page shifts no later one out."""
    after = flt.after
    seen: set[str] = set()  # a request listed again past a deleted one's cursor
    while True:
        scope = replace(flt, limit=_SCAN, offset=0, after=after)
        if read is None:
            page = await store.pending(scope)
            listed, last = len(page), cursor_past(page[-1], after) if page else None
        else:
            page, (listed, last) = await read(scope)
        yield first_seen(page, seen)
        if listed < _SCAN or last is None:
            return
        after = last
