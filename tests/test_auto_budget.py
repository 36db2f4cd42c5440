"""An `auto()` review's output is capped at what the session's budgets leave, whatever model it
uses, as a turn's own model call is (`ApprovalContext.budget_left`, less what earlier reviews of
the same reply spent, less the review's own input: its text at four bytes a token); a review cut
off there, or by its own limit, clears nothing and its cost counts. Run on both stores."""

from __future__ import annotations

import json
import math
from typing import Any

import signoff as so
from signoff.models import ModelRequest
from signoff.testing import ExecutionLog, call, call_tools, reply

from ._models import review_reads
from .fakes.llm import API_KEY, FakeLLM, Received, Reply, openai_completion

ALICE = so.Principal(authenticator="test", principal_id="alice")
CLEAR = json.dumps({"verdict": "clear", "reason": "fine"})


class Reviewer:
    """A reviewer model of one's own: records each request's output cap, answers clear."""

    def __init__(self, usage: so.Usage, price: Any = None) -> None:
        self.caps: list[int | None] = []
        self.budgeted: list[bool] = []
        self.reads: list[int] = []  # each review's input as held back: its text's bytes / 4
        self.usage = usage
        self.price_per_mtok = price

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        self.caps.append(request.max_output_tokens)
        self.budgeted.append(getattr(request, "budgeted", False))  # a model may not read it
        self.reads.append(review_reads(request))
        return so.ModelResponse(text=CLEAR, usage=self.usage)


def agent_with(
    reviewer: Any, limits: so.Limits, *steps: so.ModelResponse, instructions: str | None = None
) -> tuple[so.Agent, ExecutionLog]:
    log = ExecutionLog()

    @log.tool(approval=so.auto(reviewer, instructions=instructions))
    async def refund_charge(charge_id: str) -> str:
        """Refund a charge."""
        return "refunded"

    agent = so.Agent(
        name="billing", model=so.models.Scripted(list(steps)), tools=[refund_charge], limits=limits
    )
    return agent, log


async def test_each_review_is_capped_at_what_the_budgets_leave(store_url: str) -> None:
    """max_tokens=1000; the reply proposing two calls spent 40: the first review may write the 960
    left less its input, the second what the first (10 + 5) left, 945, less its own. Before, both
    were sent uncapped (then capped at 960 and 945, their input not held back)."""
    reviewer = Reviewer(so.Usage(input_tokens=10, output_tokens=5))
    two = call_tools(
        call("refund_charge", charge_id="a"),
        call("refund_charge", charge_id="b"),
        usage=so.Usage(input_tokens=10, output_tokens=30),
    )
    agent, log = agent_with(reviewer, so.Limits(max_tokens=1000), two, reply("done"))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund both", auth=ALICE)
        assert (r.status, log.count()) == ("completed", 2)
    first, second = reviewer.reads
    assert 100 < first == second < 200  # the default instructions, criteria, tool and input
    assert reviewer.caps == [960 - first, 945 - second]


async def test_a_cost_budget_caps_a_review_at_its_own_models_output_price(store_url: str) -> None:
    """max_cost_usd=0.001 with $0.0002 spent: the reviewer, at $1 per million input tokens and
    $20 per million output tokens, may write what the $0.0008 left buys once its input is paid
    for (40 tokens less 1/20 of one for each input token)."""
    reviewer = Reviewer(so.Usage(), price=(1.0, 20.0))
    first = call_tools(call("refund_charge", charge_id="a"), usage=so.Usage(cost_usd=0.0002))
    agent, _ = agent_with(reviewer, so.Limits(max_cost_usd=0.001), first, reply("done"))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        assert r.status == "completed"
    [read] = reviewer.reads
    assert reviewer.caps == [math.floor(round((0.0008 - read * 1e-6) / 20e-6, 6))]


async def test_a_reviewer_with_free_output_still_holds_its_input_back(store_url: str) -> None:
    """max_cost_usd=0.001 with $0.0008 left, output free: at $1 per million input tokens the
    review's input fits, so it is sent uncapped but said budgeted; at $10 per million it does
    not, so none is made and a person is asked. Before, free output left the input unchecked
    and the review unbudgeted: both were made."""
    first = call_tools(call("refund_charge", charge_id="a"), usage=so.Usage(cost_usd=0.0002))
    cheap = Reviewer(so.Usage(), price=(1.0, 0.0))
    agent, log = agent_with(cheap, so.Limits(max_cost_usd=0.001), first, reply("done"))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        assert (r.status, log.count()) == ("completed", 1)
    assert (cheap.caps, cheap.budgeted) == ([None], [True])
    dear = Reviewer(so.Usage(), price=(10.0, 0.0))
    agent, log = agent_with(dear, so.Limits(max_cost_usd=0.001), first)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        assert r.status == "waiting"
        [ask] = r.pending
        assert ask.auto_verdict == "failed" and ask.auto_reason is not None
        assert "once its input" in ask.auto_reason
    assert dear.caps == [] and log.count() == 0


async def test_a_reviews_input_is_held_back_from_what_the_budgets_leave(store_url: str) -> None:
    """max_tokens=1000 with 900 spent: 100 left pay for the review's output, but not once its
    input (its instructions, criteria and the call, well over 100 tokens) is counted: no review
    is made and a person is asked, saying so. Before, the review was sent capped at 100 and
    could pass the budget by all it read. A review whose input fits is capped below it."""
    reviewer = Reviewer(so.Usage(input_tokens=10, output_tokens=5))
    first = call_tools(call("refund_charge", charge_id="a"), usage=so.Usage(output_tokens=900))
    agent, log = agent_with(reviewer, so.Limits(max_tokens=1000), first)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        assert r.status == "waiting"
        [ask] = r.pending
        assert ask.auto_verdict == "failed" and ask.auto_reason is not None
        assert ask.auto_reason.startswith(
            "the session's budgets leave no output token for a review once its input (about "
        )
        assert (await rt.state(r.session_id)).usage.total_tokens == 900
    assert reviewer.caps == [] and log.count() == 0
    short, log = agent_with(
        reviewer, so.Limits(max_tokens=1000), first, reply("done"), instructions="Say clear."
    )
    async with so.Runtime([short], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        assert (r.status, log.count()) == ("completed", 1)
    [read] = reviewer.reads
    assert 0 < read < 100 and reviewer.caps == [100 - read]


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
    """The shipped adapter sends the cap (the 960 tokens left less the review's input) in place
    of its own max_tokens and, cut off there, raises BudgetSpent: the call goes to a person, and
    the 12 input tokens and all it wrote count in the session's usage (before, a failed review's
    cost was dropped), within the 1,000 of the budget. A review the model's own limit cut
    (`cut_off`) clears nothing either, though its text says clear."""
    with FakeLLM("openai") as fake:

        def cut(got: Received) -> Reply:  # it wrote all the cap it was sent
            body = openai_completion(
                '{"verdict": "clear", "reason": "the amo', usage=(12, got.body["max_tokens"])
            )
            body["choices"][0]["finish_reason"] = "length"
            return Reply(body)

        own = openai_completion('{"verdict": "clear"}', usage=(12, 7))
        own["choices"][0]["finish_reason"] = "length"
        fake.queue(cut, own)
        reviewer = so.models.OpenAIChat(
            "m", base_url=fake.base_url, api_key=API_KEY, max_retries=0, max_tokens=4096
        )
        first = call_tools(
            call("refund_charge", charge_id="a"), usage=so.Usage(input_tokens=30, output_tokens=10)
        )
        agent, log = agent_with(reviewer, so.Limits(max_tokens=1000), first)
        async with so.Runtime([agent], store=store_url) as rt:
            r = await rt.generate("billing", prompt="refund", auth=ALICE)
            assert r.status == "waiting"
            [ask] = r.pending
            assert ask.auto_verdict == "failed"
            capped = ask.auto_reason
            spent = (await rt.state(r.session_id)).usage.total_tokens
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
    read = math.ceil(len("".join(m["content"] for m in first_body["messages"]).encode()) / 4)
    assert 100 < read < 200
    assert first_body["max_tokens"] == 960 - read
    assert capped is not None and f"cut off at the {960 - read} output tokens" in capped
    assert spent == 40 + 12 + 960 - read
    assert second_body["max_tokens"] == 4096
