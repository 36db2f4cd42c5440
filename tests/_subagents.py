"""Helpers of the subagent tests: a support agent delegating refunds to a billing child whose
refund needs approval, a scripted step that counts its calls, and a session's events.
"""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff import _subagents
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    tool_results,
)

__all__ = [
    "ALICE",
    "Counted",
    "approve_refund_through_parent",
    "events",
    "refund_agents",
    "two_step_children",
]


ALICE = so.Principal(authenticator="okta", principal_id="alice")


async def events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


class Counted:
    """A scripted step that counts its calls and remembers what the model was shown."""

    def __init__(self, text: str) -> None:
        self.capture = Capture(reply(text))
        self.calls = 0

    def __call__(self, conversation: list[so.Message]) -> so.ModelResponse:
        self.calls += 1
        return self.capture(conversation)


def refund_agents(ran: list[dict[str, Any]], parent_step: Counted) -> tuple[so.Agent, so.Agent]:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        ran.append({"order_id": order_id, "amount": amount})
        return {"refunded": amount}

    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042", amount=180)),
            lambda conv: reply(f"Refunded: {tool_results(conv)[-1].content}"),
        ],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund order 1042")), parent_step],
        tools=[so.delegate("billing", description="Billing specialist.")],
    )
    return parent, child


def two_step_children(monkeypatch: pytest.MonkeyPatch) -> None:
    """Create children as signoff before one-write creation (d7ea7d83) did: the session alone,
    its delegated turn started by a second write (`RuntimeHost.start_child`), which a process
    could die before. A store written so is what the code for such children must still read."""
    original = _subagents.RuntimeHost.create_child

    async def create_child(host: _subagents.RuntimeHost, *args: Any, **kwargs: Any) -> str:
        return await original(host, *args, **{**kwargs, "task": None})

    monkeypatch.setattr(_subagents.RuntimeHost, "create_child", create_child)


async def approve_refund_through_parent(
    rt: so.Runtime,
    session_id: str,
    mirror: so.InputRequest,
    ran: list[dict[str, Any]],
    after: Counted,
) -> None:
    """Approve the child's refund (`refund_agents`) through its mirror on the parent: the refund
    runs once and the parent's model reads the child's text as the delegate call's result."""
    done = await rt.respond(
        session_id, [so.InputResponse(request_id=mirror.id, option_id="approve")], principal=ALICE
    )
    assert (done.status, done.text) == ("completed", "The refund went through.")
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1
    [result] = tool_results(after.capture.last)
    assert result.content == "Refunded: {'refunded': 180.0}"
