"""A subagent's spend is counted in its parent when the parent's turn ended before the delegate
call did (cancelled, its TTL passed): `subagent.spent` records it once the child's turn ended,
once per child, whichever process records it and however often it is tried, on both stores."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff import _child_sessions
from signoff.models import ModelRequest
from signoff.server import create_app
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._subagents import ALICE, events


def tokens(n: int) -> so.Usage:
    return so.Usage(input_tokens=n)


def orders(spent: so.Usage) -> so.Agent:
    """A child whose first reply (costing `spent`) asks for a refund's approval."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return scripted_agent(
        "orders",
        [call_tools(call("issue_refund", order_id="3"), usage=spent)],
        tools=[issue_refund],
        repeat_last=True,
    )


def support(**limits: Any) -> so.Agent:
    """A parent whose every model step (10 tokens) delegates a refund to `orders`."""
    return scripted_agent(
        "support",
        [call_tools(call("orders", message="refund 3"), usage=tokens(10))],
        tools=[so.delegate("orders")],
        limits=so.Limits(**limits),
        repeat_last=True,
    )


async def spent(rt: so.Runtime, session_id: str) -> list[dict[str, Any]]:
    """The `data` of each `subagent.spent` of the session."""
    return [e.data for e in await events(rt, session_id) if e.type == "subagent.spent"]


async def waiting_child(rt: so.Runtime, session_id: str | None = None) -> tuple[str, str]:
    """Start a turn of `support` (a new session, or `session_id`'s): its child waits on an
    approval. Returns the parent's and the child's session ids."""
    if session_id is None:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
    else:
        r = await rt.generate(session_id=session_id, prompt="refund 3", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    return r.session_id, mirror.child.session_id


async def test_cancelling_the_parent_counts_what_its_waiting_child_spent(store_url: str) -> None:
    """The child spent 40 tokens and waits; cancelling the parent cancels it, and the parent's
    `delegated` counts those 40 once, however often the cancel is repeated."""
    async with so.Runtime([support(), orders(tokens(40))], store=store_url) as rt:
        parent, child = await waiting_child(rt)
        assert (await rt.state(parent)).delegated == so.Usage()
        await rt.cancel(parent, principal=ALICE)
        kid = (await rt.state(child)).turn
        assert kid is not None and kid.status == "cancelled"
        assert (await rt.state(parent)).delegated == tokens(40)
        assert (await rt.state(parent)).usage == tokens(10)  # its own model calls only
        once = [{"session_id": child, "delegated": tokens(40).model_dump()}]
        assert await spent(rt, parent) == once
        await rt.cancel(parent, principal=ALICE)
        assert await spent(rt, parent) == once
    async with so.Runtime([support(), orders(tokens(40))], store=store_url) as rt2:
        assert (await rt2.state(parent)).delegated == tokens(40)  # folded again: the same


@pytest.mark.parametrize("ends", ["cancelled", "expired"])
async def test_a_child_left_to_its_process_is_counted_when_its_turn_ends_on_its_own(
    store_url: str, ends: str
) -> None:
    """The parent is cancelled by a process without the child's agent (the child is left to one
    that has it, and the parent owes its spend); the child's turn then ends on its own, cancelled
    or its TTL passed: the parent counts what it spent then. Before, nothing did until the
    parent's next cancel or drive, which a cancelled session rarely has."""
    clock = ManualClock()
    child_agent = orders(tokens(40))
    if ends == "expired":
        child_agent.limits = so.Limits(ttl=60)
    agents = [support(), child_agent]
    async with (
        so.Runtime(agents, store=store_url, clock=clock) as rt,
        so.Runtime([support()], store=store_url, clock=clock) as lacking,
    ):
        parent, child = await waiting_child(rt)
        await lacking.cancel(parent, principal=ALICE)
        assert child in (await rt.state(parent)).owed
        if ends == "cancelled":
            await rt.cancel(child, principal=ALICE)
        else:
            clock.advance(61)
            await rt.expire_due()
        state = await rt.state(parent)
        assert (state.delegated, state.owed) == (tokens(40), {})
        assert await spent(rt, parent) == [
            {"session_id": child, "delegated": tokens(40).model_dump()}
        ]


async def test_a_parent_cannot_dodge_its_budget_by_being_cancelled(store_url: str) -> None:
    """max_tokens=100: each turn delegates (its child spends 60) and is cancelled while the child
    waits. The second turn starts at 70 spent; the third at 140 asks to continue or stop before
    its model runs, as the parent's own spending would."""
    agents = [support(max_tokens=100), orders(tokens(60))]
    async with so.Runtime(agents, store=store_url) as rt:
        parent, _ = await waiting_child(rt)
        await rt.cancel(parent, principal=ALICE)
        await waiting_child(rt, parent)
        await rt.cancel(parent, principal=ALICE)
        state = await rt.state(parent)
        assert (state.usage, state.delegated) == (tokens(20), tokens(120))
        r = await rt.generate(session_id=parent, prompt="refund 3", auth=ALICE)
        assert r.status == "waiting"
        [limit] = r.pending
        assert limit.kind == "session-limit" and limit.child is None
        assert "140 of max_tokens=100 (120 of them by its subagents)" in (limit.question or "")
        assert len(await rt.sessions(agent="orders")) == 2  # the third turn delegated nothing


async def test_a_parent_whose_ttl_passed_counts_what_its_child_spent(store_url: str) -> None:
    """The parent's TTL passes while its child waits: recording its expiry cancels the child,
    and what the child spent is counted in the parent, which stays expired."""
    parent_agent = support(ttl=60)
    clock = ManualClock()
    async with so.Runtime([parent_agent, orders(tokens(40))], store=store_url, clock=clock) as rt:
        parent, child = await waiting_child(rt)
        clock.advance(61)
        assert await rt.expire_due() >= 1
        kid = (await rt.state(child)).turn
        assert kid is not None and kid.status == "cancelled"
        state = await rt.state(parent)
        assert state.delegated == tokens(40) and state.expired(clock())
        assert len(await spent(rt, parent)) == 1
        with pytest.raises(so.SessionExpired):
            await rt.generate(session_id=parent, prompt="again", auth=ALICE)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("restart", [False, True], ids=["same-process", "new-process"])
async def test_a_failure_recording_the_spend_neither_loses_nor_doubles_it(
    store_url: str, when: str, restart: bool
) -> None:
    """The child is cancelled with its parent, and recording its spend on the parent fails
    (before the commit: nothing recorded; after it: recorded, the cancel raised). The parent's
    next turn, in this process or a new one, counts the child's 40 tokens exactly once."""
    refused: list[str] = []

    def full(moment: str, label: str) -> None:
        if moment == when and label == "subagent.spent" and not refused:
            refused.append(label)
            raise so.StoreError("could not extend file: No space left on device")

    agents = [support(), orders(tokens(40))]
    async with so.Runtime(agents, store=store_url) as rt:
        parent, child = await waiting_child(rt)
        rt.store.set_fault_hook(full)
        with pytest.raises(so.StoreError, match="No space left"):
            await rt.cancel(parent, principal=ALICE)
        rt.store.set_fault_hook(None)
        kid = (await rt.state(child)).turn
        assert kid is not None and kid.status == "cancelled"
        if not restart:
            await waiting_child(rt, parent)
    if restart:
        async with so.Runtime(agents, store=store_url) as rt2:
            await waiting_child(rt2, parent)
    assert refused == ["subagent.spent"]
    async with so.Runtime(agents, store=store_url) as rt3:
        state = await rt3.state(parent)
        assert (state.usage, state.delegated) == (tokens(20), tokens(40))
        assert [d["session_id"] for d in await spent(rt3, parent)] == [child]


async def test_the_orphan_sweep_counts_the_child_its_parents_cancel_missed(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process cancelling the parent dies before reaching the child: the sweep that cancels
    the child later counts what it spent in the parent, once."""
    async with so.Runtime([support(), orders(tokens(40))], store=store_url) as rt:
        parent, child = await waiting_child(rt)
        with monkeypatch.context() as m:
            m.setattr(_child_sessions, "children", lambda requests: [])
            m.setattr(_child_sessions, "delegated", lambda state: [])
            await rt.cancel(parent, principal=ALICE)
        assert (await rt.state(parent)).delegated == so.Usage()  # not ended yet: not counted
        assert await rt.expire_due() == 1
        assert (await rt.state(parent)).delegated == tokens(40)
        assert await rt.expire_due() == 0
        assert len(await spent(rt, parent)) == 1


async def test_a_child_cancelled_while_it_runs_is_counted_once_its_drive_stopped(
    store_url: str,
) -> None:
    """The parent is cancelled while its child's tool runs (its model step spent 40): the
    child's turn is cancelled and its 40 tokens are counted in the parent."""
    started, release = asyncio.Event(), asyncio.Event()

    @so.tool
    async def look_up(order_id: str) -> str:
        """Look an order up (slowly)."""
        started.set()
        await release.wait()
        return "shipped"

    child = scripted_agent(
        "orders",
        [call_tools(call("look_up", order_id="3"), usage=tokens(40)), reply("ok")],
        tools=[look_up],
    )
    async with so.Runtime([support(), child], store=store_url) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="where?", auth=ALICE))
        await asyncio.wait_for(started.wait(), 10)
        await rt.cancel(sid, principal=ALICE)
        release.set()
        await asyncio.wait_for(running, 10)
        [kid] = await rt.sessions(agent="orders")
        turn = (await rt.state(kid.id)).turn
        assert turn is not None and turn.status == "cancelled"
        assert (await rt.state(sid)).delegated == tokens(40)
        assert len(await spent(rt, sid)) == 1


class Slow:
    """A child's model whose one reply (400 tokens in, 100 out) comes once `release` is set;
    `started` is set as it is asked."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        self.started.set()
        await self.release.wait()
        return so.ModelResponse(text="late", usage=LATE)


LATE = so.Usage(input_tokens=400, output_tokens=100)


async def test_a_reply_billed_after_the_parents_cancel_is_counted_in_the_parent(
    store_url: str,
) -> None:
    """The parent (max_tokens=300, its own step 10 tokens) is cancelled while its child's model
    call is in flight; that reply, billed once the child's turn was cancelled (`model.spent` on
    the child: 500 tokens), is counted in the parent, once, and the parent's next turn asks to
    continue or stop (510 of 300). Before, the cancel counted the child at 0 as its turn ended,
    and the late bill reached the child's usage only: the next turn went on without asking."""
    model = Slow()
    async with so.Runtime(
        [support(max_tokens=300), so.Agent(name="orders", model=model)], store=store_url
    ) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="refund", auth=ALICE))
        await asyncio.wait_for(model.started.wait(), 10)
        await rt.cancel(sid, principal=ALICE)
        [kid] = await rt.sessions(agent="orders")
        turn = (await rt.state(kid.id)).turn
        assert turn is not None and turn.status == "cancelled"
        model.release.set()
        await asyncio.wait_for(running, 10)
        assert (await rt.state(kid.id)).usage == LATE
        state = await rt.state(sid)
        assert (state.usage, state.delegated, state.owed) == (tokens(10), LATE, {})
        assert await spent(rt, sid) == [{"session_id": kid.id, "delegated": LATE.model_dump()}]
        r = await rt.generate(session_id=sid, prompt="refund again", auth=ALICE)
        [limit] = r.pending
        assert limit.kind == "session-limit"
        assert "510 of max_tokens=300 (500 of them by its subagents)" in (limit.question or "")
        assert len(await rt.sessions(agent="orders")) == 1  # the next turn delegated nothing


class SlowThenQuick(Slow):
    """`Slow`, whose replies after the first come at once (1 input token each)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        self.calls += 1
        if self.calls == 1:
            return await super().complete(request)
        return so.ModelResponse(text="next", usage=so.Usage(input_tokens=1))


async def test_a_late_bill_is_counted_when_the_drive_went_on_to_a_queued_message(
    store_url: str,
) -> None:
    """As above, with a message queued on the child behind its delegated turn: the drive that
    recorded the late bill went on to that message's turn, and its end counted nothing (the
    child's turn then was the message's): the parent owed the child for good. Counted once the
    drive stops, the delegated turn's figure only."""
    model = SlowThenQuick()
    async with so.Runtime(
        [support(max_tokens=300), so.Agent(name="orders", model=model)], store=store_url
    ) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="refund", auth=ALICE))
        await asyncio.wait_for(model.started.wait(), 10)
        [kid] = await rt.sessions(agent="orders")
        queued = await rt.send(kid.id, "also this", principal=ALICE, turn_policy="queue")
        assert queued.queued
        await rt.cancel(sid, principal=ALICE)
        model.release.set()
        await asyncio.wait_for(running, 10)
        for _ in range(200):  # the drive runs the queued message's turn on after the cancel
            child = await rt.state(kid.id)
            if child.turn is not None and child.turn.status == "completed":
                break
            await asyncio.sleep(0.02)
        assert child.turn is not None and child.turn.status == "completed"
        state = await rt.state(sid)
        assert (state.delegated, state.owed) == (LATE, {})
        assert await spent(rt, sid) == [{"session_id": kid.id, "delegated": LATE.model_dump()}]


def test_a_death_right_after_a_late_bill_leaves_it_for_the_parents_next_turn(
    store_url: str, tmp_path: Path
) -> None:
    """As above, but the process is killed right after it recorded the late bill on the child
    (`model.spent`), before counting it in the parent. The parent's next turn, in a new process
    once the dead one's leases lapsed, counts it before its model runs, once, and asks."""
    from . import _late_bill_child as crash
    from ._forks import Forks

    clock = ManualClock()

    async def start() -> str:
        async with so.Runtime(crash.agents(), store=store_url, clock=clock) as rt:
            return await rt.create_session("support", auth=ALICE)

    sid = asyncio.run(start())
    forks = Forks("tests._late_bill_child", tmp_path)
    try:
        code, _ = forks.run(store_url, str(clock()), sid)
        assert code == -signal.SIGKILL, forks.stderr()
    finally:
        forks.close()
    clock.advance(31)  # past the dead process's leases (30 s)

    async def after() -> None:
        agents = crash.agents(scripted_agent("orders", [reply("done")]).model)
        async with so.Runtime(agents, store=store_url, clock=clock) as rt:
            [kid, *_] = await rt.sessions(agent="orders")
            assert (await rt.state(kid.id)).usage == LATE  # the killed process recorded it
            r = await rt.generate(session_id=sid, prompt="refund again", auth=ALICE)
            [limit] = r.pending
            assert limit.kind == "session-limit"
            assert "510 of max_tokens=300 (500 of them by its subagents)" in (limit.question or "")
            assert await spent(rt, sid) == [{"session_id": kid.id, "delegated": LATE.model_dump()}]
            assert len(await rt.sessions(agent="orders")) == 1  # the next turn delegated nothing

    asyncio.run(after())


async def test_the_dashboard_trace_says_what_a_child_spent_after_its_parents_cancel(
    tmp_path: Path,
) -> None:
    """The parent's trace shows the `subagent.spent` row in a line of its own."""
    agents = [support(), orders(so.Usage(input_tokens=1200, output_tokens=34))]
    async with so.Runtime(agents, store=f"sqlite:///{tmp_path}/s.db") as rt:
        parent, child = await waiting_child(rt)
        await rt.cancel(parent, principal=ALICE)
        transport = httpx.ASGITransport(app=create_app(rt, dev=True))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            page = (await c.get(f"/_signoff/sessions/{parent}")).text
        assert f"Subagent {child} spent 1,234 tokens (counted after its turn)" in page


def test_a_death_between_cancelling_an_expired_parents_child_and_counting_it(
    store_url: str, tmp_path: Path
) -> None:
    """The parent's TTL passes while its child (40 tokens spent) waits; the process recording
    the expiry is killed right after it cancelled the child, before counting what it spent. The
    next sweep counts it in the parent, once, and the parent stays expired."""
    from . import _expired_spend_child as crash
    from ._forks import Forks

    clock = ManualClock()

    async def start() -> tuple[str, str]:
        async with so.Runtime(crash.agents(), store=store_url, clock=clock) as rt:
            return await waiting_child(rt)

    parent, child = asyncio.run(start())
    forks = Forks("tests._expired_spend_child", tmp_path)
    try:
        code, _ = forks.run(store_url, str(clock() + 61))
        assert code == -signal.SIGKILL, forks.stderr()
    finally:
        forks.close()
    clock.advance(62)

    async def after() -> None:
        async with so.Runtime(crash.agents(), store=store_url, clock=clock) as rt:
            kid = (await rt.state(child)).turn
            assert kid is not None and kid.status == "cancelled"  # the killed process did that
            await rt.expire_due()
            state = await rt.state(parent)
            assert state.delegated == tokens(40) and state.expired(clock())
            assert await rt.expire_due() == 0
            assert [d["session_id"] for d in await spent(rt, parent)] == [child]
            assert (await rt.state(parent)).delegated == tokens(40)

    asyncio.run(after())
