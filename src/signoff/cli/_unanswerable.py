"""Whether a request can still be answered, read without recording anything: `signoff approve`,
`deny` and `answer` say so before naming the command that answers a request of the other kind,
which would only be refused in turn."""

from __future__ import annotations

from .._answers import closed_text
from .._deadlines import stored_after_deadline, stored_after_expiry
from .._exceptions import RequestClosed, SignoffError
from .._mirrors import deciding_way, followed, named_as_answered, stored_followed
from .._runtime import Runtime
from ..stores import PendingFilter, StoredRequest

__all__ = ["unanswerable"]


async def unanswerable(runtime: Runtime, stored: StoredRequest) -> SignoffError | None:
    """What an answer of the right kind to `stored` is refused with as it can no longer be
    answered, None while it can: `SessionExpired` once its session's TTL passed (unless a live
    drive runs its turn on), `RequestClosed` once it was answered or closed, its deadline
    passed (one that escalates it leaves it open), a session above its own passed its TTL, or,
    for a mirror, the same befell the subagent's request it stands for. Only read: what passed
    is recorded by the answers, sweeps and workers that record it."""
    request = stored.request
    now = runtime.now()
    if stored.status == "pending" and not await _live(runtime, request.session_id, now):
        state = await runtime._state(request.session_id)
        if not state.expired(now):
            stored = stored_after_expiry(stored, now)  # a session above its own: withdrawn
        else:
            ended = await runtime._ended(state, now)
            if ended is not None:
                return ended
    if stored.status == "pending":  # a mirror as its subagent's request stands, deadline too
        [shown] = await followed(runtime.store, [request], now)
        stored = stored_after_deadline(stored_followed(stored, shown), now)
    if stored.status == "pending" and request.child is not None:
        way = await deciding_way(runtime.store, request)
        below = await runtime.store.get_request(way[-1].id)
        if below is not None and below.status != "pending":
            return named_as_answered(_closed(below), way)
    return None if stored.status == "pending" else _closed(stored)


async def _live(runtime: Runtime, session_id: str, now: float) -> bool:
    """Whether neither the session's TTL nor one above it passed by `now`: it has an open
    request the store does not leave out as lapsed (one indexed count, no state loaded)."""
    live = PendingFilter(session_id=session_id, live_at=now, limit=1)
    return await runtime.store.count_pending(live) > 0


def _closed(stored: StoredRequest) -> RequestClosed:
    """The refusal of an answer to `stored`, closed: how it was answered, or how it closed."""
    request, resolution = stored.request, stored.resolution or {}
    if stored.status != "settled":
        told = closed_text(request, stored.status, stored.outcome, resolution.get("on_timeout"))
        return RequestClosed(told, [request.id])
    outcome = stored.outcome
    if request.kind == "tool-approval" and outcome == "cancelled":
        outcome = "denied"
    return RequestClosed(
        f"request {request.id} was already {outcome}; it takes no answers", [request.id]
    )
