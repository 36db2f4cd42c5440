"""How a call's body ended, as `_call_ends` records it: approvals asked for by parallel branches
of one body (`signal_in`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import signoff as so
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)


async def test_approvals_two_task_group_branches_ask_for_are_refused(tmp_path: Path) -> None:
    """Each branch asked with its own payload: the first alone was asked, the other dropped
    unseen, and its decision, the call's result, read as a decision on both (an approved wire
    taken for an approved deletion). Now nobody is asked and the model reads an error naming
    every payload; the turn goes on."""

    @so.tool
    async def two(ctx: so.ToolContext) -> str:
        """Wire money and delete users."""

        async def wire() -> None:
            ctx.request_approval({"wire": 1000})

        async def delete() -> None:
            raise so.ApprovalRequired({"delete": "all users"}, call_id=ctx.call_id)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(wire())
            tg.create_task(delete())
        return "done"

    seen = Capture(reply("Sorry."))
    agent = scripted_agent("ops", [call_tools(call("two")), seen], tools=[two])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="go")
        assert (r.status, r.pending) == ("completed", []), r
    [result] = tool_results(seen.last)
    assert result.is_error
    error = result.content["error"]
    assert error.startswith("UsageError: the tool asked for 2 approvals at once"), error
    assert "{'wire': 1000}" in error and "{'delete': 'all users'}" in error


async def test_one_approval_a_task_group_branch_asks_for_is_asked(tmp_path: Path) -> None:
    """What stays: one branch's approval is the call's, asked with its payload."""

    @so.tool
    async def one(ctx: so.ToolContext) -> str:
        """Wire money."""

        async def wire() -> None:
            ctx.request_approval({"wire": 1000})

        async def look() -> None:
            await asyncio.sleep(0)

        async with asyncio.TaskGroup() as tg:
            tg.create_task(wire())
            tg.create_task(look())
        return "done"

    agent = scripted_agent("ops", [call_tools(call("one")), reply("ok")], tools=[one])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="go")
        assert [(p.kind, p.payload) for p in r.pending] == [("tool-approval", {"wire": 1000})]
