"""What a response policy receives and may return: its context, each status, a policy that hangs,
raises or returns nonsense, a non-text refusal reason, and the ApprovalSpec that carries it.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

import signoff as so
from signoff.testing import (
    ExecutionLog,
    ManualClock,
    sqlite_runtime,
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
    tenant_guard,
)

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
            assert ctx.request.approved_by == ()
            assert ctx.session.id == sid
            assert ctx.session.agent == "billing"
            assert ctx.session.turn == req.turn_id
            assert ctx.session.parent is None
            assert ctx.session.auth == so.SessionAuth(current=ALICE, initiator=ALICE)
        assert (first.response.decision, first.response.principal) == ("cancel", MALLORY)
        assert (second.response.decision, second.response.principal) == ("approve", BOB)
        assert log.count() == 1


async def test_a_policy_sees_the_votes_counted_before_an_escalation(tmp_path: Path) -> None:
    """A quorum's votes counted before its deadline escalated it stand: one more completes it.
    The policy could not tell (`RequestInfo` had `escalated_to`, not the votes); it is shown
    them (`approved_by`, principal ids, this answer's not among them), here to refuse the
    escalated request's completing vote where no one of the group voted before."""
    carol = so.Principal(authenticator="slack", issuer="T01", principal_id="carol")
    finance = {"carol", "dan"}
    seen: list[tuple[str | None, tuple[str, ...], str]] = []

    def finance_completes(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        who = ctx.response.principal
        assert who is not None
        seen.append((ctx.request.escalated_to, ctx.request.approved_by, who.principal_id))
        votes = {*ctx.request.approved_by, who.principal_id}
        if ctx.request.escalated_to == "finance" and not votes & finance:
            return so.Rejected("finance must vote on it now")
        return so.Allowed()

    clock = ManualClock()
    rules = so.always(approvers=2, expires_in=60, on_timeout="escalate", escalate_to="finance")
    spec = so.ApprovalSpec(request=rules, response=finance_completes)
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log, spec), clock=clock) as rt:
        sid, req, _ = await asked(rt, ALICE)

        def vote(who: so.Principal) -> Awaitable[so.GenerateResult]:
            answer = so.InputResponse(request_id=req.id, option_id="approve")
            return rt.respond(sid, [answer], principal=who)

        r = await vote(BOB)
        assert [(o.outcome, o.reason) for o in r.outcomes] == [("counted", "1 of 2")]
        clock.advance(61)
        (escalated,) = await rt.pending(session_id=sid)
        assert (escalated.escalated_to, escalated.approved_by) == ("finance", ["bob"])
        r = await vote(ALICE)  # rejected: finance has not voted
        assert [(o.outcome, o.reason) for o in r.outcomes] == [
            ("rejected", "finance must vote on it now")
        ]
        r = await vote(carol)  # bob's vote stands: carol's completes the quorum
        assert (r.status, r.text, log.count()) == ("completed", "done", 1)
        assert seen == [
            (None, (), "bob"),
            ("finance", ("bob",), "alice"),
            ("finance", ("bob",), "carol"),
        ]


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


def _blocks(ctx: so.ResponseContext) -> so.Allowed:
    time.sleep(0.2)  # a blocking lookup: run in a thread, cut short by the timeout
    return so.Allowed()


async def _blocks_async(ctx: so.ResponseContext) -> so.Allowed:
    time.sleep(0.2)  # blocking work in a coroutine that never awaits
    return so.Allowed()


def _raises(ctx: so.ResponseContext) -> so.Allowed:
    raise LookupError("directory service is down")


async def _cancelled(ctx: so.ResponseContext) -> so.Allowed:
    # Its own cancel (a client it awaits closed under it), not the answer's: it raised out of
    # respond() as if the caller were cancelled, the candidate left pending to raise again.
    raise asyncio.CancelledError("the directory client closed")


def _bad_status(ctx: so.ResponseContext) -> Any:
    return {"status": "approved"}


def _none(ctx: so.ResponseContext) -> Any:
    return None


class _Unreadable:
    """A status that cannot be compared nor shown: reading it raised out of the answer, the
    candidate left pending."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("no comparing")

    def __repr__(self) -> str:
        raise RuntimeError("no showing")

    __hash__ = object.__hash__


def _equal_to_all(ctx: so.ResponseContext) -> Any:
    """An object equal to everything (`mock.ANY`, a permissive proxy): compared with "allowed"
    before its type was checked, it allowed the answer."""
    return mock.ANY


def _unreadable(ctx: so.ResponseContext) -> Any:
    return _Unreadable()


async def _times_out_itself(ctx: so.ResponseContext) -> Any:
    """Its own call timed out at once: a failure of the policy, not its timeout passing."""
    raise TimeoutError("the directory did not answer")


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
            "RuntimeError: no showing",
        ),
        (_equal_to_all, "failed", "response policy returned an invalid status: <ANY>"),
        (_hangs, "timed-out", "response policy took longer than 0.05s"),
        (_blocks, "timed-out", "response policy took longer than 0.05s"),
        (_blocks_async, "timed-out", "response policy took longer than 0.05s"),
        (
            _cancelled,
            "failed",
            "response policy raised CancelledError: the directory client closed",
        ),
        (
            _times_out_itself,
            "failed",
            "response policy raised TimeoutError: the directory did not answer",
        ),
    ],
    ids=[
        "raises",
        "invalid status",
        "returns None",
        "unreadable",
        "equal to all",
        "hangs",
        "blocks",
        "blocks async",
        "cancels itself",
        "raises its own timeout",
    ],
)
@pytest.mark.parametrize("decision", ["approve", "cancel"])
async def test_a_broken_policy_never_settles(
    tmp_path: Path, policy: Any, outcome: str, reason: str, decision: str
) -> None:
    log = ExecutionLog()
    # A policy that fails at once gets time to: on a loaded machine a sync one's thread alone
    # took over 0.05 s to start, and its failure read as a timeout.
    timeout = 0.05 if outcome == "timed-out" else 10.0
    spec = so.ApprovalSpec(request=so.always(), response=policy, timeout=timeout)
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


def test_approval_spec_usage_errors() -> None:
    with pytest.raises(so.UsageError, match="response policy must be a function"):
        so.ApprovalSpec(request=so.always(), response="admins")  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="timeout must be positive"):
        so.ApprovalSpec(request=so.always(), response=tenant_guard, timeout=0)
    # Called with a ResponseContext alone, it raised a TypeError on every answer, so none
    # could settle the request; it is refused when the spec is made instead.
    with pytest.raises(so.UsageError, match=r"^response policy '<lambda>' must take one arg"):
        so.ApprovalSpec(response=lambda ctx, who: "allowed")  # type: ignore[arg-type,misc]
    spec = so.ApprovalSpec(response=tenant_guard)
    assert spec.request.describe() == "Always"  # request defaults to always()

    @so.tool(approval=spec)
    async def t(x: int) -> int:
        """T."""
        return x

    assert t.response_policy is tenant_guard
    assert t.approval.describe() == "Always"


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


def _rejects_at_length(ctx: so.ResponseContext) -> so.Rejected:
    return so.Rejected("not you: " + "x" * 2_000_000)


def _raises_at_length(ctx: so.ResponseContext) -> so.Rejected:
    raise ValueError("not you: " + "x" * 2_000_000)


@pytest.mark.parametrize("policy", [_rejects_at_length, _raises_at_length])
async def test_a_response_policys_reason_of_megabytes_is_cut(store_url: str, policy: Any) -> None:
    """A refusal's reason (or what the policy raised) of megabytes was recorded whole in its
    `approval.candidate`, once for every answer refused, and returned whole in each outcome: it
    is cut to an eighth of the tool's `max_result_bytes`, as an approval policy's reason is."""
    log = ExecutionLog()
    spec = so.ApprovalSpec(request=so.always(), response=policy)
    async with so.Runtime([refund_agent(log, spec)], store=store_url) as rt:
        sid, req, head = await asked(rt, ALICE)
        r = await rt.respond(
            sid, [so.InputResponse(request_id=req.id, option_id="approve")], principal=BOB
        )
        (outcome,) = r.outcomes
        assert outcome.applied is False and outcome.reason is not None
        assert "not you: xxx" in outcome.reason and outcome.reason.endswith(" [cut]")
        assert len(outcome.reason) <= (1 << 20) // 8 + len(" [cut]")
        events = await events_of(rt, sid, head)
        assert events[1].data["reason"] == outcome.reason
        assert max(len(json.dumps(e.data)) for e in events) < 200_000
        assert log.count() == 0
