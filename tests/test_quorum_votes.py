"""Quorum votes at the edges: a repeat vote through a response policy, and what it leaves."""

from __future__ import annotations

from typing import Any

import signoff as so
from signoff._candidates import RECOVERY_GRACE
from signoff.testing import ExecutionLog, ManualClock
from tests.test_quorum import ALICE, BOB, CAROL, asked, deploy_agent, events_of, lines, vote


async def test_a_repeat_vote_through_a_response_policy_closes_its_candidate(
    store_url: str,
) -> None:
    """A vote already counted, given again where a response policy runs, was recorded as a
    pending candidate that nothing closed: every later drive judged it again (the policy ran
    once more each time) and its trail never said what became of it."""
    judged: list[str] = []

    def anyone(ctx: so.ResponseContext) -> so.Allowed:
        judged.append(ctx.response.principal.principal_id if ctx.response.principal else "?")
        return so.Allowed()

    log = ExecutionLog()
    spec: Any = so.ApprovalSpec(
        request=so.always(), response=anyone, approvers=3, exclude_requester=True
    )
    clock = ManualClock()
    async with so.Runtime([deploy_agent(log, spec)], store=store_url, clock=clock) as rt:
        sid, req, head = await asked(rt)
        await rt.respond(sid, vote(req.id), principal=BOB)
        again = await rt.respond(sid, vote(req.id), principal=BOB)
        assert again.outcomes == [
            so.Outcome(
                request_id=req.id,
                outcome="counted",
                applied=False,
                reason="already counted: 1 of 3",
            )
        ]
        assert (await rt.state(sid)).candidates == {}
        events = await events_of(rt, sid, head)
        assert lines(events)[-2:] == ["approval.candidate pending", "approval.candidate stale"]
        assert events[-1].data["reason"] == "already counted: 1 of 3"
        assert judged == ["bob", "bob"]
        clock.advance(10 + RECOVERY_GRACE + 1)  # past the policy's timeout: nothing is lost
        r = await rt.respond(sid, vote(req.id), principal=CAROL)
        assert r.outcomes[0].reason == "2 of 3"
        assert judged == ["bob", "bob", "carol"]
        assert (await rt.state(sid)).pending_requests()[0].approved_by == ["bob", "carol"]
        assert log.count() == 0
        assert ALICE.principal_id not in judged
