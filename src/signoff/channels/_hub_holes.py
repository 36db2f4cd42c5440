"""How a `ChannelHub` moves a channel's position over the holes in the audit trail's ids.

Ids are taken before commit, so on PostgreSQL a lower id can show up after a higher one: a
missing id below one read is waited for `gap_timeout` seconds from the poll that first read past
it (`Holes`), then passed (a rolled-back transaction, an erased session's entries). The wait is
for the hole as a whole: every id missing below a poll's top waits from that poll, so a deleted
session's entries or a prune's thousands pass after one `gap_timeout`, not one id per
`gap_timeout` each, which held the position (and the claim's) below them for minutes or hours.
"""

from __future__ import annotations

from collections.abc import Set

__all__ = ["Holes", "advanced"]


class Holes:
    """When each id was first read past: the tops of the polls, each with when it was first
    read (both rising), so an id waits from the first poll whose top was at or above it."""

    def __init__(self) -> None:
        self._reads: list[tuple[int, float]] = []

    def read(self, top: int, now: float) -> None:
        """Note that a poll at `now` read the trail up to id `top`."""
        if not self._reads or top > self._reads[-1][0]:
            self._reads.append((top, now))

    def passed(self, timeout: float, now: float) -> int:
        """The highest id whose wait is over: read past `timeout` seconds ago or more (0 if
        none). The reads older than that are kept as their newest, which passes them all."""
        over = [i for i, (_, at) in enumerate(self._reads) if now - at >= timeout]
        if not over:
            return 0
        del self._reads[: over[-1]]
        return self._reads[0][0]

    def forget(self, low: int) -> None:
        """Drop what the ids up to `low` wait on: every channel's position is past them."""
        self._reads = [(top, at) for top, at in self._reads if top > low]


def advanced(
    pos: int, top: int, present: Set[int], seen: set[int], *, held: bool, passed: int
) -> int:
    """The position past `pos` that a channel has reached, up to `top`: over the ids it handled
    (`seen`, dropped from it as passed) and the holes up to `passed`, stopping at one it read
    and did not handle (it failed) or at any hole while `held`."""
    for i in sorted({i for i in present if i > pos} | {i for i in seen if pos < i <= top}):
        if i > pos + 1:  # pos + 1 .. i - 1 are missing
            if held:
                break
            pos = max(pos, min(passed, i - 1))
            if pos < i - 1:
                break
        if i not in seen:  # read but not handled: the channel failed on it
            break
        seen.discard(i)
        pos = i
    return pos
