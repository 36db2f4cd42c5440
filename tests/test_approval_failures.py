"""Approval policies and guardrails that break (raise, return garbage, misspell, are
unreadable) fail closed; bad approval values and non-finite input are refused."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest

import signoff as so
from signoff._approval import Verdict
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

from ._approval import ALICE, refund_tool


class Broken(Exception):
    pass


def raising(ctx: so.ApprovalContext) -> so.ApprovalStatus:
    raise Broken("policy database down")


async def raising_async(ctx: so.ApprovalContext) -> so.ApprovalStatus:
    raise Broken("policy database down")


def garbage(ctx: so.ApprovalContext) -> Any:
    return "approve"  # a typo for "approved": must not run the call


def returns_none(ctx: so.ApprovalContext) -> Any:
    return None


def predicate_raising(input: Any) -> bool:
    return bool(input.missing_attribute)


@pytest.mark.parametrize(
    ("policy", "error"),
    [
        (raising, "Broken: policy database down"),
        (raising_async, "Broken: policy database down"),
        (garbage, "'approve'"),
        (returns_none, "None"),
        (predicate_raising, "AttributeError"),
    ],
    ids=["raises", "raises-async", "garbage", "none", "predicate-raises"],
)
async def test_broken_policy_fails_closed(tmp_path: Path, policy: Any, error: str) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), reply("ok")],
        tools=[refund_tool(log, policy)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.policy_error is not None
        assert error in req.policy_error
        assert log.count() == 0
        # recorded in the log, not just in memory
        (stored,) = await rt.pending()
        assert stored.policy_error == req.policy_error
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert r.status == "completed"
        assert log.count() == 1


class _BrokenPolicy(so.ApprovalPolicy):
    async def decide(self, ctx: so.ApprovalContext) -> Any:
        raise RuntimeError("policy service down")


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


UNREADABLE = "<its text could not be read: RuntimeError>"


class _UnprintablePolicy(so.ApprovalPolicy):
    async def decide(self, ctx: so.ApprovalContext) -> Any:
        raise _Unprintable()


class _UnprintableGuardrail(so.Guardrail):
    async def decide(self, ctx: so.ApprovalContext) -> Any:
        raise _Unprintable()


class _MisspeltPolicy(so.ApprovalPolicy):
    async def decide(self, ctx: so.ApprovalContext) -> Any:
        return Verdict("denied")  # type: ignore[arg-type]


class _MisspeltGuardrail(so.Guardrail):
    async def decide(self, ctx: so.ApprovalContext) -> Any:
        return Verdict("block", "no refunds today")  # type: ignore[arg-type]


class _SdkUsagePolicy(so.ApprovalPolicy):
    async def decide(self, ctx: so.ApprovalContext) -> Any:
        sdk_usage = SimpleNamespace(input_tokens=5, output_tokens=2)  # a provider SDK's own
        return Verdict("run", usage=sdk_usage)  # type: ignore[arg-type]


class _NumberErrorGuardrail(so.Guardrail):
    async def decide(self, ctx: so.ApprovalContext) -> Any:
        return Verdict("ask", error=123)  # type: ignore[arg-type]


class _StringGuardrail(so.Guardrail):
    async def decide(self, ctx: so.ApprovalContext) -> Any:
        return "denied"  # not a Verdict: must not crash the turn, nor run the call


@pytest.mark.parametrize(
    ("approval", "guardrails", "error"),
    [
        (_BrokenPolicy(), [], "RuntimeError: policy service down"),
        (None, [_StringGuardrail()], "'denied'"),
        # Its message raises when read: formatting it must not fail the drive instead.
        (_UnprintablePolicy(), [], "_Unprintable"),
        (None, [_UnprintableGuardrail()], "_Unprintable"),
        # A verdict of no known action ran the call: only deny and ask were looked for.
        (_MisspeltPolicy(), [], "'denied'"),
        (None, [_MisspeltGuardrail()], "'block'"),
        # Fields not of their types failed the drive with a bare error, the session left running.
        (_SdkUsagePolicy(), [], "usage of type SimpleNamespace (give so.Usage or None)"),
        (None, [_NumberErrorGuardrail()], "error of type int (give text or None)"),
    ],
    ids=[
        "policy-subclass-raises",
        "guardrail-returns-garbage",
        "policy-message-unreadable",
        "guardrail-message-unreadable",
        "policy-action-unknown",
        "guardrail-action-unknown",
        "policy-usage-not-usage",
        "guardrail-error-not-text",
    ],
)
async def test_broken_policy_subclass_or_guardrail_fails_closed(
    tmp_path: Path, approval: Any, guardrails: list[so.Guardrail], error: str
) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), reply("ok")],
        tools=[refund_tool(log, approval)],
        guardrails=guardrails,
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.policy_error is not None and error in req.policy_error
        assert log.count() == 0
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert r.status == "completed"
        assert log.count() == 1


def test_invalid_approval_values_are_usage_errors() -> None:
    async def fn(x: int) -> int:
        """F."""
        return x

    for bad in ("sometimes", 3, 2.5, object()):
        with pytest.raises(so.UsageError):
            so.tool(approval=bad)(fn)  # type: ignore[call-overload]
    with pytest.raises(so.UsageError):
        so.tool(approval=lambda: True)(fn)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError):
        so.tool_policy(require_approval="issue_refund")


def test_policy_labels() -> None:
    assert so.never().describe() == "Never"
    assert so.once().describe() == "Once"
    assert so.always().describe() == "Always"

    def my_rule(ctx: so.ApprovalContext) -> so.ApprovalStatus:
        return True

    assert so.policy(my_rule).describe() == "Conditional (my_rule)"


class BrokenGuardrail(so.Guardrail):
    async def decide(self, ctx: so.ApprovalContext) -> None:
        raise RuntimeError("guardrail backend down")


async def test_broken_guardrail_fails_closed(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), reply("ok")],
        tools=[refund_tool(log, so.never())],
        guardrails=[BrokenGuardrail()],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "waiting"
        (req,) = r.pending
        assert req.source == "guardrail"
        assert req.policy_error == "guardrail raised RuntimeError: guardrail backend down"
        assert log.count() == 0
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert r.status == "completed"
        assert log.count() == 1


class _PlainDenyingGuardrail(so.Guardrail):
    def decide(self, ctx: so.ApprovalContext) -> Any:  # plain, not async
        return so.Verdict("deny", "no refunds on this agent")


class _PlainDenyingPolicy(so.ApprovalPolicy):
    def decide(self, ctx: so.ApprovalContext) -> Any:  # plain, not async
        return so.Verdict("deny", "refunds are closed")


@pytest.mark.parametrize(
    ("approval", "guardrails", "reason"),
    [
        (so.never(), [_PlainDenyingGuardrail()], "no refunds on this agent"),
        (_PlainDenyingPolicy(), [], "refunds are closed"),
    ],
    ids=["guardrail", "policy"],
)
async def test_a_plain_decide_of_a_guardrail_or_policy_class_is_heeded(
    tmp_path: Path, approval: Any, guardrails: list[so.Guardrail], reason: str
) -> None:
    """A `decide` written as a plain method (the docs say it returns a verdict) was awaited as
    it was: its Verdict raised a TypeError, so its deny asked a person instead, who could run
    the very call it denied. It is called as a plain policy function is, and its verdict holds."""
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), reply("ok")],
        tools=[refund_tool(log, approval)],
        guardrails=guardrails,
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed" and r.pending == []
        events = [e async for e in rt.events(r.session_id, follow=False)]
    (done,) = [e.data for e in events if e.type == "tool.completed"]
    assert done["status"] == "denied" and done["result"]["reason"] == reason
    assert log.count() == 0


class _Undecided(so.Guardrail):
    def tool_names(self) -> list[str]:
        return ["refund"]


class _UndecidedPolicy(so.ApprovalPolicy):
    label = "Mine"


class _OneString(so.Guardrail):
    def tool_names(self) -> Any:
        return "refund"

    async def decide(self, ctx: so.ApprovalContext) -> None:
        return None


def test_a_guardrail_or_policy_class_that_cannot_decide_is_refused_when_used() -> None:
    """One that defines no `decide` raised NotImplementedError on every call, so each call of
    the tool asked a person for a reason nobody could act on; a guardrail naming its one tool
    as a string was refused as naming the unknown tools r, e, f, u, n and d."""
    log = ExecutionLog()
    with pytest.raises(so.UsageError, match=r"guardrail _Undecided defines no decide\(\): write"):
        scripted_agent(
            "a", [reply("ok")], tools=[refund_tool(log, None)], guardrails=[_Undecided()]
        )
    with pytest.raises(so.UsageError, match=r"policy _UndecidedPolicy defines no decide\(\)"):
        refund_tool(log, _UndecidedPolicy())
    with pytest.raises(so.UsageError, match=r"policy ApprovalPolicy defines no decide\(\)"):
        refund_tool(log, so.ApprovalPolicy())
    # The class, not one of it: taken for a predicate (each call asked a person), or named as
    # "<class ...> is not a guardrail"; each is refused saying to make one.
    with pytest.raises(so.UsageError, match=r"approval=_PlainDenyingPolicy is a policy class: "):
        refund_tool(log, _PlainDenyingPolicy)
    with pytest.raises(so.UsageError, match=r"_OneString is a guardrail class: pass one of it"):
        classes: list[Any] = [_OneString]
        scripted_agent("a", [reply("ok")], tools=[refund_tool(log, None)], guardrails=classes)
    with pytest.raises(so.UsageError, match=r"must return a list of tool names, not the string"):
        scripted_agent(
            "a", [reply("ok")], tools=[refund_tool(log, None)], guardrails=[_OneString()]
        )


@pytest.mark.parametrize("amount", ["NaN", "-Infinity", "inf", "1e400"])
async def test_a_non_finite_number_is_invalid_input_and_reaches_no_policy(
    tmp_path: Path, amount: str
) -> None:
    """A model's "NaN" parses as a float that slips past `amount > 100`, and infinity would show
    the reviewer null: the call is refused as invalid input, before any policy sees it."""
    log = ExecutionLog()
    seen: list[Any] = []

    def over_100(input: Any) -> bool:
        seen.append(input.amount)
        return bool(input.amount > 100)

    @log.tool(approval=over_100)
    async def refund(order_id: str, amount: float) -> str:
        """Refund."""
        return "refunded"

    @log.tool(approval=so.always())
    async def split(order_id: str, shares: list[float]) -> str:
        """Split a refund."""
        return "split"

    result = Capture(reply("ok"))
    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("refund", order_id="1", amount=amount),
                call("split", order_id="2", shares=[1.0, amount]),
            ),
            result,
        ],
        tools=[refund, split],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert r.status == "completed" and r.pending == []
        assert log.count() == 0 and seen == []
        results = tool_results(result.last)
        assert [t.is_error for t in results] == [True, True]
        assert all("finite" in str(t.content) for t in results)


class _Opaque:
    def __str__(self) -> str:
        return "opaque reason"


@pytest.mark.parametrize(
    ("status", "expected", "reason"),
    [
        (so.Approved(_Opaque()), "run", "opaque reason"),  # type: ignore[arg-type]
        (so.Denied(b"no"), "deny", "b'no'"),  # type: ignore[arg-type]
        (so.Denied(float("nan")), "deny", "nan"),  # type: ignore[arg-type]
        (so.Denied("bad \ud800 text"), "deny", "bad ? text"),
        ({"type": "denied", "reason": _Opaque()}, "deny", "opaque reason"),
        # Its str() raises: that raised out of the drive, leaving the turn half done.
        (so.Denied(_Unprintable()), "deny", UNREADABLE),  # type: ignore[arg-type]
        (so.Approved(_Unprintable()), "run", UNREADABLE),  # type: ignore[arg-type]
    ],
    ids=[
        "approved-object",
        "denied-bytes",
        "denied-nan",
        "denied-surrogate",
        "dict-object",
        "denied-unreadable",
        "approved-unreadable",
    ],
)
async def test_a_policy_reason_that_is_not_text_is_recorded_as_text(
    tmp_path: Path, status: Any, expected: str, reason: str
) -> None:
    """An object or bytes reason made the turn raise a bare TypeError; NaN and a lone surrogate
    were stored as no JSON reader can read them. The reason is written out as text."""
    log = ExecutionLog()
    seen = Capture(reply("finished"))
    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), seen],
        tools=[refund_tool(log, so.policy(lambda ctx: status))],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
        (result,) = tool_results(seen.last)
        note = result.content["approval"] if expected == "run" else result.content
        assert note["reason"] == reason
        assert log.count() == (1 if expected == "run" else 0)
        events = [e async for e in rt.events(r.session_id, 0, follow=False)]
        json.dumps([e.data for e in events], allow_nan=False).encode()


def _asked(tmp_path: Path, approval: Any) -> so.InputRequest:
    """The one request a refund of 5 under `approval` leaves open."""

    @so.tool(approval=approval)
    async def refund(amount: float) -> float:
        """Refund."""
        return amount

    agent = scripted_agent(
        "shop", [call_tools(call("refund", amount=5)), reply("ok")], tools=[refund]
    )
    rt = sqlite_runtime(tmp_path, agent)
    try:
        r = rt.generate_sync("shop", prompt="refund 5")
    finally:
        rt.close_sync()
    (request,) = r.pending
    return request


def test_a_predicate_reading_the_input_as_a_dict_says_how_to_read_it(tmp_path: Path) -> None:
    """`lambda input: input["amount"] > 100` raises on every call, so every call asks a person
    (fail closed); the request's `policy_error` says the input is an object, `input.amount`."""

    request = _asked(tmp_path, lambda input: input["amount"] > 100)
    assert request.policy_error == (
        "approval policy raised TypeError: 'refund_input' object is not subscriptable (a "
        "predicate gets the validated input as an object: input.amount, not input['amount'])"
    )


def _raises_at_length(ctx: so.ApprovalContext) -> so.ApprovalStatus:
    raise Broken("policy database down: " + "x" * 2_000_000)


async def test_a_policy_error_of_megabytes_is_cut(store_url: str) -> None:
    """What a failing approval policy raised is the request's `policy_error`, stored in its
    `input.requested`, its row and every copy a reviewer reads: one of megabytes is cut to a
    quarter of the tool's `max_result_bytes`, as a tool's own error message is."""
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), reply("ok")],
        tools=[refund_tool(log, _raises_at_length)],
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        (req,) = r.pending
        error = req.policy_error
        assert error is not None and "policy database down: xxx" in error
        assert error.endswith(" [cut]") and len(error) <= (1 << 20) // 4 + len(" [cut]")
        (stored,) = await rt.pending()
        assert stored.policy_error == error
        events = [e async for e in rt.events(r.session_id, follow=False)]
        assert max(len(json.dumps(e.data)) for e in events) < 300_000
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert r.status == "completed" and log.count() == 1


@pytest.mark.parametrize("odd", [mock.ANY, {"type": mock.ANY}], ids=["object", "in a dict"])
def test_an_approval_policy_returning_an_object_equal_to_all_asks_saying_why(
    tmp_path: Path, odd: Any
) -> None:
    """An object equal to everything (`mock.ANY`, a permissive proxy) was compared before its
    type was checked: read as "user-approval", it asked with no `policy_error`, or, in a dict,
    as "approved" it ran the call. It is an invalid status: a person is asked, told why."""

    request = _asked(tmp_path, lambda input: odd)
    assert request.policy_error == f"approval policy returned an invalid status: {odd!r}"
