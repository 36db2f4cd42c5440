"""A call whose body runs again (`_tool_calls`): resumed after its drive was cut short, or once
the question it parked on is answered. The re-run tells the model what the first run would have
(an approval policy's `so.Approved` reason)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import signoff as so
from signoff.testing import Capture, call, call_tools, reply, scripted_agent, tool_results

from ._steps import closed_mid_call

_WHY = "small refund, auto-approved"
_NOTE = {"approved": True, "by": "policy", "reason": _WHY}


async def test_a_policys_approved_reason_reaches_the_model_when_a_cut_short_call_resumes(
    store_url: str,
) -> None:
    """The note of an `so.Approved(reason)` was rebuilt on a re-run only from a person's
    decision: a call a policy let run, cut short in its body by `Runtime.close` and resumed by
    another runtime, gave the model its bare result, not the reason beside it as the turn run
    through did."""
    runs: list[int] = []
    started = threading.Event()
    turn: list[asyncio.Task[so.GenerateResult]] = []

    @so.tool(approval=lambda input: so.Approved(_WHY))
    async def refund(amount: int) -> dict[str, int]:
        """Refund an amount."""
        runs.append(amount)
        if len(runs) == 1:
            started.set()
            await asyncio.sleep(3600)  # cut short by the close
        return {"refunded": amount}

    def agent(seen: Capture) -> so.Agent:
        return scripted_agent("a", [call_tools(call("refund", amount=5)), seen], tools=[refund])

    rt = so.Runtime([agent(Capture(reply("ok")))], store=store_url, lease_ttl=600)
    sid = await closed_mid_call(rt, "go", started, turn)
    seen = Capture(reply("ok"))
    async with so.Runtime([agent(seen)], store=store_url, lease_ttl=600) as again:
        r = await again.generate(session_id=sid)
        assert r.status == "completed", r
        events = [e async for e in again.events(sid, follow=False)]
    [result] = tool_results(seen.last)
    assert result.content == {"result": {"refunded": 5}, "approval": _NOTE}
    assert runs == [5, 5]
    [started_event] = [e for e in events if e.type == "tool.started"]
    assert started_event.data["policy_reason"] == _WHY  # recorded once, read back


async def test_a_policys_approved_reason_reaches_the_model_after_the_call_asked(
    store_url: str,
) -> None:
    """A workflow call a policy let run parks on `ctx.ask` and runs again once answered: its
    result carries the policy's reason as it would have without the question."""

    @so.tool(approval=lambda input: so.Approved(_WHY))
    async def refund(ctx: so.ToolContext, amount: int) -> dict[str, Any]:
        """Refund an amount, once the customer confirms."""
        answer = await ctx.ask(f"Refund {amount}?", options=["yes", "no"])
        return {"refunded": amount, "answer": answer.value}

    seen = Capture(reply("ok"))
    agent = scripted_agent("a", [call_tools(call("refund", amount=5)), seen], tools=[refund])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        [question] = r.pending
        answer = so.InputResponse(request_id=question.id, option_id="yes")
        r = await rt.respond(r.session_id, [answer])
        assert r.status == "completed", r
    [result] = tool_results(seen.last)
    assert result.content == {"result": {"refunded": 5, "answer": "yes"}, "approval": _NOTE}
