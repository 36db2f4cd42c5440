"""An `auto()` review's output is capped at what the session's budgets leave, whatever model it
uses, as a turn's own model call is (`ApprovalContext.budget_left`, less what earlier reviews of
the same reply spent); a review cut off there, or by its own limit, clears nothing and its cost
counts. Run on both stores."""

from __future__ import annotations

import json
from typing import Any

import signoff as so
from signoff.models import ModelRequest
from signoff.testing import ExecutionLog, call, call_tools, reply

from .fakes.llm import API_KEY, FakeLLM, openai_completion

ALICE = so.Principal(authenticator="test", principal_id="alice")
CLEAR = json.dumps({"verdict": "clear", "reason": "fine"})


class Reviewer:
    """A reviewer model of one's own: records each request's output cap, answers clear."""

    def __init__(self, usage: so.Usage, price: Any = None) -> None:
        self.caps: list[int | None] = []
        self.usage = usage
        self.price_per_mtok = price

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        self.caps.append(request.max_output_tokens)
        return so.ModelResponse(text=CLEAR, usage=self.usage)


def agent_with(
    reviewer: Any, limits: so.Limits, *steps: so.ModelResponse
) -> tuple[so.Agent, ExecutionLog]:
    log = ExecutionLog()

    @log.tool(approval=so.auto(reviewer))
    async def refund_charge(charge_id: str) -> str:
        """Refund a charge."""
        return "refunded"

    agent = so.Agent(
        name="billing", model=so.models.Scripted(list(steps)), tools=[refund_charge], limits=limits
    )
    return agent, log


async def test_each_review_is_capped_at_what_the_budgets_leave(store_url: str) -> None:
    """max_tokens=100; the reply proposing two calls spent 40: the first review may write 60
    tokens, the second what the first (10 + 5) left, 45. Before, both were sent uncapped."""
    reviewer = Reviewer(so.Usage(input_tokens=10, output_tokens=5))
    two = call_tools(
        call("refund_charge", charge_id="a"),
        call("refund_charge", charge_id="b"),
        usage=so.Usage(input_tokens=10, output_tokens=30),
    )
    agent, log = agent_with(reviewer, so.Limits(max_tokens=100), two, reply("done"))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund both", auth=ALICE)
        assert (r.status, log.count()) == ("completed", 2)
    assert reviewer.caps == [60, 45]


async def test_a_cost_budget_caps_a_review_at_its_own_models_output_price(store_url: str) -> None:
    """max_cost_usd=0.001 with $0.0002 spent: the reviewer, at $20 per million output tokens,
    may write 40 tokens."""
    reviewer = Reviewer(so.Usage(), price=(1.0, 20.0))
    first = call_tools(call("refund_charge", charge_id="a"), usage=so.Usage(cost_usd=0.0002))
    agent, _ = agent_with(reviewer, so.Limits(max_cost_usd=0.001), first, reply("done"))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        assert r.status == "completed"
    assert reviewer.caps == [40]


async def test_no_output_token_left_asks_a_person_without_a_review(store_url: str) -> None:
    reviewer = Reviewer(so.Usage())
    first = call_tools(call("refund_charge", charge_id="a"), usage=so.Usage(input_tokens=100))
    agent, log = agent_with(reviewer, so.Limits(max_tokens=100), first)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        assert r.status == "waiting"
        [ask] = r.pending
        assert (ask.kind, ask.auto_verdict) == ("tool-approval", "failed")
        assert ask.auto_reason == "the session's budgets leave no output token for a review"
    assert reviewer.caps == [] and log.count() == 0


async def test_an_openai_review_cut_off_at_the_cap_clears_nothing_and_counts(
    store_url: str,
) -> None:
    """The shipped adapter sends the cap (60) in place of its own max_tokens and, cut off there,
    raises BudgetSpent: the call goes to a person, and the 12 + 60 tokens it cost count in the
    session's usage (before, a failed review's cost was dropped). A review the model's own limit
    cut (`cut_off`) clears nothing either, though its text says clear."""
    with FakeLLM("openai") as fake:
        cut = openai_completion('{"verdict": "clear", "reason": "the amo', usage=(12, 60))
        cut["choices"][0]["finish_reason"] = "length"
        own = openai_completion('{"verdict": "clear"}', usage=(12, 7))
        own["choices"][0]["finish_reason"] = "length"
        fake.queue(cut, own)
        reviewer = so.models.OpenAIChat(
            "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, max_tokens=4096
        )
        first = call_tools(
            call("refund_charge", charge_id="a"), usage=so.Usage(input_tokens=30, output_tokens=10)
        )
        agent, log = agent_with(reviewer, so.Limits(max_tokens=100), first)
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("billing", prompt="refund", auth=ALICE)
            assert r.status == "waiting"
            [ask] = r.pending
            assert ask.auto_verdict == "failed"
            assert (
                ask.auto_reason is not None and "cut off at the 60 output tokens" in ask.auto_reason
            )
            assert (await rt.state(r.session_id)).usage.total_tokens == 40 + 72
        unbounded, _ = agent_with(reviewer, so.Limits(), first)
        async with so.Runtime([unbounded], store="sqlite:///:memory:") as rt:
            r = await rt.generate("billing", prompt="refund", auth=ALICE)
            [ask] = r.pending
            assert (ask.auto_verdict, ask.auto_reason) == (
                "failed",
                "the review was cut off (max_tokens)",
            )
        await reviewer.aclose()
    assert log.count() == 0
    first_body, second_body = fake.bodies
    assert first_body["max_tokens"] == 60
    assert second_body["max_tokens"] == 4096
