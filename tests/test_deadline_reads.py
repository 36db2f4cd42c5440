"""A session whose requests' deadlines passed with no sweep yet reads alike everywhere: its
state, the sessions listing (page, filters, totals) and HTTP. Before, `rt.state`, the listing
and `signoff sessions` showed it `waiting` on a request the queue no longer offered and an
answer was refused as expired, while `GET /v1/sessions/{id}` recorded the deadline. They show
it as recording leaves it, and write nothing: a read drives no turn."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

import signoff as so
from signoff._session_page import session_page, shown_total
from signoff.server import TokenAuth, create_app
from signoff.testing import (
    ExecutionLog,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    tool_results,
)

from .test_deadlines import payout_agent
from .test_runtime import types_of

ALICE = so.Principal(authenticator="token", principal_id="alice")


def _agent(on_timeout: str) -> so.Agent:
    more: dict[str, Any] = {"escalate_to": "finance"} if on_timeout == "escalate" else {}
    approval = so.always(expires_in=60, on_timeout=on_timeout, **more)  # type: ignore[arg-type]
    return payout_agent(ExecutionLog(), approval)


async def _sessions(store_url: str, on_timeout: str, clock: ManualClock) -> tuple[str, str]:
    """A session whose request's deadline passes, then one asked later, still in time."""
    async with so.Runtime([_agent(on_timeout)], store=store_url, clock=clock) as rt:
        due = (await rt.generate("pay", prompt="pay")).session_id
        clock.advance(30)
        live = (await rt.generate("pay", prompt="pay")).session_id
        clock.advance(31)  # the first one's deadline passed, the second's not
    return due, live


async def test_a_state_read_shows_a_passed_deadline_without_recording_it(
    store_url: str,
) -> None:
    """`rt.state` read `waiting` on a request past its deadline: it shows the session as
    recording the deadline leaves it (the request closed, the turn `running`), as the sessions
    listing does, writing nothing and driving no turn; the queue's listing records it."""
    clock = ManualClock()
    async with so.Runtime([_agent("deny")], store=store_url, clock=clock) as rt:
        r = await rt.generate("pay", prompt="pay")
        clock.advance(61)
        before = await types_of(rt, r.session_id)
        state = await rt.state(r.session_id)
        assert state.status == "running" and state.pending_requests() == []
        assert state.requests[r.pending[0].id].status == "expired"
        assert await rt.sessions(status="waiting") == []
        assert [s.status for s in await rt.sessions()] == ["running"]
        assert [s.id for s in await rt.sessions(status="running")] == [r.session_id]
        assert await types_of(rt, r.session_id) == before  # a read: nothing recorded
        stored = await rt.store.get_request(r.pending[0].id)
        assert stored is not None and stored.status == "pending"
        assert await rt.pending() == []  # the queue records it, and the turn goes on
        assert "input.resolved" in await types_of(rt, r.session_id)
        assert (await rt.state(r.session_id)).status == "idle"


async def test_a_listing_shows_a_passed_deadline_without_recording_it(store_url: str) -> None:
    """The sessions listing of the agent's runtime shows a passed deadline as recording leaves
    it, filters and totals alike, and records nothing: the session is no longer listed
    `waiting`, nor is its turn driven from a read."""
    clock = ManualClock()
    due, live = await _sessions(store_url, "deny", clock)
    async with so.Runtime([_agent("deny")], store=store_url, clock=clock) as rt:
        before = await types_of(rt, due)
        assert [s.id for s in await rt.sessions(status="waiting")] == [live]
        assert [s.id for s in await rt.sessions(status="running")] == [due]
        assert {s.id: s.status for s in await rt.sessions()} == {due: "running", live: "waiting"}
        now = rt.now()
        assert await shown_total(rt, None, "waiting", now) == 1
        assert await shown_total(rt, None, "running", now) == 1
        assert await types_of(rt, due) == before


@pytest.mark.parametrize("on_timeout", ["deny", "approve", "escalate"])
async def test_a_reader_without_the_agent_shows_a_passed_deadline_as_recorded(
    store_url: str, on_timeout: str
) -> None:
    """A runtime without the agent cannot record the deadline: it shows the session as the
    record leaves it, writing nothing. A deadline that closes the request leaves the turn
    `running` (the runtime's to go on with), in its state, its listing's page, filters and
    totals alike; one that escalates leaves it waiting on the group."""
    clock = ManualClock()
    due, live = await _sessions(store_url, on_timeout, clock)
    closes = on_timeout != "escalate"
    shown = "running" if closes else "waiting"
    async with so.Runtime([], store=store_url, clock=clock) as reader:
        before = await types_of(reader, due)
        state = await reader.state(due)
        assert state.status == shown
        (request,) = state.requests.values()
        if closes:
            assert (request.status, request.outcome) == ("expired", "expired")
        else:
            assert (request.status, request.request.escalated_to) == ("pending", "finance")
        assert {s.id: s.status for s in await reader.sessions()} == {due: shown, live: "waiting"}
        waiting = [live] if closes else [live, due]
        assert [s.id for s in await reader.sessions(status="waiting")] == waiting
        assert [s.id for s in await reader.sessions(status="waiting", limit=1)] == [live]
        assert [s.id for s in await reader.sessions(status="running")] == [due] * closes
        assert await reader.sessions(status="running", offset=1) == []
        now = reader.now()
        for status, count in (("waiting", len(waiting)), ("running", closes), (None, 2)):
            assert await shown_total(reader, None, status, now) == count  # `signoff sessions`
            assert len(await session_page(reader, "pay", status, 10, 0, now, {})) == count
        assert await types_of(reader, due) == before  # a read: nothing recorded
        stored = await reader.store.get_request(request.request.id)
        assert stored is not None and stored.status == "pending"
    async with so.Runtime([_agent(on_timeout)], store=store_url, clock=clock) as rt:
        assert (await rt.state(due)).status == shown  # the agent's runtime shows it alike
        assert await types_of(rt, due) == before
        await rt.pending()  # the queue's listing records it
        assert await types_of(rt, due) != before
        assert (await rt.state(due)).status == ("idle" if closes else "waiting")


def test_the_http_listing_agrees_with_the_sessions_read(tmp_path: Any) -> None:
    """`GET /v1/sessions?status=waiting` listed (and counted) the session `waiting` while
    `GET /v1/sessions/{id}` and the queue showed its request closed, for a server without
    the agent (another process's): both show it as the record leaves it, `running`."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = ManualClock()
    with so.Runtime([_agent("deny")], store=url, clock=clock) as rt:
        sid = rt.generate_sync("pay", prompt="pay").session_id
    clock.advance(61)
    reader = so.Runtime([], store=url, clock=clock)
    app = create_app(reader, auth=TokenAuth({"tok": ALICE}), sweep_every=None)
    with TestClient(app, headers={"Authorization": "Bearer tok"}) as c:
        waiting = c.get("/v1/sessions", params={"status": "waiting"}).json()
        assert (waiting["total"], waiting["items"]) == (0, [])
        running = c.get("/v1/sessions", params={"status": "running"}).json()
        assert (running["total"], [s["id"] for s in running["items"]]) == (1, [sid])
        assert [s["status"] for s in c.get("/v1/sessions").json()["items"]] == ["running"]
        assert c.get(f"/v1/sessions/{sid}").json()["status"] == "running"
        assert c.get("/v1/requests").json()["total"] == 0


def test_the_http_session_read_records_a_passed_deadline_a_listing_only_shows(
    tmp_path: Any,
) -> None:
    """A server with the agent: `GET /v1/sessions` shows the session as the deadline leaves it,
    recording nothing, while `GET /v1/sessions/{id}` records the deadline first, as it did
    before, and the turn goes on."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    clock = ManualClock()
    with so.Runtime([_agent("deny")], store=url, clock=clock) as rt:
        sid = rt.generate_sync("pay", prompt="pay").session_id
    clock.advance(61)
    rt = so.Runtime([_agent("deny")], store=url, clock=clock)
    app = create_app(rt, auth=TokenAuth({"tok": ALICE}), sweep_every=None)
    events = f"/v1/sessions/{sid}/events"
    with TestClient(app, headers={"Authorization": "Bearer tok"}) as c:
        before = c.get(events, params={"follow": "false"}).text
        assert c.get("/v1/sessions", params={"status": "waiting"}).json()["total"] == 0
        assert [s["status"] for s in c.get("/v1/sessions").json()["items"]] == ["running"]
        assert c.get(events, params={"follow": "false"}).text == before
        assert c.get(f"/v1/sessions/{sid}").json()["status"] == "idle"
        assert "input.resolved" in c.get(events, params={"follow": "false"}).text


async def test_a_parent_waiting_on_a_subagents_lapsed_request_reads_alike_everywhere(
    store_url: str,
) -> None:
    """`state()` gave the parent's mirror its subagent's passed deadline and showed the parent
    `running`, while the listings, which find passed deadlines in the store's index (a mirror
    has none of its own), kept it `waiting`: the two reads disagreed. The parent reads as the
    listings read it until the subagent's deadline is recorded; the child reads `running`."""

    @so.tool(approval=so.always(expires_in=60))
    async def payout(amount: float) -> str:
        """Pay out."""
        return "paid"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("payout", amount=5)),
            lambda conv: reply(f"payout: {tool_results(conv)[-1].content}"),
        ],
        tools=[payout],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="pay 5")), reply("timed out")],
        tools=[so.delegate("billing")],
    )
    clock = ManualClock()
    async with so.Runtime([parent, child], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="pay 5")
        clock.advance(61)
        listed = {s.agent: s.status for s in await rt.sessions()}
        shown = (await rt.state(r.session_id)).status
        assert listed == {"support": shown, "billing": "running"}, (listed, shown)
        await rt.pending()  # the queue records the deadline: both go on
        assert {s.agent: s.status for s in await rt.sessions()} == {
            "support": "idle",
            "billing": "idle",
        }
