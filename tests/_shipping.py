"""The agent the PostgreSQL failure tests park and resume: it asks approval to ship order 7,
then says "Shipped.", and its tool records each order it ships."""

from __future__ import annotations

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

__all__ = ["shipping_agent"]


def shipping_agent(runs: list[str]) -> so.Agent:
    """Agent `a`, whose `ship` tool always asks for approval and appends the order to `runs`."""

    @so.tool(approval=so.always())
    async def ship(order_id: str) -> str:
        """Ship an order."""
        runs.append(order_id)
        return "shipped"

    return scripted_agent(
        "a", [call_tools(call("ship", order_id="7")), reply("Shipped.")], tools=[ship]
    )
