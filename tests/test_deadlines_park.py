"""A turn that parks after its request's deadline passed (a slow tool of the same response ran
meanwhile) records that deadline as it parks and goes on, as a sweep would: it returned
`waiting` on a request the queue no longer offered and `state()` showed closed (both stores)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import pytest

import signoff as so
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, tool_results

from .test_runtime import types_of

OnTimeout = Literal["deny", "approve", "escalate"]


def _agent(clock: ManualClock, on_timeout: OnTimeout) -> so.Agent:
    @so.tool
    async def fetch(n: int) -> str:
        """Fetch slowly: the approval's deadline passes while it runs."""
        clock.advance(3)
        return "fetched"

    more: dict[str, Any] = {"escalate_to": "finance"} if on_timeout == "escalate" else {}

    @so.tool(approval=so.always(expires_in=1, on_timeout=on_timeout, **more))
    async def pay(invoice: str) -> str:
        """Pay an invoice."""
        return "paid"

    return scripted_agent(
        "duo",
        [
            call_tools(call("fetch", n=1), call("pay", invoice="I1")),
            lambda conv: reply(" | ".join(str(r.content) for r in tool_results(conv))),
        ],
        tools=[fetch, pay],
    )


@pytest.mark.parametrize("on_timeout", ["deny", "approve", "escalate"])
async def test_a_turn_parking_past_its_requests_deadline_records_it_and_goes_on(
    store_url: str, on_timeout: OnTimeout
) -> None:
    clock = ManualClock()
    async with so.Runtime([_agent(clock, on_timeout)], store=store_url, clock=clock) as rt:
        r = await rt.generate("duo", prompt="go")
        state = await rt.state(r.session_id)
        (request,) = state.requests.values()
        types = await types_of(rt, r.session_id)
        if on_timeout == "escalate":  # handed to the group, open: the turn waits on it
            assert r.status == "waiting"
            assert [(p.id, p.escalated_to, p.expires_at) for p in r.pending] == [
                (request.request.id, "finance", None)
            ]
            assert types[-2:] == ["approval.candidate", "turn.waiting"]
            assert [p.id for p in await rt.pending()] == [request.request.id]
            return
        assert (r.status, r.pending) == ("completed", [])
        assert (request.status, request.outcome) == ("expired", "expired")
        assert "fetched" in r.text
        assert ("paid" in r.text) == (on_timeout == "approve")
        assert "turn.waiting" not in types  # never parked on a closed request
        assert state.status == "idle"
        stored = await rt.store.get_request(request.request.id)
        assert stored is not None and stored.status == "expired"


def _boss(
    clock: ManualClock,
    on_timeout: Literal["deny", "approve"],
    ran: list[str],
    meanwhile: Callable[[], Awaitable[None]] | None = None,
) -> list[so.Agent]:

    @so.tool(approval=so.always(expires_in=1, on_timeout=on_timeout))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append("refund")
        return "refunded"

    @so.tool
    async def fetch(n: int) -> str:
        """Fetch slowly: the subagent's deadline passes while it runs."""
        if meanwhile is not None:
            await meanwhile()
        clock.advance(3)
        return "fetched"

    def told(conv: Any) -> Any:
        return reply(" | ".join(str(r.content) for r in tool_results(conv)))

    child = scripted_agent(
        "billing", [call_tools(call("refund", order_id="1")), told], tools=[refund]
    )
    boss = scripted_agent(
        "boss",
        [call_tools(call("billing", call_id="d1", message="Refund 1"), call("fetch", n=1)), told],
        tools=[so.delegate("billing"), fetch],
    )
    return [boss, child]


@pytest.mark.parametrize("on_timeout", ["deny", "approve"])
async def test_a_turn_parking_on_a_mirror_whose_subagents_deadline_passed_goes_on(
    store_url: str, on_timeout: Literal["deny", "approve"]
) -> None:
    """The mirror shows its subagent's deadline and has none of its own: the parent's turn
    recorded the child's as it would park, rather than waiting on a request no one can answer."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(_boss(clock, on_timeout, ran), store=store_url, clock=clock) as rt:
        r = await rt.generate("boss", prompt="go")
        assert (r.status, r.pending) == ("completed", [])
        state = await rt.state(r.session_id)
        (mirror,) = state.requests.values()
        assert mirror.request.child is not None
        child = await rt.state(mirror.request.child.session_id)
        (asked,) = child.requests.values()
        assert (asked.status, mirror.status) == ("expired", "expired")
        assert ran == (["refund"] if on_timeout == "approve" else [])
        assert "fetched" in r.text
        assert ("refunded" in r.text) == (on_timeout == "approve")
        assert "turn.waiting" not in await types_of(rt, r.session_id)
        assert (state.status, child.status) == ("idle", "idle")
        assert [p.id for p in await rt.pending()] == []


async def test_a_parked_turn_whose_subagent_another_drive_holds_waits_lease_wait_once(
    store_url: str,
) -> None:
    """Its subagent held by another drive as the turn would park: its deadline is recorded and
    the mirror closed, and the delegate call waits `lease_wait` for the child once (answering
    `running`), not once more for the record. The turn goes on once the child is free."""
    clock = ManualClock()
    ran: list[str] = []
    held: list[tuple[str, str, int]] = []

    async def hold_child() -> None:  # before the deadline passes: a listing records none
        (asked,) = await rt.pending(agent="billing")
        token = await rt.store.acquire_lease(asked.session_id, "elsewhere", 60.0, clock())
        assert token is not None
        held.append((asked.session_id, "elsewhere", token))

    agents = _boss(clock, "approve", ran, hold_child)
    async with so.Runtime(agents, store=store_url, clock=clock, lease_wait=3.0) as rt:
        began = time.monotonic()
        r = await rt.generate("boss", prompt="go")
        assert time.monotonic() - began < 5.5  # one lease_wait (3 s), not two (6 s)
        assert (r.status, r.pending, ran) == ("running", [], [])
        state = await rt.state(r.session_id)
        (mirror,) = state.requests.values()
        assert mirror.status == "expired"
        await rt.store.release_lease(*held[0])
        done = await rt.generate(session_id=r.session_id)
        assert (done.status, ran) == ("completed", ["refund"])
        assert "refunded" in done.text and "fetched" in done.text
