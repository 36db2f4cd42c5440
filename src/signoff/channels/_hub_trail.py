"""Where a `ChannelHub` reads the audit trail from: its end (found by ids alone where the store
can), the first position of a channel that has none saved, and the requests open now, which a
channel is handed when the hub starts delivering to it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from .._queue_page import keyed_page
from .._types import InputRequest
from ..stores import PendingFilter, Store
from ..stores._pending import first_seen
from ._base import ChannelState, logger, off_loop

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = ["behind_the_end", "open_requests", "start_at", "trail_end"]

_WINDOW = 1_000_000  # ids a look for the trail's end steps over at once (read from an index)
_SETTLING = 1000  # ids below the end a first start looks at for transactions still committing
_UNREAD = "not handed to the channels starting"  # logged for an open request no one can read


async def start_at(store: Store, page: int) -> tuple[int, set[int]]:
    """Where a channel without a saved position starts: the trail's end, or below the first
    hole in its last `_SETTLING` ids, with the ids present above that. On PostgreSQL an id
    is taken at insert and seen at commit, so a hole there may be a transaction still
    committing: it is waited for (up to the hub's `gap_timeout`) as on any poll, not skipped."""
    end = await trail_end(store)
    low = max(0, end - _SETTLING)
    present: set[int] = set()
    after = low
    while after < end:
        entries = await store.audit(after_id=after, upto_id=end, limit=page)
        if not entries:
            break
        present.update(e.id for e in entries)
        after = entries[-1].id
    at = low
    while at < end and at + 1 in present:
        at += 1
    return at, {i for i in present if i > at}


async def trail_end(store: Store) -> int:
    """The id of the newest audit entry (0 for an empty trail), found by ids alone where the
    store can (`audit_window`): a hub on memory looks for it at every start, and reading
    every entry of a long trail held the server's start for seconds per 100,000."""
    last = 0
    if hasattr(store, "audit_window"):  # not in a store of an earlier signoff
        while True:
            upto = await store.audit_window(after_id=last, limit=_WINDOW)
            if upto is None or upto <= last:
                return last
            last = upto
    while True:
        entries = await store.audit(after_id=last, limit=10_000)
        if not entries:
            return last
        last = entries[-1].id


async def open_requests(
    runtime: Runtime, clock: Callable[[], float], page: int
) -> list[InputRequest]:
    """Every open request, read in pages each past the last one's last request (not by
    offset: a request closing on an earlier page meanwhile would shift one past them all).
    One the store cannot read (a damaged row) is logged and left out: failing the read, it
    kept every channel from starting (`serve --webhook` from starting at all)."""
    await runtime.open()
    out: list[InputRequest] = []
    ids: set[str] = set()
    after: tuple[float, str] | None = None
    while True:
        flt = PendingFilter(limit=page, after=after, live_at=clock())
        found, after = await keyed_page(runtime, flt, passing=(logger, _UNREAD))
        # Once: a row edited to list later, and one listed again past a deleted one's cursor.
        out.extend(r for r in first_seen(found, ids) if r.child is None)
        if after is None:
            return out


async def behind_the_end(store: Store, state: ChannelState, key: str, saved: int) -> int:
    """The position of the channel (of `key`) whose saved one is past the trail's end: the end.
    A store restored from a backup, or one whose unsynced last commits a power cut lost, gives
    new entries the ids again, which the old position would skip as handled."""
    end = await trail_end(store)
    if end < saved:
        hub, _, channel = key.partition(":")
        logger.warning(
            "channel hub %s: %s's position %s is past the audit trail's end %s (a store "
            "restored from a backup?); going on from the end",
            hub,
            channel,
            saved,
            end,
        )
        await off_loop(state.set_position, key, end)
        return end
    return saved
