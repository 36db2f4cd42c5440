"""The checks a message's commit makes on the state it lands on: that what decided it did not
change meanwhile (`unchanged`), and that the idempotency key it records was taken by no other
call (`unclaimed`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ._idempotency import Keyed, free_for, seen
from ._recording import Batch, Changed, EventSpec
from ._state import SessionState
from .stores import Resolve

__all__ = ["unchanged", "unclaimed"]

_TURN_ENDED = ("completed", "failed", "cancelled")


def unchanged(
    checked: SessionState, specs: Sequence[EventSpec], resolve: Sequence[Resolve] = ()
) -> Callable[[SessionState], Batch]:
    """`specs` for `Driver.record`, refused (`Changed`) when the state they are committed on
    differs from the `checked` one in what decided them: the turn, whether it ended, its open
    requests; and the idempotency keys the specs record must be free then: recorded for no
    message, held aside by no answer being judged, held for no other message's answer going
    down a mirror (`free_for`), as the caller found them (`checked`, a cached state, may be
    folded on in place by this process's commits since). A message decided on a running turn
    must not land after it ended, nor twice when two calls with its key raced: the caller,
    reading again, replays the first (or is refused, for another message)."""
    turn = checked.turn
    pending = [r.id for r in checked.pending_requests()]
    keys = [(str(d["idem"][0]), str(d["idem"][1])) for _, d in specs if d.get("idem")]

    def build(current: SessionState) -> Batch:
        now = current.turn
        if (
            (now is None) != (turn is None)
            or (
                now is not None
                and turn is not None
                and (now.id, now.status in _TURN_ENDED) != (turn.id, turn.status in _TURN_ENDED)
            )
            or [r.id for r in current.pending_requests()] != pending
            or any(not free_for(current.keys, k) or _judged(current, k[0]) for k in keys)
        ):
            raise Changed
        return Batch(specs=specs, resolve=resolve)

    return build


def unclaimed(
    build: Callable[[SessionState], Batch], idem: Keyed | None, session_id: str
) -> Callable[[SessionState], Batch]:
    """`build`, which records the key of `idem`, refused (`IdempotencyKeyReused`) when the
    state it is committed on has that key recorded, or held aside by an answer being judged,
    for another call: that call took it meanwhile, and this one is refused, storing nothing."""

    def checked(current: SessionState) -> Batch:
        batch = build(current)
        if any(d.get("idem") for _, d in batch.specs):  # not a deadline's, recorded instead
            seen(current.keys, idem, session_id, current.candidates)
        return batch

    return checked


def _judged(state: SessionState, key: str) -> bool:
    """Whether a pending candidate of `state` holds the idempotency key `key` aside
    (`message_idem`) while a response policy judges its answer."""
    return any(
        isinstance(c.get("message_idem"), list) and c["message_idem"][:1] == [key]
        for c in state.candidates.values()
    )
