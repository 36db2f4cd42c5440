"""The edit tests' people, refund agent and the approval they are asked for (shared by
tests/test_edits.py and tests/test_edits_binding.py).
"""

from __future__ import annotations

from typing import Any

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
)

__all__ = ["ALICE", "BOB", "CAROL", "asked", "events_of", "refund_agent"]


ALICE = so.Principal(authenticator="sso", principal_id="alice")
BOB = so.Principal(authenticator="sso", principal_id="bob")
CAROL = so.Principal(authenticator="sso", principal_id="carol")


def refund_agent(
    log: ExecutionLog,
    approval: Any = None,
    *calls: so.ToolCall,
    seen: Capture | None = None,
) -> so.Agent:
    @log.tool(approval=approval if approval is not None else so.always())
    async def issue_refund(order_id: str, amount: float, note: str = "") -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": amount, "order": order_id}

    if not calls:
        calls = (call("issue_refund", order_id="1042", amount=180),)
    return scripted_agent(
        "support", [call_tools(*calls), seen or reply("done")], tools=[issue_refund]
    )


async def asked(rt: so.Runtime, auth: so.Principal = ALICE) -> tuple[str, so.InputRequest, int]:
    r = await rt.generate("support", prompt="refund 1042", auth=auth)
    assert r.status == "waiting"
    req = r.pending[0]
    head = await rt.store.head(r.session_id)
    assert head is not None
    return r.session_id, req, head


async def events_of(rt: so.Runtime, session_id: str, after: int = 0) -> list[so.Event]:
    return [e async for e in rt.events(session_id, after, follow=False)]
