"""Whether a subagent's conversation ended by time: its session, or one above it, passed its TTL
with its turn unfinished. That ended the delegated turns below it for good, so a message to such
a subagent (`send`, a prompt, a Slack reply) is refused rather than start a turn no one asked."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ._exceptions import UnknownSession
from ._state import SessionState

__all__ = ["lapsed", "lapsed_in_tree"]


async def lapsed_in_tree(
    state: SessionState, now: float, read: Callable[[str], Awaitable[SessionState]]
) -> SessionState | None:
    """The session, `state` or one above it (its parent, theirs...; `read` reads each), that
    passed its TTL with its turn unfinished (`lapsed`) by `now`, if any. A parent deleted since
    ends the walk (no TTL of its own to tell), as does a loop of parents."""
    seen = {state.id}
    while not lapsed(state, now):
        if state.parent is None or state.parent in seen:
            return None
        seen.add(state.parent)
        try:
            state = await read(state.parent)
        except UnknownSession:
            return None
    return state


def lapsed(state: SessionState, now: float) -> bool:
    """Whether the session's TTL passed with its turn unfinished: its lapse recorded, or its
    TTL passed by `now` while its turn runs or waits (an idle session past it ended nothing)."""
    turn = state.turn
    unfinished = turn is not None and turn.status in ("running", "waiting")
    return state.lapsed or (unfinished and state.expired(now))
