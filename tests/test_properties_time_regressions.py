"""Regressions the clock state machine found (tests/test_properties_time.py): a response decided
past its deadline or an escalation's, and cancelling a session that has expired.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

import signoff as so
from signoff.testing import ManualClock, call, call_tools, reply

from ._properties_time import (
    AGENT,
    ALICE,
    FIONA,
    TTL,
    Runs,
    Slow,
    check_requests,
    make_agent,
    prompt,
)

# -- regressions the machine found ----------------------------------------------------------------


def slow_policy_agent(
    clock: ManualClock, runs: Runs, on_timeout: Any, approvers: int = 1
) -> so.Agent:
    """Agent `slow`: `wire` has a 60 s deadline and a response policy that takes 61 s."""

    async def finance(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        clock.advance(61)
        who = ctx.response.principal
        if ctx.request.escalated_to is not None and who is not None and who.same_as(FIONA):
            return so.Allowed()
        return so.Allowed() if who is not None and who.same_as(ALICE) else so.Rejected("no")

    spec = so.ApprovalSpec(
        request=so.always(approvers=approvers),
        response=finance,
        expires_in=60,
        on_timeout=on_timeout,
        escalate_to="finance" if on_timeout == "escalate" else None,
    )

    @so.tool(approval=spec)
    async def wire(ctx: so.ToolContext, order: str) -> dict[str, str]:
        """Wire money."""
        runs.count[ctx.idempotency_key()] += 1
        return {"wired": order}

    return so.Agent(
        name="slow",
        model=so.models.Scripted([call_tools(call("wire", order="1")), reply("over")]),
        tools=[wire],
    )


def kinds(events: list[so.Event]) -> list[str]:
    return [
        f"{e.type} {e.data.get('outcome') or e.data.get('decision') or e.data.get('status')}"
        if e.type in ("approval.candidate", "approval.settled", "input.resolved", "tool.completed")
        else e.type
        for e in events
    ]


@pytest.mark.parametrize("approvers", [1, 2])
async def test_a_response_decided_past_the_deadline_does_not_settle(
    store_url: str, approvers: int
) -> None:
    """Regression: a response policy slower than the time left recorded the approval (or a
    quorum vote) after the deadline; the deadline wins, and the answer is refused as closed."""
    clock, runs = ManualClock(), Runs()
    agent = slow_policy_agent(clock, runs, "deny", approvers)
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await rt.generate("slow", prompt="wire it", auth=ALICE)
        (req,) = r.pending
        mark = (await rt.store.head(r.session_id)) or 0
        answer = [so.InputResponse(request_id=req.id, option_id="approve")]
        with pytest.raises(so.RequestClosed, match="deadline"):
            await rt.respond(r.session_id, answer, principal=ALICE)
        events = [e async for e in rt.events(r.session_id, mark, follow=False)]
        assert kinds(events) == [
            "approval.candidate pending",
            "approval.candidate stale",
            "input.resolved expired",
            "tool.completed expired",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        assert req.expires_at is not None and all(e.at >= req.expires_at for e in events[1:])
        assert runs.count == Counter()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "expired"
        check_requests([e.to_dict() async for e in rt.events(r.session_id, follow=False)])


async def test_a_response_decided_past_an_escalation_deadline_is_stale(store_url: str) -> None:
    """Regression: the same with `on_timeout="escalate"`: the request is escalated, the slow
    answer counts for nothing, and the group can then settle it."""
    clock, runs = ManualClock(), Runs()
    agent = slow_policy_agent(clock, runs, "escalate")
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await rt.generate("slow", prompt="wire it", auth=ALICE)
        (req,) = r.pending
        mark = (await rt.store.head(r.session_id)) or 0
        answer = [so.InputResponse(request_id=req.id, option_id="approve")]
        r = await rt.respond(r.session_id, answer, principal=ALICE)
        (outcome,) = r.outcomes
        assert (outcome.outcome, outcome.applied) == ("stale", False)
        assert r.status == "waiting" and r.pending[0].escalated_to == "finance"
        events = [e async for e in rt.events(r.session_id, mark, follow=False)]
        assert kinds(events)[:3] == [
            "approval.candidate pending",
            "approval.candidate stale",
            "approval.candidate escalated",
        ]
        assert runs.count == Counter()
        r = await rt.respond(r.session_id, answer, principal=FIONA)
        assert r.status == "completed" and sum(runs.count.values()) == 1
        check_requests([e.to_dict() async for e in rt.events(r.session_id, follow=False)])


@pytest.mark.parametrize("waiting", [True, False])
async def test_cancelling_an_expired_session_does_not_bring_it_back(
    store_url: str, waiting: bool
) -> None:
    """Regression: `cancel()` on a session past its TTL recorded a cancellation, and with it a
    new TTL: the expired session took messages again. It is refused as expired, as any call."""
    clock = ManualClock()
    agent = make_agent(Runs(), clock, Slow())
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        plan = prompt(["pay"] if waiting else [])
        r = await rt.generate(AGENT, prompt=plan, auth=ALICE)
        assert r.status == ("waiting" if waiting else "completed")
        clock.advance(TTL)
        with pytest.raises(so.SessionExpired):
            await rt.cancel(r.session_id, reason="stop", principal=ALICE)
        state = await rt.state(r.session_id)
        assert state.expired(clock.now) and state.pending_requests() == []
        assert state.status == ("failed" if waiting else "idle")
        with pytest.raises(so.SessionExpired):
            await rt.generate(session_id=r.session_id, prompt="hello", auth=ALICE)
        log = [e.to_dict() async for e in rt.events(r.session_id, follow=False)]
        assert [e["type"] for e in log if e["at"] == clock.now] == (
            ["input.resolved", "turn.failed"] if waiting else []
        )
