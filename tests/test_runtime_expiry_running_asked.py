"""A session's TTL against a turn a live drive runs with a request open beside it (a tool
slower than the TTL running while another call of the turn waits for an approval): the session
is not idle, so no look records its expiry while that drive holds the turn."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from .test_runtime_expiry_running import followed_past_the_ttl
from .test_server_common import ALICE, TOKENS, auth

Look = Callable[[so.Runtime, str], Awaitable[Any]]
LOOKS: dict[str, Look] = {
    "state": lambda rt, sid: rt.state(sid),
    "sessions": lambda rt, sid: rt.sessions(),
    "pending": lambda rt, sid: rt.pending(),
    "expire_due": lambda rt, sid: rt.expire_due(),
}


def asking_agent(started: asyncio.Event, go: asyncio.Event, approvers: int = 1) -> so.Agent:
    """Agent `a`: its turn calls `slow`, which waits for `go`, and `pay`, which asks for an
    approval (of `approvers` people); sessions expire 60 s after their last event."""

    @so.tool()
    async def slow(x: str) -> str:
        """Take a while."""
        started.set()
        await go.wait()
        return "done"

    @so.tool(approval=so.always(approvers=approvers))
    async def pay(x: str) -> str:
        """Pay."""
        return "paid"

    return scripted_agent(
        "a",
        [call_tools(call("slow", x="1"), call("pay", x="2")), reply("ok")],
        tools=[slow, pay],
        limits=so.Limits(ttl=60),
    )


async def types_of(rt: so.Runtime, session_id: str) -> list[str]:
    return [e.type async for e in rt.events(session_id, follow=False)]


@pytest.mark.parametrize("elsewhere", [False, True], ids=["same", "other"])
@pytest.mark.parametrize("look", sorted(LOOKS))
async def test_a_look_records_no_expiry_of_a_turn_a_live_drive_runs_beside_a_request(
    store_url: str, look: str, elsewhere: bool
) -> None:
    """`rt.state()`, `rt.sessions()`, `rt.pending()` and `rt.expire_due()` recorded the TTL's
    expiry (`input.resolved` expired, `turn.failed`) of a turn whose tool ran on past the TTL
    while another call of it waited for an approval: any open request skipped the check of the
    turn's lease. The tool's result then landed after the turn's failure, unseen by the model,
    and the approval was refused. Now nothing is recorded while the drive holds the turn (this
    runtime's or another's); the turn parks on the approval, which is then taken."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    agent = asking_agent(started, go)
    async with (
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as rt,
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as other,
    ):
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        try:
            await started.wait()
            [row] = await rt.sessions()
            clock.advance(61)
            await LOOKS[look](other if elsewhere else rt, row.id)
            assert [r.status for r in await rt.sessions()] == ["running"]
            assert "turn.failed" not in await types_of(rt, row.id)
        finally:
            go.set()
            result = await turn
        assert result.status == "waiting"
        [request] = result.pending
        assert (await types_of(rt, row.id))[-2:] == ["tool.completed", "turn.waiting"]
        answer = so.InputResponse(request_id=request.id, option_id="approve")
        done = await rt.respond(row.id, [answer])
        assert done.status == "completed" and done.text == "ok"


async def test_a_follower_of_a_turn_a_live_drive_runs_beside_a_request_follows_it(
    store_url: str,
) -> None:
    """A follower met the TTL passed with a request open and recorded the expiry, though the
    drive holding the turn's lease ran its tool on: the stream ended in `SessionExpired`. It
    follows on to the turn's park on the approval."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    async with so.Runtime(
        [asking_agent(started, go)], store=store_url, clock=clock, lease_ttl=600, poll_interval=0.01
    ) as rt:
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        await started.wait()
        [row] = await rt.sessions()
        clock.advance(61)
        seen, result = await followed_past_the_ttl(rt, row.id, "turn.waiting", go, turn)
        assert result.status == "waiting"
        assert seen[-2:] == ["tool.completed", "turn.waiting"]
        assert "turn.failed" not in seen


async def test_a_turn_beside_a_request_whose_drive_died_still_expires(store_url: str) -> None:
    """The same turn once its drive's lease lapsed (its process died, say): another process's
    look records the expiry, as it does for a turn with no call at work."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    agent = asking_agent(started, go)
    async with (
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as rt,
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as other,
    ):
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        try:
            await started.wait()
            [row] = await rt.sessions()
            clock.advance(601)
            state = await other.state(row.id)
            assert state.turn is not None and state.turn.status == "failed"
            assert state.pending_requests() == []
        finally:
            go.set()
            await asyncio.gather(turn, return_exceptions=True)


@pytest.mark.parametrize("elsewhere", [False, True], ids=["same", "other"])
async def test_the_request_of_a_turn_a_live_drive_runs_on_reads_open_over_http(
    store_url: str, elsewhere: bool
) -> None:
    """`GET /v1/requests/{id}` read the approval `expired` (a resolution made up for a session
    past its TTL) while the session read `running` with it pending, and an answer to it was
    taken; the dashboard placed it nowhere. It reads pending, placed on its session's page."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    agent = asking_agent(started, go)
    async with (
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as rt,
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as other,
    ):
        app = create_app(other if elsewhere else rt, auth=TokenAuth(TOKENS))
        transport = httpx.ASGITransport(app=app)
        turn = asyncio.create_task(rt.generate("a", prompt="hi", auth=ALICE))
        try:
            await started.wait()
            [row] = await rt.sessions()
            [request] = await rt.pending(session_id=row.id)
            clock.advance(61)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                got = await http.get(f"/v1/requests/{request.id}", headers=auth("alice-token"))
            assert got.status_code == 200
            body = got.json()
            assert (body["status"], body["outcome"], body["resolution"]) == ("pending", None, None)
        finally:
            go.set()
            result = await turn
        assert result.status == "waiting"
