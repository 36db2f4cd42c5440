"""The signals a tool raises or receives that are not failures: `ApprovalRequired` parks the turn
for a person's decision, `QuestionWithdrawn` and `InputUnavailable` end a `ctx.ask()`."""

from __future__ import annotations

from typing import Any

from ._exceptions import UsageError

__all__ = [
    "ApprovalRequired",
    "InputUnavailable",
    "QuestionWithdrawn",
    "misuse_in_step",
    "refused_misuse",
]


class QuestionWithdrawn(Exception):  # a signal, not an error
    """Raised by `ctx.ask()` when its question was withdrawn (a steering message, a cancel)."""

    def __init__(self, request_id: str, outcome: str) -> None:
        super().__init__(f"question {request_id} was withdrawn ({outcome})")
        self.request_id = request_id
        self.outcome = outcome

    def __reduce__(self) -> tuple[Any, ...]:
        # Its attributes too (a note added on the way up), as a plain exception's pickle keeps.
        return (type(self), (self.request_id, self.outcome), self.__dict__)


class InputUnavailable(Exception):  # a signal, not an error
    """Raised by `ctx.ask()` when no person can answer (for example a scheduled turn)."""


class ApprovalRequired(Exception):
    """Raised inside a tool to park the turn until a person decides; not a failure.

    The reviewer's decision becomes the call's result; the tool body does not run again.
    `call_id` names the call that asks (`ctx.request_approval` fills it in); a signal naming
    another call opens no request, since an approval is bound to the exact call.
    """

    def __init__(self, payload: Any = None, *, call_id: str | None = None) -> None:
        if call_id is not None and not isinstance(call_id, str):
            raise UsageError(f"call_id must be the call's id (a str), not {call_id!r}")
        super().__init__(payload)
        self.payload = payload
        self.call_id = call_id

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_signal, (self.payload, self.call_id), self.__dict__)


def _rebuild_signal(payload: Any, call_id: str | None) -> ApprovalRequired:
    """Unpickle an `ApprovalRequired` (its `call_id` is keyword-only)."""
    return ApprovalRequired(payload, call_id=call_id)


_MISUSE = "_signoff_misuse_in_step"


def misuse_in_step(exc: UsageError) -> UsageError:
    """Mark `exc`, signoff refusing what a step's function did (it stepped or asked), as about
    the tool's code, not the step's effect: a step failing with it is not journaled, so the
    code once fixed runs the step on replay instead of raising the bug's refusal for ever."""
    setattr(exc, _MISUSE, True)
    return exc


def refused_misuse(exc: BaseException) -> bool:
    """Whether `exc` is such a refusal, was raised on the way out of one (`raise ... from`), or
    holds one (an exception group: the step's function stepped in an `asyncio.TaskGroup`)."""
    seen: set[int] = set()
    left: list[BaseException | None] = [exc]
    while left:
        at = left.pop()
        if at is None or id(at) in seen:
            continue
        if getattr(at, _MISUSE, False):
            return True
        seen.add(id(at))
        left.append(at.__cause__ or at.__context__)
        if isinstance(at, BaseExceptionGroup):
            left.extend(at.exceptions)
    return False
