"""What a drive's span says of the turn it resumes (`DriveSpan.begin`, docs/tracing.md): whether
the turn had run before, the answers it goes on with, and the drive that parked it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ._state import SessionState
    from ._state_parts import TurnState

__all__ = ["goes_on_with", "parked_by", "ran_before"]

_Type = TypeVar("_Type", bound=str)


def parked_by(
    specs: Sequence[tuple[_Type, dict[str, Any]]], traceparent: str
) -> list[tuple[_Type, dict[str, Any]]]:
    """`specs` with the parking drive's `traceparent` added to their `turn.waiting`: the drive
    that resumes the turn links to it."""
    return [
        (kind, {**data, "traceparent": traceparent} if kind == "turn.waiting" else data)
        for kind, data in specs
    ]


def ran_before(turn: TurnState) -> bool:
    """Whether a drive ran the turn before this one: it holds its model's calls or steps, it
    waits or failed, a retry of its failure was asked for (its error stays until the next reply:
    a worker's drive finds it running again), or a reply it paused is journaled (its drive died
    or lost the turn mid-reply)."""
    return (
        bool(turn.calls)
        or turn.steps > 0
        or turn.status != "running"
        or turn.error is not None
        or bool(turn.paused)
    )


def goes_on_with(state: SessionState) -> list[Any]:
    """The current turn's requests closed that no drive went on with yet (`TurnState.answered`)
    and this one goes on with, as they were asked: those of calls that have yet to move
    (approved, denied, decided, or asking again), and a settled budget prompt the turn still
    waits on."""
    turn = state.turn
    if turn is None or not turn.answered:
        return []
    closed = set(turn.answered)
    found = []
    for r in state.requests.values():
        req = r.request
        if req.id not in closed or r.status == "pending" or req.child is not None:
            continue
        action = req.action
        if action is None:
            if req.kind == "session-limit" and turn.status == "waiting":
                found.append(r)
            continue
        call = turn.calls.get(action.call_id)
        if call is not None and call.status in ("approved", "denied", "decided", "running"):
            found.append(r)
    return found
