"""Agents that delegate: `support` hands a refund to `billing`, whose tool asks for approval,
so the parent's request is a mirror of the subagent's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

__all__ = ["refund_desk"]


def refund_desk(
    approval: Any, ran: list[str], guardrails: Sequence[so.Guardrail] = ()
) -> list[so.Agent]:
    """`support` and `billing`: `support` delegates refunding order 9 to `billing`, whose
    `refund` tool asks for `approval` (and `guardrails`, billing's) and records each order it
    refunds in `ran`."""

    @so.tool(approval=approval)
    async def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "ok"

    child = scripted_agent(
        "billing",
        [call_tools(call("refund", order_id="9")), reply("refunded")],
        tools=[refund],
        guardrails=guardrails,
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 9")), reply("done")],
        tools=[so.delegate("billing")],
    )
    return [parent, child]
