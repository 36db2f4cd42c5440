"""Response policies: who may settle an approval, checked for every approve and cancel.

A tool's `approval=ApprovalSpec(request=..., response=...)` replaces the default rule (only the
principal whose turn asked may settle) with a function of a `ResponseContext`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

from ._approval import (
    ApprovalArg,
    ApprovalPolicy,
    OnTimeout,
    SessionInfo,
    as_policy,
    reason_text,
    takes_one,
)
from ._error_text import error_text
from ._exceptions import UsageError
from ._settings import positive_seconds, shown_value
from ._sync import TimeBound, called_off_loop, thread_note
from ._types import Principal

__all__ = [
    "DEFAULT_RESPONSE_TIMEOUT",
    "Allowed",
    "ApprovalSpec",
    "Rejected",
    "RequestInfo",
    "ResponseContext",
    "ResponseInfo",
    "ResponseStatus",
    "ResponseVerdict",
    "evaluate_response",
]


@dataclass(frozen=True, slots=True)
class Allowed:
    """The responder may settle the request."""


@dataclass(frozen=True, slots=True)
class Rejected:
    """The responder may not; the request stays pending for someone else."""

    reason: str | None = None


ResponseStatus: TypeAlias = Literal["allowed", "rejected"] | Allowed | Rejected | dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestInfo:
    """The approval being answered; `principal` is whoever's turn asked (None if anonymous).
    `approved_by`: the principal ids whose quorum votes count so far (not this answer's), also
    those counted before a deadline escalated it (`escalated_to`), which stand."""

    request_id: str
    call_id: str
    tool_name: str
    tool_input: Any
    principal: Principal | None
    escalated_to: str | None = None
    approved_by: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseInfo:
    """The submitted decision, who submitted it, and the edited input (validated) if any: None
    for an answer judged before its fault is told (an edit of the wrong type, a stale hash)."""

    decision: Literal["approve", "cancel"]
    principal: Principal | None
    edited_input: Any = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseContext:
    """What a response policy receives: the request, the answer to it, and the session."""

    request: RequestInfo
    response: ResponseInfo
    session: SessionInfo


ResponsePolicy: TypeAlias = Callable[
    [ResponseContext], "ResponseStatus | Awaitable[ResponseStatus]"
]


DEFAULT_RESPONSE_TIMEOUT = 10.0
"""Seconds a response policy may judge an answer, unless its `ApprovalSpec(timeout=...)` says."""


@dataclass(frozen=True, slots=True)
class ResponseVerdict:
    """`allowed`, `rejected`, `failed` (the policy raised) or `timed-out`."""

    outcome: Literal["allowed", "rejected", "failed", "timed-out"]
    reason: str | None = None


class ApprovalSpec:
    """Both halves of a tool's approval: when to ask (`request`) and who may answer (`response`).

    The keyword rules replace those of the `request` policy, so any policy can have a quorum or
    a deadline: `ApprovalSpec(lambda input: input.amount > 100, expires_in=3600)`. `timeout`
    bounds each run of the response policy (one that blocks past it is timed out as well).
    """

    def __init__(
        self,
        request: ApprovalArg = None,
        response: ResponsePolicy | None = None,
        *,
        timeout: float = DEFAULT_RESPONSE_TIMEOUT,
        approvers: int | None = None,
        distinct: bool | None = None,
        exclude_requester: bool | None = None,
        expires_in: float | None = None,
        on_timeout: OnTimeout | None = None,
        escalate_to: str | None = None,
    ) -> None:
        self.request: ApprovalPolicy = as_policy(request if request is not None else "always")
        if response is not None and not callable(response):
            raise UsageError(f"response policy must be a function, not {shown_value(response)}")
        if response is not None:
            takes_one(response, _RESPONSE)
        if not positive_seconds(timeout):
            # NaN passed `<= 0` and then bounded nothing; a string was a TypeError; an int no
            # float holds (10**400) passed `< inf`, and its timer raised OverflowError
            raise UsageError(
                "the response policy timeout must be positive and finite (seconds), "
                f"not {shown_value(timeout)}"
            )
        self.response = response
        self.timeout = timeout
        # The rules given here override those of `request`; the others are kept as they are.
        given: dict[str, Any] = {
            "approvers": approvers,
            "distinct": distinct,
            "exclude_requester": exclude_requester,
            "expires_in": expires_in,
            "on_timeout": on_timeout,
            "escalate_to": escalate_to,
        }
        overrides = {k: v for k, v in given.items() if v is not None}
        if overrides.get("on_timeout", "escalate") != "escalate" and escalate_to is None:
            overrides["escalate_to"] = None  # the policy's group, which nothing would escalate to
        if overrides:
            base = self.request.rules
            self.request = copy.copy(self.request)  # never change a policy shared elsewhere
            self.request.rules = dataclasses.replace(base, **overrides)


_RESPONSE = "response policy {} must take one argument, an so.ResponseContext (def who(ctx): ...)"


def _normalize(result: object) -> ResponseVerdict:
    """A response policy's return as a verdict; anything undocumented fails closed. Types are
    checked first: an object equal to everything (`mock.ANY`, a proxy) allowed the answer."""
    if isinstance(result, Allowed) or (isinstance(result, str) and result == "allowed"):
        return ResponseVerdict("allowed")
    if isinstance(result, Rejected):
        return ResponseVerdict("rejected", reason_text(result.reason))
    if isinstance(result, str) and result == "rejected":
        return ResponseVerdict("rejected")
    if isinstance(result, dict):
        status, reason = result.get("status"), reason_text(result.get("reason"))
        if isinstance(status, str) and status == "allowed":
            return ResponseVerdict("allowed", reason)
        if isinstance(status, str) and status == "rejected":
            return ResponseVerdict("rejected", reason)
    return ResponseVerdict("failed", f"response policy returned an invalid status: {result!r}")


async def evaluate_response(
    policy: ResponsePolicy, ctx: ResponseContext, timeout: float
) -> ResponseVerdict:
    """Run a response policy; raising gives `failed`, exceeding `timeout` gives `timed-out`."""

    late = ResponseVerdict("timed-out", f"response policy took longer than {timeout:g}s")
    bound = TimeBound(timeout)
    try:
        async with bound:
            # A sync one in a thread, as a sync tool: blocking, it would stop lease renewals
            # (and the timeout could not cut it short).
            result = await called_off_loop(policy, ctx)
    except TimeoutError as exc:
        if bound.expired():
            return late
        # The policy's own (its HTTP call's, say), raised before its timeout: it failed.
        return ResponseVerdict("failed", f"response policy raised {error_text(exc)}")
    except (Exception, asyncio.CancelledError) as exc:
        task = asyncio.current_task()
        if not isinstance(exc, Exception) and task is not None and task.cancelling():
            raise  # the answer itself is cancelled; a CancelledError of the policy's own is not
        note = thread_note(policy, exc)
        return ResponseVerdict("failed", f"response policy raised {error_text(exc)}{note}")
    if bound.overran():
        # A coroutine that blocked (sync work, never awaiting) past its timeout, which asyncio
        # only enforces at an await: its verdict came too late all the same.
        return late
    try:
        return _normalize(result)
    except Exception as exc:  # comparing or showing what it returned raised: user code too
        kind = type(result).__name__
        return ResponseVerdict(
            "failed", f"response policy returned a {kind} that could not be read: {error_text(exc)}"
        )
