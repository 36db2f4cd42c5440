"""once() with `on_timeout="approve"`: a deadline that approves runs that one call, but it is
nobody's grant, so the tool's next call asks a person again (both stores)."""

from __future__ import annotations

from typing import Any

import signoff as so
from signoff.testing import ExecutionLog, ManualClock, call, call_tools, reply, scripted_agent

ALICE = so.Principal(authenticator="sso", principal_id="alice")


def once_agent(log: ExecutionLog) -> so.Agent:
    @log.tool(approval=so.ApprovalSpec(so.once(), expires_in=60, on_timeout="approve"))
    async def pay_invoice(invoice: str) -> dict[str, Any]:
        """Pay an invoice."""
        return {"paid": invoice}

    return scripted_agent(
        "pay",
        [
            call_tools(call("pay_invoice", invoice="INV-1")),
            call_tools(call("pay_invoice", invoice="INV-2")),
            call_tools(call("pay_invoice", invoice="INV-3")),
            reply("done"),
        ],
        tools=[pay_invoice],
    )


async def test_a_timeout_approval_is_not_remembered_as_a_once_grant(store_url: str) -> None:
    clock = ManualClock()
    log = ExecutionLog()
    async with so.Runtime([once_agent(log)], store=store_url, clock=clock) as rt:
        r = await rt.generate("pay", prompt="pay", auth=ALICE)
        assert r.status == "waiting"
        clock.advance(60)
        assert await rt.expire_due() == 1
        # the deadline approved INV-1; INV-2 asks a person, as no one granted the tool
        assert [e.input["invoice"] for e in log.executions] == ["INV-1"]
        state = await rt.state(r.session_id)
        assert state.approved_tools == set()
        (second,) = [p for p in await rt.pending() if p.session_id == r.session_id]
        assert second.tool_name == "pay_invoice"
        # a person's approval is the grant: INV-3 then runs without asking
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=second.id, approved=True)],
            auth=ALICE,
        )
        assert r.status == "completed"
        assert [e.input["invoice"] for e in log.executions] == ["INV-1", "INV-2", "INV-3"]
        assert (await rt.state(r.session_id)).approved_tools == {"pay_invoice"}
