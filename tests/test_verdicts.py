"""A call's readers before its body (`_verdicts`): the tool's policy (a predicate, a function of
the context, `auto()`), each guardrail, as the call is proposed and again as an approved call
starts, and each response policy, read an input of their own. One shared with the body let a
reader that changed it in place (`input.amounts.sort()` to read the largest line) change what
the body ran with, after a person approved the input the request showed and its hash bound,
while the log kept the model's input as the call's."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pydantic
import pytest

import signoff as so
from signoff._policy_inputs import typed_input
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

ALICE = so.Principal(authenticator="sso", principal_id="alice")
LINES = [5.0, 50.0, 20.0]  # the order the model gave, which the body must keep
PAY: dict[str, Any] = {"payee": "acme", "amounts": LINES}


def payer(log: ExecutionLog, approval: Any, guardrails: list[so.Guardrail]) -> so.Agent:
    """An agent calling `pay` once with `PAY`, then replying."""

    @log.tool(approval=approval)
    async def pay(payee: str, amounts: list[float]) -> str:
        """Pay each line in the given order."""
        return f"paid {amounts}"

    script = [call_tools(call("pay", **copy.deepcopy(PAY))), reply("done")]  # PAY kept as given
    return scripted_agent("ops", script, tools=[pay], guardrails=guardrails)


def proposed_inputs(events: list[so.Event]) -> list[Any]:
    """The inputs of the calls the log records the model proposing."""
    return [c["input"] for e in events if e.type == "model.completed" for c in e.data["tool_calls"]]


class LargestLine(so.Guardrail):
    """Reads the largest line by sorting the list it is given in place, and notes what it read."""

    def __init__(self) -> None:
        self.read: list[list[float]] = []

    async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
        lines = ctx.tool_input.amounts
        self.read.append(list(lines))
        lines.sort(reverse=True)
        return so.Verdict("deny", "a line over 10k") if lines[0] > 10_000 else None


async def test_a_predicate_sorting_the_input_leaves_the_body_the_order_given(
    store_url: str,
) -> None:
    """No person is asked: the body ran with the predicate's sorted list, the log with the
    model's order."""

    def over_limit(input: Any) -> bool:
        input.amounts.sort(reverse=True)  # in place: "is the largest line over 100?"
        return bool(input.amounts[0] > 100)

    log = ExecutionLog()
    async with so.Runtime([payer(log, over_limit, [])], store=store_url) as rt:
        r = await rt.generate("ops", prompt="go", auth=ALICE)
        assert r.status == "completed", r
        events = [e async for e in rt.events(r.session_id, follow=False)]
    assert [e.input for e in log.executions] == [PAY]
    assert proposed_inputs(events) == [PAY]


async def test_a_guardrail_sorting_an_approved_call_runs_what_was_approved(
    store_url: str,
) -> None:
    """The guardrail reads the call as proposed and again as the approved call starts; the
    person approved the order shown, and that order runs."""
    guard = LargestLine()
    log = ExecutionLog()
    async with so.Runtime([payer(log, so.always(), [guard])], store=store_url) as rt:
        r = await rt.generate("ops", prompt="go", auth=ALICE)
        [req] = r.pending
        assert req.input == PAY  # as the model gave it, not as the guardrail left it
        approve = so.InputResponse(request_id=req.id, option_id="approve")
        r = await rt.respond(r.session_id, [approve], principal=ALICE)
        assert r.status == "completed", r
        events = [e async for e in rt.events(r.session_id, follow=False)]
    assert guard.read == [LINES, LINES]  # each time the input as given
    assert [e.input for e in log.executions] == [PAY]
    assert proposed_inputs(events) == [PAY]


async def test_a_policy_changing_the_input_it_asks_about_shows_and_runs_the_recorded_input(
    store_url: str,
) -> None:
    """A function of the context set the amount and asked: the request showed and hashed its
    amount (what the body would then run had a person approved), the log and the response
    policy the model's. Now the request, its hash, the response policy and the body all have
    the model's input."""
    judged: list[Any] = []

    def smaller(ctx: so.ApprovalContext) -> str:
        ctx.tool_input.amount = 100.0
        ctx.tool_input.tags.append("policy")
        return "user-approval"

    def noting(ctx: so.ResponseContext) -> so.Allowed:
        judged.append(ctx.request.tool_input.model_dump())
        ctx.request.tool_input.amount = 1.0  # a response policy's change reaches nothing either
        return so.Allowed()

    log = ExecutionLog()

    @log.tool(approval=so.ApprovalSpec(smaller, noting))
    async def refund(order: str, amount: float, tags: list[str]) -> dict[str, Any]:
        """Refund an order."""
        return {"amount": amount, "tags": tags}

    given: dict[str, Any] = {"order": "1", "amount": 5000.0, "tags": ["a"]}
    script = [call_tools(call("refund", **copy.deepcopy(given))), reply("done")]
    agent = scripted_agent("ops", script, tools=[refund])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("ops", prompt="go", auth=ALICE)
        [req] = r.pending
        assert req.input == given
        assert req.action is not None
        bound = so.Action.of(req.action.call_id, "refund", given)
        assert req.action.input_hash == bound.input_hash
        approve = so.InputResponse(request_id=req.id, option_id="approve")
        r = await rt.respond(r.session_id, [approve], principal=ALICE)
        assert r.status == "completed", r
        events = [e async for e in rt.events(r.session_id, follow=False)]
    assert judged == [given]
    assert [e.input for e in log.executions] == [given]
    assert proposed_inputs(events) == [given]


async def test_each_reader_reads_the_input_as_given(tmp_path: Path) -> None:
    """The tool's predicate and each guardrail after it read the call's input, whatever the
    one before them did to theirs; the body runs it as given."""
    read: list[list[float]] = []

    def reversing(input: Any) -> bool:
        read.append(list(input.amounts))
        input.amounts.reverse()
        return False

    first, second = LargestLine(), LargestLine()
    log = ExecutionLog()
    store = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([payer(log, reversing, [first, second])], store=store) as rt:
        r = await rt.generate("ops", prompt="go", auth=ALICE)
        assert r.status == "completed", r
    assert read == first.read == second.read == [LINES]
    assert [e.input for e in log.executions] == [PAY]


def test_input_that_does_not_validate_is_read_as_a_copy() -> None:
    """A policy shown input its tool refuses now (a deploy since) reads a copy of it: the
    request's or call's own, changed, changed what the log's reader of it had."""

    @so.tool
    async def pay(payee: str, amounts: list[float]) -> str:
        """Pay."""
        return "paid"

    given: dict[str, Any] = {"payee": "acme", "amounts": ["five"]}
    with pytest.raises(pydantic.ValidationError):
        pay.validate(given)
    read = typed_input(pay, given)
    assert read == given
    assert read is not given and read["amounts"] is not given["amounts"]
