"""A turn that parks after its request's deadline passed (a slow tool of the same response ran
meanwhile) records that deadline as it parks and goes on, as a sweep would: it returned
`waiting` on a request the queue no longer offered and `state()` showed closed (both stores)."""

from __future__ import annotations

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
