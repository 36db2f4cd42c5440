"""A process-wide tally of what the proof suites exercised, printed at the end of the test run.

Tests add what actually ran (Hypothesis examples and steps, crash points, kills); the
`pytest_terminal_summary` hook in conftest.py prints it as the "signoff proof" section.
"""

from __future__ import annotations

from collections import Counter

__all__ = ["lines", "record", "tally"]

tally: Counter[str] = Counter()


def record(name: str, n: int = 1) -> None:
    """Add `n` to the counter `name` (e.g. `hypothesis:test_runtime_machine:examples`)."""
    tally[name] += n


def _fmt(n: int) -> str:
    return f"{n:,}"


def lines() -> list[str]:
    """The summary lines: the crash suite first (a turn's commit points, then the kills around
    writes outside a turn), the chaos kills, then one line per Hypothesis test."""
    out: list[str] = []
    points, kills = tally["crash:commit points"], tally["crash:kills"]
    if points or kills:
        stores = sorted({k.split(":")[1] for k in tally if k.count(":") == 2 and "crash" in k})
        each = ", ".join(
            f"{s} {_fmt(tally[f'crash:{s}:commit points'])}/{_fmt(tally[f'crash:{s}:kills'])}"
            for s in stores
        )
        detail = f" (points/kills per store: {each})" if each else ""
        out.append(f"crash suite: {_fmt(points)} commit points, {_fmt(kills)} kills{detail}")
    if tally["crash-outside:kills"]:
        outside = _fmt(tally["crash-outside:kills"])
        out.append(f"crash outside a turn: {outside} kills around other writes")
    if tally["chaos:kills"]:
        each = ", ".join(
            f"{s} {_fmt(tally[f'chaos:{s}:kills'])}"
            for s in ("sqlite", "postgres")
            if tally[f"chaos:{s}:kills"]
        )
        out.append(f"chaos: {_fmt(tally['chaos:kills'])} random kills (per store: {each})")
    tests = sorted({k.split(":")[1] for k in tally if k.startswith("hypothesis:")})
    for test in tests:
        examples = tally[f"hypothesis:{test}:examples"]
        counts = [
            f"{_fmt(tally[f'hypothesis:{test}:{what}'])} {what}"
            for what in ("steps", "restarts")
            if tally[f"hypothesis:{test}:{what}"]
        ]
        detail = f" ({', '.join(counts)})" if counts else ""
        out.append(f"hypothesis: {test} {_fmt(examples)} examples{detail}")
    return out
