"""A subagent's tool outcome the store refused (`so.delegate()`), kept in memory: the parent's
lease is kept as the child's is, renewed while the child's outcome is recorded, whoever drives
the parent (a call, a worker) and whatever the runtime's `cache_size`; a worker told to stop
meanwhile still stops in time. The refund runs once. Both stores."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

import signoff as so
from signoff import _kept_outcomes
from signoff.testing import call, call_tools, reply, scripted_agent

from ._workers import until
from .test_store_failures import _is, _LostCommits, _refunds


def _tree(runs: list[str], lost: list[_LostCommits], depth: int = 2) -> list[so.Agent]:
    """`p` delegating to `a`, whose refund's outcome the store refuses (`_refunds`); with
    `depth` 3, `p` delegating to `c`, which delegates to `a`."""
    agents, below = [_refunds(runs, lost)], "a"
    for name in ("c", "p")[3 - depth :]:
        script = [call_tools(call(below, message="refund", call_id="d1")), reply(f"{name} done.")]
        agents.insert(0, scripted_agent(name, script, tools=[so.delegate(below)]))
        below = name
    return agents


async def _held(rt: so.Runtime, *sessions: str) -> list[bool]:
    return [bool(await rt.store.lease_held(s, rt.now())) for s in sessions]  # type: ignore[attr-defined]


async def _tree_of(rt: so.Runtime, leaf: str) -> list[str]:
    """The session ids from the root down to `leaf`."""
    ids = [leaf]
    while (parent := (await rt.state(ids[0])).parent) is not None:
        ids.insert(0, parent)
    return ids


async def test_the_kept_leases_of_a_subagent_chain_are_renewed_while_its_outcome_is_recorded(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent's lease (and a middle subagent's, in a chain of three) was kept but never
    renewed while the subagent's outcome was recorded: it lapsed after one TTL, and another
    process resuming the parent hung in its delegate call, waiting on the subagent's lease, well
    past its `lease_wait`. Each is taken again before it lapses: the resume finds it running."""
    runs: list[str] = []
    lost: list[_LostCommits] = []
    agents = _tree(runs, lost, depth=3)
    async with (
        so.Runtime(agents, store=store_url, lease_ttl=2.0) as rt,
        so.Runtime(agents, store=store_url, lease_wait=0.3, lease_ttl=2.0) as other,
    ):
        lost.append(_LostCommits(rt, monkeypatch))
        sid = await other.create_session("p")
        with pytest.raises(so.StoreError, match="connection lost"):
            await rt.generate("p", "refund me", session_id=sid)
        tree = await _tree_of(other, runs[0].rsplit(":", 2)[0])
        assert tree[0] == sid and len(tree) == 3
        for _ in range(6):  # well past one TTL
            await asyncio.sleep(0.5)
            assert await _held(other, *tree) == [True] * 3
        began = time.monotonic()
        resumed = await asyncio.wait_for(other.generate(session_id=sid), 10)
        assert resumed.status == "running", resumed
        assert time.monotonic() - began < 3
        assert len(runs) == 1, "another process ran the subagent's refund again"
        lost[0].down = False  # the store takes commits again: recorded, and the tree goes on
        await until(lambda: _is(other, sid, "completed"))
        assert (await other.state(sid)).turn.text == "p done."  # type: ignore[union-attr]
        await until(lambda: _free(other, *tree))
    assert len(runs) == 1


async def test_a_runtime_without_a_cache_keeps_the_parents_lease_too(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With `cache_size=0` the delegate call could not find the subagent's parent (it looked in
    the cache), so the parent's lease was given back at once: another process resumed the
    parent and hung on the subagent's lease. It is kept as with a cache."""
    runs: list[str] = []
    lost: list[_LostCommits] = []
    agents = _tree(runs, lost)
    async with (
        so.Runtime(agents, store=store_url, cache_size=0) as rt,
        so.Runtime(agents, store=store_url, lease_wait=0.3) as other,
    ):
        lost.append(_LostCommits(rt, monkeypatch))
        sid = await other.create_session("p")
        with pytest.raises(so.StoreError, match="connection lost"):
            await rt.generate("p", "refund me", session_id=sid)
        kid = runs[0].rsplit(":", 2)[0]
        assert await _held(other, sid, kid) == [True, True]
        resumed = await asyncio.wait_for(other.generate(session_id=sid), 10)
        assert resumed.status == "running", resumed
        assert len(runs) == 1, "another process ran the subagent's refund again"
        lost[0].down = False
        await until(lambda: _is(other, sid, "completed"))
        await until(lambda: _free(other, sid, kid))
    assert len(runs) == 1


async def test_a_worker_keeps_both_leases_while_a_subagents_outcome_is_unrecorded(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker's drive of the parent records the subagent's outcome the store refused in that
    drive, holding the parent's lease and the child's: another process's resume finds the
    parent running, and a second worker runs nothing. Once the store takes commits, the worker
    records it and the parent's turn completes, the refund run once."""
    runs: list[str] = []
    lost: list[_LostCommits] = []
    agents = _tree(runs, lost)
    async with (
        so.Runtime(agents, store=store_url, inline=False) as w1,
        so.Runtime(agents, store=store_url, inline=False) as w2,
        so.Runtime(agents, store=store_url, lease_wait=0.3) as other,
    ):
        lost.append(_LostCommits(w1, monkeypatch))
        sid = await other.create_session("p")
        await w1.generate("p", "refund me", session_id=sid)  # left to the workers
        stop1, stop2 = asyncio.Event(), asyncio.Event()
        work1 = asyncio.create_task(w1.work(stop=stop1, idle_wait=0.05))
        await until(lambda: _refused(w1))
        kid = runs[0].rsplit(":", 2)[0]
        work2 = asyncio.create_task(w2.work(stop=stop2, idle_wait=0.05))
        await asyncio.sleep(1.0)
        assert await _held(other, sid, kid) == [True, True]
        resumed = await asyncio.wait_for(other.generate(session_id=sid), 10)
        assert resumed.status == "running", resumed
        stop2.set()
        await asyncio.wait_for(work2, 10)
        assert len(runs) == 1, "another process ran the subagent's refund again"
        lost[0].down = False
        await until(lambda: _is(other, sid, "completed"))
        stop1.set()
        await asyncio.wait_for(work1, 10)
        await until(lambda: _free(other, sid, kid))
    assert len(runs) == 1


async def test_a_worker_told_to_stop_while_a_subagents_outcome_is_refused_stops_in_time(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker told to stop while the store still refused the subagent's outcome never
    returned: its drive gave the parent's lease back, claimed the parent again, and that drive
    waited for the child's lease, which an inline recording held until `close`. It tries for
    `RECORD_KEPT_WITHIN`, then stops with a `StoreError` naming the call, both leases given
    back."""
    monkeypatch.setattr(_kept_outcomes, "RECORD_KEPT_WITHIN", 0.5)
    runs: list[str] = []
    lost: list[_LostCommits] = []
    agents = _tree(runs, lost)
    async with (
        so.Runtime(agents, store=store_url, inline=False) as w1,
        so.Runtime(agents, store=store_url, lease_wait=0.3) as other,
    ):
        lost.append(_LostCommits(w1, monkeypatch))
        sid = await other.create_session("p")
        await w1.generate("p", "refund me", session_id=sid)
        stop = asyncio.Event()
        working = asyncio.create_task(w1.work(stop=stop, idle_wait=0.05, concurrency=1))
        await until(lambda: _refused(w1))
        await asyncio.sleep(1.0)
        stop.set()
        done, _ = await asyncio.wait({working}, timeout=10)
        assert done, "the worker did not stop"
        kid = runs[0].rsplit(":", 2)[0]
        with pytest.raises(so.StoreError, match=f"refund call c1 in session {kid}"):
            await working
        assert await _held(other, sid, kid) == [False, False]
    assert len(runs) == 1
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(line.startswith(f"session {kid}: the outcome of refund") for line in errors), errors


async def _refused(rt: so.Runtime) -> bool:
    """Whether `rt` keeps an outcome the store refused."""
    return bool(rt._unrecorded.sessions())


async def _free(rt: so.Runtime, *sessions: str) -> bool:
    return not any(await _held(rt, *sessions))
