"""A response policy's refusal SIGKILLed right before or right after each commit of the refused
answer (its candidate and the refusal): restarted, the refusal is
recorded once however often the answer is repeated, nothing else changed, and an accepted answer
then finishes the turn as an uninterrupted run does, the tool once."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

import signoff as so

from . import _proof
from ._crash_points import kill_at_each
from ._forks import Scripts
from ._procs import ROOT, lapse_leases, read_executions
from ._refusal_crash import LATER, REASON, START, approve, runtime
from ._response_policies import ALICE, BOB, MALLORY, lines
from .test_sqlite_upgrade import _child_env

_CHILD = "import sys\nfrom tests._refusal_crash import main\nmain(sys.argv[1:])\n"


async def park(url: str, records: Path) -> tuple[str, str]:
    """A turn waiting on the refund's approval: its session and request."""
    async with runtime(url, str(records), START) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        assert r.status == "waiting"
        (request,) = r.pending
        return r.session_id, request.id


def refuse(scripts: Scripts, url: str, tmp: Path, sid: str, rid: str, when: str, point: int) -> int:
    """Mallory's answer in a child, SIGKILLed WHEN its `point`-th commit is made (0: never)."""
    env = {**_child_env(), "PYTHONPATH": f"{_child_env()['PYTHONPATH']}:{ROOT}"}
    args = (url, str(tmp / "runs.jsonl"), sid, rid, when, str(point), str(tmp / "labels"))
    done = scripts.run(_CHILD, *args, env=env)
    assert done.returncode in (0, -signal.SIGKILL), (done.returncode, done.stderr)
    return done.returncode


def refusals(events: list[so.Event], rid: str) -> int:
    """How many times the log records Mallory's approval of `rid` refused for `REASON`."""
    return sum(
        1
        for e in events
        if e.type == "approval.candidate"
        and e.data["request_id"] == rid
        and e.data["outcome"] == "rejected"
        and e.data["reason"] == REASON
        and e.data["decision"] == "approve"
        and e.data["by"] == MALLORY.model_dump()
    )


async def events_of(rt: so.Runtime, sid: str) -> list[so.Event]:
    events = [e async for e in rt.events(sid, follow=False)]
    assert [e.seq for e in events] == list(range(1, len(events) + 1)), "seq has a gap"
    return events


async def finish(url: str, tmp: Path, sid: str, rid: str) -> tuple[list[str], list[str]]:
    """Restart after the refusal: Mallory's answer repeated thrice is refused and recorded once,
    the request still pending and nothing applied; then Bob approves and the turn completes,
    the refund run once. The log's lines once refused, and at the end."""
    lapse_leases(url)  # as their TTL passing would
    async with runtime(url, str(tmp / "runs.jsonl"), LATER) as rt:
        heads = []
        for _ in range(3):
            r = await rt.respond(sid, approve(rid), principal=MALLORY)
            (outcome,) = r.outcomes
            assert (r.status, outcome.outcome, outcome.applied) == ("waiting", "rejected", False)
            assert outcome.reason == REASON
            heads.append(await rt.store.head(sid))
            assert refusals(await events_of(rt, sid), rid) == 1, "refusal not recorded once"
        assert heads[1] == heads[2], "a repeat of the refused answer recorded something"
        stored = await rt.store.get_request(rid)
        assert stored is not None and stored.status == "pending"
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.status == "waiting"
        assert not state.candidates  # none left pending, for a later drive to judge again
        refused = lines(await events_of(rt, sid))
        assert read_executions(tmp / "runs.jsonl") == []

        r = await rt.respond(sid, approve(rid), principal=BOB)
        assert (r.status, r.text) == ("completed", "done"), r
        events = await events_of(rt, sid)
        assert refusals(events, rid) == 1
        assert await rt.verify_audit() == []
    assert len(read_executions(tmp / "runs.jsonl")) == 1, "the refund did not run once"
    return refused, lines(events)


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_refusal_killed_around_each_commit_is_recorded_once(
    store_url: str, tmp_path: Path, scripts: Scripts, when: str
) -> None:
    """Killed after the candidate's commit (or before the refusal's), the candidate was left
    pending: the restart judges it again, and a repeat of the answer met before that must not
    record a refusal of its own beside the one recovered."""
    kind = "sqlite" if store_url.startswith("sqlite") else "postgres"
    ref = tmp_path / "uninterrupted"
    ref.mkdir()
    sid, rid = asyncio.run(park(store_url, ref / "runs.jsonl"))
    assert refuse(scripts, store_url, ref, sid, rid, when, 0) == 0
    labels: list[str] = json.loads((ref / "labels").read_text())
    assert labels[:2] == ["approval.candidate", "approval.candidate"], labels
    expected = asyncio.run(finish(store_url, ref, sid, rid))
    if when == "before":  # the "after" kills land on the same points
        _proof.record("crash:commit points", len(labels))
        _proof.record(f"crash:{kind}:commit points", len(labels))

    def kill(point: int) -> str:
        tmp = tmp_path / f"{when}-{point}"
        tmp.mkdir()
        sid, rid = asyncio.run(park(store_url, tmp / "runs.jsonl"))
        assert refuse(scripts, store_url, tmp, sid, rid, when, point) == -signal.SIGKILL
        assert asyncio.run(finish(store_url, tmp, sid, rid)) == expected, point
        landed: list[str] = json.loads((tmp / "labels").read_text())
        return landed[-1]

    kill_at_each(kind, labels, kill)
