"""Approval policies and guardrails made with arguments of the wrong type: a `UsageError` naming
the mistake when they are made, not a TypeError when the agent is built, nor every call of the
tool asking a person for a reason nobody can act on."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so


@pytest.mark.parametrize("make", [so.predicate, so.policy], ids=["predicate", "policy"])
@pytest.mark.parametrize("fn", [None, 5, "amount > 100"], ids=["none", "int", "text"])
def test_a_policy_of_something_that_cannot_be_called_is_refused(make: Any, fn: Any) -> None:
    """It was taken, and each call of the tool then asked a person, the reason a TypeError."""
    with pytest.raises(so.UsageError, match=rf"^{make.__name__}\(\) takes a function, not "):
        make(fn)


def test_a_policy_of_a_function_is_taken() -> None:
    assert so.predicate(lambda i: True).describe() == "Conditional (<lambda>)"
    assert so.policy(lambda ctx: "approved").describe() == "Conditional (<lambda>)"


@pytest.mark.parametrize("which", ["require_approval", "deny"])
def test_tool_policy_refuses_names_that_are_not_a_list_of_text(which: str) -> None:
    """None was a bare TypeError (`'NoneType' object is not iterable`); a name not text was
    taken, and the agent then raised a TypeError sorting or joining the names it knew not."""
    with pytest.raises(so.UsageError, match=rf"^tool_policy\({which}=...\) takes a list"):
        so.tool_policy(**{which: None})  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match=rf"^tool_policy\({which}=...\): a tool name is text"):
        so.tool_policy(**{which: ["refund", 5]})  # type: ignore[arg-type]


def test_tool_policy_takes_names_from_any_iterable_once() -> None:
    """A generator is read once: its names are kept, not lost to the check."""
    guard = so.tool_policy(require_approval=(n for n in ["refund"]), deny=iter(["wipe"]))
    assert sorted(guard.tool_names()) == ["refund", "wipe"]


HUGE: Any = 10**5000  # Python writes out no int of 4300 digits or more


async def noop() -> None:
    """Do nothing."""


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda: so.always(escalate_to=HUGE), "escalate_to must be a group's name"),
        (lambda: so.always(on_timeout=HUGE), "on_timeout must be"),
        (lambda: so.ApprovalSpec(timeout=HUGE), "the response policy timeout must be positive"),
        (lambda: so.auto(timeout=HUGE), r"auto\(\) timeout must be positive"),
        (lambda: so.auto(instructions=HUGE), r"auto\(\) instructions must be text"),
        (lambda: so.Criteria(clear=HUGE), r"Criteria\(clear=...\) must be non-empty text"),
        (lambda: so.tool_policy(deny=[HUGE]), "a tool name is text"),
        (lambda: so.tool_policy(deny=HUGE), "takes a list of tool names"),
        (lambda: so.tool(approval=HUGE)(noop), "approval must be never"),
    ],
    ids=[
        "escalate_to",
        "on_timeout",
        "spec-timeout",
        "auto-timeout",
        "instructions",
        "criteria",
        "name",
        "names",
        "approval",
    ],
)
def test_an_int_too_long_to_write_out_is_refused_by_name(make: Any, problem: str) -> None:
    """Each refusal wrote the value out with repr(), which raised a bare ValueError instead."""
    with pytest.raises(so.UsageError, match=problem) as e:
        make()
    assert "a whole number of 16610 bits" in str(e.value)


@pytest.mark.parametrize("helper", [so.never, so.once, so.always, so.auto])
def test_a_helper_given_uncalled_is_refused_by_name(helper: Any) -> None:
    """`approval=so.always` (no parentheses) was taken as a predicate: each call of the tool then
    asked a person with a TypeError for its reason (`so.auto` too, and so.never was refused as
    a function that "must take one argument")."""
    name = helper.__name__
    with pytest.raises(so.UsageError, match=rf"so\.{name} is not called: write so\.{name}\(\)"):
        so.tool(approval=helper)(noop)
    with pytest.raises(so.UsageError, match=rf"so\.{name} is not called"):
        so.ApprovalSpec(helper)


@pytest.mark.parametrize("wrapper", [so.policy, so.predicate])
def test_a_wrapper_given_uncalled_is_refused_by_name(wrapper: Any) -> None:
    """`approval=so.policy` was taken for a predicate, which failed on every call (a person
    asked with a UsageError for the reason): refused as the helpers are."""
    name = wrapper.__name__
    with pytest.raises(so.UsageError, match=rf"so\.{name} is not called: write so\.{name}\(fn\)"):
        so.tool(approval=wrapper)(noop)


@pytest.mark.parametrize("cls", [so.Approved, so.Denied, so.ApprovalSpec, so.Verdict, bool])
def test_a_class_given_for_an_approval_is_refused(cls: Any) -> None:
    """A class was taken for a predicate and called with the input, making one of itself:
    `approval=so.Approved` ran every call with no one asked (an `Approved` is a yes). It is
    refused wherever a policy function is taken."""
    with pytest.raises(so.UsageError, match=rf"approval={cls.__name__} is a class, not a policy"):
        so.tool(approval=cls)(noop)
    for make, what in (
        (so.predicate, "approval predicate"),
        (so.policy, "approval policy"),
        (lambda fn: so.ApprovalSpec(response=fn), "response policy"),
    ):
        with pytest.raises(so.UsageError, match=rf"^{what} must be a function, not the class"):
            make(cls)


def _two(a: Any, b: Any) -> bool:
    return True


def _none() -> bool:
    return True


def _keyword(*, input: Any) -> bool:
    return True


def _context_and(ctx: Any, extra: Any) -> bool:
    return True


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda fn: so.predicate(fn), "approval predicate"),
        (lambda fn: so.policy(fn), "approval policy"),
        (lambda fn: so.tool(approval=fn)(noop), "approval predicate"),
        (lambda fn: so.ApprovalSpec(fn), "approval predicate"),
    ],
    ids=["predicate", "policy", "approval", "spec"],
)
@pytest.mark.parametrize("fn", [_two, _none, _keyword], ids=["two", "none", "keyword-only"])
def test_a_policy_function_that_cannot_take_its_argument_is_refused_when_made(
    make: Any, problem: str, fn: Any
) -> None:
    """A policy is called with one argument (the input, or an ApprovalContext): a function that
    cannot take it was accepted, and each call of the tool raised a TypeError in it and so
    asked a person, its `policy_error` a reason nobody could act on."""
    with pytest.raises(so.UsageError, match=rf"^{problem} '{fn.__name__}' must take one argument"):
        make(fn)


def test_a_context_policy_that_cannot_take_its_argument_is_named_a_policy() -> None:
    with pytest.raises(so.UsageError, match=r"ApprovalContext .*, not \(ctx, extra\)$"):
        so.tool(approval=_context_and)(noop)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "fn",
    [lambda input, extra=1: True, lambda *args: True, len],
    ids=["default", "varargs", "builtin"],
)
def test_a_policy_function_that_takes_one_argument_is_taken(fn: Any) -> None:
    so.tool(approval=fn)(noop)
    so.predicate(fn)
    so.ApprovalSpec(response=fn)


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (
            lambda: so.always(expires_in=3600, escalate_to="finance"),
            r"^escalate_to='finance' needs on_timeout='escalate': without it the request is denied",
        ),
        (
            lambda: so.always(expires_in=60, on_timeout="approve", escalate_to="finance"),
            "approved at its deadline and the group never hears of it",
        ),
        (lambda: so.always(on_timeout="approve"), r"^on_timeout='approve' needs expires_in"),
        (
            lambda: so.always(on_timeout="escalate", escalate_to="finance"),
            r"^on_timeout='escalate' needs expires_in",
        ),
        (lambda: so.ApprovalSpec(on_timeout="approve"), "needs expires_in"),
        (lambda: so.ApprovalSpec(escalate_to="finance", expires_in=9), "needs on_timeout"),
    ],
    ids=["escalate_to", "approve-and-group", "approve", "escalate", "spec-approve", "spec-group"],
)
def test_a_deadline_setting_that_would_do_nothing_is_refused(make: Any, problem: str) -> None:
    """Either half of a deadline alone was accepted and did nothing: the call was denied at its
    deadline with the group never told, or never timed out, while the audit trail and the
    request's `escalate_to` read as if it would escalate or approve."""
    with pytest.raises(so.UsageError, match=problem):
        make()


def test_a_spec_overriding_on_timeout_drops_the_policys_group() -> None:
    """`ApprovalSpec` overrides a policy's rules one by one: one saying `on_timeout="deny"` of
    a policy that escalates leaves no group that nothing would escalate to."""
    escalating = so.always(expires_in=60, on_timeout="escalate", escalate_to="finance")
    spec = so.ApprovalSpec(escalating, on_timeout="deny")
    assert spec.request.rules.on_timeout == "deny"
    assert spec.request.rules.escalate_to is None
    assert escalating.rules.escalate_to == "finance"  # the policy itself is not changed
    kept = so.ApprovalSpec(escalating, expires_in=120)
    rules = kept.request.rules
    assert (rules.on_timeout, rules.escalate_to) == ("escalate", "finance")
