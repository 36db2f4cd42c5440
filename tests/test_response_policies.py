"""Who may settle an approval: the default rule and response policies, for every kind of responder.

The matrix answers one question for every kind of responder (the requester, another
user, a user of another tenant, an anonymous caller, the app principal), without and with a
response policy, and asserts the outcome and the exact events each answer records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
)

from ._delegation import refund_desk
from ._response_policies import (
    ALICE,
    BOB,
    CANDIDATE_THEN_RAN,
    MALLORY,
    PEOPLE,
    POLICIES,
    REFUSED,
    asked,
    events_of,
    lines,
    ran,
    refund_agent,
    requester_only,
    tenant_guard,
)

# -- the who-may-settle matrix ------------------------------------------------------------------

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
        # The same refusal of the same person again is recorded once (test_refusals_repeated).
        assert lines(await events_of(rt, sid, head)) == REFUSED
        assert log.executions == []


FAULTS: dict[str, dict[str, Any]] = {
    "a stale input hash": {"input_hash": "sha256:" + "0" * 64},
    "a deny with a stale input hash": {"option_id": "cancel", "input_hash": "sha256:0"},
    "an edit of the wrong type": {"edited_input": {"tenant_id": "t1", "charge_id": 1, "amount": 5}},
    "an edit over the bound": {
        "edited_input": {"tenant_id": "t1", "charge_id": "c" * 1000, "amount": 5}
    },
}


@pytest.mark.parametrize("fault", list(FAULTS))
@pytest.mark.parametrize("settled", [False, True], ids=["open", "settled"])
async def test_a_responder_the_policy_refuses_is_not_told_what_is_wrong_with_the_answer(
    store_url: str, settled: bool, fault: str
) -> None:
    """Under a tenant guard, mallory's sound answer gets the policy's verdict, but her answer
    with a stale input hash got `StaleAnswer` naming the hash the request is bound to, and her
    edit of the wrong type (or over the tool's bound) `InvalidAnswer` naming the tool's schema
    (its `max_result_bytes`), the request open or settled. She gets the verdict whatever her
    answer, which the policy judges on its decision alone (no unsound edit reaches it), and
    nothing is recorded for it; bob, whom the policy allows, is told the fault."""
    log = ExecutionLog()
    seen: list[tuple[str, Any]] = []

    def guard(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        who = ctx.response.principal
        seen.append(("" if who is None else who.principal_id, ctx.response.edited_input))
        return tenant_guard(ctx)

    spec = so.ApprovalSpec(request=so.always(), response=guard)
    async with so.Runtime([refund_agent(log, spec, max_result_bytes=400)], store=store_url) as rt:
        sid, req, _ = await asked(rt, ALICE)
        sound = so.InputResponse(request_id=req.id, option_id="approve")
        refused = await rt.respond(sid, [sound], principal=MALLORY)
        [verdict] = refused.outcomes
        assert (verdict.outcome, verdict.applied) == ("rejected", False)
        if settled:
            assert (await rt.respond(sid, [sound], principal=BOB)).status == "completed"
        before = await store_contents(rt.store, sid)
        answer = so.InputResponse(**{"request_id": req.id, "option_id": "approve", **FAULTS[fault]})
        seen.clear()
        r = await rt.respond(sid, [answer], principal=MALLORY)
        assert r.outcomes == [verdict]
        if not settled:  # nor through `generate(approvals=)`
            decision = so.Decision(
                id=req.id,
                approved=answer.option_id == "approve",
                edited_input=answer.edited_input,
                input_hash=answer.input_hash,
            )
            r = await rt.generate(session_id=sid, approvals=[decision], auth=MALLORY)
            assert r.outcomes == [verdict] and r.status == "waiting"
        # An edit reaches the policy validated or not at all: the long one fits the schema,
        # and its bound is checked for an open request only.
        long = settled and fault == "an edit over the bound"
        assert seen and all(who == "mallory" for who, _ in seen)
        assert all((edited is not None) == long for _, edited in seen)
        assert await store_contents(rt.store, sid) == before
        assert req.action is not None
        told: tuple[type[so.SignoffError], str] = {
            "a stale input hash": (so.StaleAnswer, f"bound to {req.action.input_hash}"),
            "a deny with a stale input hash": (so.StaleAnswer, "bound to sha256:"),
            "an edit of the wrong type": (so.InvalidAnswer, "does not fit refund_charge's schema"),
            "an edit over the bound": (so.InvalidAnswer, "max_result_bytes"),
        }[fault]
        if long:  # settled by bob with no edit
            told = (so.ConflictingAnswer, "has other edited input")
        with pytest.raises(told[0], match=told[1]):
            await rt.respond(sid, [answer], principal=BOB)
        assert await store_contents(rt.store, sid) == before
        assert log.count() == (1 if settled else 0)


@pytest.mark.parametrize("settled", [False, True], ids=["open", "settled"])
async def test_through_a_mirror_a_refused_responder_is_not_told_what_is_wrong_either(
    store_url: str, settled: bool
) -> None:
    """Through a parent's mirror of a subagent's approval, an answer of bob's (whom the
    subagent's policy refuses) with a stale input hash or an edit of the wrong type got
    `StaleAnswer` or `InvalidAnswer`, as on the subagent itself: it gets the verdict, neither
    session changed; alice, whom it allows, is told the fault."""
    only_alice = AllowList(["alice"])
    async with so.Runtime(
        refund_desk(so.ApprovalSpec(so.always(), only_alice), []), store=store_url
    ) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        child = mirror.child
        if settled:  # on the subagent's session, leaving the mirror open
            sound = so.InputResponse(request_id=child.request_id, option_id="approve")
            await rt.respond(child.session_id, [sound], principal=ALICE, resume=False)
        sessions = (r.session_id, child.session_id)
        before = [await store_contents(rt.store, sid) for sid in sessions]
        faults: list[tuple[dict[str, Any], type[so.SignoffError]]] = [
            ({"input_hash": "sha256:0"}, so.StaleAnswer),
            ({"edited_input": {"order_id": []}}, so.InvalidAnswer),
        ]
        for given, fault in faults:
            answer = so.InputResponse(request_id=mirror.id, option_id="approve", **given)
            refused = await rt.respond(r.session_id, [answer], principal=BOB)
            assert [(o.outcome, o.reason) for o in refused.outcomes] == [
                ("rejected", "not on the allow-list")
            ]
            assert [await store_contents(rt.store, sid) for sid in sessions] == before
            with pytest.raises(fault):
                await rt.respond(r.session_id, [answer], principal=ALICE)
            assert [await store_contents(rt.store, sid) for sid in sessions] == before


async def test_approvals_leaving_a_request_open_are_partial_whatever_a_refused_answer(
    store_url: str,
) -> None:
    """`generate(approvals=)` from mallory, whom the tenant guard refuses, answering one of two
    open approvals raises `PartialAnswer` (before the policy judges her sound answer): so does
    it when her answer has a stale input hash, which got `StaleAnswer` naming the bound hash."""
    spec = so.ApprovalSpec(request=so.always(), response=tenant_guard)

    @so.tool(approval=spec)
    async def refund_charge(tenant_id: str, charge_id: str) -> str:
        """Refund a charge."""
        return charge_id

    calls = [call("refund_charge", tenant_id="t1", charge_id=c) for c in ("ch_1", "ch_2")]
    agent = scripted_agent("billing", [call_tools(*calls), reply("done")], tools=[refund_charge])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund both", auth=ALICE)
        first, second = r.pending
        before = await store_contents(rt.store, r.session_id)
        for stale in (None, "sha256:0"):
            decision = so.Decision(id=first.id, approved=True, input_hash=stale)
            with pytest.raises(so.PartialAnswer) as partial:
                await rt.generate(session_id=r.session_id, approvals=[decision], auth=MALLORY)
            assert partial.value.request_ids == [second.id]
        assert await store_contents(rt.store, r.session_id) == before


# -- judged once a call through mirrors ---------------------------------------------------------

# who answers, whether the subagent's request was settled (by alice, on its own session), and
# the answer: the policy refuses bob's, allows alice's
ONCE: dict[str, tuple[so.Principal, bool, dict[str, Any]]] = {
    "bob, a stale input hash": (BOB, False, {"input_hash": "sha256:0"}),
    "bob, an edit of the wrong type": (BOB, False, {"edited_input": {"order_id": []}}),
    "bob, a sound answer to a closed request": (BOB, True, {}),
    "alice, her answer again": (ALICE, True, {}),
}


@pytest.mark.parametrize("depth", [1, 2], ids=["mirror", "mirror of a mirror"])
@pytest.mark.parametrize("case", list(ONCE))
async def test_through_a_mirror_the_policy_judges_an_answer_once_a_call(
    store_url: str, case: str, depth: int
) -> None:
    """An answer through a parent's mirror is checked in every session before any is settled,
    and an answer the policy judges without settling it (unsound, or to a closed request) was
    judged again in each pass: three times through a mirror, more through a mirror of one. A
    policy may be slow or ask a model: it judges each answer once a call."""
    who, closed, given = ONCE[case]
    seen: list[str] = []

    def only_alice(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        assert ctx.response.principal is not None
        seen.append(ctx.response.principal.principal_id)
        return AllowList(["alice"])(ctx)

    desk = refund_desk(so.ApprovalSpec(so.always(), only_alice), [])
    top = scripted_agent(
        "top",
        [call_tools(call("support", message="refund 9")), reply("done")],
        tools=[so.delegate("support")],
    )
    async with so.Runtime([top, *desk], store=store_url) as rt:
        r = await rt.generate("top" if depth == 2 else "support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        child = mirror.child
        for _ in range(depth - 1):
            assert child is not None
            (deeper,) = (await rt.state(child.session_id)).pending_requests()
            child = deeper.child
        assert child is not None and child.agent == "billing"
        if closed:  # on the subagent's session, leaving the mirrors open
            sound = so.InputResponse(request_id=child.request_id, option_id="approve")
            await rt.respond(child.session_id, [sound], principal=ALICE, resume=False)
        seen.clear()
        answer = so.InputResponse(request_id=mirror.id, option_id="approve", **given)
        done = await rt.respond(r.session_id, [answer], principal=who)
        assert seen == [who.principal_id]
        if who == BOB:
            assert [(o.outcome, o.applied) for o in done.outcomes] == [("rejected", False)]
        else:
            assert done.status == "completed"
