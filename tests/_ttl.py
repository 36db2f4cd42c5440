"""The agent the expiry tests share: one approval-gated tool, sessions that expire 60 s after
their last event."""

from __future__ import annotations

import signoff as so


def ttl_agent(*, repeat_last: bool = False) -> so.Agent:
    """Agent `desk`: every turn proposes `reset_password`, which needs an approval; its sessions
    expire 60 s after their last event (`Limits(ttl=60)`)."""

    @so.tool(approval=so.always())
    async def reset_password(email: str) -> str:
        """Reset a password."""
        return "reset"

    call = so.ToolCall(name="reset_password", input={"email": "a@example.com"})
    return so.Agent(
        name="desk",
        model=so.models.Scripted([so.ModelResponse(tool_calls=[call])], repeat_last=repeat_last),
        tools=[reset_password],
        limits=so.Limits(ttl=60),
    )
