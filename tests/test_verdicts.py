"""A call's readers before its body (`_verdicts`): the tool's policy (a predicate, a function of
the context, `auto()`), each guardrail, as the call is proposed and again as an approved call
starts, and each response policy, read an input of their own. One shared with the body let a
reader that changed it in place (`input.amounts.sort()` to read the largest line) change what
the body ran with, after a person approved the input the request showed and its hash bound,
while the log kept the model's input as the call's."""

from __future__ import annotations

import asyncio
import copy
import itertools
import threading
from pathlib import Path
from typing import Annotated, Any

import pydantic
import pytest

import signoff as so
from signoff._approval import SessionAuth, SessionInfo
from signoff._policy_inputs import typed_input
from signoff._verdicts import strictest
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


class Noting(so.Guardrail):
    """Notes the input it reads, and leaves the call to the tool's policy."""

    def __init__(self) -> None:
        self.read: list[Any] = []

    async def decide(self, ctx: so.ApprovalContext) -> so.Verdict | None:
        self.read.append(ctx.tool_input)
        return None


async def test_a_default_factory_id_is_the_one_the_request_and_the_body_have(
    store_url: str,
) -> None:
    """Each reader had input validated anew, so each got a `default_factory` id of its own: a
    policy looking the operation up by its id, or logging it, named one the request, its hash
    and the body never had. A copy keeps the id validation filled in."""
    ids = (f"op{n}" for n in itertools.count())
    read: list[str] = []

    def noting(input: Any) -> bool:
        read.append(input.op_id)
        return True

    log = ExecutionLog()

    @log.tool(approval=noting)
    async def pay(
        amount: float, op_id: str = pydantic.Field(default_factory=lambda: next(ids))
    ) -> str:
        """Pay once per operation id."""
        return f"paid {amount} as {op_id}"

    guard = Noting()
    script = [call_tools(call("pay", amount=5.0)), reply("done")]
    agent = scripted_agent("ops", script, tools=[pay], guardrails=[guard])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("ops", prompt="go", auth=ALICE)
        [req] = r.pending
        op_id = req.input["op_id"]
        assert req.action is not None
        bound = so.Action.of(req.action.call_id, "pay", {"amount": 5.0, "op_id": op_id})
        assert req.action.input_hash == bound.input_hash
        approve = so.InputResponse(request_id=req.id, option_id="approve")
        r = await rt.respond(r.session_id, [approve], principal=ALICE)
        assert r.status == "completed", r
    assert read == [op_id]
    assert [g.op_id for g in guard.read] == [op_id, op_id]  # proposed, and as it starts
    assert [e.input for e in log.executions] == [{"amount": 5.0, "op_id": op_id}]


USED: list[str] = []
"""The nonces `Nonce` was asked to validate, one for each run of its validator."""


class Nonce(pydantic.BaseModel):
    """A nonce whose validator notes each run, and refuses a second use of a nonce."""

    n: str

    @pydantic.field_validator("n")
    @classmethod
    def used_once(cls, n: str) -> str:
        USED.append(n)
        if USED.count(n) > 1:
            raise ValueError("nonce already used")
        return n


async def test_a_predicate_and_two_guardrails_run_the_validators_once(tmp_path: Path) -> None:
    """Validated anew for each reader, the input's validators ran for the call and again for
    each of its three readers (a slow one four times its cost), and one refusing a second use
    of a value failed the policy's reading: it got a dict, failed and asked a person. A copy
    runs none."""
    USED.clear()
    read: list[str] = []

    def bad(input: Any) -> bool:
        read.append(input.nonce.n)
        return bool(input.nonce.n == "bad")

    first, second = Noting(), Noting()
    log = ExecutionLog()

    @log.tool(approval=bad)
    async def redeem(nonce: Nonce) -> str:
        """Redeem a nonce."""
        return f"redeemed {nonce.n}"

    script = [call_tools(call("redeem", nonce={"n": "x"})), reply("done")]
    agent = scripted_agent("ops", script, tools=[redeem], guardrails=[first, second])
    store = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([agent], store=store) as rt:
        r = await rt.generate("ops", prompt="go", auth=ALICE)
        assert r.status == "completed", r
    assert USED == ["x"]  # validated once, for the call
    assert read == ["x"]
    assert [g.nonce.n for g in first.read] == [g.nonce.n for g in second.read] == ["x"]
    assert [e.input for e in log.executions] == [{"nonce": {"n": "x"}}]


async def test_a_decide_set_on_a_helpers_instance_reads_a_copy(store_url: str) -> None:
    """`always()` reads no input, so it was handed the call's own; the check was of its class's
    `decide`, not of the one that runs: one set on the instance sorted what the body ran."""

    async def sorting(ctx: so.ApprovalContext) -> so.Verdict:
        ctx.tool_input.amounts.sort(reverse=True)
        return so.Verdict("run")

    policy = so.always()
    policy.decide = sorting  # type: ignore[method-assign]
    log = ExecutionLog()
    async with so.Runtime([payer(log, policy, [])], store=store_url) as rt:
        r = await rt.generate("ops", prompt="go", auth=ALICE)
        assert r.status == "completed", r
    assert [e.input for e in log.executions] == [PAY]


class Handle:
    """What a validator makes of a name: an object of the app's own (it holds a lock, which a
    deep copy refuses), which the policy is to see as it is, not a copy of it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.lock = threading.Lock()
        self.opened: list[str] = []


async def test_an_object_in_the_input_is_shared_and_its_containers_copied() -> None:
    """A guardrail reads the input's model and lists as copies of its own, while an object a
    validator made (or a Python caller passed) is the very one the body gets: identity kept,
    and nothing it links to copied (a deep copy cloned a whole bank behind an account)."""

    @so.tool(approval=lambda input: input.handle.name == "prod")
    async def open_(
        handle: Annotated[Any, pydantic.AfterValidator(Handle)], paths: list[list[str]]
    ) -> str:
        """Open a handle."""
        return "opened"

    raw = {"handle": "dev", "paths": [["b", "a"]]}
    validated: Any = open_.validate(raw)
    with pytest.raises(TypeError):
        copy.deepcopy(validated)
    guard = Noting()
    ctx = so.ApprovalContext(
        session=SessionInfo(
            id="s", agent="a", turn="t", auth=SessionAuth(current=None, initiator=None)
        ),
        tool_name=open_.name,
        tool_input=validated,
        approved_tools=frozenset(),
        call_id="c",
        abort_signal=asyncio.Event(),
    )
    verdict = await strictest(open_, ctx, [guard], raw)
    assert verdict.action == "run"
    [seen] = guard.read
    assert seen is not validated and seen.handle is validated.handle
    assert seen.paths == [["b", "a"]]
    assert seen.paths is not validated.paths and seen.paths[0] is not validated.paths[0]
