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
