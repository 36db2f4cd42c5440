"""Crash at every persistence point of a turn that delegates to a subagent and waits on quorums
and a deadline: SIGKILL right before and right after each write (the child session's creation
and its turn, each quorum vote, the mirror's answer, the child's completion reaching the parent,
the deadline a sweep applies, the leases taken and given back); restart; the result must not
change (`tests/_fault_delegate_child.py` plays it)."""

from __future__ import annotations

import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from . import _proof
from ._crash_points import kill_at_each
from ._forks import Forks
from ._procs import lapse_leases, query
from .conftest import STORE_KINDS
from .test_fault_injection import Target, read_log, runs

KINDS = ("refund", "notify", "hold")


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forks]:
    forks = Forks("tests._fault_delegate_child", tmp_path_factory.mktemp("children"))
    try:
        yield forks
    finally:
        forks.close()


@pytest.fixture(scope="module", params=STORE_KINDS)
def target(request: pytest.FixtureRequest) -> Target:
    return Target(request.param, request)


def child(
    children: Forks, url: str, tmp: Path, kill_at: int = 0, when: str = "before"
) -> tuple[int, dict[str, Any] | None]:
    return children.run(url, str(tmp / "runs"), str(tmp), str(kill_at), when)


def check_store(url: str, parent: str) -> dict[str, list[str]]:
    """The checks of every crash scenario on the parent and its child session (seq gap-free,
    no request lost, none answered twice, all settled but the hold its deadline closed); the
    event types of each, by agent."""
    sessions = dict(query(url, "SELECT id, agent FROM {t}sessions"))
    assert sorted(sessions.values()) == ["billing", "support"], sessions  # one child, once
    assert sessions[parent] == "support"
    return {
        agent: [e.type for e in read_log(url, sid, expired=int(agent == "support"))]
        for sid, agent in sessions.items()
    }


@pytest.fixture(scope="module")
def baseline(
    tmp_path_factory: pytest.TempPathFactory, target: Target, children: Forks
) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("baseline")
    url = target.url(tmp)
    rc, result = child(children, url, tmp)
    assert rc == 0 and result is not None, children.stderr()
    assert result["status"] == "completed"
    result["types"] = check_store(url, result["session"])
    assert Counter(r["kind"] for r in runs(tmp)) == dict.fromkeys(KINDS, 1)
    _proof.record("crash:commit points", result["points"])
    _proof.record(f"crash:{target.kind}:commit points", result["points"])
    return result


def test_the_scenario_writes_at_each_kind_of_point(baseline: dict[str, Any]) -> None:
    labels = baseline["labels"]
    assert labels.count("session.created") == 2  # the parent, then the child
    assert labels.count("approval.candidate") == 2  # the first vote of each quorum
    assert labels.count("approval.settled") == 3  # two quorums met, the deadline's approval
    assert "input.resolved" in labels  # the mirror's answer reaching the child
    assert baseline["text"].startswith('done: "billing: refunded 20.0 on 9" | "notified 9"')
    assert "on_timeout='approve'" in baseline["text"]
    assert baseline["types"]["billing"][-2:] == ["turn.completed", "session.waiting"]


@pytest.mark.parametrize("when", ["before", "after"])
def test_sigkill_at_every_write_of_a_delegating_turn(
    tmp_path: Path, target: Target, baseline: dict[str, Any], children: Forks, when: str
) -> None:
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
        finished, result = child(children, url, tmp)
        assert finished == 0 and result is not None, (point, children.stderr())
        assert result["status"] == "completed", (point, result)
        assert result["text"] == baseline["text"], point
        assert result["texts"] == baseline["texts"], point
        check_store(url, result["session"])
        by_kind: dict[str, Counter[str]] = {}
        for r in runs(tmp):
            by_kind.setdefault(r["kind"], Counter())[r["key"]] += 1
        for kind in KINDS:
            keys = by_kind.get(kind, Counter())
            # Exactly once; twice (same key) only if the kill landed inside the body, after it
            # ran and before its result was committed.
            assert len(keys) == 1, (point, kind, keys)
            assert list(keys.values())[0] in (1, 2), (point, kind, keys)
        reruns = sum(1 for k in by_kind.values() for n in k.values() if n == 2)
        assert reruns <= 1, (point, by_kind)

    kill_at_each(target.kind, baseline["labels"], kill)
