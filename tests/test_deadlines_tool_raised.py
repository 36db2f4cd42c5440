"""The approval a tool asks for itself (`ctx.request_approval`) keeps the tool's deadline: it
carried none, so `ApprovalSpec(..., expires_in=60)` left it open for ever (both stores)."""

from __future__ import annotations

from typing import Any, Literal

import pytest

import signoff as so
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

ALICE = so.Principal(authenticator="sso", principal_id="alice")


def wire_agent(on_timeout: Literal["deny", "approve"]) -> so.Agent:
    @so.tool(approval=so.ApprovalSpec(so.never(), expires_in=60, on_timeout=on_timeout))
    async def wire(ctx: so.ToolContext, to: str, amount: float) -> str:
        """Wire money."""
        ctx.request_approval({"to": to, "amount": amount})
        return "unreachable"

    return scripted_agent(
        "bank", [call_tools(call("wire", to="acme", amount=10)), reply("ok")], tools=[wire]
    )


@pytest.mark.parametrize("on_timeout", ["deny", "approve"])
async def test_a_tool_raised_approval_expires_by_the_tools_deadline(
    store_url: str, on_timeout: Literal["deny", "approve"]
) -> None:
    clock = ManualClock()
    async with so.Runtime([wire_agent(on_timeout)], store=store_url, clock=clock) as rt:
        r = await rt.generate("bank", prompt="wire 10 to acme", auth=ALICE)
        (req,) = r.pending
        assert req.source == "tool"
        assert (req.expires_at, req.on_timeout) == (clock.now + 60, on_timeout)
        clock.advance(59.9)
        assert await rt.expire_due() == 0
        clock.advance(0.1)
        assert await rt.expire_due() == 1
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "expired"
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        events = [e async for e in rt.events(r.session_id, 0, follow=False)]
        (result,) = [e.data["result"] for e in events if e.type == "tool.completed"]
        decision: dict[str, Any] = {"approved": on_timeout == "approve", "by": None}
        assert {k: result[k] for k in decision} == decision
