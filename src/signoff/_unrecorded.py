"""The outcomes of tool bodies (and of their steps) that ran but whose record the store refused,
which a runtime keeps in memory until a later drive of their session records them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._recording import EventSpec

__all__ = ["UNRECORDED_KEPT", "Unrecorded"]

UNRECORDED_KEPT = 1024
"""How many unrecorded outcomes (of calls and of steps) a runtime keeps (the oldest go first)."""


class Unrecorded:
    """Outcomes the store refused to record (a full disk, a database restarting), by key, each
    with its session: a later drive of the session in this process records them instead of
    running the body, and its side effects, again. Those still owed (not `fenced`) are lost
    with the process: the drive keeps their session's lease and drives it again until they
    are recorded (`KeptOutcomes`), a worker's also once stopping, an inline one's at `close`."""

    def __init__(self) -> None:
        # by key: (its session, what ran named for a log line, the events recording it, fenced)
        self._kept: dict[str, tuple[str, str, list[EventSpec], bool]] = {}

    def keep(
        self, session_id: str, key: str, specs: list[EventSpec], what: str, *, fenced: bool
    ) -> None:
        """Keep the events recording that `what` ran (`issue_refund call call_1`) in the
        session. `fenced`: refused as the drive's lease was lost, or the store lost commits it
        had made (`record_fenced`), its turn left to the process that goes on with it, which
        runs the call again unless this one gets the session back."""
        self._kept.pop(key, None)  # the newest last: the oldest forgotten first
        while len(self._kept) >= UNRECORDED_KEPT:
            del self._kept[next(iter(self._kept))]
        self._kept[key] = (session_id, what, specs, fenced)

    def pop(self, key: str) -> list[EventSpec] | None:
        kept = self._kept.pop(key, None)
        return None if kept is None else kept[2]

    def sessions(self) -> list[str]:
        """The sessions owed outcomes (not fenced), oldest first."""
        owed = (session for session, _, _, fenced in self._kept.values() if not fenced)
        return list(dict.fromkeys(owed))

    def of(self, session_id: str) -> list[str]:
        """What ran in the session whose outcome is owed, each named for a log line."""
        return [
            what
            for session, what, _, fenced in self._kept.values()
            if session == session_id and not fenced
        ]

    def forget(self, session_id: str) -> list[str]:
        """Drop what is kept of the session (it can no longer be recorded); returns what of it
        was owed, named."""
        named = self.of(session_id)
        for key in [k for k, (session, *_) in self._kept.items() if session == session_id]:
            del self._kept[key]
        return named
