"""Who may answer is checked before whether the answers are complete: someone who may not
settle a session's approvals is told so (`NotAllowed`), whatever rule gates them, not that
their decisions leave requests unanswered."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent, store_contents

ALICE = so.Principal(authenticator="sso", principal_id="alice")
CAROL = so.Principal(authenticator="sso", principal_id="carol")

RULES = {
    "default": (so.always(), CAROL),
    "four-eyes": (so.always(exclude_requester=True), ALICE),
    "quorum-anonymous": (so.always(approvers=2), None),
}


def two_deploys(log: ExecutionLog, approval: Any) -> so.Agent:
    @log.tool(approval=approval)
    async def deploy(service: str) -> str:
        """Deploy a service to production."""
        return f"{service} live"

    both = call_tools(call("deploy", service="api"), call("deploy", service="web"))
    return scripted_agent("ops", [both, reply("done")], tools=[deploy])


@pytest.mark.parametrize(("approval", "who"), list(RULES.values()), ids=list(RULES))
async def test_an_ineligible_partial_set_of_decisions_is_not_allowed(
    store_url: str, approval: Any, who: so.Principal | None
) -> None:
    """Under the default rule carol's one decision of two was `NotAllowed`; under four eyes
    (the requester) or a quorum (anonymous) the same call was `PartialAnswer`."""
    log = ExecutionLog()
    async with so.Runtime([two_deploys(log, approval)], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy both", auth=ALICE)
        first, _ = r.pending
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.NotAllowed) as refused:
            await rt.generate(
                session_id=r.session_id,
                approvals=[so.Decision(id=first.id, approved=True)],
                auth=who,
            )
        assert refused.value.request_ids == [first.id]
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0


async def test_an_ineligible_partial_set_of_decisions_on_mirrors_is_not_allowed(
    store_url: str,
) -> None:
    """A subagent's two four-eyes approvals, mirrored in the parent: the requester deciding one
    of them through the parent was told the other was unanswered (`PartialAnswer`), where the
    same call on the subagent's own session is `NotAllowed`."""
    ran: list[str] = []

    @so.tool(approval=so.always(exclude_requester=True))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "ok"

    both = call_tools(call("refund", order_id="8"), call("refund", order_id="9"))
    child = scripted_agent("billing", [both, reply("refunded")], tools=[refund])
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 8 and 9")), reply("done")],
        tools=[so.delegate("billing")],
    )
    async with so.Runtime([parent, child], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 8 and 9", auth=ALICE)
        first, _ = r.pending
        assert first.child is not None
        before = await store_contents(rt.store, r.session_id)
        for session_id, rid in (
            (first.child.session_id, first.child.request_id),
            (r.session_id, first.id),
        ):
            with pytest.raises(so.NotAllowed, match="the requester may not"):
                await rt.generate(
                    session_id=session_id,
                    approvals=[so.Decision(id=rid, approved=True)],
                    auth=ALICE,
                )
        assert await store_contents(rt.store, r.session_id) == before
        assert ran == []
