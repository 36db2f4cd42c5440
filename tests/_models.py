"""What the model adapters' tests share across providers: the refund tool schema, a request
builder, the refund and lookup tools of the support agent that runs end to end, and a model
that records the output cap of each call (the budget tests')."""

from __future__ import annotations

import math
from typing import Any

import signoff as so
from signoff.models import ModelRequest, ToolSpec

__all__ = [
    "REFUND_SCHEMA",
    "Capped",
    "issue_refund",
    "lookup_order",
    "request",
    "review_reads",
    "support_agent",
]

REFUND_SCHEMA = {
    "type": "object",
    "properties": {"order_id": {"type": "string"}, "amount": {"type": "number"}},
    "required": ["order_id", "amount"],
}


def request(
    *messages: so.Message,
    instructions: str = "",
    tools: list[ToolSpec] | None = None,
    max_output_tokens: int | None = None,
) -> ModelRequest:
    return ModelRequest(
        session_id="ses_test",
        agent="support",
        instructions=instructions,
        messages=list(messages) or [so.UserMessage(text="hello")],
        tools=tools or [],
        response_index=0,
        max_output_tokens=max_output_tokens,
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


class Capped:
    """A model of one's own that records the output cap of each call and answers from a list
    (raising what is an exception there); its `price_per_mtok` turns a cost budget into tokens,
    as the shipped models' does."""

    def __init__(self, *steps: so.ModelResponse | Exception, price: Any = None) -> None:
        self.steps = list(steps)
        self.caps: list[int | None] = []
        self.price_per_mtok = price

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        self.caps.append(request.max_output_tokens)
        step = self.steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def review_reads(request: ModelRequest) -> int:
    """The input tokens an `auto()` review's request is held to read before its output is capped:
    its instructions and its one message, at four bytes of UTF-8 a token, rounded up."""
    [message] = request.messages
    assert isinstance(message, so.UserMessage)
    return math.ceil(len((request.instructions + message.text).encode()) / 4)
