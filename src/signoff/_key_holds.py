"""The idempotency key of a message whose answer to a mirror goes down to the subagent's
session, held in the session it was sent to first: until the answer's end records it there (the
mirror's close, a counted vote's `keep_vote_key`), another message sent with the key is refused
by that session's own commits, which see no further than it. Recorded after the child's
candidate instead, a message checked before that candidate and committed after the check
would both act beside the answer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._idempotency import Keyed, key_fields, seen
from ._recording import Batch
from ._state import SessionState
from ._types import InputRequest, Principal

if TYPE_CHECKING:
    from ._answering import Answering

__all__ = ["HELD", "hold_key"]

HELD = ("key held for ", "'s message, sent on to the subagent")
"""How a listing words an `input.repeated` holding a key (`held_idem`), around its sender: never
as an answer, which the subagent may refuse, or a process killed meanwhile never give."""


async def hold_key(
    rt: Answering, parent: str, mirror: InputRequest, principal: Principal | None, mark: Keyed
) -> None:
    """Hold `mark`, the key of `principal`'s message answering `mirror` in session `parent`,
    on an `input.repeated` (`held_idem`) of the mirror's turn, before the answer is settled
    below: `IdempotencyKeyReused` if the key came with another message there, storing nothing.
    Nothing is recorded if the key is recorded or held already, or the mirror closed."""
    who = None if principal is None else principal.model_dump()
    data = {"request_id": mirror.id, "by": who, **key_fields(mark, "held_idem")}

    def build(st: SessionState) -> Batch:
        if seen(st.keys, mark, parent, st.candidates) or mark[0] in st.keys:
            return Batch(specs=[])
        live, turn = st.requests.get(mirror.id), st.turn
        if live is None or live.status != "pending" or turn is None or turn.id != mirror.turn_id:
            return Batch(specs=[])  # closed: the answer is told so below
        return Batch(specs=[("input.repeated", data)])

    await rt._append(parent, build, turn_id=mirror.turn_id)
