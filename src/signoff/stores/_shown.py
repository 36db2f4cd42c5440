"""The check a follower's read makes that the last event it showed is still the store's: a store
that lost commits (a crash, a restored copy) and then ran the session on has another event at
that seq, which the follower would skip, reading on after it. A cached state, and a commit
planned on one, are checked the same way."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._events import Event
from .._exceptions import EventsRewritten
from ._codec import type_name

__all__ = ["check_shown", "rewritten"]


def check_shown(session_id: str, shown: Event, row: Sequence[Any] | None) -> None:
    """Raise `EventsRewritten` unless `row`, the stored type, time and turn of the event at
    `shown.seq` (None: there is none), is `shown`'s. A row naming no turn has its turn from an
    earlier row (one naming "" names none): only its type and time are compared then (the time
    is the clock's at recording, so an event written anew differs there)."""
    if row is not None:
        code, at, turn = row
        if (
            type_name(code) == shown.type
            and float(at) == shown.at
            and (turn is None or (turn or None) == shown.turn_id)
        ):
            return
    raise EventsRewritten(session_id, shown.seq)


def rewritten(session_id: str, seq: int) -> str:
    """What `AppendConflict` says of a commit planned on an event at `seq` the store no longer
    holds (`Commit.expected_event`)."""
    return (
        f"session {session_id!r}: its event {seq} is not the one this commit was planned on "
        "(the store lost commits and that seq was written again)"
    )
