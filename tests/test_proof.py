"""The "signoff proof" summary (tests/_proof.py, printed by tests/conftest.py) of a parallel run
is the serial run's: each pytest-xdist worker's tally reaches the controller and is added up."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from . import _proof
from ._crash_points import kill_at_each
from ._forks import ROOT

# What two test files record: every kind of line the summary prints, split between them.
_RECORDS = [
    [
        ("crash:commit points", 3),
        ("crash:sqlite:commit points", 3),
        ("crash:sqlite:kills", 6),
        ("crash:kills", 6),
        ("chaos:kills", 2),
        ("chaos:sqlite:kills", 2),
        ("hypothesis:test_machine:examples", 100),
        ("hypothesis:test_machine:steps", 1234),
    ],
    [
        ("crash:commit points", 2),
        ("crash:postgres:commit points", 2),
        ("crash:postgres:kills", 4),
        ("crash:kills", 4),
        ("crash-outside:kills", 5),
        ("chaos:kills", 1),
        ("chaos:postgres:kills", 1),
        ("hypothesis:test_machine:examples", 50),
        ("hypothesis:test_fuzz:examples", 1000),
    ],
]


def _lines_of(counts: Counter[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.setattr(_proof, "tally", counts)
    return _proof.lines()


def test_merging_two_workers_tallies_gives_the_serial_lines(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    serial: Counter[str] = Counter()
    for records in _RECORDS:
        for name, n in records:
            serial[name] += n
    expected = _lines_of(serial, monkeypatch)
    assert expected == [
        "crash suite: 5 commit points, 10 kills (points/kills per store: postgres 2/4, sqlite 3/6)",
        "crash outside a turn: 5 kills around other writes",
        "chaos: 3 random kills (per store: sqlite 2, postgres 1)",
        "hypothesis: test_fuzz 1,000 examples",
        "hypothesis: test_machine 150 examples (1,234 steps)",
    ]
    controller: Counter[str] = Counter()
    monkeypatch.setattr(_proof, "tally", controller)
    for records in _RECORDS:  # each worker's dict(tally), as pytest_sessionfinish sends it
        _proof.merge(dict(Counter({name: n for name, n in records})))
    assert controller == serial
    assert _proof.lines() == expected


def _summary(out: str) -> list[str]:
    """The lines of the "signoff proof" section of pytest's output."""
    lines = out.splitlines()
    start = next((i + 1 for i, line in enumerate(lines) if "signoff proof" in line), len(lines))
    ends = (i for i in range(start, len(lines)) if " passed" in lines[i] or "===" in lines[i])
    return lines[start : next(ends, len(lines))]


def test_a_parallel_run_prints_the_serial_runs_summary(tmp_path: Path) -> None:
    """Two test files, one per pytest-xdist worker (`--dist loadfile`), with the hooks of
    tests/_proof.py that conftest.py registers: the controller prints what both recorded, as a
    run without workers does."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text(
        "from tests._proof import (\n"
        "    pytest_sessionfinish, pytest_terminal_summary, pytest_testnodedown\n"
        ")\n"
    )
    for i, records in enumerate(_RECORDS):
        (project / f"test_{i}.py").write_text(
            "import os\nfrom tests import _proof\n\n"
            "def test_records():\n"
            f"    with open({str(tmp_path / 'workers')!r}, 'a') as f:\n"
            "        f.write(os.environ.get('PYTEST_XDIST_WORKER', 'serial') + '\\n')\n"
            + "".join(f"    _proof.record({name!r}, {n})\n" for name, n in records)
        )
    # Only pytest-xdist among the plugins: each run is two or three pytest starts. Not the
    # variables of the worker this test may itself run in (its PYTEST_XDIST_WORKER).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    path = os.pathsep.join([str(ROOT), *sys.path])
    env.update(PYTHONPATH=path, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")

    def run(*options: str) -> list[str]:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *options],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return _summary(done.stdout)

    serial = run()
    parallel = run("-p", "xdist.plugin", "-n", "2", "--dist", "loadfile")
    workers = (tmp_path / "workers").read_text().split()
    assert sorted(workers) == ["gw0", "gw1", "serial", "serial"]  # both workers recorded
    assert parallel == serial
    assert serial[0].startswith("crash suite: 5 commit points, 10 kills")
    assert len(serial) == 5


def test_the_kills_counted_are_those_made_at_every_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """The crash suite's kill count is computed from the kills made: it falls with each one
    that did not land or whose restart failed its checks, and a point skipped fails the run."""
    tally: Counter[str] = Counter()
    monkeypatch.setattr(_proof, "tally", tally)
    labels = ["session.created", "lease.acquired", "turn.started", "lease.released"]
    tally["crash:commit points"] = tally["crash:sqlite:commit points"] = len(labels)

    assert kill_at_each("sqlite", labels, lambda point: labels[point - 1]) == 4
    assert _proof.lines() == [
        "crash suite: 4 commit points, 4 kills (points/kills per store: sqlite 4/4)"
    ]

    # The child counted one write too few (a label filtered out): each kill from the second
    # lands one write later than the uninterrupted run's count says, and the run fails.
    tally.clear()
    with pytest.raises(AssertionError, match="2: turn.started != lease.acquired"):
        kill_at_each("sqlite", labels, lambda point: labels[min(point, 3)])

    # A restart that fails its checks ends the run, and its kill is not counted.
    def second_fails(point: int) -> str:
        assert point != 2, "the restart's answer differs"
        return labels[point - 1]

    tally.clear()
    with pytest.raises(AssertionError, match="answer differs"):
        kill_at_each("postgres", labels, second_fails)
    assert tally == {"crash:kills": 1, "crash:postgres:kills": 1}
