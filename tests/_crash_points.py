"""The crash suite's loop over a scenario's persistence points, shared by its enumerations so
the kills the "signoff proof" summary prints are those that landed, and none is skipped."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from . import _proof

__all__ = ["kill_at_each"]


def kill_at_each(kind: str, labels: Sequence[str], kill: Callable[[int], str]) -> int:
    """Call `kill(point)` for each point of an uninterrupted run whose writes were `labels`
    (1 to their number): it SIGKILLs a run there, checks the restart, and returns the label of
    the write the kill landed on. Each counts as a kill of store `kind` in the summary once it
    returned; then every point must have been killed, each on the write the uninterrupted run
    made there (a point skipped, or the count of writes shifted, fails). Returns the kills."""
    landed: list[str] = []
    for point in range(1, len(labels) + 1):
        landed.append(kill(point))
        _proof.record("crash:kills")
        _proof.record(f"crash:{kind}:kills")
    assert landed == list(labels), "a kill missed its point: " + ", ".join(
        f"{i}: {a} != {b}" for i, (a, b) in enumerate(zip(landed, labels, strict=True), 1) if a != b
    )
    return len(landed)
