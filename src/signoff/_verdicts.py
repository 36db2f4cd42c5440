"""A proposed call's verdict: the strictest of its tool's policy and the agent's guardrails,
each failing closed (a person is asked) when it raises or returns something else; and the
guardrails' again as an approved call would start (a deploy since may deny it). Each reads an
input of its own, so that what one changes reaches neither the next, the request nor the body."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

from ._approval import (
    ApprovalContext,
    ApprovalPolicy,
    Guardrail,
    Verdict,
    always,
    never,
    once,
    reason_text,
    tool_policy,
)
from ._error_text import error_text
from ._input_copies import own_copy
from ._output_caps import spare
from ._policy_inputs import typed_input
from ._recording import own_cancel
from ._sync import called_off_loop, thread_note
from ._tools import Tool
from ._types import Usage

__all__ = ["still_allowed", "strictest"]


async def strictest(
    tool: Tool, ctx: ApprovalContext, guardrails: Sequence[Guardrail], raw: Any
) -> Verdict:
    """The strictest of the tool's policy and `guardrails`: deny > ask > run. Each reads a copy
    of `ctx.tool_input` (`_own_input`); `raw`, the input it was validated from, is validated anew
    for one where it cannot be copied so."""
    # A `decide` of a subclass's own may be a plain method (the docs say it returns a verdict):
    # awaited as it was, its deny asked a person instead, with a TypeError for the reason. It
    # runs in a thread, as a plain policy function does, so one that blocks stops no renewal.
    try:
        own = await called_off_loop(tool.approval.decide, _own_input(tool, ctx, raw, tool.approval))
    except (Exception, asyncio.CancelledError) as exc:  # fail closed: a person is asked
        note = thread_note(tool.approval.decide, exc)
        own = Verdict("ask", error=f"approval policy raised {_policy_error(exc)}{note}")
    if not _is_verdict(own):
        own = Verdict("ask", error=f"approval policy returned {_shown(own)}, not a valid Verdict")
    verdicts = [own, *await _guardrails(tool, ctx, guardrails, raw, own)]
    chosen = next((v for a in ("deny", "ask") for v in verdicts if v.action == a), verdicts[0])
    guard = next((v for v in verdicts[1:] if v.action == "ask"), None)
    if chosen is own and own.action == "ask" and guard is not None:
        # Asked by both: a guardrail's request, whose deadline never approves the call (the
        # tool's review and error kept with it).
        chosen = dataclasses.replace(guard, error=own.error or guard.error, auto=own.auto)
    # What any of them spent (an auto() review) is counted whichever decides.
    return _with_text_reason(dataclasses.replace(chosen, usage=Verdict.spent(verdicts)))


async def still_allowed(
    tool: Tool,
    ctx: ApprovalContext,
    guardrails: Sequence[Guardrail],
    raw: Any,
    *,
    by_deadline: bool,
) -> Verdict:
    """What `guardrails` make now of an approved call about to start (a deploy since the
    approval may have added one): `deny` if one denies it, or if one asks a person and only
    the request's deadline approved it (`by_deadline`: a guardrail's request is never approved
    so); else `run`. What their reviews spent is counted either way. `raw` as `strictest`
    takes it."""
    verdicts = await _guardrails(tool, ctx, guardrails, raw, None)
    spent = Verdict.spent(verdicts)
    chosen = next((v for v in verdicts if v.action == "deny"), Verdict("run"))
    if chosen.action == "run" and by_deadline:
        asks = next((v for v in verdicts if v.action == "ask"), None)
        if asks is not None:
            why = f" ({asks.error})" if asks.error else ""
            chosen = Verdict(
                "deny",
                f"a guardrail asks a person to approve {ctx.tool_name}{why}, and only the "
                "request's deadline approved it, which never approves a call a guardrail asks for",
            )
    return _with_text_reason(dataclasses.replace(chosen, usage=spent))


async def _guardrails(
    tool: Tool,
    ctx: ApprovalContext,
    guardrails: Sequence[Guardrail],
    raw: Any,
    own: Verdict | None,
) -> list[Verdict]:
    """The verdicts of `guardrails` that decide something (None leaves the call to the tool's
    policy), each failing closed (a person is asked); each sees a budget less what `own` (the
    tool's policy) and the guardrails before it spent."""
    verdicts = [] if own is None else [own]
    for guardrail in guardrails:
        spent = Verdict.spent(verdicts)
        seen = ctx
        if spent is not None and ctx.budget_left:  # what its own review may spend is less
            seen = dataclasses.replace(ctx, budget_left=spare(ctx.budget_left, spent))
        try:
            v = await called_off_loop(guardrail.decide, _own_input(tool, seen, raw, guardrail))
        except (Exception, asyncio.CancelledError) as exc:  # fail closed, like a policy
            note = thread_note(guardrail.decide, exc)
            v = Verdict("ask", error=f"guardrail raised {_policy_error(exc)}{note}")
        if v is not None and not _is_verdict(v):
            v = Verdict("ask", error=f"guardrail returned {_shown(v)}, not a valid Verdict or None")
        if v is not None and v.action == "ask":  # asked as the guardrail's, its review paid
            v = Verdict("ask", "guardrail", v.error, usage=v.usage)
        if v is not None:
            verdicts.append(v)
    return verdicts if own is None else verdicts[1:]


def _own_input(
    tool: Tool, ctx: ApprovalContext, raw: Any, reader: ApprovalPolicy | Guardrail
) -> ApprovalContext:
    """`ctx` with input of `reader`'s own: one changing the input in place (a predicate's
    `input.amounts.sort()` to read the largest) changed what the next reader, the request a
    person approves and the body got. signoff's helpers that decide by the tool's name alone
    (`_BLIND`) read none; the `decide` that will run is looked at (one set on the instance too)."""
    if getattr(reader.decide, "__func__", None) in _BLIND:
        return ctx
    return dataclasses.replace(ctx, tool_input=_input_copy(tool, ctx.tool_input, raw))


def _input_copy(tool: Tool, validated: Any, raw: Any) -> Any:
    """`validated` with its structure copied (`own_copy`: models and containers; the objects
    validation made or a caller passed are shared, as is), which keeps what validation filled
    in (a `default_factory`'s id, as the request and the body have it) and runs no validator
    again; `raw` validated anew where the input is lazy (reading it uses up its iterators, which
    a copy would share) or cannot be copied so."""
    if not tool.holds_lazy(validated):  # an `Iterable` parameter's, or a validator's
        try:
            return own_copy(validated)
        except Exception:  # whatever a copy raises (a model's own `__copy__`), anew serves
            pass
    return typed_input(tool, raw)


_BLIND = frozenset(type(p).decide for p in (never(), always(), once(), tool_policy()))
"""The `decide` of `never()`, `always()`, `once()` and `tool_policy()`, which never read the
call's input: they take it as it is, at no cost (a subclass's own `decide`, or a function set as
an instance's `decide`, is not one)."""


def _policy_error(exc: BaseException) -> str:
    """What a policy or guardrail raised, as its request names it. A CancelledError it raised
    on its own is its failure like any other; the cancel of the drive itself is raised again."""
    if not isinstance(exc, Exception) and not own_cancel(exc):
        raise exc
    return error_text(exc)


def _is_verdict(value: object) -> bool:
    """Whether `value` is a verdict of a known action: any other action ran the call, as only
    `deny` and `ask` are looked for."""
    return (
        isinstance(value, Verdict)
        and value.action in ("run", "deny", "ask")
        and _bad_field(value) is None
    )


def _bad_field(verdict: Verdict) -> str | None:
    """The verdict's field (besides `reason`, read as text) that is not of its type, named with
    the type it has: `usage=message.usage`, a provider SDK's own, failed the drive with a bare
    AttributeError and left the session running."""
    usage, error, auto = verdict.usage, verdict.error, verdict.auto
    if usage is not None and not isinstance(usage, Usage):
        return f"usage of type {type(usage).__name__} (give so.Usage or None)"
    if error is not None and not isinstance(error, str):
        return f"error of type {type(error).__name__} (give text or None)"
    if auto is not None and not (
        isinstance(auto, tuple) and len(auto) == 2 and all(isinstance(a, str) for a in auto)
    ):
        return f"auto of type {type(auto).__name__} (left to so.auto())"
    return None


def _shown(value: object) -> str:
    """`value` as a policy error names it: a verdict by its action, anything else by repr."""
    if isinstance(value, Verdict):
        action = value.action
        named = repr(action) if isinstance(action, str) else f"a {type(action).__name__}"
        bad = _bad_field(value) if action in ("run", "deny", "ask") else None
        return f"a Verdict of action {named}" + (f" with {bad}" if bad else "")
    try:
        return repr(value)
    except Exception as exc:
        return f"a {type(value).__name__} (its repr raised {type(exc).__name__})"


def _with_text_reason(verdict: Verdict) -> Verdict:
    """The verdict with its reason as text: a policy's `Denied(reason)` may carry any object."""
    reason = reason_text(verdict.reason)
    return verdict if reason is verdict.reason else dataclasses.replace(verdict, reason=reason)
