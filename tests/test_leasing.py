"""A drive's lease lost while a tool body runs: the body is cancelled (or, run in a thread, its
result discarded), the losing process records nothing more, and the process that takes the
turn over runs the call again with the same idempotency key. Run on both stores. A model call
in progress and a subagent's drive: test_leasing_models.py; renewals: test_leasing_renewals.py.
A call that gave up waiting for another drive's lease reports the turn as it then reads it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest

import signoff as so
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._leasing import (
    ORDER,
    SlowRefund,
    counting_renewals,
    event_types,
    finished_by_a_worker,
    once_each,
    refund_agent,
    take_over,
    until,
)
from ._procs import query
from .test_store_edited_rows import edit


async def test_a_lease_taken_over_cancels_the_tool_body_running_under_it(store_url: str) -> None:
    """The first renewal that finds the lease taken over cancels the body, which sees
    `CancelledError`; the drive ends recording nothing, and the worker that takes the turn over
    runs the call once more, with the same key."""
    slow = SlowRefund()
    async with so.Runtime([refund_agent(slow.tool)], store=store_url, lease_ttl=3.0) as rt:
        slow.renewals = counting_renewals(rt.store)
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: bool(slow.runs))
        before = await event_types(rt, sid)
        await take_over(rt.store, sid)
        made = len(slow.renewals)
        result = await asyncio.wait_for(drive, 10)
        assert slow.cancelled.is_set() and slow.renewals_at_cancel is not None
        assert slow.renewals_at_cancel - made <= 1  # the first renewal after found it lost
        assert result.status == "running"  # the turn goes on elsewhere
        assert await event_types(rt, sid) == before  # nothing recorded after the loss
        assert before[-1] == "tool.started"
    types = await finished_by_a_worker(store_url, slow.tool, sid)
    assert slow.runs == [f"{sid}:1:call_refund"] * 2
    assert once_each(types)


async def test_a_lease_that_lapses_unrenewed_cancels_the_tool_body_only_then(
    store_url: str,
) -> None:
    """Renewals that fail (the store unreachable) leave the body running while the lease may
    still be live; once its expiry passes with none getting through, this process cannot claim
    it any more: the body is cancelled at the next attempt and nothing more is recorded."""
    clock = ManualClock(time.time())  # the lease lapses only when the test says
    slow = SlowRefund()
    agent = refund_agent(slow.tool)
    async with so.Runtime([agent], store=store_url, lease_ttl=0.3, clock=clock) as rt:
        slow.renewals = counting_renewals(rt.store, failing=lambda: bool(slow.runs))
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: bool(slow.runs))
        before = await event_types(rt, sid)
        failed = len(slow.renewals)
        await until(lambda: len(slow.renewals) >= failed + 3)  # they fail, and are retried
        assert not slow.cancelled.is_set() and not drive.done()
        clock.advance(1.0)  # past the lease's expiry
        made = len(slow.renewals)
        result = await asyncio.wait_for(drive, 10)
        assert slow.cancelled.is_set() and slow.renewals_at_cancel is not None
        assert slow.renewals_at_cancel - made <= 1
        assert result.status == "running"
        assert await event_types(rt, sid) == before and before[-1] == "tool.started"
    types = await finished_by_a_worker(store_url, slow.tool, sid)
    assert slow.runs == [f"{sid}:1:call_refund"] * 2
    assert once_each(types)


async def test_a_sync_tool_whose_lease_is_lost_has_its_result_discarded(store_url: str) -> None:
    """A body run in a thread cannot be cancelled: the drive ends at once all the same, and
    what the body returns once it finishes is recorded nowhere."""
    runs: list[str] = []
    go_on, returned = threading.Event(), threading.Event()

    @so.tool(approval=so.never())
    def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        if len(runs) == 1:
            go_on.wait(30)
            returned.set()
        return {"refunded": amount}

    async with so.Runtime([refund_agent(issue_refund)], store=store_url, lease_ttl=3.0) as rt:
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: bool(runs))
        before = await event_types(rt, sid)
        await take_over(rt.store, sid)
        try:
            result = await asyncio.wait_for(drive, 10)
            assert result.status == "running" and not returned.is_set()
        finally:
            go_on.set()
        await until(returned.is_set)
        assert await event_types(rt, sid) == before and before[-1] == "tool.started"
    types = await finished_by_a_worker(store_url, issue_refund, sid)
    assert runs == [f"{sid}:1:call_refund"] * 2
    assert once_each(types)


async def test_a_renewal_that_hangs_past_the_expiry_is_given_up_and_the_body_cancelled(
    store_url: str,
) -> None:
    """A renewal that never answers (a connection gone silent) is given up when the lease's
    expiry comes, not awaited for ever: it is retried while the lease may be live, and once the
    expiry has passed the body is cancelled."""
    clock = ManualClock(time.time())
    slow = SlowRefund()
    agent = refund_agent(slow.tool)
    async with so.Runtime([agent], store=store_url, lease_ttl=0.3, clock=clock) as rt:
        renew = rt.store.renew_lease
        silent = asyncio.Event()  # never set

        async def hanging(*args: Any) -> bool:
            slow.renewals.append(1)
            if slow.runs:
                await silent.wait()
            return await renew(*args)

        rt.store.renew_lease = hanging  # type: ignore[method-assign,assignment]
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: bool(slow.runs))
        before = await event_types(rt, sid)
        hung = len(slow.renewals)
        await until(lambda: len(slow.renewals) >= hung + 2)  # one given up, then tried again
        assert not slow.cancelled.is_set() and not drive.done()
        clock.advance(1.0)
        result = await asyncio.wait_for(drive, 10)
        assert slow.cancelled.is_set() and result.status == "running"
        assert await event_types(rt, sid) == before and before[-1] == "tool.started"
    types = await finished_by_a_worker(store_url, slow.tool, sid)
    assert slow.runs == [f"{sid}:1:call_refund"] * 2
    assert once_each(types)


async def test_a_given_up_renewal_slow_to_stop_does_not_delay_the_bodys_cancel(
    store_url: str,
) -> None:
    """A hanging renewal that, once given up, takes a while to stop (psycopg, cancelled, asks
    the server to cancel the query and waits for that, up to 5 s twice on a connection gone
    silent) does not hold the lease's loss back: the body is cancelled when the expiry passes,
    while that renewal is still stopping, not after."""
    clock = ManualClock(time.time())
    slow = SlowRefund()
    agent = refund_agent(slow.tool)
    stopping = asyncio.Event()  # lets the given-up renewal end; set once the body is cancelled
    async with so.Runtime([agent], store=store_url, lease_ttl=0.3, clock=clock) as rt:
        renew = rt.store.renew_lease
        silent = asyncio.Event()  # never set
        given_up: list[int] = []

        async def hanging(*args: Any) -> bool:
            slow.renewals.append(1)
            if slow.runs:
                try:
                    await silent.wait()
                except asyncio.CancelledError:
                    given_up.append(1)
                    await stopping.wait()
                    raise
            return await renew(*args)

        rt.store.renew_lease = hanging  # type: ignore[method-assign,assignment]
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        try:
            await until(lambda: bool(slow.runs))
            before = await event_types(rt, sid)
            await until(lambda: bool(given_up))
            assert not slow.cancelled.is_set() and not drive.done()
            clock.advance(1.0)
            await until(slow.cancelled.is_set)
            assert not stopping.is_set() and len(given_up) >= 1
        finally:
            stopping.set()
        result = await asyncio.wait_for(drive, 10)
        assert result.status == "running"
        assert await event_types(rt, sid) == before and before[-1] == "tool.started"
    types = await finished_by_a_worker(store_url, slow.tool, sid)
    assert slow.runs == [f"{sid}:1:call_refund"] * 2
    assert once_each(types)


class _Lapsed(logging.Handler):
    """Notes when a drive's renewals give its lease up as lapsed (`held.lose()` follows at once)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = False

    def emit(self, record: logging.LogRecord) -> None:
        if "about to lapse, no renewal getting through" in record.getMessage():
            self.seen = True


async def test_a_lease_lost_while_confirming_it_before_the_body_runs_no_body(
    store_url: str,
) -> None:
    """A drive that stalled renews its lease before the tool body runs; if its background
    renewals give the lease up as lapsed while that renewal is on its way, the drive has lost
    it (it records nothing more), so the body must not run, even if that late renewal then
    gets through: its result would be discarded and the worker taking over would run it again."""
    clock = ManualClock(time.time())
    runs: list[str] = []
    failing = False

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        return {"refunded": amount}

    class Stalling:
        """Proposes the refund after a stall longer than half the lease (renewals failing
        meanwhile, so the drive no longer knows its lease live), then answers."""

        calls = 0

        async def complete(self, request: so.models.ModelRequest) -> so.ModelResponse:
            nonlocal failing
            self.calls += 1
            if self.calls > 1:
                return so.ModelResponse(text="Done.")
            failing = True
            await asyncio.sleep(0.3)
            call = so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))
            return so.ModelResponse(tool_calls=[call])

    agent = so.Agent(name="support", model=Stalling(), tools=[issue_refund])
    lapsed = _Lapsed()
    logging.getLogger("signoff.runtime").addHandler(lapsed)
    try:
        async with so.Runtime([agent], store=store_url, lease_ttl=0.3, clock=clock) as rt:
            renew = rt.store.renew_lease
            confirming: list[int] = []

            async def renewing(*args: Any) -> bool:
                if asyncio.current_task() is drive:  # the drive confirming before the body
                    confirming.append(1)
                    clock.advance(1.0)  # the lease's expiry passes while this is on its way
                    await until(lambda: lapsed.seen)
                    return await renew(*args)  # no one took it over: it gets through
                if failing:
                    raise so.StoreError("renewing the lease: connection lost (test)")
                return await renew(*args)

            rt.store.renew_lease = renewing  # type: ignore[method-assign,assignment]
            sid = await rt.create_session("support")
            drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
            result = await asyncio.wait_for(drive, 10)
            assert confirming and lapsed.seen
            assert runs == []  # the body never ran under the lost lease
            assert result.status == "running"
            types = await event_types(rt, sid)
            assert types[-1] == "tool.started"
    finally:
        logging.getLogger("signoff.runtime").removeHandler(lapsed)
    types = await finished_by_a_worker(store_url, agent, sid)
    assert runs == [f"{sid}:1:call_refund"]  # run once, by the worker that took over
    assert once_each(types)


async def test_a_cancel_made_in_another_process_sets_the_running_body_s_abort_signal(
    store_url: str,
) -> None:
    """A tool body waits on `ctx.abort_signal`, as a long task that stops with its turn does;
    another process (the server, say) cancels the turn. The drive's next lease renewal finds
    the turn cancelled and sets the signal, as a cancel made in the drive's own process does:
    the body stops at once. It used to run on until its own end, the signal never set."""
    entered = asyncio.Event()
    seen: list[bool] = []

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is cancelled."""
        entered.set()
        try:
            await asyncio.wait_for(ctx.abort_signal.wait(), timeout=8)
        except TimeoutError:
            pass
        seen.append(ctx.abort_signal.is_set())
        return "stopped"

    agent = so.Agent(
        name="bot",
        model=so.models.Scripted([so.ModelResponse(tool_calls=[so.ToolCall(name="crawl")])]),
        tools=[crawl],
    )
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=3.0) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0) as server,
    ):
        sid = await rt.create_session("bot")
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl"))
        await asyncio.wait_for(entered.wait(), timeout=10)
        started = time.monotonic()
        assert (await server.cancel(sid, "user left")).status == "cancelled"
        r = await asyncio.wait_for(drive, timeout=20)
        assert seen == [True]
        assert time.monotonic() - started < 4  # a renewal (every 1 s), not the body's 8 s
        assert r.status == "cancelled"
        assert "tool.completed" not in await event_types(rt, sid)


async def test_a_drive_whose_lease_row_was_deleted_records_nothing_under_the_reissued_token(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The lease row of a session a drive runs is deleted behind its back (by hand, a restore):
    the next grant starts the token again, and the process that gets it may be given the very
    token the drive holds. The drive, unaware, finishes its tool body: its commit is fenced on
    its owner as well as the token, so it records nothing and says it lost the lease. It used
    to record the tool's result, and the turn's end, beside the lease's new holder."""
    gate = asyncio.Event()
    started = asyncio.Event()

    @so.tool(approval=so.never())
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        started.set()
        await gate.wait()
        return {"refunded": amount}

    # A long TTL: no renewal comes by before the body ends, so its commit meets the fence.
    async with so.Runtime([refund_agent(issue_refund)], store=store_url, lease_ttl=60) as rt:
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await asyncio.wait_for(started.wait(), 10)
        where = "sk = (SELECT sk FROM {t}sessions WHERE id = {p})"
        [(held,)] = query(store_url, "SELECT token FROM {t}leases WHERE " + where, sid)
        edit(store_url, "DELETE FROM {t}leases WHERE " + where, sid)
        # Another process asks for the lease until it is given the drive's token.
        now = rt.now()
        while True:
            token = await rt.store.acquire_lease(sid, "restored", 60, now)
            assert token is not None and token <= held
            if token == held:
                break
            await rt.store.release_lease(sid, "restored", token)
        before = await event_types(rt, sid)
        with caplog.at_level(logging.WARNING, logger="signoff"):
            gate.set()
            result = await asyncio.wait_for(drive, 10)
        assert result.status == "running"  # the turn is the lease's holder's now
        assert await event_types(rt, sid) == before  # nothing recorded by the drive
        assert before[-1] == "tool.started"
        assert f"session {sid}: lease {held} lost" in caplog.text
        # The new holder's lease stands, and its token writes.
        assert await rt.store.renew_lease(sid, "restored", held, 60, now)


async def test_a_call_that_gave_up_waiting_for_the_lease_reports_the_turn_as_it_reads_it(
    store_url: str,
) -> None:
    """A resume waited `lease_wait` for the lease of another process's drive and gave up, and
    that turn came to wait on a question meanwhile: the call read the session after giving up
    and reported its turn, the question pending, yet said `running`, as if still driven."""
    gate, entered = asyncio.Event(), asyncio.Event()

    async def slow(conversation: list[so.Message]) -> so.ModelResponse:
        entered.set()
        await gate.wait()
        return call_tools(call("pick_plan", call_id="p1"))

    @so.tool
    async def pick_plan(ctx: so.ToolContext) -> str:
        """Choose a plan."""
        return str((await ctx.ask("Which plan?", options=["basic", "pro"])).value)

    agent = scripted_agent("sales", [slow, reply("Done.")], tools=[pick_plan])
    async with (
        so.Runtime([agent], store=store_url) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0.2) as other,
    ):
        sid = await rt.create_session("sales")
        first = asyncio.create_task(rt.generate(session_id=sid, prompt="upgrade me"))
        await asyncio.wait_for(entered.wait(), timeout=10)
        acquire = other._acquire

        async def acquiring(*args: Any, **kwargs: Any) -> int | None:
            got = await acquire(*args, **kwargs)  # gives up: the first drive holds the lease
            gate.set()
            await first  # ... whose turn comes to wait on the question meanwhile
            return got

        other._acquire = acquiring  # type: ignore[method-assign]
        told = await asyncio.wait_for(other.generate(session_id=sid), timeout=10)
        parked = await first
        assert parked.status == "waiting" and len(parked.pending) == 1
        assert (told.status, told.turn_id, told.pending) == (
            "waiting",
            parked.turn_id,
            parked.pending,
        )
