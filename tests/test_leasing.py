"""A drive's lease lost while a tool body runs: the body is cancelled (or, run in a thread, its
result discarded), the losing process records nothing more, and the process that takes the
turn over runs the call again with the same idempotency key. A model call in progress is
cancelled the same way, and a subagent's drive stopped with it gives the child's lease back.
Run on both stores."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

import signoff as so
from signoff import _leasing
from signoff.stores import Store
from signoff.testing import ManualClock

ORDER = {"order_id": "1042", "amount": 180.0}


def refund_agent(tool: so.Tool) -> so.Agent:
    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )
    steps = [call, so.ModelResponse(text="Done.")]
    return so.Agent(name="support", model=so.models.Scripted(steps), tools=[tool])


class SlowRefund:
    """A tool whose first run awaits a long sleep (noting how many of `renewals` were made when
    it is cancelled) and whose later runs return at once; every run logs its idempotency key."""

    def __init__(self) -> None:
        self.renewals: list[int] = []
        self.runs: list[str] = []
        self.cancelled = asyncio.Event()
        self.renewals_at_cancel: int | None = None
        runs, cancelled = self.runs, self.cancelled

        @so.tool(approval=so.never())
        async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
            """Refund an order."""
            runs.append(ctx.idempotency_key())
            if len(runs) == 1:
                try:
                    await asyncio.sleep(600)
                except asyncio.CancelledError:
                    self.renewals_at_cancel = len(self.renewals)
                    cancelled.set()
                    raise
            return {"refunded": amount}

        self.tool = issue_refund


def counting_renewals(store: Store, failing: Callable[[], bool] = lambda: False) -> list[int]:
    """Count `store`'s lease renewals (one entry each, as it starts); each fails (the store
    unreachable) while `failing()` says so."""
    renew = store.renew_lease
    made: list[int] = []

    async def counted(*args: Any) -> bool:
        made.append(1)
        if failing():
            raise so.StoreError("renewing the lease: connection lost (test)")
        return await renew(*args)

    store.renew_lease = counted  # type: ignore[method-assign,assignment]
    return made


async def take_over(store: Store, session_id: str) -> None:
    """Another process takes the session's lease over, as it may once the lease lapsed, then
    gives it back for a worker to claim."""
    server_time = getattr(store, "server_time", None)
    now = time.time() if server_time is None else await server_time()
    token = await store.acquire_lease(session_id, "elsewhere", 1.0, now + 3600)
    assert token is not None
    await store.release_lease(session_id, "elsewhere", token)


async def until(check: Callable[[], Awaitable[bool]] | Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while True:
        got = check()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def event_types(rt: so.Runtime, session_id: str) -> list[str]:
    return [e.type async for e in rt.events(session_id, follow=False)]


@contextlib.asynccontextmanager
async def working(rt: so.Runtime) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(rt.work(stop=stop, idle_wait=0.05))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def finished_by_a_worker(
    store_url: str, tool: so.Tool | so.Agent, session_id: str
) -> list[str]:
    """Let a worker (of `tool`'s refund agent, or of the agent given) take the turn over and
    finish it; the session's event types after."""
    agent = tool if isinstance(tool, so.Agent) else refund_agent(tool)
    async with so.Runtime([agent], store=store_url, inline=False) as worker:
        async with working(worker):

            async def completed() -> bool:
                turn = (await worker.state(session_id)).turn
                return turn is not None and turn.status == "completed"

            await until(completed)
        return await event_types(worker, session_id)


def once_each(types: list[str]) -> bool:
    return all(types.count(t) == 1 for t in ("tool.started", "tool.completed", "turn.completed"))


async def test_a_lease_taken_over_cancels_the_tool_body_running_under_it(store_url: str) -> None:
    """The first renewal that finds the lease taken over cancels the body, which sees
    `CancelledError`; the drive ends recording nothing, and the worker that takes the turn over
    runs the call once more, with the same key."""
    slow = SlowRefund()
    async with so.Runtime([refund_agent(slow.tool)], store=store_url, lease_ttl=0.3) as rt:
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

    async with so.Runtime([refund_agent(issue_refund)], store=store_url, lease_ttl=0.3) as rt:
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


class SlowModel:
    """A model whose first call awaits a long sleep (noting how many of `renewals` were made
    when it is cancelled; with `stubborn`, it answers instead of stopping) and whose later
    calls answer at once."""

    def __init__(self, *, stubborn: bool = False) -> None:
        self.calls = 0
        self.stubborn = stubborn
        self.renewals: list[int] = []
        self.cancelled = asyncio.Event()
        self.renewals_at_cancel: int | None = None

    async def complete(self, request: so.models.ModelRequest) -> so.ModelResponse:
        self.calls += 1
        if self.calls == 1:
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                self.renewals_at_cancel = len(self.renewals)
                self.cancelled.set()
                if not self.stubborn:
                    raise
                return so.ModelResponse(text="Answered anyway.")
        return so.ModelResponse(text="Done.")


async def test_a_lease_taken_over_cancels_the_model_call_running_under_it(
    store_url: str,
) -> None:
    """The first renewal that finds the lease taken over cancels the model call, whose response
    could not be recorded: the drive ends recording nothing, and the worker that takes the turn
    over calls the model again and finishes the turn."""
    slow = SlowModel()
    agent = so.Agent(name="support", model=slow)
    async with so.Runtime([agent], store=store_url, lease_ttl=0.3) as rt:
        slow.renewals = counting_renewals(rt.store)
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: slow.calls == 1)
        before = await event_types(rt, sid)
        await take_over(rt.store, sid)
        made = len(slow.renewals)
        result = await asyncio.wait_for(drive, 10)
        assert slow.cancelled.is_set() and slow.renewals_at_cancel is not None
        assert slow.renewals_at_cancel - made <= 1  # the first renewal after found it lost
        assert result.status == "running"
        assert await event_types(rt, sid) == before and before[-1] == "turn.started"
    types = await finished_by_a_worker(store_url, agent, sid)
    assert slow.calls == 2
    assert types.count("model.completed") == 1 and types.count("turn.completed") == 1
    assert "turn.failed" not in types


async def test_a_model_that_answers_after_its_lease_is_lost_has_its_answer_discarded(
    store_url: str,
) -> None:
    """A model call that ignores the cancel and answers all the same: the answer is recorded
    nowhere, and the drive ends as one whose lease was lost."""
    slow = SlowModel(stubborn=True)
    agent = so.Agent(name="support", model=slow)
    async with so.Runtime([agent], store=store_url, lease_ttl=0.3) as rt:
        slow.renewals = counting_renewals(rt.store)
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: slow.calls == 1)
        before = await event_types(rt, sid)
        await take_over(rt.store, sid)
        made = len(slow.renewals)
        result = await asyncio.wait_for(drive, 10)
        assert slow.renewals_at_cancel is not None and slow.renewals_at_cancel - made <= 1
        assert result.status == "running"
        assert await event_types(rt, sid) == before
    types = await finished_by_a_worker(store_url, agent, sid)
    assert types.count("model.completed") == 1
    texts = [e.data.get("text") for e in await _events(store_url, agent, sid)]
    assert "Answered anyway." not in texts and "Done." in texts


async def _events(store_url: str, agent: so.Agent, session_id: str) -> list[so.Event]:
    async with so.Runtime([agent], store=store_url) as rt:
        return [e async for e in rt.events(session_id, follow=False)]


async def test_a_subagent_stopped_by_its_parents_lost_lease_gives_the_childs_lease_back(
    store_url: str,
) -> None:
    """The parent's lease is lost while its delegate call drives the child: the call is
    cancelled, the child's model call with it, and the child's lease is given back at once
    rather than held until it lapses (the lease clock here stands still: it never would)."""
    clock = ManualClock(time.time())
    slow = SlowModel()
    child = so.Agent(name="billing", model=slow)
    call = so.ToolCall(id="call_1", name="billing", input={"message": "Refund order 1042"})
    parent = so.Agent(
        name="support",
        model=so.models.Scripted([so.ModelResponse(tool_calls=[call]), so.ModelResponse()]),
        tools=[so.delegate("billing")],
    )
    async with so.Runtime([parent, child], store=store_url, lease_ttl=0.3, clock=clock) as rt:
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: slow.calls == 1)
        before = await event_types(rt, sid)
        await take_over(rt.store, sid)
        result = await asyncio.wait_for(drive, 10)
        assert slow.cancelled.is_set() and result.status == "running"
        assert await event_types(rt, sid) == before and before[-1] == "tool.step"  # its child
        (kid,) = await rt.store.sessions(agent="billing")
        token = await rt.store.acquire_lease(kid.id, "probe", 60.0, rt.now())
        assert token is not None  # free: no lease of the cancelled drive left on it


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


def noting_expiry(store: Store) -> Callable[[], float]:
    """Note the expiry, by the lease clock, that `store` gives the runtime's leases as they are
    granted and renewed; the returned function gives the latest (the store keeps the latest)."""
    acquire, renew = store.acquire_lease, store.renew_lease
    expiries = [0.0]

    async def acquired(session_id: str, owner: str, ttl: float, now: float) -> int | None:
        token = await acquire(session_id, owner, ttl, now)
        if token is not None and owner != "elsewhere":
            expiries.append(now + ttl)
        return token

    async def renewed(session_id: str, owner: str, token: int, ttl: float, now: float) -> bool:
        live = await renew(session_id, owner, token, ttl, now)
        if live:
            expiries.append(now + ttl)
        return live

    store.acquire_lease = acquired  # type: ignore[method-assign]
    store.renew_lease = renewed  # type: ignore[method-assign]
    return lambda: max(expiries)


async def store_now(store: Store) -> float:
    """The time by the store's clock, as another process claiming a lease reads it."""
    server_time = getattr(store, "server_time", None)
    return time.time() if server_time is None else float(await server_time())


async def claimed_once_lapsed(store: Store, expiry: Callable[[], float]) -> float:
    """Claim the session as another worker does, as soon as the store's clock passes the
    lease's expiry (never before, whether or not the drive gave its lease back); the claim is
    given back at once. The store's time of the claim."""
    while True:
        now = await store_now(store)
        if now > expiry():
            got = await store.claim("elsewhere", 30.0, now, 10)
            if got:
                ((session_id, token),) = got
                await store.release_lease(session_id, "elsewhere", token)
                return now
        await asyncio.sleep(0.002)


@pytest.mark.parametrize("renewals", ["failing", "hanging"])
async def test_a_body_whose_renewals_do_not_get_through_stops_before_its_lease_lapses(
    store_url: str, renewals: str
) -> None:
    """Renewals that fail (the store unreachable) or hang (a connection gone silent) leave the
    body running only until a margin before the lease's expiry: it is cancelled before then, by
    the lease clock, so a worker that claims the session the moment the lease lapses never runs
    the call while this process still does."""
    ttl = 2.0  # a margin of 0.2 s: more than any scheduling delay of the event loop
    seen: list[tuple[str, float]] = []
    runs: list[str] = []
    lease_now: Callable[[], float] = time.time

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        if len(runs) == 1:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                seen.append(("cancelled", lease_now()))
                raise
        return {"refunded": amount}

    async with so.Runtime([refund_agent(issue_refund)], store=store_url, lease_ttl=ttl) as rt:
        lease_now = rt.now
        expiry = noting_expiry(rt.store)
        renew = rt.store.renew_lease
        silent = asyncio.Event()  # never set

        async def unreachable(*args: Any) -> bool:
            if runs:
                if renewals == "failing":
                    raise so.StoreError("renewing the lease: connection lost (test)")
                await silent.wait()
            return await renew(*args)

        rt.store.renew_lease = unreachable  # type: ignore[method-assign,assignment]
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: bool(runs))
        before = await event_types(rt, sid)
        claim = asyncio.create_task(claimed_once_lapsed(rt.store, expiry))
        seen.append(("claimed", await asyncio.wait_for(claim, 10)))
        result = await asyncio.wait_for(drive, 10)
        assert [what for what, _ in seen] == ["cancelled", "claimed"]
        assert seen[0][1] < expiry()  # cancelled while the lease was still live
        assert result.status == "running"
        assert await event_types(rt, sid) == before and before[-1] == "tool.started"
    types = await finished_by_a_worker(store_url, issue_refund, sid)
    assert runs == [f"{sid}:1:call_refund"] * 2
    assert once_each(types)


async def test_a_sync_body_whose_renewals_fail_is_left_before_its_lease_lapses(
    store_url: str,
) -> None:
    """A body run in a thread cannot be stopped: with renewals failing, its drive ends before
    the lease's expiry all the same, giving the lease back, and what the body returns once it
    finishes is recorded nowhere."""
    ttl = 2.0
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

    async with so.Runtime([refund_agent(issue_refund)], store=store_url, lease_ttl=ttl) as rt:
        expiry = noting_expiry(rt.store)
        counting_renewals(rt.store, failing=lambda: bool(runs))
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        try:
            await until(lambda: bool(runs))
            before = await event_types(rt, sid)
            result = await asyncio.wait_for(drive, 10)
            assert rt.now() < expiry()  # left while the lease was still live
            assert result.status == "running" and not returned.is_set()
            assert not await rt._busy(sid)  # given back: another worker may take it over
        finally:
            go_on.set()
        await until(returned.is_set)
        assert await event_types(rt, sid) == before and before[-1] == "tool.started"
    types = await finished_by_a_worker(store_url, issue_refund, sid)
    assert runs == [f"{sid}:1:call_refund"] * 2
    assert once_each(types)


async def test_a_body_running_many_times_the_ttl_keeps_its_lease_while_renewals_succeed(
    store_url: str,
) -> None:
    """Renewals every third of the TTL keep the lease far from the margin before its expiry:
    a body that runs for several TTLs is never stopped, and its call completes once."""
    runs: list[str] = []

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        await asyncio.sleep(1.5)  # five TTLs
        return {"refunded": amount}

    async with so.Runtime([refund_agent(issue_refund)], store=store_url, lease_ttl=0.3) as rt:
        made = counting_renewals(rt.store)
        sid = await rt.create_session("support")
        result = await asyncio.wait_for(rt.generate("support", "Refund", session_id=sid), 10)
        assert result.status == "completed" and len(made) >= 3
        assert once_each(await event_types(rt, sid))
    assert runs == [f"{sid}:1:call_refund"]


async def test_a_renewal_cut_just_before_the_deadline_is_tried_again_in_time(
    store_url: str,
) -> None:
    """A renewal that fails with little time left before the deadline (on PostgreSQL, one that
    hung until `operation_timeout` cut it, with a TTL above that timeout) is tried again before
    the deadline, not given up untried: the store answering again by then keeps the lease, and
    the body runs on to complete once."""
    ttl = 3.0
    skew = [0.0]
    runs: list[str] = []
    renewed_after_the_cut = asyncio.Event()

    def clock() -> float:
        return time.time() + skew[0]

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        await renewed_after_the_cut.wait()
        return {"refunded": amount}

    agent = refund_agent(issue_refund)
    async with so.Runtime([agent], store=store_url, lease_ttl=ttl, clock=clock) as rt:
        expiry = noting_expiry(rt.store)
        renew = rt.store.renew_lease
        cuts: list[float] = []

        async def cut_once(*args: Any) -> bool:
            if runs and not cuts:
                # It hung until the timeout cut it: a quarter second is left before the
                # deadline (a tenth of the TTL before the expiry), less than the TTL's tenth.
                cuts.append(1.0)
                skew[0] += expiry() - ttl / 10 - 0.25 - rt.now()
                raise so.StoreError("renewing the lease: the operation timed out (test)")
            live = await renew(*args)
            if cuts and live:
                renewed_after_the_cut.set()
            return live

        rt.store.renew_lease = cut_once  # type: ignore[method-assign,assignment]
        sid = await rt.create_session("support")
        result = await asyncio.wait_for(rt.generate("support", "Refund", session_id=sid), 10)
        assert cuts and renewed_after_the_cut.is_set()
        assert result.status == "completed"
        assert once_each(await event_types(rt, sid))
    assert runs == [f"{sid}:1:call_refund"]


@pytest.mark.parametrize("renewed_by", ["confirming", "renewals"])
async def test_a_slow_renewal_keeps_the_lease_known_live_from_when_it_was_sent(
    store_url: str, renewed_by: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renewal renews the lease from when it was sent, however late its answer: the lease is
    known live from then. So a drive about to run a tool body renews it first once half the
    TTL has passed since the renewal was sent, not since it answered: after a slow renewal and
    a stall of the process, the lease may have lapsed and another worker run the call."""
    ttl = 0.3
    monotonic = [1000.0]
    monkeypatch.setattr(_leasing, "_AWAKE", lambda: monotonic[0])  # the clock leases count by
    async with so.Runtime([refund_agent(SlowRefund().tool)], store=store_url, lease_ttl=ttl) as rt:
        sid = await rt.create_session("support")
        owner = "test-owner"
        token = await rt.store.acquire_lease(sid, owner, ttl, rt.now())
        assert token is not None
        held = _leasing.Held(monotonic[0] - 0.6 * ttl, rt.now() + ttl)
        renew = rt.store.renew_lease
        made: list[int] = []
        go_on = asyncio.Event()
        go_on.set()

        async def slow(*args: Any) -> bool:
            made.append(1)
            live = await renew(*args)
            monotonic[0] += 0.45 * ttl  # answered long after it was sent
            go_on.clear()  # the renewals stop after this one
            return live

        rt.store.renew_lease = slow  # type: ignore[method-assign,assignment]
        if renewed_by == "confirming":
            await rt._confirm(sid, owner, token, held)
        else:
            await asyncio.wait_for(rt._renew(sid, owner, token, go_on, held), 10)
        assert made == [1] and not held.lost
        monotonic[0] += 0.1 * ttl  # a stall: 0.55 of the TTL since the renewal was sent
        await rt._confirm(sid, owner, token, held)
        assert made == [1, 1]
