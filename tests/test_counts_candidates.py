"""The answer counts (`_counts`, `signoff_answers_*_total`) of answers a response policy judged
outside the plain path: one a deadline overtook (it escalated the request while the policy
decided), and one whose process died while its policy ran, judged again by another process. Each
is counted once, accepted or refused, however many processes judge it again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

import signoff as so
from signoff._candidates import RECOVERY_GRACE
from signoff.testing import ExecutionLog, ManualClock

from ._response_policies import ALICE, BOB, asked, events_of, refund_agent

_TIMEOUT = 5.0


def _candidates(events: list[so.Event]) -> list[str]:
    return [e.data["outcome"] for e in events if e.type == "approval.candidate"]


def _total(*runtimes: so.Runtime) -> tuple[int, dict[str, int]]:
    """Accepted and refused answers across these runtimes, as `sum()` over their scrapes."""
    refused: dict[str, int] = {}
    for rt in runtimes:
        for code, n in rt._counts.refused.items():
            refused[code] = refused.get(code, 0) + n
    return sum(rt._counts.accepted for rt in runtimes), refused


async def test_an_answer_a_deadline_overtook_and_escalated_is_counted_refused(
    store_url: str,
) -> None:
    """The request's deadline passes while the policy decides and escalates the request: the
    answer settles nothing (outcome `stale`), as a deadline that closes the request refuses it
    (`request_closed`). It was counted neither accepted nor refused."""
    clock = ManualClock()

    async def slow(ctx: so.ResponseContext) -> so.Allowed:
        clock.advance(61)
        return so.Allowed()

    rules = so.always(expires_in=60, on_timeout="escalate", escalate_to="finance")
    agent = refund_agent(ExecutionLog(), so.ApprovalSpec(request=rules, response=slow))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        sid, req, _ = await asked(rt, ALICE)
        r = await rt.respond(sid, [so.InputResponse(request_id=req.id, option_id="approve")])
        assert [(o.outcome, o.applied) for o in r.outcomes] == [("stale", False)]
        assert _total(rt) == (0, {"response_stale": 1})


def _dead_candidate(req: so.InputRequest, decision: str, edit: Any = None) -> dict[str, Any]:
    """A response recorded pending by a process that died while its policy ran."""
    return {
        "request_id": req.id,
        "call_id": req.call_id,
        "candidate_id": "cand_dead",
        "decision": decision,
        "by": BOB.model_dump(),
        "outcome": "pending",
        "text": None,
        "value": None,
        "edited_input": edit,
    }


async def _died_deciding(
    rt: so.Runtime, decision: str = "approve", edit: Any = None
) -> tuple[str, int]:
    """Alice's turn waits on a refund's approval; Bob's answer was recorded pending and its
    process died: the session and the head before the answer."""
    sid, req, head = await asked(rt, ALICE)
    driver = rt._driver((await rt.state(sid)).copy(), None)
    await driver.record([("approval.candidate", _dead_candidate(req, decision, edit))])
    return sid, head


def _judge(verdict: str) -> Callable[[so.ResponseContext], so.Allowed | so.Rejected]:
    def judge(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        return so.Allowed() if verdict == "allowed" else so.Rejected("not Bob's to approve")

    return judge


@pytest.mark.parametrize(
    ("verdict", "counted"),
    [("allowed", (1, {})), ("rejected", (0, {"response_rejected": 1}))],
)
async def test_an_answer_judged_again_after_its_process_died_is_counted_once(
    store_url: str, verdict: str, counted: tuple[int, dict[str, int]]
) -> None:
    """The process that recorded Bob's answer died before its policy's verdict: it counted
    nothing. The process that judges it again counts it, as the dead one would have; touching
    the session again judges and counts nothing more. It was counted neither accepted nor
    refused."""
    now = [1_000_000.0]
    spec = so.ApprovalSpec(request=so.always(), response=_judge(verdict), timeout=_TIMEOUT)
    agent = refund_agent(ExecutionLog(), spec)
    async with so.Runtime([agent], store=store_url, clock=lambda: now[0]) as rt:
        sid, _ = await _died_deciding(rt)
        assert _total(rt) == (0, {})
    now[0] += _TIMEOUT + RECOVERY_GRACE + 1
    async with so.Runtime([agent], store=store_url, clock=lambda: now[0]) as rt:
        r = await rt.generate(session_id=sid)
        assert r.status == ("completed" if verdict == "allowed" else "waiting")
        assert _total(rt) == counted
        await rt.generate(session_id=sid)
        assert _total(rt) == counted


async def test_a_dead_answer_the_tool_no_longer_takes_is_counted_refused(store_url: str) -> None:
    """Judged again under a deploy whose tool refuses its edit, the answer ends `stale` (its
    request stays open): refused as `invalid_answer`, as that answer given now would be."""
    now = [1_000_000.0]
    spec = so.ApprovalSpec(request=so.always(), response=_judge("allowed"), timeout=_TIMEOUT)
    agent = refund_agent(ExecutionLog(), spec)
    async with so.Runtime([agent], store=store_url, clock=lambda: now[0]) as rt:
        sid, head = await _died_deciding(rt, edit={"amount": "fifty"})
    now[0] += _TIMEOUT + RECOVERY_GRACE + 1
    async with so.Runtime([agent], store=store_url, clock=lambda: now[0]) as rt:
        assert (await rt.generate(session_id=sid)).status == "waiting"
        assert _candidates(await events_of(rt, sid, head)) == ["pending", "stale"]
        assert _total(rt) == (0, {"invalid_answer": 1})


@pytest.mark.parametrize(
    ("verdict", "counted"),
    [("allowed", (1, {})), ("rejected", (0, {"response_rejected": 1}))],
)
async def test_two_processes_judging_a_dead_answer_at_once_count_it_once(
    store_url: str, verdict: str, counted: tuple[int, dict[str, int]]
) -> None:
    """Two fronts (`inline=False`, no lease between them) touch the session at once and both
    judge Bob's dead answer again, their policies deciding side by side: the one whose verdict
    is recorded first ends the answer and counts it; the other records and counts nothing
    (summed over both, as Prometheus sums the processes' scrapes)."""
    now = [1_000_000.0]
    judge = _judge(verdict)
    arrived: list[int] = []
    both = asyncio.Event()

    async def side_by_side(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        arrived.append(1)
        if len(arrived) == 2:
            both.set()
        await both.wait()
        return judge(ctx)

    spec = so.ApprovalSpec(request=so.always(), response=side_by_side, timeout=_TIMEOUT)
    agent = refund_agent(ExecutionLog(), spec)
    async with so.Runtime([agent], store=store_url, clock=lambda: now[0]) as rt:
        sid, head = await _died_deciding(rt)
    now[0] += _TIMEOUT + RECOVERY_GRACE + 1
    async with (
        so.Runtime([agent], store=store_url, clock=lambda: now[0], inline=False) as one,
        so.Runtime([agent], store=store_url, clock=lambda: now[0], inline=False) as two,
    ):
        await asyncio.gather(one.generate(session_id=sid), two.generate(session_id=sid))
        assert len(arrived) == 2  # both judged it
        assert _candidates(await events_of(one, sid, head)) == (
            ["pending"] if verdict == "allowed" else ["pending", "rejected"]
        )
        assert _total(one, two) == counted
