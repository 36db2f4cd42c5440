"""Calls on a session whose turn a live drive runs on past the TTL (a tool slower than it):
the session is not idle, so not expired; they meet a running turn, as before the TTL passed,
and a cancel stops it. Once that drive's lease lapsed, the TTL expires the session as before."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

import signoff as so
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._server_api import in_process
from .test_runtime_expiry_running_asked import asking_agent


def slow_agent(started: asyncio.Event, go: asyncio.Event, *, abortable: bool = False) -> so.Agent:
    """Agent `a`: its first turn calls `slow`, which waits for `go` (or, `abortable`, its abort
    signal: a cancel's), and every later model call replies `ok`; sessions expire 60 s after
    their last event."""

    @so.tool()
    async def slow(ctx: so.ToolContext, x: str) -> str:
        """Take a while."""
        started.set()
        waits = [asyncio.ensure_future(go.wait())]
        if abortable:
            waits.append(asyncio.ensure_future(ctx.abort_signal.wait()))
        try:
            await asyncio.wait(waits, return_when="FIRST_COMPLETED")
        finally:
            for wait in waits:
                wait.cancel()
        return "done"

    return scripted_agent(
        "a",
        [call_tools(call("slow", x="1")), reply("ok")],
        tools=[slow],
        repeat_last=True,
        limits=so.Limits(ttl=60),
    )


async def types_of(rt: so.Runtime, session_id: str) -> list[str]:
    return [e.type async for e in rt.events(session_id, follow=False)]


PEOPLE = [so.Principal(authenticator="sso", principal_id=who) for who in ("alice", "bob")]
Send = Callable[[so.Runtime, str], Awaitable[so.GenerateResult]]
SENDS: dict[str, tuple[Send, str]] = {
    "steer": (lambda rt, sid: rt.send(sid, "also this"), "turn.message"),
    "queue": (lambda rt, sid: rt.send(sid, "then this", turn_policy="queue"), "turn.message"),
}
BUSY: dict[str, Send] = {
    "generate": lambda rt, sid: rt.generate(session_id=sid, prompt="again"),
    "schedule": lambda rt, sid: rt.schedule("a", "tick", session_id=sid),
}


@pytest.mark.parametrize("how", sorted(SENDS))
async def test_a_message_to_a_turn_running_past_the_ttl_is_taken(store_url: str, how: str) -> None:
    """`send()` raised `SessionExpired`, recording nothing, though the session's turn ran on
    (a live drive's tool slower than the TTL) and later messages were taken: it steers the
    running turn, or queues behind it, as before the TTL passed."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    async with so.Runtime(
        [slow_agent(started, go)], store=store_url, clock=clock, lease_wait=0.1
    ) as rt:
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        try:
            await started.wait()
            [row] = await rt.sessions()
            clock.advance(61)
            send, recorded = SENDS[how]
            sent = await send(rt, row.id)
            assert sent.status == "running"
            assert (await types_of(rt, row.id))[-1] == recorded
        finally:
            go.set()
            result = await turn
        assert result.status == "completed"
        assert "turn.failed" not in await types_of(rt, row.id)


@pytest.mark.parametrize("how", sorted(BUSY))
async def test_a_prompt_to_a_turn_running_past_the_ttl_is_session_busy(
    store_url: str, how: str
) -> None:
    """`generate(session_id=..., prompt=...)` and `schedule(session_id=...)` raised
    `SessionExpired` (over HTTP a 410) while a live drive ran the session's turn on past the
    TTL, and the session then went on: they are `SessionBusy`, as on any running turn."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    async with so.Runtime([slow_agent(started, go)], store=store_url, clock=clock) as rt:
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        try:
            await started.wait()
            [row] = await rt.sessions()
            clock.advance(61)
            before = await types_of(rt, row.id)
            with pytest.raises(so.SessionBusy):
                await BUSY[how](rt, row.id)
            assert await types_of(rt, row.id) == before
        finally:
            go.set()
            result = await turn
        assert result.status == "completed"


async def test_a_turn_running_past_the_ttl_can_be_cancelled(store_url: str) -> None:
    """`cancel()` raised `SessionExpired` (recording nothing) while a live drive ran the turn on
    past the TTL: a runaway turn could not be stopped. It is cancelled, its tool stopped."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    agent = slow_agent(started, go, abortable=True)
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        try:
            await started.wait()
            [row] = await rt.sessions()
            clock.advance(61)
            cancelled = await rt.cancel(row.id, "too slow")
            assert cancelled.status == "cancelled" and cancelled.cancelled
            result = await asyncio.wait_for(turn, 5)  # its tool was stopped: `go` never set
        finally:
            go.set()
        assert result.status == "cancelled"
        assert "turn.failed" not in await types_of(rt, row.id)


@pytest.mark.parametrize("approvers", [1, 2])
async def test_an_answer_beside_a_tool_running_past_the_ttl_is_taken(
    store_url: str, approvers: int
) -> None:
    """An approval of one call while another of the turn ran on past the TTL raised
    `SessionExpired` and recorded the expiry under the drive (its commit checked the TTL
    itself; a quorum's vote too): it is taken, and the turn goes on with both calls."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    agent = asking_agent(started, go, approvers)
    async with so.Runtime([agent], store=store_url, clock=clock, lease_wait=0.1) as rt:
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        try:
            await started.wait()
            [row] = await rt.sessions()
            [request] = await rt.pending(session_id=row.id)
            clock.advance(61)
            answer = so.InputResponse(request_id=request.id, option_id="approve")
            for who in PEOPLE[:approvers]:
                answered = await rt.respond(row.id, [answer], principal=who)
                assert [o.outcome for o in answered.outcomes] != ["expired"]
            assert "turn.failed" not in await types_of(rt, row.id)
        finally:
            go.set()
            result = await turn
        assert result.status == "completed" and result.text == "ok"
        types = await types_of(rt, row.id)
        assert "turn.failed" not in types and types.count("tool.completed") == 2


CALLS: dict[str, Send] = {
    "cancel": lambda rt, sid: rt.cancel(sid),
    "send": lambda rt, sid: rt.send(sid, "also this"),
}


@pytest.mark.parametrize("what", sorted(CALLS))
async def test_a_call_on_a_turn_whose_drive_died_past_the_ttl_expires_it(
    store_url: str, what: str
) -> None:
    """Once the drive's lease lapsed (its process died, say), the session is idle: another
    process's call records the expiry and raises `SessionExpired`, as before."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    agent = slow_agent(started, go)
    async with (
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as rt,
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as other,
    ):
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        try:
            await started.wait()
            [row] = await rt.sessions()
            clock.advance(601)
            with pytest.raises(so.SessionExpired):
                await CALLS[what](other, row.id)
            assert (await types_of(other, row.id))[-1] == "turn.failed"
        finally:
            go.set()
            await asyncio.gather(turn, return_exceptions=True)


async def test_over_http_a_turn_running_past_the_ttl_is_busy_not_gone(store_url: str) -> None:
    """Over HTTP the same calls were 410 `session_expired`: a prompt is 409 `session_busy`, and
    the cancel stops the turn (200)."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    async with (
        so.Runtime([slow_agent(started, go, abortable=True)], store=store_url, clock=clock) as rt,
        in_process(rt) as c,
    ):
        opened = asyncio.create_task(c.post("/v1/sessions", json={"agent": "a", "message": "hi"}))
        try:
            await started.wait()
            [row] = await rt.sessions()
            clock.advance(61)
            r = await c.post(f"/v1/sessions/{row.id}/generate", json={"message": "again"})
            assert r.status_code == 409 and r.json()["error"]["code"] == "session_busy", r.text
            r = await c.post(f"/v1/sessions/{row.id}/cancel", json={})
            assert r.status_code == 200 and r.json()["status"] == "cancelled", r.text
            body: Any = (await asyncio.wait_for(opened, 5)).json()
        finally:
            go.set()
        assert body["status"] == "cancelled"


async def test_a_look_at_a_parent_whose_subagent_runs_past_its_ttl_cancels_nothing(
    store_url: str,
) -> None:
    """Reading a parent session whose delegate call's subagent ran a slow tool past the
    parent's TTL cancelled that subagent's turn (its expiry cancelled the children first, then
    declined to record itself, the parent's drive holding it): the child runs to its end, and
    the parent's turn with it."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()

    @so.tool()
    async def refund(order_id: str) -> str:
        """Refund an order."""
        started.set()
        await go.wait()
        return "refunded"

    child = scripted_agent(
        "billing", [call_tools(call("refund", order_id="9")), reply("refunded")], tools=[refund]
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 9")), reply("done")],
        tools=[so.delegate("billing")],
        limits=so.Limits(ttl=60),
    )
    async with so.Runtime([parent, child], store=store_url, clock=clock) as rt:
        turn = asyncio.create_task(rt.generate("support", prompt="hi"))
        try:
            await started.wait()
            ids = {r.agent: r.id for r in await rt.sessions()}
            clock.advance(61)
            assert (await rt.state(ids["support"])).status == "running"
            assert (await rt.state(ids["billing"])).status == "running"
        finally:
            go.set()
            result = await turn
        assert result.status == "completed" and result.text == "done"
        assert "turn.cancelled" not in await types_of(rt, ids["billing"])
