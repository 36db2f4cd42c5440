"""How a response policy's candidates settle against the world: a request closed meanwhile,
typed answers, all-or-nothing batches, a deadline passing while the policy decides, and
requests recorded before the flag.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    ExecutionLog,
    ManualClock,
    call,
    call_tools,
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
    REFUSED,
    asked,
    events_of,
    lines,
    refund_agent,
    requester_only,
    tenant_guard,
)


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


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), -1, "5", None, True, 10**400])
def test_approval_spec_refuses_a_timeout_that_is_not_positive_finite_seconds(
    timeout: Any,
) -> None:
    """A NaN response-policy timeout passed the `<= 0` check and bounded nothing; a string or
    None was a bare TypeError."""
    with pytest.raises(so.UsageError, match="timeout must be positive and finite"):
        so.ApprovalSpec(request=so.always(), response=tenant_guard, timeout=timeout)


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


async def test_a_deadline_that_approves_while_the_policy_decides_says_the_call_ran(
    store_url: str,
) -> None:
    """`on_timeout="approve"`: the deadline that passed while the policy decided approved the
    call, which runs; the answer it overtook was told the request `expired`, as though the
    deadline had denied the call, and is told it was approved automatically."""
    clock = ManualClock()

    async def slow(ctx: so.ResponseContext) -> so.Allowed:
        clock.advance(61)
        return so.Allowed()

    log = ExecutionLog()
    approving = so.always(expires_in=60, on_timeout="approve")
    spec = so.ApprovalSpec(request=approving, response=slow)
    async with so.Runtime([refund_agent(log, spec)], store=store_url, clock=clock) as rt:
        sid, req, head = await asked(rt, ALICE)
        with pytest.raises(so.RequestClosed) as late:
            await rt.respond(
                sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
            )
        assert str(late.value) == (
            f"request {req.id} was approved automatically when its deadline passed "
            "(on_timeout='approve'): the deadline passed before this response could settle it "
            f"(request {req.id})"
        )
        events = await events_of(rt, sid, head)
        settled = [e.data for e in events if e.type == "approval.settled"]
        assert [(d["decision"], d["by"], d["auto"]) for d in settled] == [
            ("approve", None, "timeout")
        ]
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "expired"


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


def _on_call(
    judging: asyncio.Event, release: asyncio.Event, seen: list[str | None]
) -> Callable[[so.ResponseContext], Awaitable[so.Allowed | so.Rejected]]:
    """Alice, on call, may answer until the request is escalated, then only bob (a manager):
    the policy notes the escalation it was shown in `seen`, sets `judging`, and decides once
    `release` is set."""

    async def on_call(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        seen.append(ctx.request.escalated_to)
        judging.set()
        await release.wait()
        who = ctx.response.principal
        allowed = {None: "alice", "managers": "bob"}[ctx.request.escalated_to]
        if who is not None and who.principal_id == allowed:
            return so.Allowed()
        return so.Rejected(f"only {allowed} may answer now")

    return on_call


@pytest.mark.parametrize("sweeper", ["another runtime", "this runtime", "its call cancelled"])
async def test_an_escalation_recorded_while_the_policy_decides_spends_the_answer(
    store_url: str, sweeper: str
) -> None:
    """Alice, on call, may answer until the deadline escalates her request to the managers.
    Her answer is judged before; while the policy decides, a sweep (another runtime's, this
    one's, or after her call was cancelled, the judging left going) records the escalation. The
    answer was judged on the request as it stood before, so it is spent as the deadline would
    have spent it unrecorded: `stale`, the request open to the managers, the tool not run."""
    clock = ManualClock()
    judging, release = asyncio.Event(), asyncio.Event()
    seen: list[str | None] = []
    on_call = _on_call(judging, release, seen)

    log = ExecutionLog()
    rules = so.always(expires_in=60, on_timeout="escalate", escalate_to="managers")
    # The policy's timeout outlasts the clock's jump: the sweep does not take the answer for
    # one whose process died, to judge it again.
    agent = refund_agent(log, so.ApprovalSpec(request=rules, response=on_call, timeout=60.0))
    async with (
        so.Runtime([agent], store=store_url, clock=clock) as rt,
        so.Runtime([agent], store=store_url, clock=clock) as other,
    ):
        sid, req, head = await asked(rt, ALICE)
        clock.advance(30)
        yes = so.InputResponse(request_id=req.id, option_id="approve")
        answer = asyncio.create_task(rt.respond(sid, [yes], principal=ALICE))
        await judging.wait()
        if sweeper == "its call cancelled":
            answer.cancel()
            with pytest.raises(asyncio.CancelledError):
                await answer
        clock.advance(31)  # the deadline passes while the policy decides
        assert await (rt if sweeper == "this runtime" else other).expire_due() == 1
        release.set()
        if sweeper == "its call cancelled":
            async for event in rt.events(sid, head, follow=True):  # until the answer ends
                if event.type == "approval.settled" or event.data.get("outcome") == "stale":
                    break
        else:
            (outcome,) = (await answer).outcomes
            assert (outcome.outcome, outcome.applied) == ("stale", False)
            assert outcome.reason == (
                f"the deadline passed before this response could settle it (request {req.id}); "
                "it was escalated to 'managers'"
            )
        assert seen == [None]
        events = await events_of(rt, sid, head)
        outcomes = [e.data["outcome"] for e in events if e.type == "approval.candidate"]
        assert outcomes == ["pending", "escalated", "stale"]
        assert not any(e.type == "approval.settled" for e in events)
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert stored.request.escalated_to == "managers"
        assert log.count() == 0
        r = await rt.respond(sid, [yes], principal=BOB)  # open to the managers
        assert r.status == "completed" and log.count() == 1
        assert seen == [None, "managers"]


async def test_an_escalation_recorded_while_a_recovered_answer_is_judged_spends_it(
    store_url: str,
) -> None:
    """Alice's keyed answer is left pending (her runtime closed while the policy judged it, as
    one whose process died); a drive elsewhere judges it again, and while it does, a sweep
    records the deadline's escalation. Judged on the request as it stood before, the answer is
    spent (`stale`) as her own call's would be: the request stays open to the managers."""
    clock = ManualClock()
    judging, release = asyncio.Event(), asyncio.Event()
    seen: list[str | None] = []
    on_call = _on_call(judging, release, seen)

    log = ExecutionLog()
    rules = so.always(expires_in=60, on_timeout="escalate", escalate_to="managers")
    agent = refund_agent(log, so.ApprovalSpec(request=rules, response=on_call, timeout=30.0))
    async with so.Runtime([agent], store=store_url, clock=clock) as dead:
        sid, req, head = await asked(dead, ALICE)
        clock.advance(10)
        sent = dead.send(sid, "approve", principal=ALICE, idempotency_key="k-1")
        first = asyncio.create_task(sent)
        await judging.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    judging.clear()
    clock.advance(40)  # past the policy's timeout and the grace: taken for dead, not yet due
    async with (
        so.Runtime([agent], store=store_url, clock=clock) as rt,
        so.Runtime([agent], store=store_url, clock=clock) as other,
    ):
        drive = asyncio.create_task(rt.generate(session_id=sid))
        await judging.wait()
        clock.advance(11)  # the deadline passes while the policy judges the answer again
        sweep = asyncio.create_task(other.expire_due())
        async for event in rt.events(sid, head, follow=True):
            if event.data.get("outcome") == "escalated":
                break
        release.set()
        assert (await drive).status == "waiting"
        assert await sweep == 1
        assert seen == [None, None]
        events = await events_of(rt, sid, head)
        outcomes = [e.data["outcome"] for e in events if e.type == "approval.candidate"]
        assert outcomes == ["pending", "escalated", "stale"]
        assert not any(e.type == "approval.settled" for e in events)
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert stored.request.escalated_to == "managers"
        assert log.count() == 0
