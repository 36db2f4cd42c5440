"""An edit given on a subagent's request mirrored on its parent is reviewed once: the check of
every answer before any is settled (`check_only`) and the settlement share the review, whose
cost counts once, in the child, whatever comes of the answer after it (a TTL passing meanwhile).
Run on both stores."""

from __future__ import annotations

import json
from typing import Any

import pytest

import signoff as so
from signoff.models import ModelRequest
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, tool_results

ALICE = so.Principal(authenticator="test", principal_id="alice")
BOB = so.Principal(authenticator="test", principal_id="bob")
REVIEW = so.Usage(input_tokens=10, output_tokens=5)


class Reviewer:
    """Answers caution to every review, and counts them; a review of an edit takes two minutes
    of `clock`, if given."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.inputs: list[str] = []
        self.clock = clock

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        self.inputs.append(request.messages[0].text)  # type: ignore[union-attr]
        if self.clock is not None and '"amount": 90' in self.inputs[-1]:
            self.clock.advance(120)
        text = json.dumps({"verdict": "caution", "reason": "a refund"})
        return so.ModelResponse(text=text, usage=REVIEW)


def only_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    who = ctx.response.principal
    return so.Allowed() if who is not None and who.principal_id == "bob" else so.Rejected("not bob")


def agents(ran: list[Any], reviewer: Reviewer, response: Any = None) -> list[so.Agent]:
    policy = so.auto(reviewer, review_edits=True)
    approval = policy if response is None else so.ApprovalSpec(request=policy, response=response)

    @so.tool(approval=approval)
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        ran.append(amount)
        return {"refunded": amount}

    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042", amount=180)),
            lambda conv: reply(f"Refunded: {tool_results(conv)[-1].content}"),
        ],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund order 1042")), reply("done")],
        tools=[so.delegate("billing", description="Billing specialist.")],
    )
    return [parent, child]


async def parked_on_mirror(
    rt: so.Runtime,
) -> tuple[so.GenerateResult, str, so.InputResponse]:
    """Alice's turn parked on the mirror of the subagent's refund, the subagent's session id,
    and her approval of the mirror with an edit (the amount made 90)."""
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    edited = {"order_id": "1042", "amount": 90.0}
    answer = so.InputResponse(request_id=mirror.id, option_id="approve", edited_input=edited)
    return r, mirror.child.session_id, answer


async def test_an_edit_on_a_mirror_is_reviewed_once(store_url: str) -> None:
    """Before, the edit was reviewed twice (3 reviews in all) and one of the two was counted."""
    ran: list[Any] = []
    reviewer = Reviewer()
    async with so.Runtime(agents(ran, reviewer), store=store_url) as rt:
        r, child_id, answer = await parked_on_mirror(rt)
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert r.status == "completed" and ran == [90.0]
        child = await rt.state(child_id)
        assert child.usage.total_tokens == 2 * REVIEW.total_tokens
    assert len(reviewer.inputs) == 2


async def test_an_edit_on_a_mirror_the_response_policy_rejects_is_not_reviewed(
    store_url: str,
) -> None:
    """The subagent's response policy judges an edit given on the mirror before it is reviewed:
    one it rejects is not reviewed (nor billed) by the check or the settlement, and one it
    allows is reviewed once. Before, the rejected edit was reviewed too."""
    ran: list[Any] = []
    reviewer = Reviewer()
    async with so.Runtime(agents(ran, reviewer, only_bob), store=store_url) as rt:
        r, child_id, answer = await parked_on_mirror(rt)
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert r.status == "waiting"
        assert (r.outcomes[0].outcome, r.outcomes[0].reason) == ("rejected", "not bob")
        assert len(reviewer.inputs) == 1
        r = await rt.respond(r.session_id, [answer], principal=BOB)
        assert r.status == "completed" and ran == [90.0]
        child = await rt.state(child_id)
        assert child.usage.total_tokens == 2 * REVIEW.total_tokens
    assert len(reviewer.inputs) == 2


async def test_an_edit_on_a_mirror_in_a_refused_call_is_not_reviewed(store_url: str) -> None:
    """An edit on a mirror sent with an unknown id is refused before the subagent reviews it:
    the check of every answer comes before any review. Before, the child's reviewer was called
    (and billed) for each refused call, its cost counted nowhere."""
    ran: list[Any] = []
    reviewer = Reviewer()
    async with so.Runtime(agents(ran, reviewer), store=store_url) as rt:
        r, child_id, answer = await parked_on_mirror(rt)
        unknown = so.InputResponse(request_id="req_nope", option_id="approve")
        for _ in range(2):
            with pytest.raises(so.UnknownRequest):
                await rt.respond(r.session_id, [answer, unknown], principal=ALICE)
        assert len(reviewer.inputs) == 1  # the proposal's
        child = await rt.state(child_id)
        assert child.usage.total_tokens == REVIEW.total_tokens
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert r.status == "completed" and ran == [90.0]
    assert len(reviewer.inputs) == 2


@pytest.mark.parametrize("expiring", ["billing", "support"], ids=["subagent's", "parent's"])
async def test_a_review_of_an_edit_on_a_mirror_a_ttl_overtakes_is_billed(
    store_url: str, expiring: str
) -> None:
    """The subagent's (or the parent's) TTL passes while the edit given on the mirror is
    reviewed: the answer is refused (the mirror closed with the subagent's expiry; the parent's
    own `SessionExpired`), nothing runs, and the review counts in the child, and in the parent
    through it. Before, the review kept for the settlement was never counted: the settlement
    never came."""
    clock = ManualClock()
    ran: list[Any] = []
    parent, child = agents(ran, Reviewer(clock))
    (parent if expiring == "support" else child).limits = so.Limits(ttl=60)
    async with so.Runtime([parent, child], store=store_url, clock=clock) as rt:
        r, child_id, answer = await parked_on_mirror(rt)
        refused = so.SessionExpired if expiring == "support" else so.RequestClosed
        with pytest.raises(refused):
            await rt.respond(r.session_id, [answer], principal=ALICE)
        assert ran == []
        state = await rt.state(child_id)
        assert state.usage.total_tokens == 2 * REVIEW.total_tokens
        if expiring == "support":
            assert state.turn is not None and state.turn.status == "cancelled"
            above = await rt.state(r.session_id)
            assert above.lapsed and above.delegated.total_tokens == 2 * REVIEW.total_tokens
        else:
            assert state.lapsed
