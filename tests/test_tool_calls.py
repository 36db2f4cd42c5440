"""Deciding a turn's tool calls (`_tool_calls`): the strictest of the tool's policy and the
agent's guardrails decides, and each call sees the requests opened before it."""

from __future__ import annotations

import asyncio
import json
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


@pytest.mark.parametrize(
    ("approval", "guardrail"),
    [
        (so.always(), so.tool_policy(deny=["refund"])),
        (
            so.policy(lambda ctx: so.Denied("over the limit")),
            so.tool_policy(require_approval=["refund"]),
        ),
    ],
    ids=["guardrail-denies-policy-asks", "policy-denies-guardrail-asks"],
)
async def test_a_deny_outranks_an_ask_from_either_side(
    tmp_path: Path, approval: Any, guardrail: so.Guardrail
) -> None:
    """Deny beats ask, whichever of the tool's policy and a guardrail says it: the call is
    denied at once, no person is asked and the body never runs."""
    log = ExecutionLog()

    @log.tool(approval=approval)
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    seen = Capture(reply("ok"))
    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), seen],
        tools=[refund],
        guardrails=[guardrail],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed" and r.pending == []
    assert log.count() == 0
    (result,) = tool_results(seen.last)
    assert result.is_error and result.content["denied"] is True


async def test_a_policy_sees_the_approvals_asked_earlier_in_the_same_response(
    tmp_path: Path,
) -> None:
    """`ApprovalContext.pending_tools` holds the tools already waiting on a person, those asked
    for by earlier calls of the same model response included."""
    seen: list[frozenset[str]] = []

    def ask(ctx: so.ApprovalContext) -> so.ApprovalStatus:
        seen.append(ctx.pending_tools)
        return "user-approval"

    @so.tool(approval=ask)
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1"), call("refund", order_id="2")), reply("ok")],
        tools=[refund],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "waiting" and len(r.pending) == 2
    assert seen == [frozenset(), frozenset({"refund"})]


async def test_a_reason_given_with_an_approval_reaches_the_model_beside_the_result(
    tmp_path: Path,
) -> None:
    """The model hears why a person approved: the result is wrapped with who approved and the
    reason they gave."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    seen = Capture(reply("ok"))
    agent = scripted_agent("a", [call_tools(call("refund", order_id="1")), seen], tools=[refund])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        approve = so.Decision(id=r.pending[0].id, approved=True, reason="a known customer")
        done = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        assert done.status == "completed"
    (result,) = tool_results(seen.last)
    approval = {"approved": True, "by": "alice", "reason": "a known customer"}
    assert result.content == {"result": "refunded", "approval": approval}


async def test_a_tool_errors_long_message_is_cut_to_a_quarter_of_its_result_bound(
    tmp_path: Path,
) -> None:
    """A tool's error message longer than a quarter of the tool's result bound is recorded cut
    to that quarter, not whole; one within it is kept as it is."""

    @so.tool(max_result_bytes=4000)
    async def fetch(size: int) -> str:
        """Fetch."""
        raise ValueError("x" * size)

    seen = Capture(reply("ok"))
    calls = call_tools(call("fetch", size=900), call("fetch", size=2000))
    agent = scripted_agent("a", [calls, seen], tools=[fetch])
    async with sqlite_runtime(tmp_path, agent) as rt:
        assert (await rt.generate("a", prompt="go")).status == "completed"
    kept, cut = (r.content["error"] for r in tool_results(seen.last))
    assert kept == "ValueError: " + "x" * 900
    assert cut == ("ValueError: " + "x" * 2000)[:1000] + " [cut]"


async def test_an_approval_is_not_asked_while_an_approved_workflow_call_waits_to_run(
    tmp_path: Path,
) -> None:
    """A sibling's approval waits for the response's unfinished workflow calls, an approved
    one that has not started yet included: it is asked only once that call has run."""

    @so.tool
    async def survey(ctx: so.ToolContext) -> str:
        """Ask where to migrate."""
        return str((await ctx.ask("Region?", options=["eu", "us"])).value)

    @so.tool(approval=so.always())
    async def migrate(ctx: so.ToolContext) -> str:
        """Migrate."""
        return "migrated"

    @so.tool(approval=so.always())
    async def notify(team: str) -> str:
        """Tell a team."""
        return "sent"

    calls = call_tools(
        call("survey", call_id="s"),
        call("migrate", call_id="m"),
        call("notify", call_id="n", team="ops"),
    )
    agent = scripted_agent("a", [calls, reply("ok")], tools=[survey, migrate, notify])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        by_kind = {p.kind: p.id for p in r.pending}
        assert set(by_kind) == {"question", "tool-approval"} and len(r.pending) == 2
        answers = [
            so.InputResponse(request_id=by_kind["question"], option_id="eu"),
            so.InputResponse(request_id=by_kind["tool-approval"], option_id="approve"),
        ]
        r = await rt.respond(r.session_id, answers, principal=ALICE)
        assert r.status == "waiting" and [p.tool_name for p in r.pending] == ["notify"]
        events = [e async for e in rt.events(r.session_id, follow=False)]
    done = [e.seq for e in events if e.type == "tool.completed" and e.data["call_id"] == "m"]
    asked = [
        e.seq
        for e in events
        if e.type == "input.requested"
        for q in e.data["requests"]
        if (q.get("action") or {}).get("tool_name") == "notify"
    ]
    assert len(done) == 1 and len(asked) == 1 and done[0] < asked[0]


class _Refusing(so.Guardrail):
    """A guardrail whose check was cancelled under it (a client it shares closed, say)."""

    async def decide(self, ctx: so.ApprovalContext) -> None:
        raise asyncio.CancelledError()


async def test_a_policy_or_guardrail_that_raises_cancelled_error_on_its_own_asks_a_person(
    tmp_path: Path,
) -> None:
    """A CancelledError a policy or guardrail raised itself (the drive was not cancelled) is its
    failure, like any other: a person is asked, with the error named. It escaped the drive:
    `generate` raised CancelledError as if its caller had been cancelled, the session stayed
    running, and every retry (a worker's too) raised it again."""
    log = ExecutionLog()

    async def cancelled(ctx: so.ApprovalContext) -> so.ApprovalStatus:
        raise asyncio.CancelledError()

    @log.tool(approval=cancelled)
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    @log.tool
    async def ship(order_id: str) -> str:
        """Ship an order."""
        return "shipped"

    calls = call_tools(call("refund", order_id="1"), call("ship", order_id="2"))
    agent = scripted_agent(
        "a", [calls, reply("ok")], tools=[refund, ship], guardrails=[_Refusing()]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert r.status == "waiting"
        errors = {p.tool_name: p.policy_error for p in r.pending}
    assert set(errors) == {"refund", "ship"}
    assert "CancelledError" in str(errors["refund"]) and "CancelledError" in str(errors["ship"])
    assert errors["ship"].startswith("guardrail raised")  # type: ignore[union-attr]
    assert log.count() == 0


async def test_an_approval_a_tool_asked_for_that_the_store_failed_to_record_is_not_asked_again(
    store_url: str,
) -> None:
    """A body that raised ApprovalRequired ran (its effects before the raise too); the store
    then failed to record its request (a full disk). The retry in this process records the
    request kept from that run, as it records a result kept so: it ran the body again."""
    runs: list[str] = []

    @so.tool
    async def refund(ctx: so.ToolContext, order_id: str) -> str:
        """Refund an order, once a person agrees."""
        runs.append(order_id)  # an effect before it asks
        ctx.request_approval({"order_id": order_id})

    refused: list[str] = []

    def full(when: str, label: str) -> None:
        if when == "before" and label == "input.requested" and not refused:
            refused.append(label)
            raise so.StoreError("could not extend file: No space left on device")

    agent = scripted_agent(
        "a", [call_tools(call("refund", order_id="7")), reply("ok")], tools=[refund]
    )
    async with so.Runtime([agent], store=store_url) as rt:
        rt.store.set_fault_hook(full)
        sid = await rt.create_session("a")
        with pytest.raises(so.StoreError, match="No space left"):
            await rt.generate(session_id=sid, prompt="refund 7")
        r = await rt.generate(session_id=sid)
        assert r.status == "waiting"
        assert [(p.kind, p.payload) for p in r.pending] == [("tool-approval", {"order_id": "7"})]
        approve = [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        done = await rt.respond(sid, approve)
        assert done.status == "completed"
        events = [e async for e in rt.events(sid, follow=False)]
    assert refused and runs == ["7"]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert sum(e.type == "input.requested" for e in events) == 1


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "denied"])
async def test_a_reviewer_s_reason_of_megabytes_reaches_the_model_cut(
    tmp_path: Path, approved: bool
) -> None:
    """The reason a reviewer gives reaches the model beside the call's result, or as its
    denial; one of megabytes (an answer may hold 4 MiB) went whole into a result over the
    tool's `max_result_bytes`, read again by every later model call of the session. It is cut
    to a quarter of that bound, as a tool's error message is."""
    runs: list[str] = []

    @so.tool(approval=so.always(), max_result_bytes=4000)
    async def refund(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        return "refunded"

    seen = Capture(reply("ok"))
    agent = scripted_agent("a", [call_tools(call("refund", order_id="1")), seen], tools=[refund])
    reason = "because " + "x" * 2_000_000
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        decision = so.Decision(id=r.pending[0].id, approved=approved, reason=reason)
        done = await rt.generate(session_id=r.session_id, approvals=[decision], auth=ALICE)
        assert done.status == "completed"
    (result,) = tool_results(seen.last)
    shown = json.dumps(result.content)
    assert len(shown) < 4000
    assert "because xxx" in shown and "[cut]" in shown
    assert runs == (["1"] if approved else [])


@pytest.mark.parametrize(
    ("approval", "timed_out"),
    [
        (
            so.ApprovalSpec(lambda i: len(i.order_id) > 100, expires_in=60, on_timeout="approve"),
            "deny",
        ),
        (so.always(expires_in=60, on_timeout="approve"), "deny"),
        (so.always(expires_in=60, on_timeout="escalate", escalate_to="ops"), "escalate"),
    ],
    ids=["tool-would-run", "tool-asks-too", "escalates"],
)
async def test_a_guardrails_approval_is_never_approved_by_the_tools_deadline(
    tmp_path: Path, approval: Any, timed_out: str
) -> None:
    """`tool_policy(require_approval=[...])` asks a person "without modifying" the tool, the
    stricter winning; the request took the tool's own `on_timeout="approve"`, so its deadline
    ran the call with no one deciding. Under a guardrail a deadline denies (or escalates, if
    the tool says so); it never approves."""
    log = ExecutionLog()
    clock = ManualClock()

    @log.tool(approval=approval)
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), reply("ok")],
        tools=[refund],
        guardrails=[so.tool_policy(require_approval=["refund"])],
    )
    async with sqlite_runtime(tmp_path, agent, clock=clock) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        (asked,) = r.pending
        assert (asked.source, asked.on_timeout) == ("guardrail", timed_out)
        clock.advance(61)
        r = await rt.generate(session_id=r.session_id, auth=ALICE)
        events = [e async for e in rt.events(r.session_id, follow=False)]
    assert log.count() == 0
    assert not any(e.type == "approval.settled" and e.data["decision"] == "approve" for e in events)
