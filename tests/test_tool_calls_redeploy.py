"""An approved call whose agent was deployed again before it ran (`_tool_calls`): the agent's
guardrails are asked again as its body would first start, and one that denies it now wins over
the approval, read by the model and recorded as a denial at proposal is. A plain approve ran a
tool the new deploy's `tool_policy(deny=[...])` denied (an edited one was refused)."""

from __future__ import annotations

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
    tool_results,
)

ALICE = so.Principal(authenticator="test", principal_id="alice")
BOB = so.Principal(authenticator="test", principal_id="bob")
DENIED = {"denied": True, "reason": "refund is not allowed for this agent", "by": "policy"}


def _agent(log: ExecutionLog, approval: Any, seen: Capture, *guardrails: so.Guardrail) -> so.Agent:
    @log.tool(approval=approval)
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    @log.tool
    async def ship(order_id: str) -> str:
        """Ship an order."""
        return "shipped"

    steps: list[Any] = [call_tools(call("refund", order_id="1")), seen]
    return scripted_agent("a", steps, tools=[refund, ship], guardrails=list(guardrails))


async def _events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


@pytest.mark.parametrize("answered", ["respond", "resume=False", "quorum"])
async def test_a_guardrail_deployed_since_an_approval_denies_the_call_as_it_would_start(
    tmp_path: Path, answered: str
) -> None:
    """The approval was given (or its quorum completed) under a deploy whose guardrails deny
    the tool, or only driven there (`resume=False`): the body never runs, and the model reads
    what it reads of a call that guardrail denies as it is proposed."""
    log = ExecutionLog()
    approval = so.always(approvers=2) if answered == "quorum" else so.always()
    async with sqlite_runtime(tmp_path, _agent(log, approval, Capture())) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        sid, rid = r.session_id, r.pending[0].id
        approve = so.InputResponse(request_id=rid, option_id="approve")
        if answered == "quorum":
            await rt.respond(sid, [approve], principal=ALICE)
        elif answered == "resume=False":
            await rt.respond(sid, [approve], principal=ALICE, resume=False)
    seen = Capture(reply("ok"))
    denying = so.tool_policy(deny=["refund"])
    async with sqlite_runtime(tmp_path, _agent(log, approval, seen, denying)) as rt:
        if answered == "quorum":
            r = await rt.respond(sid, [approve], principal=BOB)
        elif answered == "resume=False":
            r = await rt.generate(session_id=sid, auth=ALICE)
        else:
            r = await rt.respond(sid, [approve], principal=ALICE)
        assert r.status == "completed"
        events = await _events(rt, sid)
    # The same call proposed under this deploy: denied at once, which reads the same.
    proposed = Capture(reply("ok"))
    async with sqlite_runtime(tmp_path / "fresh", _agent(log, approval, proposed, denying)) as rt:
        assert (await rt.generate("a", prompt="go")).status == "completed"
    assert log.count() == 0
    (result,) = tool_results(seen.last)
    assert result.is_error and result.content == DENIED
    assert tool_results(proposed.last)[0].content == DENIED
    kinds = [(e.type, e.data.get("decision") or e.data.get("status")) for e in events]
    assert ("approval.settled", "approve") in kinds and ("tool.completed", "denied") in kinds
    assert not any(e.type == "tool.started" for e in events)


@pytest.mark.parametrize(
    ("guardrail", "denied"),
    [
        (so.tool_policy(require_approval=["refund"]), "only the request's deadline approved it"),
        (so.tool_policy(deny=["refund"]), "refund is not allowed for this agent"),
        (so.tool_policy(require_approval=["ship"]), None),
    ],
    ids=["asks", "denies", "names-another-tool"],
)
async def test_a_deadline_approval_does_not_run_a_call_a_guardrail_deployed_since_names(
    tmp_path: Path, guardrail: so.Guardrail, denied: str | None
) -> None:
    """`on_timeout="approve"` ran a call no one saw; under a guardrail asking for it a deadline
    never approves (README), so one deployed while the request waited denies it too, as one
    denying the tool does. A guardrail naming other tools leaves it to run."""
    log = ExecutionLog()
    clock = ManualClock()
    approval = so.always(expires_in=60, on_timeout="approve")
    async with sqlite_runtime(tmp_path, _agent(log, approval, Capture()), clock=clock) as rt:
        sid = (await rt.generate("a", prompt="go", auth=ALICE)).session_id
    clock.advance(61)
    seen = Capture(reply("ok"))
    async with sqlite_runtime(tmp_path, _agent(log, approval, seen, guardrail), clock=clock) as rt:
        r = await rt.generate(session_id=sid, auth=ALICE)
        assert r.status == "completed"
    (result,) = tool_results(seen.last)
    if denied is None:
        assert log.count() == 1 and result.content["result"] == "refunded"
    else:
        assert log.count() == 0
        assert result.content["denied"] is True and result.content["by"] == "policy"
        assert denied in result.content["reason"]


class _Counted(so.Guardrail):
    """A guardrail that lets every call run and bills a review of its own each time it is asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
        self.asked.append(ctx.call_id)
        return so.Verdict("run", usage=so.Usage(input_tokens=7, output_tokens=3))


async def test_guardrails_are_asked_again_once_before_the_body_starts_and_not_on_its_resume(
    tmp_path: Path,
) -> None:
    """A guardrail is asked again when the approved call is about to start, once, its review
    billed on the call's `tool.started`; a body that started (here parked on `ctx.ask`) runs on
    once answered, whatever a deploy since says, and no guardrail is asked then: its decision
    was recorded with that start, so a resumed body replays what its first run did."""
    runs: list[str] = []

    @so.tool(approval=so.always())
    async def migrate(ctx: so.ToolContext) -> str:
        """Migrate, in a region a person picks."""
        runs.append("run")
        return str((await ctx.ask("Region?", options=["eu", "us"])).value)

    def agent(*guardrails: so.Guardrail) -> so.Agent:
        steps = [call_tools(call("migrate")), reply("ok")]
        return scripted_agent("a", steps, tools=[migrate], guardrails=list(guardrails))

    counted = _Counted()
    async with sqlite_runtime(tmp_path, agent(counted)) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert len(counted.asked) == 1  # as it was proposed
        approve = so.InputResponse(request_id=r.pending[0].id, option_id="approve")
        r = await rt.respond(r.session_id, [approve], principal=ALICE)
        assert [p.kind for p in r.pending] == ["question"] and len(counted.asked) == 2
        sid, question = r.session_id, r.pending[0].id
    again = _Counted()
    async with sqlite_runtime(tmp_path, agent(again, so.tool_policy(deny=["migrate"]))) as rt:
        answer = so.InputResponse(request_id=question, option_id="eu")
        r = await rt.respond(sid, [answer], principal=ALICE)
        assert r.status == "completed"
        events = await _events(rt, sid)
    assert again.asked == [] and runs == ["run", "run"]
    (started,) = [e.data for e in events if e.type == "tool.started"]
    assert started["usage"]["input_tokens"] == 7
    (ended,) = [e.data for e in events if e.type == "tool.completed"]
    assert ended["status"] == "ok" and ended["result"] == "eu"
    billed = sum(e.data.get("usage", {}).get("input_tokens", 0) for e in events)
    assert billed == 14  # the proposal's review and the start's, each once


class _Judge(so.Guardrail):
    """A guardrail with a billed review, made only for a call not yet approved: asked again as
    an approved call would start (`ApprovalContext.approved`), it leaves the call as it was."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, bool]] = []  # (approved, edited) each time it was asked

    async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
        self.seen.append((ctx.approved, ctx.edited))
        if ctx.approved:
            return None
        return so.Verdict("ask", usage=so.Usage(input_tokens=1000))


@pytest.mark.parametrize("edit", [False, True], ids=["approve", "edit"])
async def test_a_guardrail_tells_the_asking_as_an_approved_call_starts_from_its_proposal(
    tmp_path: Path, edit: bool
) -> None:
    """`ApprovalContext.approved` is false as the call is proposed (and as an approver's edit is
    checked), true when the guardrails are asked again as the approved call would start: a
    costly review can then decide cheaply, and the call's review is billed once."""
    log = ExecutionLog()
    judge = _Judge()
    async with sqlite_runtime(tmp_path, _agent(log, so.never(), Capture(reply("ok")), judge)) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert judge.seen == [(False, False)]
        answer = so.InputResponse(
            request_id=r.pending[0].id,
            option_id="approve",
            **({"edited_input": {"order_id": "2"}} if edit else {}),
        )
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert r.status == "completed" and log.count() == 1
        events = await _events(rt, r.session_id)
    asked = [(False, False), *([(False, True)] if edit else []), (True, edit)]
    assert judge.seen == asked
    billed = sum(e.data.get("usage", {}).get("input_tokens", 0) for e in events)
    assert billed == 1000 * (2 if edit else 1)
