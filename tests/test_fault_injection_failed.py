"""Crash at every persistence point of a turn that fails for good with a message queued behind
it: SIGKILL right before and right after each commit of a turn whose two approved tools run and
which then reaches `max_steps`, while Bob's message waits for its end; restart; the failure, Bob's
turn and the final state must be the baseline's (`tests/_fault_failed_child.py` plays it)."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from signoff.stores._codec import needs_previous

from . import _proof
from ._crash_points import kill_at_each
from ._fault_child import BOB_MESSAGE, PROMPT
from ._forks import Forks
from ._procs import lapse_leases, query
from .conftest import STORE_KINDS
from .test_fault_injection import Target, read_log, runs

FAILURE = {"code": "session_limit_reached", "message": "the turn reached max_steps=1"}


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forks]:
    """One process that imported signoff, forking a child per run of the scenario."""
    forks = Forks("tests._fault_failed_child", tmp_path_factory.mktemp("children"))
    try:
        yield forks
    finally:
        forks.close()


def child(
    children: Forks, url: str, tmp: Path, kill_at: int = 0, when: str = "before", by: str = "call"
) -> tuple[int, dict[str, Any] | None]:
    """Run the scenario (or resume it) in a child: its exit code, and its result if it ended.
    `by` resumes a session the kill left between Alice's failure and Bob's start."""
    args = (str(kill_at), when, by)
    return children.run(url, str(tmp / "runs"), str(tmp / "session"), *args)


def check_log(url: str, session_id: str) -> list[str]:
    """What the store holds after the scenario: besides what every crash scenario checks, one
    failure of Alice's turn, Bob's message recorded once and started once, after it."""
    events = read_log(url, session_id)
    types: list[str] = [e.type for e in events]
    assert Counter(types)["model.completed"] == 2  # Alice's one step, then Bob's
    assert Counter(types)["tool.completed"] == 2, "a tool's result was lost or recorded twice"
    [failed] = [e for e in events if e.type == "turn.failed"]
    assert failed.data["retryable"] is False and failed.data["error"] == FAILURE
    queued = [e for e in events if e.type == "turn.message" and e.data.get("queued")]
    assert len(queued) == 1, "the queued message was lost or recorded twice"
    assert queued[0].data["message"] == BOB_MESSAGE and queued[0].seq < failed.seq
    started = [e for e in events if e.type == "turn.started"]
    messages = [e.data["message"] for e in started]
    assert messages == [PROMPT, BOB_MESSAGE], "a turn started twice, or never"
    bob = started[1]
    assert bob.data.get("dequeued") is True and bob.seq > failed.seq
    # Alice's turn recorded nothing after its failure; Bob's ran to its end, answered.
    assert types[failed.seq : bob.seq - 1] == ["session.waiting"]
    tail = [(e.type, e.turn_id) for e in events if e.seq > bob.seq]
    ended = ["model.completed", "turn.completed", "session.waiting"]
    assert tail == [(t, bob.turn_id) for t in ended], tail
    return types


@pytest.fixture(scope="module", params=STORE_KINDS)
def target(request: pytest.FixtureRequest) -> Target:
    return Target(request.param, request)


@pytest.fixture(scope="module")
def baseline(
    tmp_path_factory: pytest.TempPathFactory, target: Target, children: Forks
) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("baseline")
    url = target.url(tmp)
    rc, result = child(children, url, tmp)
    assert rc == 0 and result is not None, children.stderr()
    result["types"] = check_log(url, result["session"])
    assert Counter(r["kind"] for r in runs(tmp)) == {"refund": 1, "ship": 1}
    # the long tool input is stored once: its request is kept on the model's response
    stored = query(url, "SELECT data FROM {t}events")
    assert any(needs_previous(data) for (data,) in stored)
    _proof.record("crash:commit points", result["points"])
    _proof.record(f"crash:{target.kind}:commit points", result["points"])
    return result


def test_the_failed_turn_starts_the_queued_message_in_the_baseline(
    baseline: dict[str, Any],
) -> None:
    assert (baseline["status"], baseline["session_status"]) == ("completed", "idle")
    assert baseline["stored"] == ["idle"] and baseline["queued"] == 0
    assert baseline["text"] == f"to bob: {BOB_MESSAGE}"
    assert baseline["turns"] == [[PROMPT, "alice"], [BOB_MESSAGE, "bob"]]
    assert baseline["ends"] == [["turn.failed", FAILURE, False], ["turn.completed", None, None]]
    # Alice's approval reports her turn failed; Bob's ran in that same call.
    assert baseline["calls"][-1] == "failed"
    # session, turn, model, the requests, Bob's message, two approvals and their tools' starts
    # and results, the failure, Bob's turn and its answer
    assert baseline["points"] >= 14
    labels = baseline["labels"]
    assert labels.index("turn.failed") + 1 == labels.index("turn.started", 2)


@pytest.mark.parametrize("when", ["before", "after"])
def test_sigkill_at_every_commit_point_of_a_turn_that_fails_for_good(
    tmp_path: Path, target: Target, baseline: dict[str, Any], children: Forks, when: str
) -> None:
    labels = baseline["labels"]
    # The kill between the failure's commit and the one starting Bob's turn: after the first,
    # or before the second.
    ending = labels.index("turn.failed") if when == "after" else labels.index("turn.started", 2)
    # Both kills there leave the same store: one is resumed by a call, the other by a worker.
    by = "call" if when == "after" else "worker"
    windows = []

    def kill(point: int) -> str:
        tmp = tmp_path / f"{when}-{point}"
        tmp.mkdir()
        url = target.url(tmp)
        killed, result = child(children, url, tmp, kill_at=point, when=when)
        assert killed == -signal.SIGKILL, (point, result, children.stderr())
        if (tmp / "session").exists():  # else killed before it existed: nothing acknowledged
            finish(tmp, url, point)
        return (tmp / "killed").read_text()

    def finish(tmp: Path, url: str, point: int) -> None:
        lapse_leases(url)  # as its TTL passing would
        finished, result = child(children, url, tmp, by=by)
        assert finished == 0 and result is not None, (point, children.stderr())
        for key in ("status", "session_status", "stored", "queued", "text", "turns", "texts"):
            assert result[key] == baseline[key], (point, key, result)
        assert result["ends"] == baseline["ends"], (point, result)  # the same error, once
        if result["window"] is not None:
            # Left `running` (what a worker claims); a call runs Bob's turn and returns it.
            done = "completed" if by == "call" else "answered"
            assert result["window"] == {"stored": ["running"], by: done}, (point, result)
            windows.append(point)
        check_log(url, result["session"])
        by_kind: dict[str, Counter[str]] = {}
        for r in runs(tmp):
            by_kind.setdefault(r["kind"], Counter())[r["key"]] += 1
        for kind in ("refund", "ship"):
            keys = by_kind.get(kind, Counter())
            # Exactly once; twice (same key) only if the kill landed inside the body, after it
            # ran and before its result was committed.
            assert len(keys) == 1, (point, kind, keys)
            assert list(keys.values())[0] in (1, 2), (point, kind, keys)
        reruns = sum(1 for k in by_kind.values() for n in k.values() if n == 2)
        assert reruns <= 1, (point, by_kind)  # one kill can interrupt one body at most

    kill_at_each(target.kind, labels, kill)
    assert windows == [ending + 1], (windows, labels)  # the one kill there
