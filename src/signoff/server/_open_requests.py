"""How many requests the queue shows, and a fingerprint of them, from indexed queries: what
the dashboard's badge, `X-Total-Count`, its live count and `/metrics` read, often."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import TYPE_CHECKING

from .._exceptions import StoreDamaged
from .._queue_page import counted_listing
from .._session_page import passing_sessions
from ..stores import InitiatorFilter, PendingFilter, Store

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = ["OpenRequests", "digest"]


class OpenRequests:
    """The open requests the queue shows, counted: a part of `ServerContext`."""

    __slots__ = ()

    runtime: Runtime

    if TYPE_CHECKING:  # `ServerContext._listed`

        async def _listed(self, flt: PendingFilter, *, record: bool = False) -> PendingFilter: ...

    async def open_requests_version(self, picks: InitiatorFilter | None = None) -> tuple[int, str]:
        """The count and fingerprint of every open request the queue shows (of the sessions the
        store `picks`, if given), from indexed queries (one while nothing is open): a caller's
        own queue can only have changed when this did. Nothing is recorded: a stream asks often.

        A vote counted toward a quorum changes neither the set nor its ends, only the parked
        session it was cast in: the fingerprint takes in the newest change of a waiting session
        (of those the store `picks`), so a card's count of approvals is redrawn too. SQLite finds
        it by its index; PostgreSQL's index of sessions is by status alone (an `updated_at` in
        it would cost each commit its in-place update), so there it reads the waiting sessions'
        rows, as the count reads every open request's (measured: 7-10 ms for 30,000 waiting
        sessions, where the fingerprint of 30,000 open requests took about 200 ms)."""
        store = self.runtime.store
        live = PendingFilter(live_at=self.runtime.now(), initiated_by=picks)
        total = await store.count_pending(live)
        ends: list[str] = []
        if total:
            live = await self._listed(live)
            try:
                first, total = await counted_listing(store, replace(live, limit=1))  # one snapshot
                last = (
                    await store.pending(replace(live, limit=1, offset=total - 1)) if total else []
                )
                ends = [r.id for r in first + last]
            except StoreDamaged as exc:  # an end that does not read back: its id, data unread
                ends = await _end_ids(store, live, total, exc)
        marks: list[str] = []
        if total:
            parked, _ = await passing_sessions(
                store, agent=None, status="waiting", limit=1, offset=0, initiated_by=picks
            )
            marks = [f"{s.id}@{s.head}" for s in parked]
        return total, digest(total, ends + marks)

    async def open_requests_count(self) -> int:
        """The count of every open request the queue shows, as `open_requests_version`'s, with
        no row read while none is past a deadline or a TTL: a damaged row fails the queue's
        listing (so it is seen), not a scrape's count of it (`signoff_store_up`)."""
        live = PendingFilter(live_at=self.runtime.now())
        store = self.runtime.store
        if not await store.count_pending(live):
            return 0
        return await store.count_pending(await self._listed(live))


async def _end_ids(
    store: Store, live: PendingFilter, total: int, damaged: StoreDamaged
) -> list[str]:
    """The ids of the first and last of the `total` requests `live` lists, from the store's
    keys of them (`pending_keys`, their data unread); a store without them raises `damaged`."""
    keys = getattr(store, "pending_keys", None)
    if keys is None:
        raise damaged
    rows: list[tuple[float, str, str]] = await keys(replace(live, limit=1))
    if total:
        rows += await keys(replace(live, limit=1, offset=total - 1))
    return [row[1] for row in rows]


def digest(total: int, ids: list[str]) -> str:
    return hashlib.sha256(f"{total} {' '.join(ids)}".encode()).hexdigest()[:16]
