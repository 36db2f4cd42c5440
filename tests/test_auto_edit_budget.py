"""The `auto()` review of an approver's edit is capped at what the session's budgets leave and
its cost counts, as the review of a model's proposal is (tests/test_auto_budget.py); with no
output token left no review is made and the edit stands, as the answer of the person a caution
would have asked. Run on both stores."""

from __future__ import annotations

import json
from typing import Any, Literal

import pytest

import signoff as so
from signoff.models import ModelRequest
from signoff.testing import ExecutionLog, call, call_tools, reply, store_contents

from ._models import review_reads

ALICE = so.Principal(authenticator="test", principal_id="alice")
BOB = so.Principal(authenticator="test", principal_id="bob")
MALLORY = so.Principal(authenticator="test", principal_id="mallory")
REVIEW = so.Usage(input_tokens=10, output_tokens=5)
CAUTION = json.dumps({"verdict": "caution", "reason": "a refund"})


class Reviewer:
    """A reviewer model of one's own: records each request's output cap, answers caution."""

    def __init__(self) -> None:
        self.caps: list[int | None] = []
        self.reads: list[int] = []

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        self.caps.append(request.max_output_tokens)
        self.reads.append(review_reads(request))
        return so.ModelResponse(text=CAUTION, usage=REVIEW)


def agent_with(
    log: ExecutionLog,
    reviewer: Reviewer,
    limits: so.Limits,
    *,
    response: Any = None,
    charges: tuple[str, ...] = ("a",),
) -> so.Agent:
    policy = so.auto(reviewer, review_edits=True)
    approval = policy if response is None else so.ApprovalSpec(request=policy, response=response)

    @log.tool(approval=approval)
    async def refund_charge(charge_id: str, amount: float) -> str:
        """Refund a charge."""
        return "refunded"

    calls = [call("refund_charge", charge_id=c, amount=180) for c in charges]
    first = call_tools(*calls, usage=so.Usage(input_tokens=100))
    return so.Agent(
        name="billing",
        model=so.models.Scripted([first, reply("done")]),
        tools=[refund_charge],
        limits=limits,
    )


def less(reads: list[int], *left: int) -> list[int]:
    """Each review's cap: what the budgets left it less its own input."""
    return [n - r for n, r in zip(left, reads, strict=True)]


def edit(*asks: so.InputRequest) -> list[so.InputResponse]:
    return [
        so.InputResponse(
            request_id=ask.id,
            option_id="approve",
            edited_input={**(ask.action.input if ask.action else {}), "amount": 150},
        )
        for ask in asks
    ]


async def test_an_edits_review_is_capped_and_counted(store_url: str) -> None:
    """max_tokens=1000; the reply spent 100, the proposals' two reviews 15 each: the first
    edit's review may write 870 tokens, the second's what the first left (855), each less its
    input, and both count. Before, they were sent uncapped and their cost dropped."""
    log, reviewer = ExecutionLog(), Reviewer()
    agent = agent_with(log, reviewer, so.Limits(max_tokens=1000), charges=("a", "b"))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        assert r.status == "waiting"
        assert (await rt.state(r.session_id)).usage.total_tokens == 130
        r = await rt.respond(r.session_id, edit(*r.pending), principal=ALICE)
        assert r.status == "completed"
        assert (await rt.state(r.session_id)).usage.total_tokens == 160
    async with so.Runtime([agent], store=store_url) as again:  # folded from the log
        assert (await again.state(r.session_id)).usage.total_tokens == 160
    assert reviewer.caps == less(reviewer.reads, 900, 885, 870, 855)
    assert [e.input["amount"] for e in log.executions] == [150.0, 150.0]


async def test_an_edit_through_a_response_policy_has_its_review_counted(store_url: str) -> None:
    """An edit the response policy allows is reviewed, and the review's cost is counted on the
    answer's `approval.candidate`, which is recorded before the settlement."""
    log, reviewer = ExecutionLog(), Reviewer()
    agent = agent_with(log, reviewer, so.Limits(max_tokens=1000), response=lambda ctx: so.Allowed())
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        [ask] = r.pending
        r = await rt.respond(r.session_id, edit(ask), principal=ALICE)
        assert r.status == "completed"
        events = [e async for e in rt.events(r.session_id, 0, follow=False)]
        [pending] = [e for e in events if e.type == "approval.candidate"]
        assert pending.data["usage"]["output_tokens"] == 5
        assert (await rt.state(r.session_id)).usage.total_tokens == 130
    assert reviewer.caps == less(reviewer.reads, 900, 885)


def only_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    who = ctx.response.principal
    return so.Allowed() if who is not None and who.principal_id == "bob" else so.Rejected("not bob")


async def test_an_edit_the_response_policy_rejects_is_not_reviewed(store_url: str) -> None:
    """The response policy judges an edited answer before its review: one it rejects is neither
    reviewed nor billed, and its refusal is recorded once, as a plain answer's is. Before, each
    repeat was reviewed, billed and recorded (3 events), so someone who may not answer could spend
    the session's budget and grow its log."""
    log, reviewer = ExecutionLog(), Reviewer()
    agent = agent_with(log, reviewer, so.Limits(max_tokens=1000), response=only_bob)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        sid, [ask] = r.session_id, r.pending
        for _ in range(3):
            r = await rt.respond(sid, edit(ask), principal=MALLORY)
            [out] = r.outcomes
            assert (r.status, out.outcome, out.applied, out.reason) == (
                "waiting",
                "rejected",
                False,
                "not bob",
            )
        events = [e async for e in rt.events(sid, 0, follow=False)]
        candidates = [e.data for e in events if e.type == "approval.candidate"]
        assert [c["outcome"] for c in candidates] == ["pending", "rejected"]
        assert not any("usage" in c or "auto_verdict" in c for c in candidates)
        assert (await rt.state(sid)).usage.total_tokens == 115
        r = await rt.respond(sid, edit(ask), principal=BOB)
        assert r.status == "completed"
        assert (await rt.state(sid)).usage.total_tokens == 130
    assert len(reviewer.caps) == 2  # the proposal's review and bob's edit's
    assert [e.input["amount"] for e in log.executions] == [150.0]


async def test_with_nothing_left_an_edit_is_not_reviewed_and_stands(store_url: str) -> None:
    """The reply spent all 100 tokens: neither the proposal nor the edit is reviewed (a review
    with no output token left says caution, which asks a person: the approver who edited it is
    that person), the call runs with the edit, and the turn then asks to raise the budget."""
    log, reviewer = ExecutionLog(), Reviewer()
    agent = agent_with(log, reviewer, so.Limits(max_tokens=100))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        [ask] = r.pending
        assert ask.auto_verdict == "failed"
        r = await rt.respond(r.session_id, edit(ask), principal=ALICE)
        assert r.status == "waiting"
        [limit] = r.pending
        assert limit.kind == "session-limit"
        assert (await rt.state(r.session_id)).usage.total_tokens == 100
    assert reviewer.caps == []
    assert [e.input["amount"] for e in log.executions] == [150.0]


async def test_an_edit_in_a_call_refused_for_another_answer_is_not_reviewed(
    store_url: str,
) -> None:
    """Every answer of a call is checked before an edit in it is reviewed: an edit sent with an
    unknown id, a bad option on another approval, or (to `generate(approvals=)`) leaving one
    open, is refused unreviewed and unbilled. Before, each refused call reviewed the edit and
    dropped what it cost: repeated, it spent past the session's budget, counting none of it."""
    log, reviewer = ExecutionLog(), Reviewer()
    agent = agent_with(log, reviewer, so.Limits(max_tokens=1000), charges=("a", "b"))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        sid, (a, b) = r.session_id, r.pending
        before = await store_contents(rt.store, sid)
        bad = [
            so.InputResponse(request_id="req_nope", option_id="approve"),
            so.InputResponse(request_id=b.id, option_id="bogus"),
        ]
        for other in bad:
            with pytest.raises((so.UnknownRequest, so.InvalidAnswer)):
                await rt.respond(sid, [*edit(a), other], principal=ALICE)
        [edited] = edit(a)
        with pytest.raises(so.PartialAnswer):
            await rt.generate(
                session_id=sid,
                approvals=[so.Decision(id=a.id, approved=True, edited_input=edited.edited_input)],
                auth=ALICE,
            )
        assert len(reviewer.caps) == 2  # the proposals' reviews only
        assert await store_contents(rt.store, sid) == before
        r = await rt.respond(sid, edit(a, b), principal=ALICE)
        assert r.status == "completed"
        assert (await rt.state(sid)).usage.total_tokens == 160
    assert len(reviewer.caps) == 4


@pytest.mark.parametrize("reviewed_first", [True, False])
async def test_an_edit_another_edits_policy_denies_bills_no_review(
    store_url: str, reviewed_first: bool
) -> None:
    """One call edits two approvals: one reviewed by `auto(review_edits=True)`, the other denied
    by its own tool's policy. The review ran and was billed before the denial refused the call,
    its cost counted nowhere: 70 repeats spent past `max_tokens` with the session counting none
    of it. The edits no review bills are checked first, so the denial comes before any review."""
    log, reviewer = ExecutionLog(), Reviewer()

    @log.tool(approval=so.auto(reviewer, review_edits=True))
    async def refund_charge(charge_id: str, amount: float) -> str:
        """Refund a charge."""
        return "refunded"

    def big_wires_denied(ctx: so.ApprovalContext) -> Literal["denied", "user-approval"]:
        return "denied" if ctx.tool_input.amount > 1000 else "user-approval"

    @log.tool(approval=so.policy(big_wires_denied))
    async def wire(to: str, amount: float) -> str:
        """Wire money."""
        return "sent"

    calls = [call("refund_charge", charge_id="a", amount=180), call("wire", to="x", amount=5)]
    first = call_tools(*calls, usage=so.Usage(input_tokens=100))
    agent = so.Agent(
        name="billing",
        model=so.models.Scripted([first, reply("done")]),
        tools=[refund_charge, wire],
        limits=so.Limits(max_tokens=1000),
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund", auth=ALICE)
        refund = next(p for p in r.pending if p.tool_name == "refund_charge")
        wired = next(p for p in r.pending if p.tool_name == "wire")
        reviews = len(reviewer.caps)
        before = await store_contents(rt.store, r.session_id)
        edit_refund = so.InputResponse(
            request_id=refund.id,
            option_id="approve",
            edited_input={"charge_id": "a", "amount": 150},
        )
        edit_wire = so.InputResponse(
            request_id=wired.id, option_id="approve", edited_input={"to": "x", "amount": 5000}
        )
        answers = [edit_refund, edit_wire] if reviewed_first else [edit_wire, edit_refund]
        for _ in range(3):
            with pytest.raises(so.InvalidAnswer, match="denies the edited input"):
                await rt.respond(r.session_id, answers, principal=ALICE)
        assert len(reviewer.caps) == reviews  # no review billed for a refused call
        assert await store_contents(rt.store, r.session_id) == before
    assert log.count() == 0
