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
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
)

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
