"""Quorum: `so.always(approvers=N)` needs N distinct eligible principals; one cancel denies."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    timeline,
    tool_results,
)

ALICE = so.Principal(authenticator="sso", principal_id="alice")
BOB = so.Principal(authenticator="sso", principal_id="bob")
CAROL = so.Principal(authenticator="sso", principal_id="carol")
DAN = so.Principal(authenticator="sso", principal_id="dan")


def lines(events: list[so.Event]) -> list[str]:
    out = []
    for e, line in zip(events, timeline(events), strict=True):
        if e.type == "approval.candidate":
            line = f"approval.candidate {e.data['outcome']}"
        out.append(line)
    return out


async def events_of(rt: so.Runtime, session_id: str, after: int = 0) -> list[so.Event]:
    return [e async for e in rt.events(session_id, after, follow=False)]


def deploy_agent(log: ExecutionLog, approval: Any, seen: Capture | None = None) -> so.Agent:
    @log.tool(approval=approval)
    async def deploy(service: str, version: str) -> str:
        """Deploy a service to production."""
        return f"{service}@{version} live"

    return scripted_agent(
        "ops",
        [call_tools(call("deploy", service="api", version="2.0")), seen or reply("deployed")],
        tools=[deploy],
    )


async def asked(rt: so.Runtime) -> tuple[str, so.InputRequest, int]:
    r = await rt.generate("ops", prompt="deploy api 2.0", auth=ALICE)
    assert r.status == "waiting"
    (req,) = r.pending
    head = await rt.store.head(r.session_id)
    assert head is not None
    return r.session_id, req, head


def vote(request_id: str, decision: str = "approve") -> list[so.InputResponse]:
    return [so.InputResponse(request_id=request_id, option_id=decision)]


async def test_two_distinct_approvers_are_needed(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("deployed"))
    policy = so.always(approvers=2, exclude_requester=True)
    assert policy.describe() == "Always (2 approvers)"
    async with sqlite_runtime(tmp_path, deploy_agent(log, policy, seen)) as rt:
        sid, req, head = await asked(rt)
        assert (req.approvers, req.progress, req.approved_by) == (2, "0 of 2", [])
        r = await rt.respond(sid, vote(req.id), principal=BOB)
        assert r.status == "waiting"
        assert r.outcomes == [
            so.Outcome(request_id=req.id, outcome="counted", applied=True, reason="1 of 2")
        ]
        assert log.count() == 0
        # progress is visible on the request, in the queue
        (queued,) = await rt.pending(session_id=sid)
        assert queued.approved_by == ["bob"] and queued.progress == "1 of 2"
        (pending,) = r.pending
        assert pending.progress == "1 of 2"
        events = await events_of(rt, sid, head)
        assert lines(events) == ["approval.candidate counted", "turn.waiting"]
        counted = events[0].data
        assert (counted["votes"], counted["needed"], counted["decision"]) == (1, 2, "approve")
        assert counted["by"] == BOB.model_dump()
        assert {e.turn_id for e in events} == {req.turn_id}
        # a repeat vote is a no-op: nothing is recorded and the count stays
        before = await store_contents(rt.store, sid)
        r = await rt.respond(sid, vote(req.id), principal=BOB)
        assert r.outcomes == [
            so.Outcome(
                request_id=req.id,
                outcome="counted",
                applied=False,
                reason="already counted: 1 of 2",
            )
        ]
        assert await store_contents(rt.store, sid) == before
        # the second distinct approver settles it; the call runs as the requester
        r = await rt.respond(sid, vote(req.id), principal=CAROL)
        assert r.status == "completed"
        assert r.outcomes == [so.Outcome(request_id=req.id, outcome="approved", applied=True)]
        events = await events_of(rt, sid, head)
        assert lines(events) == [
            "approval.candidate counted",
            "turn.waiting",
            "approval.settled approve",
            "input.resolved approved",
            "tool.started deploy",
            "tool.completed deploy ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        settled = next(e for e in events if e.type == "approval.settled").data
        assert settled["approved_by"] == ["bob", "carol"]
        assert settled["by"] == CAROL.model_dump()
        assert [e.principal_id for e in log.executions] == ["alice"]
        assert tool_results(seen.last)[0].content == "api@2.0 live"
        assert await rt.pending(session_id=sid) == []


async def test_a_votes_reason_and_value_are_recorded_with_it(tmp_path: Path) -> None:
    # Without a response policy (whose pending candidate records the answer), a counted vote
    # recorded only who voted: the first approver's reason was accepted and lost, audit too.
    log = ExecutionLog()
    policy = so.always(approvers=2, exclude_requester=True)
    async with sqlite_runtime(tmp_path, deploy_agent(log, policy)) as rt:
        sid, req, head = await asked(rt)
        why = so.InputResponse(
            request_id=req.id, option_id="approve", text="invoice 7 checked", value={"t": 9}
        )
        r = await rt.respond(sid, [why], principal=BOB)
        assert r.outcomes[0].outcome == "counted"
        [counted] = [e.data for e in await events_of(rt, sid, head) if e.data.get("votes")]
        assert (counted["text"], counted["value"]) == ("invoice 7 checked", {"t": 9})
        trail = [e.data for e in await rt.audit(sid)]
        assert any(d.get("text") == "invoice 7 checked" for d in trail)


async def test_one_cancel_denies(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("not deployed"))
    agent = deploy_agent(log, so.always(approvers=3, exclude_requester=True), seen)
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, head = await asked(rt)
        await rt.respond(sid, vote(req.id), principal=BOB)
        r = await rt.respond(sid, vote(req.id), principal=CAROL)
        assert r.outcomes[0].reason == "2 of 3"
        r = await rt.respond(
            sid,
            [so.InputResponse(request_id=req.id, option_id="cancel", text="change freeze")],
            principal=DAN,
        )
        assert r.status == "completed"
        assert r.outcomes == [so.Outcome(request_id=req.id, outcome="cancelled", applied=True)]
        assert lines(await events_of(rt, sid, head)) == [
            "approval.candidate counted",
            "turn.waiting",
            "approval.candidate counted",
            "turn.waiting",
            "approval.settled cancel",
            "input.resolved cancelled",
            "tool.completed deploy denied",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        assert log.count() == 0
        (result,) = tool_results(seen.last)
        assert result.is_error and result.content["denied"] is True
        assert result.content["by"] == "dan"
        # the quorum is closed: a late approval conflicts, it does not count
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(sid, vote(req.id), principal=BOB.model_copy())
        # the excluded requester is refused as while it was open, not told how it closed
        with pytest.raises(so.NotAllowed, match="the requester may not"):
            await rt.respond(sid, vote(req.id), principal=ALICE.model_copy())


async def test_a_cancel_before_the_quorum_is_reached_denies_at_once(store_url: str) -> None:
    """A cancel is not a vote: the first one denies the call, even with no approval counted,
    and no later approval can bring the quorum back (on both stores)."""
    log = ExecutionLog()
    seen = Capture(reply("not deployed"))
    agent = deploy_agent(log, so.always(approvers=3, exclude_requester=True), seen)
    async with so.Runtime([agent], store=store_url) as rt:
        sid, req, head = await asked(rt)
        await rt.respond(sid, vote(req.id), principal=BOB)
        r = await rt.respond(sid, vote(req.id, "cancel"), principal=CAROL)
        assert r.status == "completed"
        assert r.outcomes == [so.Outcome(request_id=req.id, outcome="cancelled", applied=True)]
        events = await events_of(rt, sid, head)
        assert lines(events)[:4] == [
            "approval.candidate counted",
            "turn.waiting",
            "approval.settled cancel",
            "input.resolved cancelled",
        ]
        settled = next(e for e in events if e.type == "approval.settled").data
        assert settled["by"] == CAROL.model_dump()
        assert settled["approved_by"] is None
        assert log.count() == 0
        stored = await rt.store.get_request(req.id)
        assert stored is not None
        assert (stored.status, stored.outcome) == ("settled", "cancelled")
        assert stored.request.approved_by == ["bob"]
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(sid, vote(req.id), principal=DAN)
        assert log.count() == 0


async def test_the_requester_is_not_eligible_when_excluded(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = deploy_agent(log, so.always(approvers=2, exclude_requester=True))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, _ = await asked(rt)
        before = await store_contents(rt.store, sid)
        for decision, verb in (("approve", "approve"), ("cancel", "deny")):
            with pytest.raises(so.NotAllowed, match=f"the requester may not {verb} their") as info:
                await rt.respond(sid, vote(req.id, decision), principal=ALICE)
            assert info.value.request_ids == [req.id]
        # full identity: other attributes are still the requester
        with pytest.raises(so.NotAllowed):
            await rt.respond(
                sid,
                vote(req.id),
                principal=ALICE.model_copy(update={"attributes": {"role": "admin"}}),
            )
        assert await store_contents(rt.store, sid) == before


async def test_anonymous_answers_do_not_count(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = deploy_agent(log, so.always(approvers=2))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, _ = await asked(rt)
        before = await store_contents(rt.store, sid)
        for decision in ("approve", "cancel"):
            with pytest.raises(so.NotAllowed, match="anonymous answer does not count"):
                await rt.respond(sid, vote(req.id, decision), principal=None)
        assert await store_contents(rt.store, sid) == before


async def test_the_requester_counts_unless_excluded(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, deploy_agent(log, so.always(approvers=2))) as rt:
        sid, req, _ = await asked(rt)
        r = await rt.respond(sid, vote(req.id), principal=ALICE)
        assert r.outcomes[0].reason == "1 of 2"
        r = await rt.respond(sid, vote(req.id), principal=BOB)
        assert r.status == "completed"
        assert log.count() == 1


async def test_distinct_false_counts_every_approval(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = deploy_agent(log, so.always(approvers=2, distinct=False))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, _ = await asked(rt)
        r = await rt.respond(sid, vote(req.id), principal=BOB)
        assert r.outcomes[0] == so.Outcome(
            request_id=req.id, outcome="counted", applied=True, reason="1 of 2"
        )
        r = await rt.respond(sid, vote(req.id), principal=BOB)
        assert r.status == "completed"
        assert log.count() == 1


async def test_progress_survives_a_new_runtime(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = deploy_agent(log, so.always(approvers=2, exclude_requester=True))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, _ = await asked(rt)
        await rt.respond(sid, vote(req.id), principal=BOB)
    async with sqlite_runtime(tmp_path, agent) as rt2:
        (queued,) = await rt2.pending()
        assert queued.progress == "1 of 2"
        state = await rt2.state(sid)
        assert state.requests[req.id].request.approved_by == ["bob"]
        again = await rt2.respond(sid, vote(req.id), principal=BOB)
        assert again.outcomes[0].applied is False
        r = await rt2.respond(sid, vote(req.id), principal=CAROL)
        assert r.status == "completed"
        assert log.count() == 1


async def test_concurrent_votes_settle_once(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = deploy_agent(log, so.always(approvers=2, exclude_requester=True))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, head = await asked(rt)
        results = await asyncio.gather(
            rt.respond(sid, vote(req.id), principal=BOB),
            rt.respond(sid, vote(req.id), principal=CAROL),
            rt.respond(sid, vote(req.id), principal=DAN),
        )
        outcomes = sorted((o.outcome, o.applied) for r in results for o in r.outcomes)
        assert ("counted", True) in outcomes
        assert ("approved", True) in outcomes
        assert [o for o in outcomes if o == ("approved", True)] == [("approved", True)]
        events = await events_of(rt, sid, head)
        assert [line for line in lines(events) if line.startswith("approval.settled")] == [
            "approval.settled approve"
        ]
        settled = next(e for e in events if e.type == "approval.settled").data
        assert len(settled["approved_by"]) == 2
        assert len(set(settled["approved_by"])) == 2
        assert log.count() == 1


async def test_quorum_with_a_response_policy(tmp_path: Path) -> None:
    def leads_only(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        who = ctx.response.principal
        if who is not None and who.principal_id in ("bob", "carol"):
            return so.Allowed()
        return so.Rejected("only team leads vote on deploys")

    log = ExecutionLog()
    spec = so.ApprovalSpec(
        request=so.always(), response=leads_only, approvers=2, exclude_requester=True
    )
    async with sqlite_runtime(tmp_path, deploy_agent(log, spec)) as rt:
        sid, req, head = await asked(rt)
        assert req.approvers == 2 and req.exclude_requester
        r = await rt.respond(sid, vote(req.id), principal=DAN)
        assert r.outcomes[0].outcome == "rejected"
        r = await rt.respond(sid, vote(req.id), principal=BOB)
        assert r.outcomes[0].reason == "1 of 2"
        r = await rt.respond(sid, vote(req.id), principal=CAROL)
        assert r.status == "completed"
        assert lines(await events_of(rt, sid, head)) == [
            "approval.candidate pending",
            "approval.candidate rejected",
            "turn.waiting",
            "approval.candidate pending",
            "approval.candidate counted",
            "turn.waiting",
            "approval.candidate pending",
            "approval.settled approve",
            "input.resolved approved",
            "tool.started deploy",
            "tool.completed deploy ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        assert log.count() == 1


async def test_quorum_through_generate_approvals(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = deploy_agent(log, so.always(approvers=2, exclude_requester=True))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, _ = await asked(rt)
        r = await rt.generate(
            session_id=sid, approvals=[so.Decision(id=req.id, approved=True)], auth=BOB
        )
        assert r.status == "waiting"
        assert r.outcomes[0].outcome == "counted"
        r = await rt.generate(
            session_id=sid, approvals=[so.Decision(id=req.id, approved=True)], auth=CAROL
        )
        assert r.status == "completed"
        assert log.count() == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_approvers_must_be_a_positive_integer(bad: Any) -> None:
    with pytest.raises(so.UsageError, match="approvers must be a positive integer"):
        so.always(approvers=bad)
    with pytest.raises(so.UsageError, match="approvers must be a positive integer"):
        so.ApprovalSpec(request=so.always(), approvers=bad)


@pytest.mark.parametrize("bad", [2**63, 10**5000], ids=["2**63", "10**5000"])
def test_approvers_past_what_a_store_holds_are_refused_by_name(bad: int) -> None:
    """10**5000 approvers passed, then every runtime of the agent failed to open with a bare
    ValueError (Python writes out no int of 4300 digits or more: the policy's description, the
    request's JSON); the error names the setting without writing the number out either."""
    for make in (lambda: so.always(approvers=bad), lambda: so.ApprovalSpec(approvers=bad)):
        with pytest.raises(so.UsageError, match="approvers must be a positive integer") as e:
            make()
        assert len(str(e.value)) < 200


async def test_the_largest_quorum_a_store_holds_parks_on_both_stores(store_url: str) -> None:
    log = ExecutionLog()
    most = 2**63 - 1
    async with so.Runtime([deploy_agent(log, so.always(approvers=most))], store=store_url) as rt:
        r = await rt.generate("ops", prompt="ship it", auth=ALICE)
        (req,) = r.pending
        assert (req.approvers, req.progress) == (most, f"0 of {most}")
        (queued,) = await rt.pending(session_id=r.session_id)
        assert queued.approvers == most


async def test_votes_by_typed_message(tmp_path: Path) -> None:
    """A typed "approve" from an eligible person is a vote; the excluded requester's is refused."""
    log = ExecutionLog()
    agent = deploy_agent(log, so.always(approvers=2, exclude_requester=True))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, head = await asked(rt)
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.NotAllowed, match="the requester may not approve"):
            await rt.send(sid, "approve", principal=ALICE)
        assert await store_contents(rt.store, sid) == before
        r = await rt.send(sid, "approve", principal=BOB)
        assert r.status == "waiting" and r.pending[0].progress == "1 of 2"
        r = await rt.send(sid, "Approve", principal=CAROL)
        assert r.status == "completed"
        assert lines(await events_of(rt, sid, head))[:4] == [
            "approval.candidate counted",
            "turn.waiting",
            "approval.settled approve",
            "input.resolved approved",
        ]
        assert log.count() == 1


@pytest.mark.parametrize("with_policy", [False, True], ids=["default-rule", "response-policy"])
async def test_exclude_requester_holds_for_a_single_approver(
    tmp_path: Path, with_policy: bool
) -> None:
    """`exclude_requester=True` with one approver was ignored: the requester approved their own
    call. It is four eyes: anyone identified but the requester may settle it."""
    log = ExecutionLog()
    approval: Any = so.always(exclude_requester=True)
    if with_policy:
        approval = so.ApprovalSpec(request=approval, response=lambda ctx: so.Allowed())
    async with sqlite_runtime(tmp_path, deploy_agent(log, approval)) as rt:
        sid, req, _ = await asked(rt)
        assert (req.approvers, req.exclude_requester) == (1, True)
        before = await store_contents(rt.store, sid)
        for who in (ALICE, ALICE.model_copy(update={"attributes": {"role": "admin"}})):
            for decision in ("approve", "cancel"):
                with pytest.raises(so.NotAllowed, match="the requester may not") as info:
                    await rt.respond(sid, vote(req.id, decision), principal=who)
                assert info.value.request_ids == [req.id]
        with pytest.raises(so.NotAllowed, match="identified approver"):
            await rt.respond(sid, vote(req.id), principal=None)
        with pytest.raises(so.NotAllowed, match="the requester may not"):
            await rt.send(sid, "approve", principal=ALICE)
        assert await store_contents(rt.store, sid) == before
        assert log.count() == 0
        r = await rt.respond(sid, vote(req.id), principal=BOB)
        assert r.status == "completed"
        assert r.outcomes == [so.Outcome(request_id=req.id, outcome="approved", applied=True)]
        assert [e.principal_id for e in log.executions] == ["alice"]


async def test_one_person_is_one_principal_id_across_authenticators(tmp_path: Path) -> None:
    """Votes are counted per principal id, so the requester's exclusion is by principal id too:
    the requester answering through another surface (the CLI's `local:alice`) was counted."""
    log = ExecutionLog()
    agent = deploy_agent(log, so.always(approvers=2, exclude_requester=True))
    alice_cli = so.Principal(authenticator="local", principal_id="alice")
    bob_cli = so.Principal(authenticator="local", principal_id="bob")
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid, req, _ = await asked(rt)
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.NotAllowed, match="the requester may not"):
            await rt.respond(sid, vote(req.id), principal=alice_cli)
        assert await store_contents(rt.store, sid) == before
        await rt.respond(sid, vote(req.id), principal=BOB)
        again = await rt.respond(sid, vote(req.id), principal=bob_cli)
        assert again.outcomes[0].outcome == "counted" and again.outcomes[0].applied is False
        assert log.count() == 0
        r = await rt.respond(sid, vote(req.id), principal=CAROL)
        assert r.status == "completed" and log.count() == 1


@pytest.mark.parametrize(
    ("rules", "message"),
    [
        ({"distinct": "no"}, r"distinct must be True or False, not 'no'"),
        ({"distinct": 0}, r"distinct must be True or False, not 0"),
        ({"exclude_requester": "yes"}, r"exclude_requester must be True or False, not 'yes'"),
        ({"escalate_to": ""}, r"escalate_to must be a group's name \(non-empty text\), not ''"),
        ({"escalate_to": 5}, r"escalate_to must be a group's name \(non-empty text\), not 5"),
        ({"escalate_to": "  "}, r"escalate_to must be a group's name \(non-empty text\), not '  '"),
        ({"escalate_to": "\u200b"}, r"escalate_to must be a group's name \(non-empty text\)"),
        ({"escalate_to": "ops\ud800"}, r"escalate_to must be a group's name \(non-empty text\)"),
    ],
    ids=["distinct-no", "distinct-0", "exclude-yes", "empty", "int", "blank", "invisible", "lone"],
)
def test_approval_rules_refuse_flags_and_groups_of_the_wrong_kind(
    rules: dict[str, Any], message: str
) -> None:
    """`distinct="no"` was taken as true (a non-empty string), and `escalate_to=""` or `5` as
    a group no one could be part of; so were a name of only spaces or invisible characters (the
    request shown escalated to nothing), and one holding a lone surrogate (not Unicode text)."""
    with pytest.raises(so.UsageError, match=message):
        so.always(**rules)
    with pytest.raises(so.UsageError, match=message):
        so.ApprovalSpec(request=so.always(), **rules)
