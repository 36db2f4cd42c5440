"""What `auto()`'s reviews cost counts in the session's usage, as the turn's own model responses:
folded from the log (so a new runtime reads it too) and held against `Limits`. Run on both stores.
"""

from __future__ import annotations

import json
from typing import Any

import signoff as so
from signoff.testing import ExecutionLog, call, scripted_agent

ALICE = so.Principal(authenticator="test", principal_id="alice")
BILLED = so.Usage(input_tokens=300, output_tokens=20, cost_usd=5.0)
TURN = so.Usage(input_tokens=10, output_tokens=2, cost_usd=0.01)


def review(kind: str) -> so.ModelResponse:
    text = json.dumps({"verdict": kind, "reason": f"{kind} it is"})
    return so.ModelResponse(text=text, usage=BILLED)


def billing(log: ExecutionLog, reviewer: Any, limits: so.Limits | None = None) -> so.Agent:
    @log.tool(approval=so.auto(reviewer))
    async def refund_charge(charge_id: str, amount: float) -> dict[str, Any]:
        """Refund a charge."""
        return {"refunded": amount}

    steps = [
        so.ModelResponse(
            tool_calls=[call("refund_charge", charge_id="ch_1", amount=40)], usage=TURN
        ),
        so.ModelResponse(text="done", usage=TURN),
    ]
    return scripted_agent("billing", steps, tools=[refund_charge], limits=limits or so.Limits())


async def test_a_clear_review_counts_in_the_sessions_usage(store_url: str) -> None:
    log = ExecutionLog()
    agent = billing(log, so.models.Scripted([review("clear")]))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        assert r.status == "completed"
        assert log.count() == 1
        expected = TURN + TURN + BILLED
        assert (await rt.state(r.session_id)).usage == expected
    async with so.Runtime([billing(ExecutionLog(), None)], store=store_url) as again:
        assert (await again.state(r.session_id)).usage == expected  # folded from the log


async def test_a_caution_review_counts_in_the_sessions_usage(store_url: str) -> None:
    log = ExecutionLog()
    agent = billing(log, so.models.Scripted([review("caution")]))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.auto_verdict == "caution"
        assert (await rt.state(r.session_id)).usage == TURN + BILLED
    async with so.Runtime([billing(ExecutionLog(), None)], store=store_url) as again:
        assert (await again.state(r.session_id)).usage == TURN + BILLED


async def test_an_approvals_usage_counts_the_review_that_opened_it(store_url: str) -> None:
    """A request's usage is the session's at park time: the `auto()` review that opened it is
    recorded with it, so it counts there too (it was left out: the queue showed the turn's cost
    without the review's)."""
    agent = billing(ExecutionLog(), so.models.Scripted([review("caution")]))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        (req,) = r.pending
        assert req.usage == TURN + BILLED, req.usage
        (queued,) = await rt.pending(session_id=r.session_id)
        assert queued.usage == TURN + BILLED == (await rt.state(r.session_id)).usage


async def test_a_review_nested_past_pythons_limit_is_unparsable_and_counts(
    store_url: str,
) -> None:
    """A reviewer's reply of JSON nested past Python's recursion limit raised `RecursionError`
    out of the review after it was billed: the policy "crashed", and what the review cost was
    counted nowhere. It is an unparsable answer (a person asked), its cost counted as any
    other's."""
    nested = '{"verdict": ' + "[" * 3000 + "]" * 3000 + "}"
    log = ExecutionLog()
    reviewer = so.models.Scripted([so.ModelResponse(text=nested, usage=BILLED)])
    async with so.Runtime([billing(log, reviewer)], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        assert r.status == "waiting"
        (req,) = r.pending
        assert (req.auto_verdict, req.policy_error) == ("failed", None), req
        assert (req.auto_reason or "").startswith("the review answered something unparsable")
        assert (await rt.state(r.session_id)).usage == TURN + BILLED
    assert log.count() == 0


async def test_a_review_counts_against_max_cost_usd(store_url: str) -> None:
    """The review billed $5 of a $1 budget: the next model call is not made, the person is asked
    to continue or stop, as for a turn's own spending."""
    log = ExecutionLog()
    agent = billing(log, so.models.Scripted([review("clear")]), so.Limits(max_cost_usd=1.0))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        assert log.count() == 1  # the reviewed call ran; what comes after it is over budget
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.kind == "session-limit"
        assert "max_cost_usd=1" in (req.question or "")


async def test_a_review_counts_against_max_tokens(store_url: str) -> None:
    """The review's 320 tokens take the session (12 spent) past max_tokens=300: the turn asks to
    raise it. (The budget leaves the review room to write, once its input is held back.)"""
    log = ExecutionLog()
    agent = billing(log, so.models.Scripted([review("clear")]), so.Limits(max_tokens=300))
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.kind == "session-limit"


async def test_a_review_that_reports_negative_usage_gives_no_budget_back(tmp_path: Any) -> None:
    """A reviewer reporting a negative count would lower the session's spending: not counted."""
    refund = so.Usage(input_tokens=-1000, output_tokens=0, cost_usd=-4.0)
    text = json.dumps({"verdict": "clear", "reason": "fine"})
    reviewer = so.models.Scripted([so.ModelResponse(text=text, usage=refund)])
    log = ExecutionLog()
    async with so.Runtime([billing(log, reviewer)], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("billing", prompt="refund ch_1", auth=ALICE)
        assert log.count() == 1
        assert (await rt.state(r.session_id)).usage == TURN + TURN
