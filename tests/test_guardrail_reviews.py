"""A guardrail may review a call with a model (an `auto()` of its own): what that review cost
counts in the session's usage and budgets whatever the guardrail decides, as the tool's own
policy's does, and a later guardrail's review may spend only what is left. Run on both stores."""

from __future__ import annotations

import json

import signoff as so
from signoff.models import ModelRequest
from signoff.testing import ExecutionLog, call, call_tools, reply

from ._models import review_reads

ALICE = so.Principal(authenticator="test", principal_id="alice")


class Reviewer:
    """A reviewer model of one's own: answers `verdict` at 10 input and 5 output tokens, and
    records each request's output cap."""

    def __init__(self, verdict: str) -> None:
        self.verdict = verdict
        self.caps: list[int | None] = []
        self.reads: list[int] = []

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        self.caps.append(request.max_output_tokens)
        self.reads.append(review_reads(request))
        text = json.dumps({"verdict": self.verdict, "reason": "looked"})
        return so.ModelResponse(text=text, usage=so.Usage(input_tokens=10, output_tokens=5))


class Reviewing(so.Guardrail):
    """A guardrail that has a model review every call (`auto()`) and says what it said."""

    def __init__(self, reviewer: Reviewer) -> None:
        self.policy = so.auto(reviewer)

    async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
        return await self.policy.decide(ctx)


async def test_a_guardrails_review_that_asks_a_person_counts(store_url: str) -> None:
    """The first guardrail's review says caution (a person is asked), the second's clear: both
    cost 15 tokens, and the second may write what the reply (40) and the first review left of
    1,000, 945, less its input (the first 960 less its own). Before, the first's cost was dropped
    with its verdict (the session's usage 55, not 70) and the second was capped at 960."""
    cautious, clearing = Reviewer("caution"), Reviewer("clear")
    log = ExecutionLog()

    @log.tool
    async def refund_charge(charge_id: str) -> str:
        """Refund a charge."""
        return "refunded"

    proposal = call_tools(
        call("refund_charge", charge_id="a"), usage=so.Usage(input_tokens=10, output_tokens=30)
    )
    agent = so.Agent(
        name="billing",
        model=so.models.Scripted([proposal, reply("done")]),
        tools=[refund_charge],
        guardrails=[Reviewing(cautious), Reviewing(clearing)],
        limits=so.Limits(max_tokens=1000),
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund it", auth=ALICE)
        assert (r.status, log.count()) == ("waiting", 0)
        usage = (await rt.state(r.session_id)).usage
    assert (usage.input_tokens, usage.output_tokens) == (30, 40)
    [read] = cautious.reads
    assert clearing.reads == [read]
    assert (cautious.caps, clearing.caps) == ([960 - read], [945 - read])
