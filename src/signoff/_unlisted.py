"""The open requests a listing of the queue leaves out though the store still holds them open:
one past its deadline that nothing recorded yet (its agent runs in another process, no sweep
came by, the store is read-only), and a mirror whose subagent's request passed its deadline so
or whose subagent's session passed its TTL. A listing and its count exclude the same ones
(`PendingFilter.excluded`), so a total is what paging through the listing to its end returns.
A listing of `expired` requests includes those that read `expired` so (`unrecorded_expiries`,
`PendingFilter.included`), and those of sessions whose TTL passed unrecorded."""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection
from dataclasses import replace

from ._deadlines import after_deadline
from ._mirrors import followed
from ._types import InputRequest
from .stores import PendingFilter, Store
from .stores._pending import cursor_past

__all__ = ["unlisted", "unrecorded_expiries"]

_SCAN = 500  # open requests read at a time


async def unlisted(store: Store, flt: PendingFilter, now: float) -> list[str]:
    """The ids of the open requests `flt` matches that the queue does not show at `now`
    (`Runtime.pending_page` leaves them out). Read from the index of deadlines, and of mirrors
    only those in the sessions the store names above a lapsed subagent session or a passed
    deadline (`lapsed_ancestors`): two queries while nothing is past either. A store without
    `lapsed_ancestors` has the mirrors of its whole queue read."""
    if flt.status != "pending":
        return []
    hidden: list[str] = []
    due = replace(flt, due_by=now, excluded=())
    async for page in _pages(store, due):
        # A mirror has no deadline of its own (its subagent's shows): left to the next reading.
        hidden += [r.id for r in page if r.child is None and after_deadline(r, now) is None]
    async for shown in _mirrors(store, flt, now):
        if shown.status != "pending" or after_deadline(shown, now) is None:
            hidden.append(shown.id)
    return hidden


async def unrecorded_expiries(
    store: Store, flt: PendingFilter, now: float, lapsed: Collection[str]
) -> list[str]:
    """The ids of the open requests a listing of `expired` ones (`flt`) shows, as each reads
    `expired` on its own (`GET /v1/requests/{id}`) though nothing recorded it yet: one past a
    deadline that closes it, one of a session of `lapsed` (its own TTL passed, no live drive
    running it on), a mirror whose subagent's request or session did so. Read as `unlisted`
    reads them, and each lapsed session's: a few queries while none is."""
    if flt.status != "expired":
        return []
    scope = replace(flt, status="pending", excluded=(), included=(), live_at=now)
    found: dict[str, None] = {}
    async for page in _pages(store, replace(scope, due_by=now)):
        closes = [r for r in page if r.child is None and after_deadline(r, now) is None]
        found.update((r.id, None) for r in closes)
    async for shown in _mirrors(store, scope, now):
        if shown.status == "expired" or (
            shown.status == "pending" and after_deadline(shown, now) is None
        ):
            found[shown.id] = None
    for sid in lapsed:  # of a subagent below one, withdrawn when recorded: not `expired`
        if flt.session_id in (None, sid):
            async for page in _pages(store, replace(scope, session_id=sid, live_at=None)):
                found.update((r.id, None) for r in page)
    return list(found)


async def _mirrors(store: Store, flt: PendingFilter, now: float) -> AsyncIterator[InputRequest]:
    """The open mirrors `flt` matches, as `followed` shows them at `now`: only those in the
    sessions the store names above a lapsed subagent session or a passed deadline
    (`lapsed_ancestors`), else every one."""
    query = getattr(store, "lapsed_ancestors", None)
    if query is None:
        scopes = [flt]
    else:
        above: list[str] = await query(now)
        scopes = [replace(flt, session_id=sid) for sid in above if flt.session_id in (None, sid)]
    for scope in scopes:
        async for page in _pages(store, replace(scope, excluded=())):
            for shown in await followed(store, [r for r in page if r.child is not None], now):
                yield shown


async def _pages(store: Store, flt: PendingFilter) -> AsyncIterator[list[InputRequest]]:
    """Every request `flt` matches, page after page by keyset (not `flt`'s offset): one closed
    meanwhile on an earlier page shifts no later one out."""
    after = flt.after
    while True:
        page = await store.pending(replace(flt, limit=_SCAN, offset=0, after=after))
        yield page
        if len(page) < _SCAN:
            return
        after = cursor_past(page[-1], after)
