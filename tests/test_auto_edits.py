"""An approver's edit of a call `auto()` sent to a person: a review of it can only clear or
caution, and either way the edit stands (a caution asks a person, and the approver is one), so
by default it is not reviewed and costs nothing; `auto(review_edits=True)` reviews it and records
the verdict and reason with the approval (`approval.settled`, or the answer's pending
`approval.candidate` under a response policy), where the audit trail shows them. Run on both
stores."""

from __future__ import annotations

import json
from typing import Any

import pytest

import signoff as so
from signoff.models import ModelRequest
from signoff.testing import ExecutionLog, ManualClock, call, call_tools, reply

ALICE = so.Principal(authenticator="test", principal_id="alice")
REVIEW = so.Usage(input_tokens=10, output_tokens=5, cost_usd=0.5)
TURN = so.Usage(input_tokens=100, output_tokens=20)


class Reviewer:
    """A reviewer model of one's own: cautions on every call and on an amount over 100 says
    why, recording the input of each review."""

    def __init__(self) -> None:
        self.reviewed: list[str] = []

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        [message] = request.messages
        assert isinstance(message, so.UserMessage)
        self.reviewed.append(message.text)
        big = '"amount": 5000' in message.text
        reason = "the edit raised the refund to 5000" if big else "a refund"
        return so.ModelResponse(
            text=json.dumps({"verdict": "caution", "reason": reason}), usage=REVIEW
        )


def agent_with(
    log: ExecutionLog,
    policy: so.ApprovalPolicy,
    response: Any = None,
    limits: so.Limits | None = None,
    expires_in: float | None = None,
) -> so.Agent:
    approval: Any = policy
    if response is not None or expires_in is not None:
        approval = so.ApprovalSpec(request=policy, response=response, expires_in=expires_in)

    @log.tool(approval=approval)
    async def refund_charge(charge_id: str, amount: float) -> str:
        """Refund a charge."""
        return "refunded"

    proposal = call_tools(call("refund_charge", charge_id="a", amount=50), usage=TURN)
    return so.Agent(
        name="billing",
        model=so.models.Scripted([proposal, reply("done", usage=TURN)]),
        tools=[refund_charge],
        limits=limits,
    )


def raised(ask: so.InputRequest) -> list[so.InputResponse]:
    """The approver approves with the amount raised to 5000."""
    edited = {**(ask.action.input if ask.action else {}), "amount": 5000}
    return [so.InputResponse(request_id=ask.id, option_id="approve", edited_input=edited)]


async def test_an_edit_is_not_reviewed_unless_asked(store_url: str) -> None:
    """The proposal is reviewed (a person is asked); the approver's edit is not, and nothing but
    the proposal's review is counted. Before, the edit was reviewed too and its $0.50 counted,
    though clear or caution the edit ran all the same."""
    log, reviewer = ExecutionLog(), Reviewer()
    async with so.Runtime([agent_with(log, so.auto(reviewer))], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund a", auth=ALICE)
        [ask] = r.pending
        assert ask.auto_verdict == "caution"
        r = await rt.respond(r.session_id, raised(ask), principal=ALICE)
        assert r.status == "completed"
        assert (await rt.state(r.session_id)).usage == TURN + TURN + REVIEW
        [settled] = [e for e in await rt.audit(r.session_id) if e.type == "approval.settled"]
        assert "auto_verdict" not in settled.data and "usage" not in settled.data
    assert len(reviewer.reviewed) == 1 and '"amount": 50' in reviewer.reviewed[0]
    assert [e.input["amount"] for e in log.executions] == [5000.0]


async def test_a_reviewed_edits_verdict_is_in_the_trail(store_url: str) -> None:
    """With `review_edits=True` the edit is reviewed, its cost counts, and its caution and reason
    are on the approval's `approval.settled`, in the audit trail; the edit still runs, as the
    approver's. Before, the verdict was recorded nowhere: the review only cost."""
    log, reviewer = ExecutionLog(), Reviewer()
    policy = so.auto(reviewer, review_edits=True)
    async with so.Runtime([agent_with(log, policy)], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund a", auth=ALICE)
        [ask] = r.pending
        r = await rt.respond(r.session_id, raised(ask), principal=ALICE)
        assert r.status == "completed"
        assert (await rt.state(r.session_id)).usage == TURN + TURN + REVIEW + REVIEW
        [settled] = [e for e in await rt.audit(r.session_id) if e.type == "approval.settled"]
        assert (settled.data["auto_verdict"], settled.data["auto_reason"]) == (
            "caution",
            "the edit raised the refund to 5000",
        )
        assert await rt.verify_audit() == []
    assert len(reviewer.reviewed) == 2
    assert [e.input["amount"] for e in log.executions] == [5000.0]


async def test_a_reviewed_edit_under_a_response_policy_has_its_verdict_on_the_candidate(
    store_url: str,
) -> None:
    """Under a response policy the answer is recorded first as a pending `approval.candidate`:
    the review's verdict is there, and on the `approval.settled` that ends it."""
    log, reviewer = ExecutionLog(), Reviewer()
    policy = so.auto(reviewer, review_edits=True)
    agent = agent_with(log, policy, response=lambda ctx: so.Allowed())
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund a", auth=ALICE)
        [ask] = r.pending
        r = await rt.respond(r.session_id, raised(ask), principal=ALICE)
        assert r.status == "completed"
        trail = await rt.audit(r.session_id)
        [pending] = [
            e
            for e in trail
            if e.type == "approval.candidate" and e.data.get("outcome") == "pending"
        ]
        [settled] = [e for e in trail if e.type == "approval.settled"]
        for entry in (pending, settled):
            assert entry.data["auto_verdict"] == "caution"
            assert entry.data["auto_reason"] == "the edit raised the refund to 5000"
    assert [e.input["amount"] for e in log.executions] == [5000.0]


class SlowReviewer(Reviewer):
    """A `Reviewer` whose review of an edit takes `seconds` (two minutes) of `clock`."""

    def __init__(self, clock: ManualClock, seconds: float = 120) -> None:
        super().__init__()
        self.clock, self.seconds = clock, seconds

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        verdict = await super().complete(request)
        if '"amount": 5000' in self.reviewed[-1]:
            self.clock.advance(self.seconds)
        return verdict


@pytest.mark.parametrize("response", [False, True], ids=["alone", "with a response policy"])
async def test_a_review_of_an_edit_the_ttl_overtakes_is_billed_and_settles_nothing(
    store_url: str, response: bool
) -> None:
    """The session's TTL passes while the edit is reviewed: the answer is refused with
    `SessionExpired` and the call does not run, and the review is counted all the same. Under
    a response policy the answer, recorded after the review, renewed the TTL and settled."""
    clock = ManualClock()
    log, reviewer = ExecutionLog(), SlowReviewer(clock)
    allowed = (lambda ctx: so.Allowed()) if response else None
    agent = agent_with(log, so.auto(reviewer, review_edits=True), allowed, so.Limits(ttl=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await rt.generate("billing", prompt="refund a", auth=ALICE)
        [ask] = r.pending
        with pytest.raises(so.SessionExpired):
            await rt.respond(r.session_id, raised(ask), principal=ALICE)
        state = await rt.state(r.session_id)
        assert state.lapsed
        assert state.usage == TURN + REVIEW + REVIEW
    assert len(reviewer.reviewed) == 2
    assert log.executions == []


@pytest.mark.parametrize(
    "responses", [(True, True), (False, True)], ids=["both", "one under a response policy"]
)
async def test_every_review_of_a_call_the_ttl_overtakes_is_billed(
    store_url: str, responses: tuple[bool, bool]
) -> None:
    """Two edits in one call, each reviewed for 40 s, the TTL 60 s: the answers are refused with
    `SessionExpired` and both reviews are counted. Before, only the first was: the second was
    under a response policy, whose answer's record the expiry of the first took the place of."""
    clock = ManualClock()
    log, reviewer = ExecutionLog(), SlowReviewer(clock, 40)
    policy = so.auto(reviewer, review_edits=True)
    tools = []
    for name, response in zip(("refund_a", "refund_b"), responses, strict=True):
        allowed = so.ApprovalSpec(request=policy, response=lambda ctx: so.Allowed())

        @log.tool(name=name, approval=allowed if response else policy)
        async def refund(charge_id: str, amount: float) -> str:
            """Refund a charge."""
            return "refunded"

        tools.append(refund)
    proposal = call_tools(
        call("refund_a", charge_id="a", amount=50),
        call("refund_b", charge_id="b", amount=50),
        usage=TURN,
    )
    model = so.models.Scripted([proposal, reply("done", usage=TURN)])
    agent = so.Agent(name="billing", model=model, tools=tools, limits=so.Limits(ttl=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await rt.generate("billing", prompt="refund a and b", auth=ALICE)
        answers = [a for ask in r.pending for a in raised(ask)]
        with pytest.raises(so.SessionExpired):
            await rt.respond(r.session_id, answers, principal=ALICE)
        state = await rt.state(r.session_id)
        assert state.lapsed
        assert state.usage == TURN + REVIEW + REVIEW + REVIEW + REVIEW
    assert len(reviewer.reviewed) == 4
    assert log.executions == []


async def test_a_review_of_an_edit_the_deadline_overtakes_is_billed(store_url: str) -> None:
    """The request's deadline passes while the edit is reviewed: the answer is refused with
    `RequestClosed`, the call does not run and the turn goes on without it, and the review is
    counted. Before, it was not: the deadline's record took the place of the settlement."""
    clock = ManualClock()
    log, reviewer = ExecutionLog(), SlowReviewer(clock)
    agent = agent_with(log, so.auto(reviewer, review_edits=True), expires_in=60)
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await rt.generate("billing", prompt="refund a", auth=ALICE)
        [ask] = r.pending
        with pytest.raises(so.RequestClosed):
            await rt.respond(r.session_id, raised(ask), principal=ALICE)
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        assert state.usage == TURN + REVIEW + REVIEW + TURN
    assert len(reviewer.reviewed) == 2
    assert log.executions == []


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_review_edits_is_true_or_false(value: Any) -> None:
    with pytest.raises(so.UsageError, match=r"auto\(\) review_edits must be True or False"):
        so.auto(review_edits=value)
