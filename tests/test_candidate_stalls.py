"""An answer whose own process stalls while its response policy decides (a GC pause, an
overloaded machine) past the policy's timeout and `RECOVERY_GRACE`: another process takes it
for dead and judges it again. The answer is ended, settled and counted once, by whichever
process records its verdict first, and the stalled call returns what was recorded."""

from __future__ import annotations

import asyncio

import pytest

import signoff as so
from signoff._candidates import RECOVERY_GRACE
from signoff.testing import ExecutionLog

from ._response_policies import (
    ALICE,
    BOB,
    CANDIDATE_THEN_RAN,
    REFUSED,
    asked,
    events_of,
    lines,
    refund_agent,
)

_TIMEOUT = 5.0
CAROL = so.Principal(
    authenticator="slack", issuer="T01", principal_id="carol", attributes={"tenant_id": "t1"}
)


def _total(*runtimes: so.Runtime) -> tuple[int, dict[str, int]]:
    """Accepted and refused answers across these runtimes, as `sum()` over their scrapes."""
    refused: dict[str, int] = {}
    for rt in runtimes:
        for code, n in rt._counts.refused.items():
            refused[code] = refused.get(code, 0) + n
    return sum(rt._counts.accepted for rt in runtimes), refused


@pytest.mark.parametrize("stalled_says", ["same", "other"])
@pytest.mark.parametrize("recheck", ["allowed", "rejected"])
async def test_a_stalled_answer_judged_again_elsewhere_is_ended_settled_and_counted_once(
    store_url: str, recheck: str, stalled_says: str
) -> None:
    """Bob's answer is recorded pending and its process stalls in the policy; the clock passes
    its timeout and grace, and another process touching the session judges it again and
    records that verdict. When the stalled policy returns (with the same verdict, or another:
    a policy reading something that changed), its process records nothing more: the answer
    ends once, the request is settled (or left open) once, the answer is counted once across
    both, and Bob's call returns the recorded verdict, not its own."""
    now = [1_000_000.0]
    flipped = "rejected" if recheck == "allowed" else "allowed"
    own = recheck if stalled_says == "same" else flipped
    started, release = asyncio.Event(), asyncio.Event()
    judged: list[int] = []

    async def stalls_first(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        judged.append(1)
        verdict = recheck
        if len(judged) == 1:  # the answer's own process: it stalls, then decides
            started.set()
            await release.wait()
            verdict = own
        return so.Allowed() if verdict == "allowed" else so.Rejected(f"{verdict} by judge")

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=stalls_first, timeout=_TIMEOUT)
    agent = refund_agent(log, spec)
    async with (
        so.Runtime([agent], store=store_url, clock=lambda: now[0]) as own_rt,
        so.Runtime([agent], store=store_url, clock=lambda: now[0]) as other,
    ):
        sid, req, head = await asked(own_rt, ALICE)
        yes = so.InputResponse(request_id=req.id, option_id="approve")
        stalled = asyncio.create_task(own_rt.respond(sid, [yes], principal=BOB))
        await started.wait()
        now[0] += _TIMEOUT + RECOVERY_GRACE + 1  # it is taken for dead
        again = await other.generate(session_id=sid)
        assert again.status == ("completed" if recheck == "allowed" else "waiting")
        release.set()
        r = await stalled
        assert len(judged) == 2

        events = await events_of(own_rt, sid, head)
        assert lines(events) == (CANDIDATE_THEN_RAN if recheck == "allowed" else REFUSED)
        (cid,) = {e.data["candidate_id"] for e in events if e.type == "approval.candidate"}
        settled = [e.data for e in events if e.type == "approval.settled"]
        stored = await own_rt.store.get_request(req.id)
        assert stored is not None
        [outcome] = r.outcomes
        if recheck == "allowed":
            assert [s.get("candidate_id") for s in settled] == [cid]
            assert stored.status == "settled"
            assert (outcome.outcome, outcome.applied) == ("approved", True)
            assert outcome.reason is not None and "another process" in outcome.reason
            assert r.status == "completed"
            assert _total(own_rt, other) == (1, {})
            assert log.count() == 1
        else:
            assert settled == []
            assert stored.status == "pending"
            assert (outcome.outcome, outcome.applied) == ("rejected", False)
            assert outcome.reason == "rejected by judge"  # the verdict recorded, not its own
            assert r.status == "waiting"
            assert _total(own_rt, other) == (0, {"response_rejected": 1})
            assert log.count() == 0


@pytest.mark.parametrize("passes", ["before the re-check", "during the re-check"])
async def test_a_stalled_answer_a_deadline_overtook_is_refused_once(
    store_url: str, passes: str
) -> None:
    """The request's deadline passes while Bob's answer stalls in its policy. Either the other
    process touching the session closes the request first (the answer, no longer pending, is
    not judged again: the stalled call ends it), or its check of the answer finds the deadline
    passed and ends it (`stale`) as it closes the request (the stalled call records nothing).
    Either way the answer ends once, and the stalled call raises `RequestClosed`, as a repeat
    of the answer would: one refusal across both."""
    now = [1_000_000.0]
    started, release = asyncio.Event(), asyncio.Event()
    judged: list[int] = []
    wait = _TIMEOUT + RECOVERY_GRACE + 1

    async def stalls_first(ctx: so.ResponseContext) -> so.Allowed:
        judged.append(1)
        if len(judged) == 1:
            started.set()
            await release.wait()
        else:
            now[0] += 60  # a slow check: the deadline passes meanwhile
        return so.Allowed()

    expires = wait - 1 if passes == "before the re-check" else wait + 30
    log = ExecutionLog()
    spec = so.ApprovalSpec(
        request=so.always(expires_in=expires), response=stalls_first, timeout=_TIMEOUT
    )
    agent = refund_agent(log, spec)
    async with (
        so.Runtime([agent], store=store_url, clock=lambda: now[0]) as own_rt,
        so.Runtime([agent], store=store_url, clock=lambda: now[0]) as other,
    ):
        sid, req, head = await asked(own_rt, ALICE)
        yes = so.InputResponse(request_id=req.id, option_id="approve")
        stalled = asyncio.create_task(own_rt.respond(sid, [yes], principal=BOB))
        await started.wait()
        now[0] += wait
        await other.generate(session_id=sid)
        release.set()
        with pytest.raises(so.RequestClosed):
            await stalled
        assert len(judged) == (1 if passes == "before the re-check" else 2)
        events = await events_of(own_rt, sid, head)
        ends = [e.data["outcome"] for e in events if e.type == "approval.candidate"]
        assert ends == ["pending", "stale"]
        assert not any(e.type == "approval.settled" for e in events)
        stored = await own_rt.store.get_request(req.id)
        assert stored is not None and stored.status == "expired"
        assert _total(own_rt, other) == (0, {"request_closed": 1})
        assert log.count() == 0


async def test_a_stalled_vote_of_a_quorum_counted_elsewhere_is_counted_once(
    store_url: str,
) -> None:
    """Bob's vote, one of two a quorum needs, stalls in its policy and is counted by the process
    that judges it again: the stalled call says it was counted (1 of 2) and records nothing
    more, so the quorum holds one vote, and the answer is counted accepted once."""
    now = [1_000_000.0]
    started, release = asyncio.Event(), asyncio.Event()
    judged: list[int] = []

    async def stalls_first(ctx: so.ResponseContext) -> so.Allowed:
        judged.append(1)
        if len(judged) == 1:
            started.set()
            await release.wait()
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(approvers=2), response=stalls_first, timeout=_TIMEOUT)
    agent = refund_agent(log, spec)
    async with (
        so.Runtime([agent], store=store_url, clock=lambda: now[0]) as own_rt,
        so.Runtime([agent], store=store_url, clock=lambda: now[0]) as other,
    ):
        sid, req, head = await asked(own_rt, ALICE)
        yes = so.InputResponse(request_id=req.id, option_id="approve")
        stalled = asyncio.create_task(own_rt.respond(sid, [yes], principal=BOB))
        await started.wait()
        now[0] += _TIMEOUT + RECOVERY_GRACE + 1
        assert (await other.generate(session_id=sid)).status == "waiting"
        release.set()
        r = await stalled
        [outcome] = r.outcomes
        assert (outcome.outcome, outcome.applied, outcome.reason) == ("counted", True, "1 of 2")
        assert r.status == "waiting"
        events = await events_of(own_rt, sid, head)
        ends = [e.data["outcome"] for e in events if e.type == "approval.candidate"]
        assert ends == ["pending", "counted"]
        state = await own_rt.state(sid)
        assert state.requests[req.id].request.approved_by == ["bob"]
        assert _total(own_rt, other) == (1, {})
        assert log.count() == 0


@pytest.mark.parametrize("meanwhile", ["nothing", "carol settles"])
async def test_a_keyed_answer_whose_call_was_cancelled_deciding_is_judged_once(
    store_url: str, meanwhile: str
) -> None:
    """Bob's "approve" sent with idempotency key k-1 is cancelled while the response policy
    judges it (a caller's timeout; the process lives on). The answer is not left pending: it is
    judged and settled all the same, or ended by the commit of Carol's settlement meanwhile,
    which keeps its key. The message sent again with its key is a repeat answered with the
    turn at once, rather than waiting out the policy's timeout and `RECOVERY_GRACE` for the
    answer to be taken for dead, and the policy judges Bob's answer once."""
    started, release = asyncio.Event(), asyncio.Event()
    judged: list[str] = []

    async def slow_for_bob(ctx: so.ResponseContext) -> so.Allowed:
        assert ctx.response.principal is not None
        judged.append(ctx.response.principal.principal_id)
        if ctx.response.principal.principal_id == "bob":
            started.set()
            await release.wait()
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=slow_for_bob, timeout=60.0)
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        sid, req, head = await asked(rt, ALICE)
        turn = (await rt.state(sid)).turn
        assert turn is not None
        first = asyncio.create_task(rt.send(sid, "approve", principal=BOB, idempotency_key="k-1"))
        await started.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        if meanwhile == "carol settles":
            yes = so.InputResponse(request_id=req.id, option_id="approve")
            assert (await rt.respond(sid, [yes], principal=CAROL)).status == "completed"
        release.set()
        if meanwhile == "nothing":  # its call gone, the answer is judged and settled all the same
            await asyncio.wait_for(_settled(rt, sid, head), _TIMEOUT)
        resent = rt.send(sid, "approve", principal=BOB, idempotency_key="k-1")
        again = await asyncio.wait_for(resent, _TIMEOUT)  # the policy's timeout is 60 s
        assert (again.status, again.turn_id, again.replayed) == ("completed", turn.id, True)
        assert judged.count("bob") == 1
        events = await events_of(rt, sid, head)
        assert [e.type for e in events].count("turn.started") == 0
        bob = [
            e.data
            for e in events
            if e.type == "approval.candidate" and e.data["by"]["principal_id"] == "bob"
        ]
        (settled,) = [e.data for e in events if e.type == "approval.settled"]
        if meanwhile == "nothing":
            assert [b["outcome"] for b in bob] == ["pending"]  # its settlement ends it
            assert settled["candidate_id"] == bob[0]["candidate_id"]
            assert settled["idem"] == bob[0]["message_idem"]
        else:
            assert [b["outcome"] for b in bob] == ["pending", "stale"]
            assert bob[1]["idem"] == bob[0]["message_idem"]
            assert settled["by"]["principal_id"] == "carol"
        assert rt._counts.accepted == 1
        assert log.count() == 1


async def test_the_judging_a_cancelled_call_left_going_is_stopped_by_close(store_url: str) -> None:
    """Bob's call is cancelled while the response policy judges his answer: the judging goes on
    without it, until the runtime's `close` stops it as it stops the runtime's calls, and the
    answer is left pending, as one whose process died, for the next process to judge again."""
    started, never = asyncio.Event(), asyncio.Event()
    stopped: list[bool] = []

    async def never_decides(ctx: so.ResponseContext) -> so.Allowed:
        started.set()
        try:
            await never.wait()
        except asyncio.CancelledError:
            stopped.append(True)
            raise
        return so.Allowed()

    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=never_decides, timeout=60.0)
    agent = refund_agent(log, spec)
    rt = so.Runtime([agent], store=store_url)
    async with rt:
        sid, req, head = await asked(rt, ALICE)
        first = asyncio.create_task(rt.send(sid, "approve", principal=BOB, idempotency_key="k-1"))
        await started.wait()
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        assert stopped == []  # still judging
    assert stopped == [True]  # stopped by close
    async with so.Runtime([agent], store=store_url) as again:
        (pending,) = (await again.state(sid)).candidates.values()
        assert (pending["request_id"], pending["by"]) == (req.id, BOB.model_dump())


async def _settled(rt: so.Runtime, session_id: str, after: int) -> None:
    """Follow the session's events after `after` until an approval is settled."""
    async for event in rt.events(session_id, after, follow=True):
        if event.type == "approval.settled":
            return
