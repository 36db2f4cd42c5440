"""A request parked under its tool's response policy, answered after a redeploy that took the
policy (or the tool) away: refused, as no one may settle it without that policy, with an error
that says so, not one sending the person to "a runtime that runs" the agent this one runs."""

from __future__ import annotations

import pytest

import signoff as so
from signoff.testing import ExecutionLog, reply, scripted_agent, store_contents

from ._response_policies import ALICE, BOB, asked, refund_agent


async def allow(ctx: so.ResponseContext) -> so.Allowed:
    return so.Allowed()


@pytest.mark.parametrize("redeployed", ["policy dropped", "tool dropped"])
async def test_an_answer_after_a_redeploy_dropped_the_policy_is_refused_by_name(
    store_url: str, redeployed: str
) -> None:
    """Before, the refusal said "which this runtime does not have: answer it from a runtime
    that runs agent 'billing'", from the runtime running agent 'billing'."""
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=allow)
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        sid, req, _ = await asked(rt, ALICE)
    if redeployed == "policy dropped":
        agent, lost = refund_agent(log, so.always()), "which billing.refund_charge here no longer"
    else:
        agent = scripted_agent("billing", [reply("no tools")])
        lost = "and agent 'billing' here has no tool 'refund_charge' now"
    async with so.Runtime([agent], store=store_url) as rt:
        before = await store_contents(rt.store, sid)
        for who in (ALICE, BOB):
            answer = so.InputResponse(request_id=req.id, option_id="approve")
            with pytest.raises(so.NotAllowed) as info:
                await rt.respond(sid, [answer], principal=who)
            assert lost in str(info.value)
            assert "runs agent" not in str(info.value)
            assert "or cancel the turn" in str(info.value)
        assert await store_contents(rt.store, sid) == before
        cancelled = await rt.cancel(sid, "the policy is gone")
        assert cancelled.status == "cancelled"
    assert log.count() == 0
