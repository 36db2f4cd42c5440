"""The runtime state machine's agent (tools that count their runs, a model that follows the
user's plan) and its model of sessions and requests (tests/test_properties.py).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypeVar

import signoff as so
from signoff._types import Message
from signoff.testing import call, call_tools, reply

__all__ = [
    "AGENT",
    "ANSWERED_ELSEWHERE",
    "AUDITED",
    "REASON",
    "Request",
    "Runs",
    "SHIPPING",
    "Session",
    "T",
    "TOOLS",
    "make_agent",
    "prompt",
]


T = TypeVar("T")

AGENT = "shop"
TOOLS = ("refund", "ship", "note")
SHIPPING = [{"id": "std", "label": "Standard"}, {"id": "exp", "label": "Express delivery"}]
ANSWERED_ELSEWHERE = {"approved", "cancelled", "answered"}  # outcomes a person's answer records
AUDITED = {
    "input.requested",
    "approval.candidate",
    "approval.settled",
    "input.resolved",
    "tool.started",
    "tool.completed",
    "turn.cancelled",
}
"""The event types the audit trail records (docs/audit.md)."""


# -- the agent: tools that count their runs, and a model that follows the user's plan ----------


@dataclass
class Runs:
    """Every time a tool body got past its approval and questions, keyed by idempotency key."""

    count: Counter[str] = field(default_factory=Counter)
    where: dict[str, tuple[str, str, str]] = field(default_factory=dict)  # key -> sid, call, tool

    def ran(self, ctx: so.ToolContext) -> None:
        key = ctx.idempotency_key()
        self.count[key] += 1
        self.where[key] = (ctx.session.id, ctx.call_id, ctx.tool_name)


REASON = " ".join(
    f"line {i}: the parcel was opened and item {i * 5 % 11} is missing" for i in range(12)
)
"""A refund's long reason makes its approval request be stored on the model's response, so the
machine also reads back rows that need the one before them."""


def make_agent(runs: Runs) -> so.Agent:
    @so.tool(approval=so.always())
    async def refund(ctx: so.ToolContext, order: str, reason: str) -> dict[str, str]:
        """Refund an order."""
        runs.ran(ctx)
        return {"refunded": order}

    @so.tool
    async def ship(ctx: so.ToolContext, order: str) -> dict[str, str | None]:
        """Ship an order the way the customer picks."""
        answer = await ctx.ask("How should we ship?", options=SHIPPING, allow_text=False)
        runs.ran(ctx)
        return {"shipped": order, "by": answer.option_id}

    @so.tool
    async def note(ctx: so.ToolContext, text: str) -> dict[str, str]:
        """Write a note."""
        runs.ran(ctx)
        return {"noted": text}

    def brain(messages: list[Message]) -> so.ModelResponse:
        last = messages[-1]
        if isinstance(last, so.UserMessage):
            turn = sum(isinstance(m, so.UserMessage) for m in messages)
            if not last.text.startswith("plan:"):
                return reply("noted")
            plan = last.text.split(":", 1)[1].split()
            calls = [
                call(
                    name,
                    call_id=f"t{turn}c{i}",
                    **({"text": "hi"} if name == "note" else {"order": f"{turn}"}),
                    **({"reason": REASON} if name == "refund" else {}),
                )
                for i, name in enumerate(plan)
            ]
            return call_tools(*calls) if calls else reply("nothing to do")
        done = [m for m in messages if isinstance(m, so.ToolResultMessage)]
        return reply(f"done: {len(done)} results")

    return so.Agent(
        name=AGENT, model=so.models.Scripted([brain], repeat_last=True), tools=[refund, ship, note]
    )


def prompt(plan: list[str]) -> str:
    return "plan:" + " ".join(plan)


# -- the model of what must be true ---------------------------------------------------------------


@dataclass
class Request:
    id: str
    session_id: str
    kind: str
    tool: str | None
    answer: dict[str, Any] | None = None  # how it was settled (to repeat or contradict it)
    outcome: str | None = None  # None while pending


@dataclass
class Session:
    id: str
    status: str = "idle"
    events: list[dict[str, Any]] = field(default_factory=list)  # every event seen so far
    plans: list[list[str]] = field(default_factory=list)
    turns: list[str] = field(default_factory=list)  # its turns' ids, the current one last
