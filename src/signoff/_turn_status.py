"""What a session's turn has left to do, read from its state: over for good, waiting for a
retry, runnable now. Kept apart from `_state`'s fold, which re-exports them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._state import SessionState, TurnState
    from ._types import Principal

__all__ = ["delegated_turn", "runnable", "starts_queued", "turn_over", "waits_for_retry"]


def delegated_turn(s: SessionState) -> bool:
    """Whether the session's current turn is its first, the one a delegate call started in a
    child session: a later turn, which a message sent to the child started, is the child's own."""
    return s.turn is not None and s.turn.first_seq <= 2


def turn_over(turn: TurnState) -> bool:
    """Whether the turn has ended for good: completed, cancelled, or failed where no retry can
    resume it (`max_steps`, a budget nobody can raise). A turn a retry can resume has not."""
    return turn.status in ("completed", "cancelled") or (
        turn.status == "failed" and not turn.retryable
    )


def waits_for_retry(turn: TurnState | None, sender: Principal | None, *, queue: bool) -> bool:
    """Whether a message `sender` sends waits behind `turn`, failed in a way a retry can resume
    (it has not ended): a `queue` message does, and one from someone other than the person the
    turn serves; only that person's `steer` message starts the next turn past it."""
    if turn is None or turn.status != "failed" or not turn.retryable:
        return False
    serves = turn.principal
    return queue or not (serves is None or (sender is not None and sender.same_as(serves)))


def starts_queued(state: SessionState) -> bool:
    """Whether the session's turn has ended for good and a message queued behind it starts
    the next turn now."""
    return state.turn is not None and turn_over(state.turn) and runnable(state)


def runnable(state: SessionState, *, retry: bool = False) -> bool:
    """Whether the session's turn has something to do now (as opposed to waiting or over)."""
    turn = state.turn
    if turn is None:
        return False
    if turn.status == "failed" and turn.retryable:
        return retry  # the messages queued behind it wait for the retry (or the next message)
    if turn_over(turn):
        # Messages queued behind it start now, unless its TTL failed it (recorded, or shown so).
        ttl = state.lapsed or (turn.error or {}).get("code") == "session_expired"
        return bool(state.queued) and not (turn.status == "failed" and ttl)
    if turn.status == "waiting":
        statuses = {c.status for c in turn.calls.values()}
        if statuses & {"approved", "denied", "decided", "running"}:
            return True
        # everything answered (a session-limit prompt, say) and no call left waiting
        return not state.pending_requests() and not (statuses & {"requested", "awaiting", "asking"})
    return True
