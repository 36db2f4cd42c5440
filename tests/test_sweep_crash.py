"""A sweep SIGKILLed right after it recorded a passed approval deadline (approved or denied on
timeout), before it went on with the turn that made runnable, or at any write of its drive of
that turn (a subagent's parent's too): the next sweep of an inline runtime (no worker) finds
that turn and finishes it, and so does a new worker, with the events, text and tool runs of an
uninterrupted run, the tool once (twice only if killed inside its body), `seq` gap-free.

Before the inline sweep looked for such turns, nothing ever drove one again: the deadline's
request was closed, so no later sweep or listing met it, and the turn read `running` for good
(until someone called `generate(session_id=...)` on that very session). Until it looked past
the drive's own writes, so did a turn whose drive died after its first one (`tool.started`)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.server import create_app

from . import _proof
from ._forks import Scripts
from ._procs import ROOT, read_executions
from ._sweep_crash import DEADLINE, PAST, PROMPT, START, runtime
from ._workers import is_, until
from .test_sqlite_upgrade import _child_env

_CHILD = "import sys\nfrom tests._sweep_crash import main\nmain(sys.argv[1:])\n"


def child(scripts: Scripts, url: str, records: Path, on_timeout: str, mode: str, sid: str) -> int:
    env = {**_child_env(), "PYTHONPATH": f"{_child_env()['PYTHONPATH']}:{ROOT}"}
    done = scripts.run(_CHILD, url, str(records), on_timeout, mode, sid, env=env)
    assert done.returncode in (0, -signal.SIGKILL), (done.returncode, done.stderr)
    return done.returncode


async def park(url: str, records: Path, on_timeout: str, shape: str = "plain") -> str:
    """A turn parked on the refund's approval, before its deadline (`shape`: `agents`')."""
    async with runtime(url, str(records), on_timeout, START, shape) as rt:
        parked = await rt.generate("support", prompt=PROMPT)
        assert parked.status == "waiting" and len(parked.pending) == 1
        return parked.session_id


async def log_of(rt: so.Runtime, sid: str) -> list[tuple[int, str, Any]]:
    """The session's events as `(seq, type, what matters of their data)`."""
    keep = ("decision", "outcome", "reason", "result", "text", "error", "auto")
    return [
        (e.seq, e.type, {k: e.data[k] for k in keep if k in e.data})
        async for e in rt.events(sid, follow=False)
    ]


async def uninterrupted(tmp: Path, on_timeout: str) -> list[tuple[int, str, Any]]:
    """The log of the same turn, its deadline swept by an inline runtime that was not killed."""
    url, records = f"sqlite:///{tmp / 'reference.db'}", tmp / "reference.jsonl"
    sid = await park(url, records, on_timeout)
    async with runtime(url, str(records), on_timeout, PAST) as rt:
        assert await rt.expire_due() == 1
        assert (await rt.state(sid)).turn.status == "completed"  # type: ignore[union-attr]
        return await log_of(rt, sid)


async def check_finished(url: str, records: Path, sid: str, on_timeout: str, tmp: Path) -> None:
    expected = await uninterrupted(tmp, on_timeout)
    async with runtime(url, str(records), on_timeout, PAST) as rt:
        got = await log_of(rt, sid)
        assert [seq for seq, _, _ in got] == list(range(1, len(got) + 1))  # gap-free
        assert [e[1:] for e in got] == [e[1:] for e in expected]
        assert await rt.verify_audit() == []
    runs = read_executions(records)
    assert len(runs) == (1 if on_timeout == "approve" else 0), runs


async def killed_after_the_deadline(
    scripts: Scripts, url: str, records: Path, on_timeout: str, mode: str = "sweep"
) -> str:
    """A parked session whose deadline a child's sweep (or listing) recorded before it was
    SIGKILLed: its turn runnable, undriven."""
    sid = await park(url, records, on_timeout)
    assert child(scripts, url, records, on_timeout, mode, sid) == -signal.SIGKILL
    _proof.record("crash-outside:kills")
    assert read_executions(records) == []  # killed before anything ran
    return sid


@pytest.mark.parametrize("on_timeout", ["approve", "deny"])
@pytest.mark.parametrize("mode", ["sweep", "listing"])
async def test_an_inline_sweep_killed_after_a_deadline_leaves_the_turn_to_the_next_sweep(
    store_url: str, tmp_path: Path, scripts: Scripts, on_timeout: str, mode: str
) -> None:
    """No worker: the process that swept (or listed the queue, which records the deadlines it
    meets) is killed right after the deadline's commit, and a new process does what a user
    does (lists the queue, reads the session, sweeps). Before the fix its turn was left
    `running` with nothing to run it, after any number of sweeps."""
    records = tmp_path / "runs.jsonl"
    sid = await killed_after_the_deadline(scripts, store_url, records, on_timeout, mode)

    async with runtime(store_url, str(records), on_timeout, PAST) as rt:
        assert await rt.pending() == []  # the deadline is recorded: nothing to answer
        state = await rt.state(sid)
        assert state.status == "running" and state.pending_requests() == []
        assert await rt.expire_due() == 1  # the sweep after the kill goes on with the turn
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.status == "completed", state.turn
        assert await rt.expire_due() == 0  # once
    await check_finished(store_url, records, sid, on_timeout, tmp_path)


@pytest.mark.parametrize("on_timeout", ["approve", "deny"])
async def test_a_worker_killed_after_its_sweep_recorded_a_deadline_leaves_the_turn_to_another(
    store_url: str, tmp_path: Path, scripts: Scripts, on_timeout: str
) -> None:
    """A worker's sweep records the deadline and leaves the turn to claims: killed right after
    that commit, the turn is a runnable session with no lease, which the next worker claims."""
    records = tmp_path / "runs.jsonl"
    sid = await park(store_url, records, on_timeout)
    assert child(scripts, store_url, records, on_timeout, "worker-sweep", sid) == -signal.SIGKILL
    _proof.record("crash-outside:kills")
    assert read_executions(records) == []
    assert child(scripts, store_url, records, on_timeout, "worker", sid) == 0
    await check_finished(store_url, records, sid, on_timeout, tmp_path)


async def test_a_server_without_workers_restarted_after_a_killed_sweep_finishes_the_turn(
    store_url: str, tmp_path: Path, scripts: Scripts
) -> None:
    """`serve` with no workers: its sweep loop, restarted after the kill, finishes the turn
    within a sweep period or so, nobody calling anything."""
    records = tmp_path / "runs.jsonl"
    sid = await killed_after_the_deadline(scripts, store_url, records, "approve")
    rt = runtime(store_url, str(records), "approve", PAST)
    app = create_app(rt, dev=True, workers=0, sweep_every=0.05)
    async with app.router.lifespan_context(app):
        await until(lambda: is_(rt, sid, "completed"))
    await check_finished(store_url, records, sid, "approve", tmp_path)


async def test_two_runtimes_sweeping_at_once_finish_a_killed_sweeps_turn_once(
    store_url: str, tmp_path: Path, scripts: Scripts
) -> None:
    """Two processes' sweeps meet the same undriven turn: one drives it, the other leaves it
    to that one (it asks for the lease without waiting); the tool runs once, one log."""
    records = tmp_path / "runs.jsonl"
    sid = await killed_after_the_deadline(scripts, store_url, records, "approve")
    one = runtime(store_url, str(records), "approve", PAST)
    two = runtime(store_url, str(records), "approve", PAST)
    async with one, two:
        counts = await asyncio.gather(one.expire_due(), two.expire_due(), one.expire_due())
        assert 1 <= sum(counts) <= 3, counts
        assert await is_(one, sid, "completed")
    await check_finished(store_url, records, sid, "approve", tmp_path)


LATER = PAST + DEADLINE  # a process after the kill: the lease a killed drive held has lapsed


def child_at(
    scripts: Scripts,
    url: str,
    tmp: Path,
    on_timeout: str,
    mode: str,
    sid: str,
    point: int,
    when: str,
    shape: str,
) -> int:
    """Run the sweep (or listing) of `mode` in a child that dies `when` its `point`-th write
    (0: never), its writes' labels kept in `tmp / "labels"`."""
    env = {**_child_env(), "PYTHONPATH": f"{_child_env()['PYTHONPATH']}:{ROOT}"}
    argv = [url, str(tmp / "runs.jsonl"), on_timeout, mode, sid, str(point), when]
    done = scripts.run(_CHILD, *argv, str(tmp / "labels"), shape, env=env)
    assert done.returncode in (0, -signal.SIGKILL), (done.returncode, done.stderr)
    return done.returncode


async def logs_of(rt: so.Runtime, sid: str) -> list[list[tuple[int, str, Any]]]:
    """The session's log (`log_of`), and its subagent's after it if it delegated, each `seq`
    gap-free."""
    sids = [sid]
    sids += [
        e.data["result"]
        async for e in rt.events(sid, follow=False)
        if e.type == "tool.step" and e.data.get("name") == "subagent.session"
    ]
    out = [await log_of(rt, s) for s in sids]
    for log in out:
        assert [seq for seq, _, _ in log] == list(range(1, len(log) + 1))  # gap-free
    # The subagent's session id, which the parent's journal keeps, differs from run to run.
    return [[(n, t, {} if t == "tool.step" else d) for n, t, d in log] for log in out]


async def kill_at_each_write(
    scripts: Scripts, url: str, tmp: Path, on_timeout: str, mode: str, when: str, shape: str
) -> int:
    """An uninterrupted sweep (or listing) of a parked session whose deadline passed, then one
    of another such session SIGKILLed `when` each of its writes in turn: the deadline's commit,
    the lease, and each of the drive's. A later process's sweep must finish every one of those
    turns as the uninterrupted run did, nothing left pending, the audit trail clean, and run
    the tool once, twice (one key) only if killed inside its body. Returns the kills."""
    base = tmp / "base"
    base.mkdir()
    sid = await park(url, base / "runs.jsonl", on_timeout, shape)
    assert child_at(scripts, url, base, on_timeout, f"{mode}-at", sid, 0, when, shape) == 0
    labels = (base / "labels").read_text().splitlines()
    async with runtime(url, str(base / "runs.jsonl"), on_timeout, LATER, shape) as rt:
        assert await is_(rt, sid, "completed")
        expected = [[e[1:] for e in log] for log in await logs_of(rt, sid)]
    for point, label in enumerate(labels, 1):
        where = tmp / f"{when}-{point}"
        where.mkdir()
        sid = await park(url, where / "runs.jsonl", on_timeout, shape)
        killed = child_at(scripts, url, where, on_timeout, f"{mode}-at", sid, point, when, shape)
        assert killed == -signal.SIGKILL, (point, label)
        assert (where / "labels").read_text().splitlines() == labels[:point]  # died there
        _proof.record("crash-outside:kills")
        async with runtime(url, str(where / "runs.jsonl"), on_timeout, LATER, shape) as rt:
            await rt.expire_due()
            assert await is_(rt, sid, "completed"), (point, when, label)
            assert await rt.expire_due() == 0, (point, label)  # nothing left to go on with
            assert await rt.pending() == [], (point, label)
            got = [[e[1:] for e in log] for log in await logs_of(rt, sid)]
            assert got == expected, (point, when, label)
            assert await rt.verify_audit() == [], (point, label)
        runs = read_executions(where / "runs.jsonl")
        # The gated tool's body ran, its result not committed: run again, with its key.
        inside = when == "before" and label == "tool.completed"
        inside = inside and "tool.completed" not in labels[: point - 1]  # not the delegate's
        wanted = 0 if on_timeout == "deny" else 2 if inside else 1
        assert len(runs) == wanted, (point, when, label, runs)
        assert len({r["key"] for r in runs}) <= 1, runs
    return len(labels)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("on_timeout", ["approve", "deny"])
@pytest.mark.parametrize("mode", ["sweep", "listing"])
async def test_an_inline_sweep_killed_at_any_write_of_its_drive_leaves_the_turn_to_the_next(
    store_url: str, tmp_path: Path, scripts: Scripts, mode: str, on_timeout: str, when: str
) -> None:
    """No worker: the sweep (or listing) that recorded the deadline dies at a write of its drive
    of the turn: `tool.started`, `tool.completed`, `model.completed`, its lease. Before the fix
    only a death before the drive's first event was gone on with: after it, the turn read
    `running` for good, the approved call never ran, and no later sweep touched it."""
    kills = await kill_at_each_write(scripts, store_url, tmp_path, on_timeout, mode, when, "plain")
    assert kills >= 4  # the deadline, the lease, the call's result, the model's reply


@pytest.mark.parametrize("when", ["before", "after"])
async def test_an_inline_sweep_killed_at_any_write_of_a_subagents_parent_finishes_both(
    store_url: str, tmp_path: Path, scripts: Scripts, when: str
) -> None:
    """The deadline is a subagent's approval: the sweep drives the subagent's turn, then its
    parent's, whose delegate call's result it records first. Killed at any write of either,
    the next sweep finishes both turns (before the fix, a parent killed after its delegate
    call's `tool.completed` read `running` for good)."""
    kills = await kill_at_each_write(
        scripts, store_url, tmp_path, "approve", "sweep", when, "delegate"
    )
    assert kills >= 8
