"""What the model adapters' tests share across providers: the refund tool schema, a request
builder, and the refund and lookup tools of the support agent that runs end to end."""

from __future__ import annotations

import signoff as so
from signoff.models import ModelRequest, ToolSpec

__all__ = ["REFUND_SCHEMA", "issue_refund", "lookup_order", "request", "support_agent"]

REFUND_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["order_id", "amount"],
}


def request(*messages: so.Message, instructions: str = "", tools: list[ToolSpec] | None = None):
    return ModelRequest(
        session_id="ses_test",
        agent="support",
        instructions=instructions,
        messages=list(messages) or [so.UserMessage(text="hello")],
        tools=tools or [],
        response_index=0,
    )


@so.tool(approval=so.always())
async def issue_refund(order_id: str, amount: float) -> dict[str, object]:
    """Refund an order."""
    return {"refunded": amount, "order_id": order_id}


def support_agent(model: so.models.Model) -> so.Agent:
    return so.Agent(
        name="support", model=model, instructions="You help customers.", tools=[issue_refund]
    )


@so.tool
async def lookup_order(order_id: str) -> dict[str, object]:
    """Look an order up."""
    return {"order_id": order_id, "total": 180.0}
