"""Deciding a turn's tool calls (`_tool_calls`): the strictest of the tool's policy and the
agent's guardrails decides, and each call sees the requests opened before it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

ALICE = so.Principal(authenticator="test", principal_id="alice")


@pytest.mark.parametrize(
    ("approval", "guardrail"),
    [
        (so.always(), so.tool_policy(deny=["refund"])),
        (
            so.policy(lambda ctx: so.Denied("over the limit")),
            so.tool_policy(require_approval=["refund"]),
        ),
    ],
    ids=["guardrail-denies-policy-asks", "policy-denies-guardrail-asks"],
)
async def test_a_deny_outranks_an_ask_from_either_side(
    tmp_path: Path, approval: Any, guardrail: so.Guardrail
) -> None:
    """Deny beats ask, whichever of the tool's policy and a guardrail says it: the call is
    denied at once, no person is asked and the body never runs."""
    log = ExecutionLog()

    @log.tool(approval=approval)
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    seen = Capture(reply("ok"))
    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), seen],
        tools=[refund],
        guardrails=[guardrail],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed" and r.pending == []
    assert log.count() == 0
    (result,) = tool_results(seen.last)
    assert result.is_error and result.content["denied"] is True


async def test_a_policy_sees_the_approvals_asked_earlier_in_the_same_response(
    tmp_path: Path,
) -> None:
    """`ApprovalContext.pending_tools` holds the tools already waiting on a person, those asked
    for by earlier calls of the same model response included."""
    seen: list[frozenset[str]] = []

    def ask(ctx: so.ApprovalContext) -> so.ApprovalStatus:
        seen.append(ctx.pending_tools)
        return "user-approval"

    @so.tool(approval=ask)
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1"), call("refund", order_id="2")), reply("ok")],
        tools=[refund],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "waiting" and len(r.pending) == 2
    assert seen == [frozenset(), frozenset({"refund"})]


async def test_a_reason_given_with_an_approval_reaches_the_model_beside_the_result(
    tmp_path: Path,
) -> None:
    """The model hears why a person approved: the result is wrapped with who approved and the
    reason they gave."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    seen = Capture(reply("ok"))
    agent = scripted_agent("a", [call_tools(call("refund", order_id="1")), seen], tools=[refund])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        approve = so.Decision(id=r.pending[0].id, approved=True, reason="a known customer")
        done = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        assert done.status == "completed"
    (result,) = tool_results(seen.last)
    approval = {"approved": True, "by": "alice", "reason": "a known customer"}
    assert result.content == {"result": "refunded", "approval": approval}


async def test_a_tool_errors_long_message_is_cut_to_a_quarter_of_its_result_bound(
    tmp_path: Path,
) -> None:
    """A tool's error message longer than a quarter of the tool's result bound is recorded cut
    to that quarter, not whole; one within it is kept as it is."""

    @so.tool(max_result_bytes=4000)
    async def fetch(size: int) -> str:
        """Fetch."""
        raise ValueError("x" * size)

    seen = Capture(reply("ok"))
    calls = call_tools(call("fetch", size=900), call("fetch", size=2000))
    agent = scripted_agent("a", [calls, seen], tools=[fetch])
    async with sqlite_runtime(tmp_path, agent) as rt:
        assert (await rt.generate("a", prompt="go")).status == "completed"
    kept, cut = (r.content["error"] for r in tool_results(seen.last))
    assert kept == "ValueError: " + "x" * 900
    assert cut == ("ValueError: " + "x" * 2000)[:1000] + " [cut]"
