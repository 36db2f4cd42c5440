"""Workers that cannot drive a session, race each other's sweeps, stall while holding a lease,
miss an announced change or disagree on the time: each turn runs once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

import signoff as so
from signoff.stores import Commit

from ._workers import (
    ORDER,
    is_,
    refund_agent,
    until,
    working,
)


async def test_a_worker_leaves_sessions_of_agents_it_does_not_have(store_url: str) -> None:
    """A worker claims only sessions of its own agents (as in a rolling deploy, or workers
    split by agent), so those wait for a worker that can drive them rather than its lease."""
    other = so.Agent(name="other", model=so.models.Scripted([so.ModelResponse(text="x")]))
    async with (
        so.Runtime([refund_agent([])], store=store_url, inline=False) as front,
        so.Runtime([other], store=store_url, inline=False) as stranger,
        so.Runtime([refund_agent([])], store=store_url, inline=False) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        head = await front.store.head(r.session_id)
        async with working(stranger):
            await asyncio.sleep(0.5)
            assert await front.store.head(r.session_id) == head  # untouched
            token = await front.store.acquire_lease(r.session_id, "probe", 10, time.time())
            assert token is not None  # and not leased by the stranger
            await front.store.release_lease(r.session_id, "probe", token)
            async with working(worker):
                await until(lambda: is_(front, r.session_id, "waiting"))


async def test_a_session_a_worker_cannot_drive_is_retried_per_lease_not_in_a_loop(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A drive that fails every time (here: a bug in it) keeps its lease until it lapses;
    released at once, it was claimed again at once, hundreds of times a second on PostgreSQL,
    whose release wakes every worker."""
    async with (
        so.Runtime([refund_agent([])], store=store_url, inline=False) as front,
        so.Runtime([refund_agent([])], store=store_url, inline=False, lease_ttl=3.0) as worker,
    ):

        async def broken(session_id: str, **kwargs: Any) -> so.GenerateResult:
            raise RuntimeError("a bug in the drive (test)")

        worker._drive = broken  # type: ignore[method-assign]
        r = await front.generate("support", prompt="Refund order 1042")
        claimed = f"claimed session {r.session_id}"
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(worker):
                async with asyncio.timeout(10):  # claimed once, however busy the machine
                    while claimed not in caplog.text:
                        await asyncio.sleep(0.02)
                await asyncio.sleep(1.0)  # and not again meanwhile (a third of the TTL)
        assert caplog.text.count(claimed) == 1
        assert "retried once its lease expires" in caplog.text
        assert await front.store.claim("other", 10, time.time(), 10) == []  # still leased


@pytest.mark.parametrize("on_timeout", ["deny", "approve"])
async def test_sweeps_racing_in_two_workers_expire_a_request_once(
    store_url: str, on_timeout: str
) -> None:
    """Workers sweep deadlines independently: six sweeps at once over two runtimes record one
    expiry (and, with on_timeout='approve', one settlement and one tool run)."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.always(expires_in=0.2, on_timeout=on_timeout))  # type: ignore[arg-type]
    async with (
        so.Runtime([agent], store=store_url) as front,
        so.Runtime([agent], store=store_url) as a,
        so.Runtime([agent], store=store_url) as b,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        assert r.status == "waiting"
        await asyncio.sleep(0.3)
        await asyncio.gather(*(rt.expire_due() for rt in (a, b, a, b, a, b)))
        await until(lambda: is_(front, r.session_id, "completed"))
        types = [e.type async for e in front.events(r.session_id, follow=False)]
        assert types.count("input.resolved") == 1
        assert types.count("approval.settled") == (1 if on_timeout == "approve" else 0)
        assert len(runs) == (1 if on_timeout == "approve" else 0)
        assert types.count("turn.completed") == 1


async def test_a_stalled_holder_is_fenced_and_its_caller_told_the_turn_moved_on(
    store_url: str,
) -> None:
    """A drive whose lease lapsed while it stalled (here: in a tool body, its renewals not
    getting through) and was taken over by a worker writes nothing after: the worker's run
    is the one recorded, and the stalled caller gets the session's state, not `LeaseLost`."""
    runs: list[str] = []
    gate = asyncio.Event()

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        if len(runs) == 1:
            await gate.wait()  # the first holder stalls here
        return {"refunded": amount}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )

    def agent() -> so.Agent:
        steps = [call, so.ModelResponse(text="Done.")]
        return so.Agent(name="support", model=so.models.Scripted(steps), tools=[issue_refund])

    async with (
        so.Runtime([agent()], store=store_url, lease_ttl=0.4) as stalled,
        so.Runtime([agent()], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):

        async def no_renewal(*args: Any) -> bool:
            return True  # the renewals of a stalled process never reach the store

        stalled.store.renew_lease = no_renewal  # type: ignore[method-assign,assignment]
        sid = await stalled.create_session("support")
        first = asyncio.create_task(stalled.generate("support", "Refund", session_id=sid))
        await until(lambda: asyncio.sleep(0, bool(runs)))
        async with working(worker):
            await until(lambda: is_(worker, sid, "completed"))
        gate.set()
        result = await asyncio.wait_for(first, 10)
        assert result.status == "completed" and result.text == "Done."
        assert runs == [f"{sid}:1:call_refund"] * 2  # ran again, with the same key
        types = [e.type async for e in worker.events(sid, follow=False)]
        assert types.count("tool.completed") == 1 and types.count("turn.completed") == 1


async def test_a_holder_that_stalled_before_a_tool_body_does_not_run_it_once_taken_over(
    store_url: str,
) -> None:
    """A drive that stalls (a paused process: no renewal gets through) right after recording
    `tool.started` and resumes once a worker has taken the turn over and run the call must not
    run the tool body again: its lease is checked before the body, not only at its next write."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.never())
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=0.4) as stalled,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        paused, resumed = asyncio.Event(), asyncio.Event()
        commit, renew = stalled.store.commit, stalled.store.renew_lease

        async def stalling_commit(c: Commit) -> None:
            await commit(c)
            if any(e.type == "tool.started" for e in c.events):
                paused.set()
                await resumed.wait()  # paused right after the commit, before the body

        async def paused_renewal(*args: Any) -> bool:
            await resumed.wait()  # nothing runs while paused
            return await renew(*args)

        stalled.store.commit = stalling_commit  # type: ignore[method-assign,assignment]
        stalled.store.renew_lease = paused_renewal  # type: ignore[method-assign,assignment]
        sid = await stalled.create_session("support")
        first = asyncio.create_task(stalled.generate("support", "Refund", session_id=sid))
        await asyncio.wait_for(paused.wait(), 10)
        await asyncio.sleep(0.6)  # past the stalled drive's TTL
        async with working(worker):
            await until(lambda: is_(worker, sid, "completed"))
        resumed.set()
        result = await asyncio.wait_for(first, 10)
        assert result.status == "completed" and result.text == "Done."
        assert runs == [f"{sid}:1:call_refund"]  # by the worker only
        types = [e.type async for e in worker.events(sid, follow=False)]
        assert types.count("tool.started") == 1 and types.count("tool.completed") == 1


async def test_a_change_announced_while_a_worker_claims_is_not_missed(store_url: str) -> None:
    """A commit announced while an idle worker is busy claiming (or sweeping) wakes it as soon
    as it goes back to waiting, not only when its `idle_wait` poll comes round (on SQLite, a
    commit made to the file while it claimed)."""
    agent = refund_agent([])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=5.0) as worker,
    ):
        claim = worker.store.claim
        late: list[str] = []

        async def claim_then_commit(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            found = await claim(*args, **kwargs)
            # A session becomes runnable just after the claim looked: at the first claim (the
            # listener is not subscribed yet), and once more when the first one has parked.
            if not late or (len(late) == 1 and await is_(front, late[0], "waiting")):
                late.append((await front.generate("support", prompt="Refund")).session_id)
                await asyncio.sleep(0.1)  # its NOTIFY arrives before the worker waits again
            return found

        worker.store.claim = claim_then_commit  # type: ignore[method-assign]
        stop = asyncio.Event()
        # Its poll comes round every 30 s: a missed change fails a 10 s wait by far, and a
        # busy machine's drive keeps 10 s.
        task = asyncio.create_task(worker.work(stop=stop, idle_wait=30.0, sweep_every=60))
        try:
            await until(lambda: asyncio.sleep(0, bool(late)))
            await until(lambda: is_(front, late[0], "waiting"), timeout=10.0)
            await until(lambda: asyncio.sleep(0, len(late) == 2), timeout=10.0)
            await until(lambda: is_(front, late[1], "waiting"), timeout=10.0)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("skewed", ["ahead", "behind"])
async def test_workers_whose_clocks_differ_keep_each_others_leases(
    pg_store_url: str, skewed: str
) -> None:
    """Leases on PostgreSQL are timed by the database's clock, not each machine's: a worker
    whose clock runs two minutes ahead must not take a live lease as lapsed, nor one whose
    clock runs behind grant leases that others take as lapsed (either ran the tool twice)."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.never(), delay=1.0)
    shift = 120.0 if skewed == "ahead" else -120.0

    def off() -> float:
        return time.time() + shift

    async with (
        so.Runtime([agent], store=pg_store_url, inline=False) as front,
        so.Runtime([agent], store=pg_store_url, inline=False, lease_ttl=2.0) as right,
        so.Runtime([agent], store=pg_store_url, inline=False, lease_ttl=2.0) as wrong,
    ):
        # Its machine's wall clock is off. (A clock given as `Runtime(clock=...)` is taken as
        # every process's: tests move time with one.)
        wrong.clock = off
        # The one behind claims first (its lease is the one others misread); the one ahead
        # second (it misreads the other's lease).
        first, second = (right, wrong) if skewed == "ahead" else (wrong, right)
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(first):
            await until(lambda: asyncio.sleep(0, bool(runs)))  # its tool body is running
            async with working(second):
                await until(lambda: is_(front, r.session_id, "completed"))
        assert runs == [f"{r.session_id}:1:call_refund"]
