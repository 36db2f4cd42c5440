"""A process-wide tally of what the proof suites exercised, printed at the end of the test run.

Tests add what actually ran (Hypothesis examples and steps, crash points, kills); the
`pytest_terminal_summary` hook (registered by conftest.py) prints it as the "signoff proof"
section. Under pytest-xdist each worker keeps its own tally and sends it to the controller when
it finishes (`pytest_sessionfinish`), which adds them all up (`pytest_testnodedown`) and prints.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest

__all__ = [
    "lines",
    "merge",
    "pytest_sessionfinish",
    "pytest_terminal_summary",
    "pytest_testnodedown",
    "record",
    "tally",
]

tally: Counter[str] = Counter()

_KEY = "signoff_proof"
"""Where a pytest-xdist worker puts its tally for the controller (`config.workeroutput`)."""


def record(name: str, n: int = 1) -> None:
    """Add `n` to the counter `name` (e.g. `hypothesis:test_runtime_machine:examples`)."""
    tally[name] += n


def merge(counts: Mapping[str, int]) -> None:
    """Add a worker's whole tally (as `dict(tally)` sent it) to this process's."""
    for name, n in counts.items():
        record(name, n)


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


def pytest_sessionfinish(session: pytest.Session) -> None:
    """In a pytest-xdist worker, send what its tests exercised to the controller."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput[_KEY] = dict(tally)


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: unknown when run with -p no:xdist
def pytest_testnodedown(node: Any, error: object) -> None:
    """In the controller, add the tally of a worker that finished to its own."""
    merge(getattr(node, "workeroutput", {}).get(_KEY, {}))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print what the proof suites exercised: crash points, kills and Hypothesis examples (in a
    parallel run, the sum of every worker's)."""
    out = lines()
    if out:
        terminalreporter.section("signoff proof")
        for line in out:
            terminalreporter.write_line(line)
