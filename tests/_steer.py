"""The follow-up message tests' principals, refund and plan agents and helpers: the texts and
events a session holds, and the tails its log ends with once a refund was approved or denied.
"""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    scripted_agent,
)

__all__ = [
    "ALICE",
    "APPROVED_TAIL",
    "BOB",
    "DENIED_TAIL",
    "answered_first",
    "events",
    "PACKS",
    "plan_agent",
    "refund_agent",
    "refund_tool",
    "texts",
]


ALICE = so.Principal(authenticator="okta", principal_id="alice")
BOB = so.Principal(authenticator="okta", principal_id="bob", principal_type="user")


PACKS = [
    {"label": "Three-pack", "description": "Three shirts."},
    {"label": "Six-pack", "description": "Six shirts."},
]


async def events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


def texts(conversation: list[so.Message]) -> list[tuple[str, Any]]:
    """(kind, text or tool result) for each message the model saw."""
    out: list[tuple[str, Any]] = []
    for m in conversation:
        if isinstance(m, so.ToolResultMessage):
            out.append(("tool", m.content))
        else:
            out.append((m.kind, m.text))
    return out


def refund_tool(log: ExecutionLog) -> so.Tool:
    @log.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": amount, "order_id": order_id}

    return issue_refund


def refund_agent(log: ExecutionLog, *steps: Any) -> so.Agent:
    first = call_tools(call("issue_refund", call_id="r1", order_id="1042", amount=180))
    return scripted_agent("support", [first, *steps], tools=[refund_tool(log)])


APPROVED_TAIL = [
    "input.requested tool-approval:issue_refund",
    "turn.waiting",
    "approval.settled approve",
    "input.resolved approved",
    "tool.started issue_refund",
    "tool.completed issue_refund ok",
    "model.completed",
    "turn.completed",
    "session.waiting",
]


DENIED_TAIL = [
    "input.requested tool-approval:issue_refund",
    "turn.waiting",
    "approval.settled cancel",
    "input.resolved cancelled",
    "tool.completed issue_refund denied",
    "model.completed",
    "turn.completed",
    "session.waiting",
]


def plan_agent(seen: Capture, *more: Any) -> so.Agent:
    @so.tool
    async def pick_plan(ctx: so.ToolContext) -> str:
        """Choose a plan (options only)."""
        a = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
        return a.value

    return scripted_agent(
        "sales", [call_tools(call("pick_plan", call_id="p1")), seen, *more], tools=[pick_plan]
    )


def answered_first(
    monkeypatch: pytest.MonkeyPatch,
    rt: so.Runtime,
    request_id: str,
    option_id: str,
    principal: so.Principal,
) -> None:
    """Have `principal` answer `request_id` with `option_id` (not resuming) between a message's
    check and its own answer: the message's answer then loses to this one."""
    settle = so.Runtime._settle
    raced: list[bool] = []

    async def racing(runtime: so.Runtime, session_id: str, answers: Any, *a: Any, **k: Any) -> Any:
        if not raced:
            raced.append(True)
            answer = so.InputResponse(request_id=request_id, option_id=option_id)
            await rt.respond(session_id, [answer], principal=principal, resume=False)
        return await settle(runtime, session_id, answers, *a, **k)

    monkeypatch.setattr(so.Runtime, "_settle", racing)
