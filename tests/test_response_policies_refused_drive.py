"""An answer a response policy refuses settles nothing, and its call drives nothing only when
nothing is due: a deadline the same call found passed, or a verdict a dead process left, still
moves the turn on in that call, as an answer refused with an error does."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff._candidates import RECOVERY_GRACE
from signoff.testing import ManualClock

ALICE = so.Principal(authenticator="test", principal_id="alice")
BOB = so.Principal(authenticator="test", principal_id="bob")


def _only_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    who = ctx.response.principal
    if who is not None and who.principal_id == "bob":
        return so.Allowed()
    return so.Rejected("only bob approves refunds")


def _desk(ran: list[str], request: so.ApprovalPolicy) -> so.Agent:
    @so.tool(approval=so.ApprovalSpec(request=request, response=_only_bob, timeout=1.0))
    async def refund(order_id: str) -> dict[str, str]:
        """Refund an order."""
        ran.append(order_id)
        return {"refunded": order_id}

    model = so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="refund", input={"order_id": "9"})]),
            so.ModelResponse(text="done"),
        ]
    )
    return so.Agent(name="support", model=model, tools=[refund])


async def _answer(rt: so.Runtime, how: str, session_id: str, request_id: str) -> Any:
    if how == "respond":
        yes = so.InputResponse(request_id=request_id, option_id="approve")
        return await rt.respond(session_id, [yes], principal=ALICE)
    decision = so.Decision(id=request_id, approved=True)
    return await rt.generate(session_id=session_id, approvals=[decision], auth=ALICE)


async def _dead_candidate(
    rt: so.Runtime, session_id: str, req: so.InputRequest, **answer: Any
) -> None:
    """Bob's approval of `req` (`answer` its other fields), pending as a process that died in
    the response policy left it; the clock must pass the policy's timeout and the grace."""
    dead = {
        "request_id": req.id,
        "call_id": req.call_id,
        "candidate_id": "cand_dead",
        "decision": "approve",
        "by": BOB.model_dump(),
        "outcome": "pending",
        "text": None,
        "value": None,
        "edited_input": None,
        **answer,
    }
    driver = rt._driver((await rt.state(session_id)).copy(), None)
    await driver.record([("approval.candidate", dead)], durable=True)


@pytest.mark.parametrize("how", ["respond", "approvals"])
async def test_a_refused_answer_past_the_deadline_lets_the_turn_go_on(
    store_url: str, how: str
) -> None:
    """The call records the passed deadline (the call denied) before the policy refuses Alice:
    the turn goes on to its end in that call, not left waiting for a sweep."""
    ran: list[str] = []
    clock = ManualClock()
    agent = _desk(ran, so.always(expires_in=10, on_timeout="deny"))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (req,) = r.pending
        clock.advance(11)
        res = await _answer(rt, how, r.session_id, req.id)
        assert [(o.outcome, o.applied) for o in res.outcomes] == [("rejected", False)]
        assert (res.status, res.text) == ("completed", "done")
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        assert state.requests[req.id].status == "expired"
        assert ran == []


@pytest.mark.parametrize("how", ["respond", "approvals"])
async def test_a_refused_answer_recovers_a_verdict_a_dead_process_left(
    store_url: str, how: str
) -> None:
    """Bob's approval, whose process died while it was judged, is recovered by the drive of
    Alice's refused answer, as before: the refund runs once and the turn ends."""
    ran: list[str] = []
    clock = ManualClock()
    async with so.Runtime([_desk(ran, so.always())], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (req,) = r.pending
        await _dead_candidate(rt, r.session_id, req, text="ok by bob")
        clock.advance(1.0 + RECOVERY_GRACE + 1)
        res = await _answer(rt, how, r.session_id, req.id)
        assert [(o.outcome, o.applied) for o in res.outcomes] == [("rejected", False)]
        assert (res.status, ran) == ("completed", ["9"])
        assert (await rt.state(r.session_id)).candidates == {}


async def test_a_recovered_answer_keeps_its_edits_review_on_the_settlement(store_url: str) -> None:
    """Bob's edited approval, whose edit an `auto()` review found `caution`, was left pending
    by a process that died in the response policy: settled by the drive that judges it again,
    its `approval.settled` lost the review's verdict (the candidate held it)."""
    ran: list[str] = []
    clock = ManualClock()
    async with so.Runtime([_desk(ran, so.always())], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (req,) = r.pending
        edit = {"order_id": "10"}
        review = {"auto_verdict": "caution", "auto_reason": "another order"}
        await _dead_candidate(rt, r.session_id, req, edited_input=edit, **review)
        clock.advance(1.0 + RECOVERY_GRACE + 1)
        done = await rt.generate(session_id=r.session_id)
        assert (done.status, ran) == ("completed", ["10"])
        [settled] = [
            e.data
            async for e in rt.events(r.session_id, follow=False)
            if e.type == "approval.settled"
        ]
        assert (settled["auto_verdict"], settled["auto_reason"]) == ("caution", "another order")
