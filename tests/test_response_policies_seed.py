"""The eve seed's response-policy examples: a Slack approver allow list, an allow list that lets
anyone cancel, a same-principal release policy and a tenant guard on request and response.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

from ._response_policies import (
    ALICE,
    BOB,
    MALLORY,
    REFUSED,
    asked,
    events_of,
    lines,
    ran,
    refund_agent,
    requester_only,
    tenant_guard,
)

# -- the seed's examples ------------------------------------------------------------------------

SLACK_APPROVERS = ["slack:T012AB3CD:U045EF6GH", "slack:T012AB3CD:U078JK9LM"]


def slack_approvers(ctx: so.ResponseContext) -> dict[str, Any]:
    """eve's refund_charge response policy: a fixed list of Slack approvers."""
    who = ctx.response.principal
    can_approve = who is not None and who.principal_id in SLACK_APPROVERS
    if can_approve:
        return {"status": "allowed"}
    return {"status": "rejected", "reason": "This user cannot approve refunds."}


def slack_user(user: str, team: str = "T012AB3CD") -> so.Principal:
    return so.Principal(
        authenticator="slack",
        issuer=team,
        principal_id=f"slack:{team}:{user}",
        attributes={"team_id": team, "user_id": user},
    )


async def test_seed_slack_approver_allow_list(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool(approval=so.ApprovalSpec(request=so.always(), response=slack_approvers))
    async def refund_charge(charge_id: str) -> dict[str, str]:
        """Refund a charge."""
        return {"refunded": charge_id}

    seen = Capture(reply("Refunded."))
    agent = scripted_agent(
        "billing",
        [call_tools(call("refund_charge", charge_id="ch_1")), seen],
        tools=[refund_charge],
    )
    requester = slack_user("U999REQ00")
    approver = slack_user("U078JK9LM")
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=requester)
        (req,) = r.pending
        head = await rt.store.head(r.session_id)
        assert head is not None
        # the requester is not an approver: they can neither approve nor cancel
        for decision in ("approve", "cancel"):
            r = await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id=decision)],
                principal=requester,
            )
            assert r.outcomes == [
                so.Outcome(
                    request_id=req.id,
                    outcome="rejected",
                    applied=False,
                    reason="This user cannot approve refunds.",
                )
            ]
        # a look-alike from another workspace is not on the list either
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve")],
            principal=slack_user("U078JK9LM", team="T0OTHER00"),
        )
        assert r.outcomes[0].outcome == "rejected"
        assert log.count() == 0
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve", text="ok by me")],
            principal=approver,
        )
        assert r.status == "completed" and r.text == "Refunded."
        events = await events_of(rt, r.session_id, head)
        assert lines(events) == [
            *REFUSED * 3,
            "approval.candidate pending",
            "approval.settled approve",
            "input.resolved approved",
            "tool.started refund_charge",
            "tool.completed refund_charge ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        reasons = [
            e.data["reason"]
            for e in events
            if e.type == "approval.candidate" and e.data["outcome"] == "rejected"
        ]
        assert reasons == ["This user cannot approve refunds."] * 3
        settled = next(e for e in events if e.type == "approval.settled")
        assert settled.data["by"]["principal_id"] == "slack:T012AB3CD:U078JK9LM"
        assert settled.data["reason"] == "ok by me"
        assert [e.principal_id for e in log.executions] == [requester.principal_id]
        # The approver's reason reaches the model beside the result.
        assert tool_results(seen.last)[0].content == {
            "result": {"refunded": "ch_1"},
            "approval": {"approved": True, "by": "slack:T012AB3CD:U078JK9LM", "reason": "ok by me"},
        }


async def test_seed_allow_list_that_lets_anyone_cancel(tmp_path: Path) -> None:
    """ "When a policy only cares who approves, return allowed for cancel"."""
    log = ExecutionLog()

    def approvers_only(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        if ctx.response.decision == "cancel":
            return so.Allowed()
        return so.Allowed() if ctx.response.principal == BOB else so.Rejected("not an approver")

    spec = so.ApprovalSpec(request=so.always(), response=approvers_only)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, head = await asked(rt, ALICE)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=MALLORY
        )
        assert r.outcomes[0].outcome == "rejected"
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="cancel")], principal=MALLORY
        )
        assert r.status == "completed"
        assert r.outcomes == [so.Outcome(request_id=req.id, outcome="cancelled", applied=True)]
        assert lines(await events_of(rt, sid, head)) == [
            *REFUSED,
            "approval.candidate pending",
            *ran("cancel"),
        ]
        assert log.count() == 0


async def test_seed_same_principal_release_policy(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool(approval=so.ApprovalSpec(request=so.always(), response=requester_only))
    async def publish_release(version: str) -> str:
        """Publish a release."""
        return f"published {version}"

    agent = scripted_agent(
        "rel",
        [
            call_tools(call("publish_release", version="2.0")),
            reply("released"),
            call_tools(call("publish_release", version="2.1")),
            reply("never"),
        ],
        tools=[publish_release],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("rel", prompt="ship 2.0", auth=ALICE)
        (req,) = r.pending
        # full identity counts: same id from another issuer, authenticator or type is refused;
        # other attributes are not part of identity
        for other in (
            ALICE.model_copy(update={"issuer": "T02"}),
            ALICE.model_copy(update={"authenticator": "github"}),
            ALICE.model_copy(update={"principal_type": "service"}),
            BOB,
        ):
            r = await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=other,
            )
            assert r.outcomes[0].outcome == "rejected"
            assert r.outcomes[0].reason == "Only the person who asked for this release can respond."
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve")],
            principal=ALICE.model_copy(update={"attributes": {"tenant_id": "t1", "role": "x"}}),
        )
        assert r.status == "completed" and r.text == "released"
        assert log.count() == 1
        # an anonymous caller's release can be settled by nobody, not even another anonymous one
        r = await rt.generate(session_id=r.session_id, prompt="ship 2.1")
        (anon_req,) = r.pending
        assert anon_req.requested_by is None
        for who in (None, ALICE, so.APP_PRINCIPAL):
            r = await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=anon_req.id, option_id="approve")],
                principal=who,
            )
            assert r.outcomes[0].outcome == "rejected"
        assert [p.id for p in await rt.pending(session_id=r.session_id)] == [anon_req.id]
        assert log.count() == 1


async def test_seed_tenant_guard_on_request_and_response(tmp_path: Path) -> None:
    """eve's tenant guard decides whether to ask; its twin decides who may answer."""

    def tenant_request_policy(ctx: so.ApprovalContext) -> Any:
        current = ctx.session.auth.current
        caller_tenant = None if current is None else current.attributes.get("tenant_id")
        if caller_tenant is None or caller_tenant != ctx.tool_input.tenant_id:
            return {"type": "denied", "reason": "Caller cannot access this tenant."}
        return "user-approval" if ctx.tool_input.amount > 1000 else "not-applicable"

    log = ExecutionLog()

    @log.tool(approval=so.ApprovalSpec(request=tenant_request_policy, response=tenant_guard))
    async def refund_charge(tenant_id: str, charge_id: str, amount: float) -> dict[str, Any]:
        """Refund a charge."""
        return {"refunded": amount}

    seen = Capture(reply("ok"))
    agent = scripted_agent(
        "billing",
        [
            call_tools(
                call("refund_charge", tenant_id="t2", charge_id="ch_x", amount=10),
                call("refund_charge", tenant_id="t1", charge_id="ch_s", amount=10),
                call("refund_charge", tenant_id="t1", charge_id="ch_b", amount=5000),
            ),
            seen,
        ],
        tools=[refund_charge],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="refunds", auth=ALICE)
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.input == {"tenant_id": "t1", "charge_id": "ch_b", "amount": 5000.0}
        assert [e.input["charge_id"] for e in log.executions] == ["ch_s"]  # small one ran
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve")],
            principal=MALLORY,
        )
        assert r.outcomes[0].reason == "Responder cannot act for this tenant."
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve")],
            principal=BOB,
        )
        assert r.status == "completed"
        assert [e.input["charge_id"] for e in log.executions] == ["ch_s", "ch_b"]
        denied, small, big = tool_results(seen.last)
        assert denied.is_error and denied.content["reason"] == "Caller cannot access this tenant."
        assert small.content == {"refunded": 10.0} and big.content == {"refunded": 5000.0}
