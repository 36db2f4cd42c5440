"""One request read for a caller (`ServerContext.request`), once its session's id decided that
they may see it (`_request_session.session_of`): the request as it stands now (a passed TTL or
deadline recorded first)."""

from __future__ import annotations

from .._deadlines import is_due, stored_after_deadline, stored_after_expiry
from .._runtime import Runtime
from ..stores import PendingFilter, StoredRequest

__all__ = ["as_it_stands"]


async def as_it_stands(runtime: Runtime, stored: StoredRequest) -> StoredRequest:
    """`stored` as the queue shows it now: closed if its session's TTL or its own deadline
    passed, recorded first where this runtime can record it."""
    request_id, session_id = stored.request.id, stored.request.session_id
    if stored.status == "pending" and not await _live(runtime, session_id):
        # Its session's TTL passed (or one's above it): the queue leaves it out. Record that,
        # as the session's own read does; what is not recorded reads as recording closes it.
        state = await runtime.state(session_id)
        stored = await runtime.store.get_request(request_id) or stored
        now = runtime.now()
        if state.expired(now) and await runtime._ended(state, now) is None:
            return stored  # a live drive runs its turn on past the TTL: not closed
        return stored_after_expiry(stored, now)
    if is_due(stored.request, runtime.now()):
        # Its deadline passed and no sweep applied it yet: apply it, as the queue does.
        await runtime.pending_page(PendingFilter(session_id=session_id, limit=10_000))
        stored = await runtime.store.get_request(request_id) or stored
        # What this runtime could not record (another agent's session, a store it may only
        # read) reads as the queue shows it.
        stored = stored_after_deadline(stored, runtime.now())
    return stored


async def _live(runtime: Runtime, session_id: str) -> bool:
    """Whether neither the session's TTL nor one above it has passed: it still has an open
    request the store does not leave out as lapsed (one indexed count, no state loaded)."""
    live = PendingFilter(session_id=session_id, live_at=runtime.now(), limit=1)
    return await runtime.store.count_pending(live) > 0
