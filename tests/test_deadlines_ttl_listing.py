"""A listing of expired requests records first the passed TTLs of the sessions holding open
requests it would list, as it records passed deadlines, so it lists and counts them as
`rt.state()` and `GET /v1/requests/{id}` show them; a listing of every status shows them
`expired`. Before, only deadlines were recorded: such a request was in no expired listing and
read `pending` in a listing of every status until a read of its session recorded the expiry."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import pytest

import signoff as so
from signoff.stores import PendingFilter
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._dashboard import csrf_of
from ._delegation import refund_desk
from .test_deadlines_listing import served

ALICE = so.Principal(authenticator="sso", principal_id="alice")


def _solo() -> so.Agent:
    """Agent `solo`: its one call waits on an approval with no deadline; its sessions expire
    after 5 idle seconds."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return scripted_agent(
        "solo",
        [call_tools(call("refund", order_id="1")), reply("done")],
        tools=[refund],
        limits=so.Limits(ttl=5),
    )


async def _lapsed(rt: so.Runtime, clock: ManualClock) -> tuple[str, str]:
    """A session waiting on a request when its TTL passes, nothing recording that."""
    r = await rt.generate("solo", prompt="refund order 1", auth=ALICE)
    assert r.status == "waiting"
    clock.advance(10)
    return r.session_id, r.pending[0].id


async def _stored(rt: so.Runtime, request_id: str) -> str:
    row = await rt.store.get_request(request_id)
    assert row is not None
    return row.status


async def test_a_listing_of_expired_requests_records_a_passed_ttl_first(store_url: str) -> None:
    """`pending_page(status="expired")` listed nothing and a listing of every status showed the
    request `pending`, while `rt.state()` showed it `expired`. The expired listing records the
    expiry (the session `failed`) and lists it; one of every status shows it `expired`, writing
    nothing; the queue leaves it out, and a listing the request does not match records none."""
    clock = ManualClock()
    async with so.Runtime([_solo()], store=store_url, clock=clock) as rt:
        sid, rid = await _lapsed(rt, clock)
        before = len(await rt.store.read_events(sid))
        page, _ = await rt.pending_page(PendingFilter(status=None))
        assert [(r.id, r.status) for r in page] == [(rid, "expired")]
        assert await rt.pending() == []
        flt = PendingFilter(status="pending", live_at=clock())
        assert (await rt.pending_page(flt))[0] == []
        flt = PendingFilter(status="expired", tool_name="other")
        assert (await rt.pending_page(flt))[0] == []
        flt = PendingFilter(status="expired", agent="another")
        assert (await rt.pending_page(flt))[0] == []
        assert len(await rt.store.read_events(sid)) == before
        assert await _stored(rt, rid) == "pending"
        page, more = await rt.pending_page(PendingFilter(status="expired"))
        assert ([(r.id, r.status) for r in page], more) == ([(rid, "expired")], False)
        assert await _stored(rt, rid) == "expired"
        assert (await rt.sessions())[0].status == "failed"
        state = await rt.state(sid)
        assert state.status == "failed" and state.requests[rid].status == "expired"
        page, _ = await rt.pending_page(PendingFilter(status=None))
        assert [(r.id, r.status) for r in page] == [(rid, "expired")]


async def test_a_runtime_without_the_agent_shows_a_passed_ttl_closed(store_url: str) -> None:
    """One that cannot record the expiry (it lacks the agent) shows the request `expired` in a
    listing of every status, writing nothing, and leaves it out of the queue."""
    clock = ManualClock()
    async with so.Runtime([_solo()], store=store_url, clock=clock) as rt:
        sid, rid = await _lapsed(rt, clock)
    async with so.Runtime([], store=store_url, clock=clock) as reader:
        before = await reader.store.read_events(sid)
        page, _ = await reader.pending_page(PendingFilter(status=None))
        assert [(r.id, r.status) for r in page] == [(rid, "expired")]
        assert (await reader.pending_page(PendingFilter(status="expired")))[0] == []
        assert await reader.pending() == []
        assert await reader.store.read_events(sid) == before


@pytest.mark.parametrize("rule", ["default", "own"])
async def test_the_http_listing_of_expired_requests_records_a_passed_ttl_first(
    store_url: str, rule: str
) -> None:
    """`GET /v1/requests?status=expired` (with no sweep) listed and counted nothing, the
    dashboard's audit page alike, while `GET /v1/requests/{id}` read `expired`; it records the
    expiry first, under the default rule and under an app's own, and the queue leaves it out."""
    clock = ManualClock()
    runtime = so.Runtime([_solo()], store=store_url, clock=clock)
    async with served(runtime, rule) as c:
        sid, rid = await _lapsed(runtime, clock)
        body = (await c.get("/v1/requests", params={"status": "pending"})).json()
        assert (body["total"], body["items"]) == (0, [])
        assert await _stored(runtime, rid) == "pending"
        body = (await c.get("/v1/requests", params={"status": "expired"})).json()
        assert (body["total"], [i["id"] for i in body["items"]]) == (1, [rid])
        assert await _stored(runtime, rid) == "expired"
        assert (await c.get(f"/v1/sessions/{sid}")).json()["status"] == "failed"
        _, later = await _lapsed(runtime, clock)
        page = await c.get("/_signoff/login")
        signed = {"token": "tok", "csrf": csrf_of(page.text)}
        assert (await c.post("/_signoff/login", data=signed)).status_code == 303
        audit = (await c.get("/_signoff/audit", params={"status": "expired"})).text
        assert rid in audit and later in audit


def _counting(store: Any, names: tuple[str, ...]) -> dict[str, list[dict[str, Any]]]:
    """Each call of the store's `names` from now on: its keywords, and what it returned
    (`rows`)."""
    calls: dict[str, list[dict[str, Any]]] = {name: [] for name in names}

    def counting(name: str) -> Callable[..., Any]:
        of = getattr(store, name)

        @functools.wraps(of)  # its signature, which the runtime reads
        async def counted(*args: Any, **kwargs: Any) -> Any:
            got = await of(*args, **kwargs)
            calls[name].append({**kwargs, "rows": got})
            return got

        return counted

    for name in names:
        setattr(store, name, counting(name))
    return calls


async def test_lapsed_sessions_holding_no_such_request_cost_a_listing_a_few_queries(
    store_url: str,
) -> None:
    """A lapsed session holding no request an expired listing matches (of another tool) is
    never recorded, so every such listing counted its requests again, one query each (300
    lapsed sessions: 300 queries a listing); and a listing of every status read every lapsed
    session of its page's agents. Now one listing of their requests, and the page's sessions
    only."""
    clock = ManualClock()
    async with so.Runtime([_solo()], store=store_url, clock=clock) as rt:
        for i in range(60):
            await rt.generate("solo", prompt=f"refund order {i}", auth=ALICE)
        clock.advance(10)
        calls = _counting(rt.store, ("pending", "count_pending", "lapsed_sessions"))
        for _ in range(2):
            flt = PendingFilter(status="expired", tool_name="other")
            assert (await rt.pending_page(flt))[0] == []
        assert len(calls["count_pending"]) == 0
        assert len(calls["pending"]) <= 2 * 3 and len(calls["lapsed_sessions"]) == 2
        assert await rt.store.count_sessions(status="waiting") == 60  # none recorded
        for name in calls:
            calls[name].clear()
        page, _ = await rt.pending_page(PendingFilter(status=None, limit=10))
        assert [r.status for r in page] == ["expired"] * 10
        assert len(calls["pending"]) <= 3 and len(calls["lapsed_sessions"]) == 1
        (lapsed,) = calls["lapsed_sessions"]
        assert sorted(lapsed["ids"]) == sorted({r.session_id for r in page})
        assert len(lapsed["rows"]) == 10


async def test_a_listing_of_every_status_shows_a_subagents_request_below_a_lapsed_parent_withdrawn(
    store_url: str,
) -> None:
    """The parent's TTL passed: the queue left the subagent's request out, `state()` read it
    withdrawn and an answer to it was refused, while a listing of every status showed it
    `pending` (it looked at the request's own session only)."""
    clock = ManualClock()
    support, billing = refund_desk(so.always(), [])
    support.limits = so.Limits(ttl=60)
    async with so.Runtime([support, billing], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        child = mirror.child
        clock.advance(61)
        page, _ = await rt.pending_page(PendingFilter(status=None))
        assert {x.id: x.status for x in page} == {
            mirror.id: "expired",
            child.request_id: "withdrawn",
        }
        assert await rt.pending() == []
        state = await rt.state(child.session_id)
        assert state.requests[child.request_id].status == "withdrawn"
        page, _ = await rt.pending_page(PendingFilter(status=None))
        assert {x.id: x.status for x in page}[child.request_id] == "withdrawn"
