"""Who may settle an approval: the default rule, response policies and the eve seed's examples.

The matrix at the top answers one question for every kind of responder (the requester, another
user, a user of another tenant, an anonymous caller, the app principal), without and with a
response policy, and asserts the outcome and the exact events each answer records.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    timeline,
    tool_results,
)

ALICE = so.Principal(
    authenticator="slack", issuer="T01", principal_id="alice", attributes={"tenant_id": "t1"}
)
BOB = so.Principal(
    authenticator="slack", issuer="T01", principal_id="bob", attributes={"tenant_id": "t1"}
)
MALLORY = so.Principal(
    authenticator="slack", issuer="T99", principal_id="mallory", attributes={"tenant_id": "t2"}
)
PEOPLE: dict[str, so.Principal | None] = {
    "requester": ALICE,
    "another user": BOB,
    "other tenant": MALLORY,
    "anonymous": None,
    "app": so.APP_PRINCIPAL,
}


def lines(events: list[so.Event]) -> list[str]:
    """`timeline()`, with the outcome of each `approval.candidate`."""
    out = []
    for e, line in zip(events, timeline(events), strict=True):
        if e.type == "approval.candidate":
            line = f"approval.candidate {e.data['outcome']}"
        out.append(line)
    return out


async def events_of(rt: so.Runtime, session_id: str, after: int = 0) -> list[so.Event]:
    return [e async for e in rt.events(session_id, after, follow=False)]


def refund_agent(log: ExecutionLog, approval: Any, **kwargs: Any) -> so.Agent:
    @log.tool(approval=approval, **kwargs)
    async def refund_charge(tenant_id: str, charge_id: str, amount: float) -> dict[str, Any]:
        """Refund a charge."""
        return {"refunded": amount, "charge": charge_id}

    return scripted_agent(
        "billing",
        [
            call_tools(call("refund_charge", tenant_id="t1", charge_id="ch_1", amount=50)),
            reply("done"),
        ],
        tools=[refund_charge],
    )


async def asked(rt: so.Runtime, auth: so.Principal | None) -> tuple[str, so.InputRequest, int]:
    """Start a turn that waits on one approval; return the session, the request and the head."""
    r = await rt.generate("billing", prompt="refund ch_1", auth=auth)
    assert r.status == "waiting"
    (req,) = r.pending
    assert req.requested_by == auth
    head = await rt.store.head(r.session_id)
    assert head is not None
    return r.session_id, req, head


# -- response policies used below -----------------------------------------------------------------


def tenant_guard(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    """Responders of the call's tenant (and the app itself) may settle; no one else."""
    who = ctx.response.principal
    if who is not None and who.same_as(so.APP_PRINCIPAL):
        return so.Allowed()
    tenant = None if who is None else who.attributes.get("tenant_id")
    if tenant is not None and tenant == ctx.request.tool_input.tenant_id:
        return so.Allowed()
    return so.Rejected("Responder cannot act for this tenant.")


def same_principal(a: so.Principal, b: so.Principal) -> bool:
    return (
        a.authenticator == b.authenticator
        and a.issuer == b.issuer
        and a.principal_type == b.principal_type
        and a.principal_id == b.principal_id
    )


def requester_only(ctx: so.ResponseContext) -> dict[str, Any]:
    """eve's publish_release policy: only the person who asked may respond."""
    asker, responder = ctx.request.principal, ctx.response.principal
    if asker is not None and responder is not None and same_principal(responder, asker):
        return {"status": "allowed"}
    return {
        "status": "rejected",
        "reason": "Only the person who asked for this release can respond.",
    }


POLICIES: dict[str, Any] = {"tenant guard": tenant_guard, "requester only": requester_only}


# -- the who-may-settle matrix ------------------------------------------------------------------


def ran(decision: str) -> list[str]:
    if decision == "approve":
        return [
            "approval.settled approve",
            "input.resolved approved",
            "tool.started refund_charge",
            "tool.completed refund_charge ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
    return [
        "approval.settled cancel",
        "input.resolved cancelled",
        "tool.completed refund_charge denied",
        "model.completed",
        "turn.completed",
        "session.waiting",
    ]


REFUSED = ["approval.candidate pending", "approval.candidate rejected", "turn.waiting"]
NOT_ALLOWED = "not allowed"

# (response policy, who asked, who answers) -> settled, refused by the policy, or NotAllowed
MATRIX: list[tuple[str | None, str, str, str]] = [
    # no response policy: only the requester; an anonymous request is anyone's
    (None, "requester", "requester", "settled"),
    (None, "requester", "another user", NOT_ALLOWED),
    (None, "requester", "other tenant", NOT_ALLOWED),
    (None, "requester", "anonymous", NOT_ALLOWED),
    (None, "requester", "app", NOT_ALLOWED),
    (None, "anonymous", "requester", "settled"),
    (None, "anonymous", "another user", "settled"),
    (None, "anonymous", "other tenant", "settled"),
    (None, "anonymous", "anonymous", "settled"),
    (None, "anonymous", "app", "settled"),
    # a tenant guard replaces the default: the tenant's people and the app
    ("tenant guard", "requester", "requester", "settled"),
    ("tenant guard", "requester", "another user", "settled"),
    ("tenant guard", "requester", "other tenant", "rejected"),
    ("tenant guard", "requester", "anonymous", "rejected"),
    ("tenant guard", "requester", "app", "settled"),
    # eve's requester-only policy: the requester, and nobody for an anonymous request
    ("requester only", "requester", "requester", "settled"),
    ("requester only", "requester", "another user", "rejected"),
    ("requester only", "requester", "other tenant", "rejected"),
    ("requester only", "requester", "anonymous", "rejected"),
    ("requester only", "requester", "app", "rejected"),
    ("requester only", "anonymous", "requester", "rejected"),
    ("requester only", "anonymous", "anonymous", "rejected"),
    ("requester only", "anonymous", "app", "rejected"),
]


@pytest.mark.parametrize("decision", ["approve", "cancel"])
@pytest.mark.parametrize(
    ("policy", "asker", "responder", "expected"),
    MATRIX,
    ids=[f"{p or 'default'}|asked by {a}|answered by {r}" for p, a, r, _ in MATRIX],
)
async def test_who_may_settle(
    tmp_path: Path, policy: str | None, asker: str, responder: str, expected: str, decision: str
) -> None:
    log = ExecutionLog()
    approval: Any = so.always()
    if policy is not None:
        approval = so.ApprovalSpec(request=so.always(), response=POLICIES[policy])
    async with sqlite_runtime(tmp_path, refund_agent(log, approval)) as rt:
        sid, req, head = await asked(rt, PEOPLE[asker])
        before = await store_contents(rt.store, sid)
        answer = so.InputResponse(request_id=req.id, option_id=decision)
        if expected == NOT_ALLOWED:
            with pytest.raises(so.NotAllowed) as info:
                await rt.respond(sid, [answer], principal=PEOPLE[responder])
            assert info.value.request_ids == [req.id]
            assert await store_contents(rt.store, sid) == before  # nothing recorded
            return
        r = await rt.respond(sid, [answer], principal=PEOPLE[responder])
        events = await events_of(rt, sid, head)
        candidate = ["approval.candidate pending"] if policy is not None else []
        by = PEOPLE[responder]
        who = None if by is None else by.model_dump()
        if expected == "settled":
            outcome = "approved" if decision == "approve" else "cancelled"
            assert r.outcomes == [so.Outcome(request_id=req.id, outcome=outcome, applied=True)]
            assert lines(events) == [*candidate, *ran(decision)]
            assert r.status == "completed"
            settled = next(e for e in events if e.type == "approval.settled")
            assert settled.data["by"] == who
            assert settled.data["decision"] == decision
            # an approved call runs with the requester's identity, whoever approved it
            runs = [e.principal_id for e in log.executions]
            asker_id = None if PEOPLE[asker] is None else "alice"
            assert runs == ([asker_id] if decision == "approve" else [])
        else:
            assert len(r.outcomes) == 1
            (o,) = r.outcomes
            assert (o.request_id, o.outcome, o.applied) == (req.id, "rejected", False)
            assert o.reason
            assert lines(events) == REFUSED
            pending, refused, waiting = events
            assert pending.data["by"] == who and refused.data["by"] == who
            assert pending.data["decision"] == refused.data["decision"] == decision
            assert refused.data["reason"] == o.reason
            assert pending.data["candidate_id"] == refused.data["candidate_id"]
            # the turn stays held on the same request, for the same turn: no session boundary
            assert {e.turn_id for e in events} == {req.turn_id}
            assert waiting.data == {"on": "input", "request_ids": [req.id]}
            assert r.status == "waiting"
            assert [p.id for p in r.pending] == [req.id]
            assert [p.id for p in await rt.pending(session_id=sid)] == [req.id]
            assert log.count() == 0


async def test_a_refused_request_stays_answerable_by_someone_else(tmp_path: Path) -> None:
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=tenant_guard)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, head = await asked(rt, ALICE)
        for who in (MALLORY, None):
            for decision in ("approve", "cancel"):
                r = await rt.respond(
                    sid, [so.InputResponse(request_id=req.id, option_id=decision)], principal=who
                )
                assert r.outcomes[0].outcome == "rejected"
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
        )
        assert r.status == "completed"
        assert lines(await events_of(rt, sid, head)) == [*REFUSED * 4, *CANDIDATE_THEN_RAN]
        assert [e.principal_id for e in log.executions] == ["alice"]
        # once settled, a repeat is a no-op and a contrary answer a conflict, as without policy
        again = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
        )
        assert again.outcomes == [so.Outcome(request_id=req.id, outcome="approved", applied=False)]
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(
                sid, [so.InputResponse(request_id=req.id, option_id="cancel")], principal=BOB
            )


CANDIDATE_THEN_RAN = ["approval.candidate pending", *ran("approve")]


@pytest.mark.parametrize("elsewhere", ["agent without the tool", "tool, no policy"])
async def test_only_a_runtime_with_the_response_policy_settles_its_request(
    tmp_path: Path, elsewhere: str
) -> None:
    """The request records that a response policy decides it; a runtime on the same store that
    lacks that policy (a tool-less settler, an older deploy) refuses every answer, changing
    nothing, instead of settling past the policy."""
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=requester_only)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, _ = await asked(rt, ALICE)
        assert req.response_policy
        url = rt.store.url
    others = {
        "agent without the tool": [scripted_agent("billing", [reply("x")])],
        "tool, no policy": [refund_agent(ExecutionLog(), so.always())],
    }[elsewhere]
    async with so.Runtime(others, store=url) as other:
        before = await store_contents(other.store, sid)
        for who in (ALICE, BOB, None):
            with pytest.raises(so.NotAllowed, match="response policy"):
                await other.respond(
                    sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=who
                )
            with pytest.raises(so.NotAllowed, match="response policy"):
                await other.generate(
                    session_id=sid, approvals=[so.Decision(id=req.id, approved=True)], auth=who
                )
        assert await store_contents(other.store, sid) == before
    assert log.count() == 0
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=ALICE
        )
        assert r.status == "completed" and log.count() == 1


async def test_without_a_response_policy_the_generate_path_settles_directly(
    tmp_path: Path,
) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log, so.always())) as rt:
        sid, req, head = await asked(rt, ALICE)
        with pytest.raises(so.NotAllowed):
            await rt.generate(
                session_id=sid, approvals=[so.Decision(id=req.id, approved=True)], auth=BOB
            )
        r = await rt.generate(
            session_id=sid, approvals=[so.Decision(id=req.id, approved=True)], auth=ALICE
        )
        assert r.status == "completed"
        assert lines(await events_of(rt, sid, head)) == ran("approve")


async def test_the_generate_path_runs_the_response_policy_too(tmp_path: Path) -> None:
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=tenant_guard)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, head = await asked(rt, ALICE)
        r = await rt.generate(
            session_id=sid, approvals=[so.Decision(id=req.id, approved=True)], auth=MALLORY
        )
        assert r.status == "waiting"
        assert r.outcomes[0].outcome == "rejected"
        r = await rt.generate(
            session_id=sid, approvals=[so.Decision(id=req.id, approved=True)], auth=BOB
        )
        assert r.status == "completed"
        assert lines(await events_of(rt, sid, head)) == [*REFUSED, *CANDIDATE_THEN_RAN]


class AllowList(list[str]):
    """A response policy that is also a list: empty, it is falsy, and lets no one approve."""

    def __call__(self, ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        who = ctx.response.principal
        if who is not None and who.principal_id in self:
            return so.Allowed()
        return so.Rejected("not on the allow-list")


async def test_a_response_policy_that_is_falsy_still_decides(tmp_path: Path) -> None:
    """A policy object is a policy however it converts to bool: an empty allow-list must not
    fall back to the default rule, under which the requester alone settles their own call."""
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=AllowList())
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, head = await asked(rt, ALICE)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=ALICE
        )
        assert r.outcomes[0].outcome == "rejected" and r.status == "waiting"
        r = await rt.generate(
            session_id=sid, approvals=[so.Decision(id=req.id, approved=True)], auth=ALICE
        )
        assert r.outcomes[0].outcome == "rejected" and r.status == "waiting"
        assert lines(await events_of(rt, sid, head)) == [*REFUSED, *REFUSED]
        assert log.executions == []


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


# -- what a response policy receives and may return ------------------------------------------------


async def test_response_policy_receives_request_response_and_session(tmp_path: Path) -> None:
    seen: list[so.ResponseContext] = []

    def record(ctx: so.ResponseContext) -> Any:
        seen.append(ctx)
        return "rejected" if ctx.response.principal == MALLORY else "allowed"

    log = ExecutionLog()
    async with sqlite_runtime(
        tmp_path, refund_agent(log, so.ApprovalSpec(request=so.always(), response=record))
    ) as rt:
        sid, req, _ = await asked(rt, ALICE)
        await rt.send(sid, "hello from bob", principal=BOB)  # waits for the end of the turn
        await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="cancel")], principal=MALLORY
        )
        await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
        )
        first, second = seen
        for ctx in seen:
            assert ctx.request.request_id == req.id
            assert ctx.request.call_id == req.call_id
            assert ctx.request.tool_name == "refund_charge"
            # typed, like ApprovalContext.tool_input: the validated input of the exact call
            assert ctx.request.tool_input.tenant_id == "t1"
            assert ctx.request.tool_input.amount == 50.0
            assert ctx.request.tool_input.model_dump() == req.input
            assert ctx.request.principal == ALICE
            assert ctx.request.escalated_to is None
            assert ctx.session.id == sid
            assert ctx.session.agent == "billing"
            assert ctx.session.turn == req.turn_id
            assert ctx.session.parent is None
            assert ctx.session.auth == so.SessionAuth(current=ALICE, initiator=ALICE)
        assert (first.response.decision, first.response.principal) == ("cancel", MALLORY)
        assert (second.response.decision, second.response.principal) == ("approve", BOB)
        assert log.count() == 1


@pytest.mark.parametrize(
    ("returned", "outcome", "reason"),
    [
        (so.Allowed(), "approved", None),
        ("allowed", "approved", None),
        ({"status": "allowed"}, "approved", None),
        (so.Rejected("no way"), "rejected", "no way"),
        (so.Rejected(), "rejected", None),
        ("rejected", "rejected", None),
        ({"status": "rejected", "reason": "nope"}, "rejected", "nope"),
    ],
    ids=repr,
)
@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
async def test_response_policy_statuses(
    tmp_path: Path, returned: Any, outcome: str, reason: str | None, is_async: bool
) -> None:
    def sync_policy(ctx: so.ResponseContext) -> Any:
        return returned

    async def async_policy(ctx: so.ResponseContext) -> Any:
        await asyncio.sleep(0)
        return returned

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=async_policy if is_async else sync_policy)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, head = await asked(rt, ALICE)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
        )
        (o,) = r.outcomes
        assert (o.outcome, o.reason) == (outcome, reason)
        expected = CANDIDATE_THEN_RAN if outcome == "approved" else REFUSED
        assert lines(await events_of(rt, sid, head)) == expected
        assert log.count() == (1 if outcome == "approved" else 0)


async def _hangs(ctx: so.ResponseContext) -> so.Allowed:
    await asyncio.sleep(10)
    return so.Allowed()


def _raises(ctx: so.ResponseContext) -> so.Allowed:
    raise LookupError("directory service is down")


def _bad_status(ctx: so.ResponseContext) -> Any:
    return {"status": "approved"}


def _none(ctx: so.ResponseContext) -> Any:
    return None


class _Unreadable:
    """A status that cannot be compared: reading it raised out of the answer, the candidate
    left pending."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing")

    __hash__ = object.__hash__


def _unreadable(ctx: so.ResponseContext) -> Any:
    return _Unreadable()


@pytest.mark.parametrize(
    ("policy", "outcome", "reason"),
    [
        (_raises, "failed", "response policy raised LookupError: directory service is down"),
        (
            _bad_status,
            "failed",
            "response policy returned an invalid status: {'status': 'approved'}",
        ),
        (_none, "failed", "response policy returned an invalid status: None"),
        (
            _unreadable,
            "failed",
            "response policy returned a _Unreadable that could not be read: "
            "RuntimeError: no comparing",
        ),
        (_hangs, "timed-out", "response policy took longer than 0.05s"),
    ],
    ids=["raises", "invalid status", "returns None", "unreadable", "hangs"],
)
@pytest.mark.parametrize("decision", ["approve", "cancel"])
async def test_a_broken_policy_never_settles(
    tmp_path: Path, policy: Any, outcome: str, reason: str, decision: str
) -> None:
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=policy, timeout=0.05)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, head = await asked(rt, ALICE)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id=decision)], principal=ALICE
        )
        assert r.outcomes == [
            so.Outcome(request_id=req.id, outcome=outcome, applied=False, reason=reason)
        ]
        assert r.status == "waiting"
        events = await events_of(rt, sid, head)
        assert lines(events) == [
            "approval.candidate pending",
            f"approval.candidate {outcome}",
            "turn.waiting",
        ]
        assert events[1].data["reason"] == reason
        assert [p.id for p in await rt.pending(session_id=sid)] == [req.id]
        assert log.count() == 0


async def test_a_candidate_whose_request_closed_meanwhile_is_stale(tmp_path: Path) -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow_for_mallory(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        if ctx.response.principal == MALLORY:
            started.set()
            await release.wait()
            return so.Rejected("not in this tenant")
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=slow_for_mallory)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, head = await asked(rt, ALICE)
        answer = so.InputResponse(request_id=req.id, option_id="cancel")
        mallory = asyncio.create_task(rt.respond(sid, [answer], principal=MALLORY, resume=False))
        await started.wait()
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
        )
        assert r.status == "completed"
        release.set()
        late = await mallory
        assert late.outcomes[0].outcome == "rejected"
        events = await events_of(rt, sid, head)
        candidates = [
            (e.data["outcome"], e.data["by"]["principal_id"])
            for e in events
            if e.type == "approval.candidate"
        ]
        assert candidates == [
            ("pending", "mallory"),
            ("pending", "bob"),
            ("stale", "mallory"),
        ]
        # the stale refusal neither reopened the turn nor undid Bob's approval
        assert lines(events)[-1] == "approval.candidate stale"
        assert "turn.waiting" not in lines(events)
        assert log.count() == 1


async def test_a_typed_message_answer_goes_through_the_response_policy(tmp_path: Path) -> None:
    """`send()` that names an option is an answer: the policy, not the default rule, decides."""
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=tenant_guard)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, head = await asked(rt, ALICE)
        r = await rt.send(sid, "approve", principal=MALLORY)
        assert r.status == "waiting"
        assert [p.id for p in r.pending] == [req.id]
        r = await rt.send(sid, "approve", principal=BOB)
        assert r.status == "completed"
        events = await events_of(rt, sid, head)
        assert lines(events) == [*REFUSED, *CANDIDATE_THEN_RAN]
        assert [e.principal_id for e in log.executions] == ["alice"]


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1, "5", None, True])
def test_approval_spec_refuses_a_timeout_that_is_not_positive_finite_seconds(
    timeout: Any,
) -> None:
    """A NaN response-policy timeout passed the `<= 0` check and bounded nothing; a string or
    None was a bare TypeError."""
    with pytest.raises(so.UsageError, match="timeout must be positive and finite"):
        so.ApprovalSpec(request=so.always(), response=tenant_guard, timeout=timeout)


def test_approval_spec_usage_errors() -> None:
    with pytest.raises(so.UsageError, match="response policy must be a function"):
        so.ApprovalSpec(request=so.always(), response="admins")  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="timeout must be positive"):
        so.ApprovalSpec(request=so.always(), response=tenant_guard, timeout=0)
    spec = so.ApprovalSpec(response=tenant_guard)
    assert spec.request.describe() == "Always"  # request defaults to always()

    @so.tool(approval=spec)
    async def t(x: int) -> int:
        """T."""
        return x

    assert t.response_policy is tenant_guard
    assert t.approval.describe() == "Always"


async def test_answers_to_several_requests_are_all_or_nothing_for_the_default_rule(
    tmp_path: Path,
) -> None:
    """One refused answer (NotAllowed) in a batch records none of them, policy or not."""
    log = ExecutionLog()

    @log.tool(approval=so.ApprovalSpec(request=so.always(), response=tenant_guard))
    async def refund_charge(tenant_id: str, charge_id: str, amount: float) -> str:
        """Refund a charge."""
        return "refunded"

    @log.tool(approval=so.always())
    async def close_account(tenant_id: str) -> str:
        """Close an account."""
        return "closed"

    agent = scripted_agent(
        "billing",
        [
            call_tools(
                call("refund_charge", tenant_id="t1", charge_id="c", amount=1),
                call("close_account", tenant_id="t1"),
            ),
            reply("done"),
        ],
        tools=[refund_charge, close_account],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("billing", prompt="refund and close", auth=ALICE)
        refund, close = r.pending
        assert (refund.tool_name, close.tool_name) == ("refund_charge", "close_account")
        before = await store_contents(rt.store, r.session_id)
        answers = [
            so.InputResponse(request_id=refund.id, option_id="approve"),
            so.InputResponse(request_id=close.id, option_id="approve"),
        ]
        with pytest.raises(so.NotAllowed) as info:
            await rt.respond(r.session_id, answers, principal=BOB)
        assert info.value.request_ids == [close.id]
        assert await store_contents(rt.store, r.session_id) == before
        # Bob may settle the refund (its policy admits his tenant); Alice the closure
        r = await rt.respond(r.session_id, answers[:1], principal=BOB)
        assert r.outcomes[0].outcome == "approved"
        r = await rt.respond(r.session_id, answers[1:], principal=ALICE)
        assert r.status == "completed"
        assert sorted(e.tool_name for e in log.executions) == ["close_account", "refund_charge"]


@pytest.mark.parametrize("alice_says", ["approve", "cancel"])
async def test_an_allowed_candidate_whose_request_closed_meanwhile_ends_stale(
    tmp_path: Path, alice_says: str
) -> None:
    """Every pending candidate ends: allowed too late, it is `stale` and settles nothing."""
    release = asyncio.Event()
    started = asyncio.Event()

    async def slow_for_bob(ctx: so.ResponseContext) -> so.Allowed:
        if ctx.response.principal == BOB:
            started.set()
            await release.wait()
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=slow_for_bob)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, head = await asked(rt, ALICE)
        bob = asyncio.create_task(
            rt.respond(
                sid,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=BOB,
                resume=False,
            )
        )
        await started.wait()
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id=alice_says)], principal=ALICE
        )
        assert r.status == "completed"
        release.set()
        if alice_says == "approve":
            late = await bob  # the same decision: a no-op, as for any repeated answer
            assert late.outcomes == [
                so.Outcome(request_id=req.id, outcome="approved", applied=False)
            ]
        else:
            with pytest.raises(so.ConflictingAnswer):
                await bob
        events = await events_of(rt, sid, head)
        candidates = [
            (e.data["outcome"], e.data["by"]["principal_id"])
            for e in events
            if e.type == "approval.candidate"
        ]
        assert candidates == [("pending", "bob"), ("pending", "alice"), ("stale", "bob")]
        settled = [e.data["by"]["principal_id"] for e in events if e.type == "approval.settled"]
        assert settled == ["alice"]
        assert log.count() == (1 if alice_says == "approve" else 0)


async def test_a_deadline_that_passes_while_the_policy_decides_wins(store_url: str) -> None:
    """The request's deadline passes while its response policy decides (a slow one): the
    deadline wins, as it would have had anyone looked, and the allowed answer settles nothing."""
    clock = ManualClock()

    async def slow(ctx: so.ResponseContext) -> so.Allowed:
        clock.advance(61)
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(expires_in=60), response=slow)
    async with so.Runtime([refund_agent(log, spec)], store=store_url, clock=clock) as rt:
        sid, req, head = await asked(rt, ALICE)
        with pytest.raises(so.RequestClosed, match="deadline passed before this response"):
            await rt.respond(
                sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
            )
        events = await events_of(rt, sid, head)
        outcomes = [e.data["outcome"] for e in events if e.type == "approval.candidate"]
        assert outcomes == ["pending", "stale"]
        assert not any(e.type == "approval.settled" for e in events)
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "expired"
        assert log.count() == 0


async def test_a_deadline_that_escalates_while_the_policy_decides_leaves_the_request_open(
    store_url: str,
) -> None:
    """With `on_timeout="escalate"`, a deadline passing while the response policy decides
    hands the request to the group: the answer is spent (`stale`, saying so), and the request
    stays open for the group, without a deadline."""
    clock = ManualClock()

    async def slow(ctx: so.ResponseContext) -> so.Allowed:
        clock.advance(61)
        return so.Allowed()

    log = ExecutionLog()
    rules = so.always(expires_in=60, on_timeout="escalate", escalate_to="finance")
    spec = so.ApprovalSpec(request=rules, response=slow)
    async with so.Runtime([refund_agent(log, spec)], store=store_url, clock=clock) as rt:
        sid, req, _ = await asked(rt, ALICE)
        answer = so.InputResponse(request_id=req.id, option_id="approve")
        r = await rt.respond(sid, [answer], principal=BOB)
        (outcome,) = r.outcomes
        assert (outcome.outcome, outcome.applied) == ("stale", False)
        assert outcome.reason is not None and "escalated to 'finance'" in outcome.reason
        (pending,) = r.pending
        assert pending.id == req.id and pending.escalated_to == "finance"
        assert pending.expires_at is None
        assert log.count() == 0


def test_approval_spec_keeps_the_request_policys_rules_it_does_not_override() -> None:
    """Giving the spec `approvers=` kept nothing else of `request`'s rules (its deadline action
    and requester exclusion fell back to defaults), and giving only `exclude_requester=`,
    `distinct=` or `on_timeout=` changed nothing at all."""
    base = so.always(
        exclude_requester=True, expires_in=60, on_timeout="escalate", escalate_to="finance"
    )
    spec = so.ApprovalSpec(request=base, approvers=2)
    rules = spec.request.rules
    assert (rules.approvers, rules.distinct, rules.exclude_requester) == (2, True, True)
    assert (rules.expires_in, rules.on_timeout, rules.escalate_to) == (60, "escalate", "finance")
    assert base.rules.approvers == 1  # the shared policy itself is untouched
    only = so.ApprovalSpec(request=so.always(expires_in=30), exclude_requester=True)
    assert only.request.rules.exclude_requester is True
    only = so.ApprovalSpec(request=so.always(approvers=3), distinct=False)
    assert (only.request.rules.approvers, only.request.rules.distinct) == (3, False)
    only = so.ApprovalSpec(request=so.always(expires_in=30), on_timeout="approve")
    assert only.request.rules.on_timeout == "approve"
    with pytest.raises(so.UsageError, match="needs escalate_to"):
        so.ApprovalSpec(request=so.always(expires_in=30), on_timeout="escalate")


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        (so.Rejected(b"not you"), "b'not you'"),  # type: ignore[arg-type]
        ({"status": "rejected", "reason": ValueError("not a lead")}, "not a lead"),
        (so.Rejected(float("nan")), "nan"),  # type: ignore[arg-type]
    ],
    ids=["bytes", "dict-object", "nan"],
)
async def test_a_refusal_reason_that_is_not_text_is_recorded_as_text(
    tmp_path: Path, status: Any, reason: str
) -> None:
    """A response policy's non-text reason made `respond` raise a bare TypeError (a 500 over
    HTTP) after its candidate was recorded; a NaN one was stored as non-JSON."""
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=lambda ctx: status)
    async with sqlite_runtime(tmp_path, refund_agent(log, spec)) as rt:
        sid, req, head = await asked(rt, ALICE)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
        )
        assert r.outcomes == [
            so.Outcome(request_id=req.id, outcome="rejected", applied=False, reason=reason)
        ]
        events = await events_of(rt, sid, head)
        assert lines(events) == [
            "approval.candidate pending",
            "approval.candidate rejected",
            "turn.waiting",
        ]
        assert events[1].data["reason"] == reason
        json.dumps([e.data for e in events], allow_nan=False)
        assert log.count() == 0


async def test_a_request_recorded_before_the_flag_is_still_decided_by_its_policy(
    store_url: str,
) -> None:
    """A request parked by a signoff older than `InputRequest.response_policy` has no such key
    (a false flag is stored as none, so writing it unflagged gives the old record exactly). It
    loads on both stores; a runtime without the tool (a record-only settler) refuses it, from
    the tool's recorded setting, changing nothing; the runtime with the policy lets only the
    requester settle it, and the turn resumes and completes, the tool run once."""
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=requester_only)
    agent = refund_agent(log, spec)
    tool = agent.tools["refund_charge"]
    async with so.Runtime([agent], store=store_url) as rt:
        policy, tool.response_policy = tool.response_policy, None
        try:
            sid, req, head = await asked(rt, ALICE)  # as the older signoff recorded it
        finally:
            tool.response_policy = policy
        (asking,) = [e for e in await events_of(rt, sid) if e.type == "input.requested"]
        assert "response_policy" not in asking.data["requests"][0]
    approve = [so.InputResponse(request_id=req.id, option_id="approve")]
    async with so.Runtime([scripted_agent("billing", [])], store=store_url) as other:
        (loaded,) = await other.pending(session_id=sid)
        assert loaded.id == req.id and not loaded.response_policy
        before = await store_contents(other.store, sid)
        for who in (ALICE, BOB, None):
            for resume in (True, False):
                with pytest.raises(so.NotAllowed, match="response policy"):
                    await other.respond(sid, approve, principal=who, resume=resume)
            with pytest.raises(so.NotAllowed, match="response policy"):
                await other.generate(
                    session_id=sid, approvals=[so.Decision(id=req.id, approved=True)], auth=who
                )
        assert await store_contents(other.store, sid) == before
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        r = await rt.respond(sid, approve, principal=BOB)
        (o,) = r.outcomes
        assert (o.outcome, o.applied, r.status, log.count()) == ("rejected", False, "waiting", 0)
        r = await rt.respond(sid, approve, principal=ALICE)
        assert r.status == "completed" and r.text == "done" and log.count() == 1
        assert lines(await events_of(rt, sid, head)) == REFUSED + CANDIDATE_THEN_RAN
