"""Where a follow-up message went (`Went`): the turn it started or steered, or its place in the
queue, by which the turn that later took it from there is found in the session's log
(`turn_taking`). Its `send` is told that turn, not another one its drive went on to or began
with."""

from __future__ import annotations

from typing import NamedTuple, TypeAlias

from ._state import SessionState
from .stores import Store

__all__ = ["InTurn", "Queued", "Went", "queued_last", "turn_taking"]

_PAGE = 500


class InTurn(NamedTuple):
    """A turn a message started or steered: its id and first event."""

    turn_id: str
    first_seq: int


class Queued(NamedTuple):
    """A message put in the queue: the event `seq` that queued it, `ahead` messages waiting
    before it."""

    seq: int
    ahead: int


Went: TypeAlias = InTurn | Queued


def queued_last(state: SessionState) -> Queued:
    """The place of the message that `state`'s last event put at the end of the queue."""
    return Queued(state.seq, len(state.queued) - 1)


async def turn_taking(store: Store, session_id: str, went: Went) -> InTurn | None:
    """The turn a message went to: the one `went` names, or the one that took it from the
    queue, which is first in, first out (the turn started `dequeued` `ahead` + 1 times after the
    message was queued: `_event_handlers._turn_started`). None while it still waits there."""
    if isinstance(went, InTurn):
        return went
    left, after = went.ahead, went.seq
    while True:
        page = await store.read_events(session_id, after, limit=_PAGE, types=("turn.started",))
        for e in page:
            if e.data.get("dequeued") and e.turn_id is not None:
                if left == 0:
                    return InTurn(e.turn_id, e.seq)
                left -= 1
        if len(page) < _PAGE:
            return None
        after = page[-1].seq
