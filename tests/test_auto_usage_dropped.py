"""What an `auto()` review costs counts once in the session's usage also when its verdict is not
the one acted on: another guardrail denies the call, a steering message makes the drive ignore it,
the input has no JSON form to show, or the call waits behind a busy workflow call. Both stores.
"""

from __future__ import annotations

import json
from typing import Any

import signoff as so
from signoff.testing import ExecutionLog, call, scripted_agent

ALICE = so.Principal(authenticator="test", principal_id="alice")
BILLED = so.Usage(input_tokens=300, output_tokens=20, cost_usd=5.0)
TURN = so.Usage(input_tokens=10, output_tokens=2, cost_usd=0.01)


def review(kind: str) -> so.ModelResponse:
    text = json.dumps({"verdict": kind, "reason": f"{kind} it is"})
    return so.ModelResponse(text=text, usage=BILLED)


def refunds(log: ExecutionLog, reviewer: Any) -> so.Tool:
    @log.tool(approval=so.auto(reviewer))
    async def refund_charge(charge_id: str, amount: float) -> dict[str, Any]:
        """Refund a charge."""
        return {"refunded": amount}

    return refund_charge


async def test_a_review_of_a_call_a_guardrail_denies_counts(store_url: str) -> None:
    log = ExecutionLog()
    reviewer = so.models.Scripted([review("clear")])
    steps = [
        so.ModelResponse(
            tool_calls=[call("refund_charge", charge_id="ch_1", amount=40)], usage=TURN
        ),
        so.ModelResponse(text="denied", usage=TURN),
    ]
    agent = scripted_agent(
        "billing",
        steps,
        tools=[refunds(log, reviewer)],
        guardrails=[so.tool_policy(deny=["refund_charge"])],
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        assert r.status == "completed"
        assert log.count() == 0
        assert reviewer.calls == 1
        assert (await rt.state(r.session_id)).usage == TURN + TURN + BILLED
    again = scripted_agent("billing", [], tools=[refunds(ExecutionLog(), None)])
    async with so.Runtime([again], store=store_url) as rt2:
        assert (await rt2.state(r.session_id)).usage == TURN + TURN + BILLED


async def test_a_review_of_a_call_behind_a_busy_workflow_counts_once(store_url: str) -> None:
    """The reviewed call waits while a workflow call of the same response runs: it is reviewed
    once in the drive, and that review counts once."""
    log = ExecutionLog()
    reviewer = so.models.Scripted([review("caution")], repeat_last=True)

    @log.tool()
    async def plan(ctx: so.ToolContext, goal: str) -> str:
        """Plan a refund."""
        return "planned"

    steps = [
        so.ModelResponse(
            tool_calls=[
                call("plan", goal="refund"),
                call("refund_charge", charge_id="ch_1", amount=40),
            ],
            usage=TURN,
        ),
    ]
    agent = scripted_agent("billing", steps, tools=[plan, refunds(log, reviewer)])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.auto_verdict == "caution"
        assert reviewer.calls == 1
        assert (await rt.state(r.session_id)).usage == TURN + BILLED
    again = scripted_agent("billing", [], tools=[plan, refunds(ExecutionLog(), None)])
    async with so.Runtime([again], store=store_url) as rt2:
        assert (await rt2.state(r.session_id)).usage == TURN + BILLED


async def test_a_caution_held_behind_a_parked_workflow_call_is_asked_not_reviewed_again(
    store_url: str,
) -> None:
    """The reviewed call waits behind a workflow call that parks on a question: its caution
    was kept only by the drive, which ended with the park, so the drive after the answer
    reviewed it again, and a second review saying clear ran it with no person asked. The
    verdict is recorded with the first event, and the call is asked for as decided, after a
    restart too."""
    log = ExecutionLog()
    reviews: list[str] = []

    def second_opinion(conversation: Any) -> so.ModelResponse:
        """Caution on the first review, clear on any other: a reviewer that can change its mind."""
        reviews.append("caution" if not reviews else "clear")
        return review(reviews[-1])

    reviewer = so.models.Scripted([second_opinion])

    @so.tool
    async def confirm(ctx: so.ToolContext, question: str) -> str:
        """Ask the customer."""
        return (await ctx.ask(question, options=["yes", "no"])).value

    steps = [
        so.ModelResponse(
            tool_calls=[
                call("confirm", question="Refund ch_1?"),
                call("refund_charge", charge_id="ch_1", amount=40),
            ],
            usage=TURN,
        ),
        so.ModelResponse(text="done", usage=TURN),
    ]
    agent = scripted_agent("billing", steps, tools=[confirm, refunds(log, reviewer)])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        (question,) = r.pending
        assert question.kind == "question" and reviews == ["caution"]
    async with so.Runtime([agent], store=store_url) as rt:  # a restart: nothing in memory
        answer = so.InputResponse(request_id=question.id, option_id="yes")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert r.status == "waiting", r
        (approval,) = r.pending
        assert approval.kind == "tool-approval" and approval.tool_name == "refund_charge"
        assert (approval.auto_verdict, approval.auto_reason) == ("caution", "caution it is")
        assert reviews == ["caution"] and log.count() == 0
        assert (await rt.state(r.session_id)).usage == TURN + BILLED


def test_a_held_verdict_is_recorded_with_its_texts_cut() -> None:
    """A policy's error of megabytes on a held-back call went whole into the event that records
    it (5 MB on a `tool.started`), though its request cuts it to a quarter of the result bound."""
    from signoff._approval import Verdict
    from signoff._tool_calls import _held, _unheld

    huge = "x" * 5_000_000
    held = _held(Verdict("ask", error=huge, auto=("caution", huge)), 1000)
    for text in (held["error"], held["auto"][1]):
        assert len(text) < 1100 and text.endswith("[cut]"), len(text)  # as the request cuts it
    assert _unheld(held) == Verdict("ask", error=held["error"], auto=("caution", held["auto"][1]))
