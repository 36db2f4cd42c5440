"""Workers in one process: `Runtime(inline=False)` records what it is given, `Runtime.work()`
claims the sessions that have work under a lease and runs them. Run on both stores.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._events import Event
from signoff._exceptions import LeaseLost
from signoff.stores import Commit
from signoff.testing import ManualClock

from ._workers import (
    is_,
    refund_agent,
    until,
    working,
)


async def test_a_front_records_and_a_worker_runs_the_turns(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[str] = []
    agent = refund_agent(runs)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        assert r.status == "running" and r.pending == []  # recorded; nobody ran it yet
        assert await front.store.head(r.session_id) == 2
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(worker, concurrency=2):
                await until(lambda: is_(front, r.session_id, "waiting"))
                (req,) = await front.pending(session_id=r.session_id)
                answered = await front.respond(
                    r.session_id, [so.InputResponse(request_id=req.id, option_id="approve")]
                )
                assert answered.outcomes[0].applied and runs == []  # the worker runs the tool
                await until(lambda: is_(front, r.session_id, "completed"))
        assert runs == [f"{r.session_id}:1:call_refund"]
        assert (await front.state(r.session_id)).turn.text == "Done."  # type: ignore[union-attr]
        assert f"claimed session {r.session_id}" in caplog.text


async def test_a_live_lease_keeps_workers_off_and_an_expired_one_is_fenced(
    store_url: str,
) -> None:
    runs: list[str] = []
    agent = refund_agent(runs)
    # Time moves when the test says: the stalled lease is live however long a loaded machine
    # takes to start the worker and look (0.5 s of the wall clock was sometimes not enough).
    clock = ManualClock(time.time())
    async with (
        so.Runtime([agent], store=store_url, inline=False, clock=clock) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0, clock=clock) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        sid = r.session_id
        # Another process claimed it first (and then stalled): its lease is live for 0.5 s.
        ((got, token),) = await front.store.claim("stalled", 0.5, clock(), 10)
        assert got == sid
        assert await front.store.claim("nobody", 10, clock(), 10) == []
        async with working(worker):
            await asyncio.sleep(0.25)
            assert await front.store.head(sid) == 2  # nobody ran the turn under the live lease
            clock.advance(1.0)  # past the stalled lease's 0.5 s: it expires
            await until(lambda: is_(front, sid, "waiting"))  # taken over once it expired
        head = await front.store.head(sid)
        assert head is not None
        late = Event(session_id=sid, seq=head + 1, type="turn.message", at=clock(), data={})
        with pytest.raises(LeaseLost):  # the stalled holder's token no longer writes
            await front.store.commit(
                Commit(session_id=sid, expected_seq=head, events=[late], lease_token=token)
            )
        assert await front.store.head(sid) == head


async def test_a_worker_retries_a_failed_turn_when_asked(store_url: str) -> None:
    runs: list[str] = []
    calls = 0

    async def flaky(messages: list[so.Message]) -> so.ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise so.ModelError("upstream overloaded")
        return so.ModelResponse(text="Done.")

    agent = refund_agent(runs, first=flaky)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker):
            await until(lambda: is_(front, r.session_id, "failed"))
            state = await front.state(r.session_id)
            assert state.turn is not None and state.turn.retryable
            await asyncio.sleep(0.2)
            assert calls == 1  # a failed turn is not retried by itself
            again = await front.generate(session_id=r.session_id)  # retry: a worker runs it
            assert again.status == "running"
            await until(lambda: is_(front, r.session_id, "completed"))
        assert calls == 2
        types = [e.type async for e in front.events(r.session_id, follow=False)]
        assert types.count("turn.failed") == 1 and types.count("turn.resumed") == 1


async def test_the_worker_sweep_applies_passed_deadlines(store_url: str) -> None:
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.always(expires_in=0.3))
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker, sweep_every=0.1):
            # Nobody answers: the sweep denies it and a worker finishes the turn. (The request
            # is read from the log, not the queue: a busy machine may reach its 0.3 s deadline
            # before the test reads the queue.)
            await until(lambda: is_(front, r.session_id, "completed"))
        log = await front.store.read_events(r.session_id, types=["input.requested"])
        (raw,) = [q for e in log if e.type == "input.requested" for q in e.data["requests"]]
        req = so.InputRequest.model_validate(raw)
        assert req.expires_at is not None
        assert time.time() >= req.expires_at
        assert runs == []  # denied by the deadline: the tool never ran
        stored = await front.store.get_request(req.id)
        assert stored is not None and stored.status == "expired"
        assert await front.pending(session_id=r.session_id) == []


async def test_stop_lets_a_running_turn_finish_and_releases_its_lease(store_url: str) -> None:
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.never(), delay=0.4)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=30.0) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        stop = asyncio.Event()
        task = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        await until(lambda: asyncio.sleep(0, bool(runs)))  # the tool body is running
        stop.set()
        await asyncio.wait_for(task, 10)  # returns once the turn in flight is over
        assert await is_(front, r.session_id, "completed")
        assert runs == [f"{r.session_id}:1:call_refund"]
        # Released, not left to expire: another owner gets the lease at once.
        assert await front.store.acquire_lease(r.session_id, "next", 30, time.time()) is not None
        other = await front.generate(prompt="Refund order 7", agent="support")
        await asyncio.sleep(0.2)
        assert await is_(front, other.session_id, "running")  # a stopped worker claims nothing


async def test_work_refuses_a_concurrency_below_one(store_url: str) -> None:
    async with so.Runtime([refund_agent([])], store=store_url, inline=False) as rt:
        with pytest.raises(so.UsageError, match="concurrency"):
            await rt.work(concurrency=0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"concurrency": -3}, "concurrency"),
        ({"concurrency": 2.5}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"idle_wait": 0}, "idle_wait"),  # a claim loop that never sleeps
        ({"idle_wait": -1.0}, "idle_wait"),
        ({"sweep_every": 0}, "sweep_every"),  # a full deadline sweep on every round
        ({"sweep_every": float("nan")}, "sweep_every"),
        ({"stop": True}, "^stop must be an asyncio.Event"),  # was an AttributeError, `is_set`
        ({"stop": threading.Event()}, "^stop must be an asyncio.Event"),  # would block the loop
    ],
)
async def test_work_refuses_settings_that_would_spin(
    tmp_path: Path, kwargs: dict[str, Any], name: str
) -> None:
    async with so.Runtime([refund_agent([])], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        with pytest.raises(so.UsageError, match=name):
            await asyncio.wait_for(rt.work(**kwargs), 2)


@pytest.mark.parametrize("ttl", [0, -5.0, float("inf"), float("nan"), "30"])
def test_a_runtime_refuses_a_lease_ttl_that_is_not_a_positive_duration(ttl: Any) -> None:
    """A lease of 0 s (or less) is expired as it is granted, so every worker could claim the
    same session at once; an infinite one never lets a dead worker's sessions be resumed."""
    with pytest.raises(so.UsageError, match="lease_ttl"):
        so.Runtime([refund_agent([])], store="sqlite:///:memory:", lease_ttl=ttl)
