"""`Scripted`: a deterministic model for tests and examples, shipped with the package."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import TypeAlias

from .._exceptions import BudgetSpent, ModelError, UsageError
from .._settings import flag
from .._types import Message, ModelResponse, Usage
from ._base import ModelRequest

__all__ = ["Scripted", "misfit"]

Step: TypeAlias = (
    ModelResponse | Callable[[list[Message]], ModelResponse | Awaitable[ModelResponse]] | Exception
)


class Scripted:
    """Plays responses in order *per session*: index = responses the session already has.

    An entry may be a `ModelResponse`, a function of the conversation returning one, or an
    exception to raise (to test failures). With `repeat_last=True` the last entry is reused
    once the script runs out, which suits long benchmarks (an empty script, with none to reuse,
    is refused). With `cut_at_cap=True` a response whose `usage` says it wrote more output
    tokens than the request's `max_output_tokens` (what the session's budgets leave) is cut
    there, as the shipped models cut one: `BudgetSpent` is raised, counting the tokens up to
    the cap. Without it, the cap is ignored, so a script may spend past a budget in one reply,
    which no real model can.
    """

    def __init__(
        self, steps: Sequence[Step], *, repeat_last: bool = False, cut_at_cap: bool = False
    ) -> None:
        if isinstance(steps, str | bytes | ModelResponse | Exception) or not isinstance(
            steps, Iterable
        ):
            # One response alone would be iterated as its pydantic fields, or a string's letters.
            raise UsageError(
                f"Scripted takes a list of steps, not a {type(steps).__name__}: "
                "wrap a single response in a list"
            )
        self.steps = list(steps)
        for i, step in enumerate(self.steps):
            # Refused here: at the model call it was a TypeError inside a failed turn.
            if not (isinstance(step, ModelResponse | Exception) or callable(step)):
                raise UsageError(
                    f"scripted step #{i + 1} is a {type(step).__name__}: a step is a "
                    "ModelResponse, a function of the conversation returning one, or an exception"
                )
            _check_function(i, step)
        self.repeat_last = flag("Scripted repeat_last", repeat_last)  # "no" was true
        if self.repeat_last and not self.steps:  # else each session's first call failed
            raise UsageError("Scripted repeat_last=True has no step to repeat: script at least one")
        self.cut_at_cap = flag("Scripted cut_at_cap", cut_at_cap)
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The scripted step at the number of responses the session already has."""
        self.calls += 1
        index = request.response_index
        if index >= len(self.steps):
            if not (self.repeat_last and self.steps):
                hint = "script more" + ("" if self.repeat_last else ", or pass repeat_last=True")
                raise ModelError(
                    f"the Scripted model of agent {request.agent!r} has {len(self.steps)} "
                    f"response(s); session {request.session_id!r} asked for response "
                    f"#{index + 1} ({hint})"
                )
            index = len(self.steps) - 1
        step = self.steps[index]
        if isinstance(step, Exception):
            raise step
        cap = request.max_output_tokens if self.cut_at_cap else None
        if isinstance(step, ModelResponse):
            return _capped(step, cap)
        result = step(list(request.messages))
        if inspect.isawaitable(result):
            result = await result
        if not isinstance(result, ModelResponse):
            raise ModelError(f"scripted step #{index + 1} returned {result!r}, not a ModelResponse")
        return _capped(result, cap)


def _capped(response: ModelResponse, cap: int | None) -> ModelResponse:
    """`response`, unless it is longer than `cap` output tokens: then it stops there, as a real
    model's would, and `BudgetSpent` counts what it spent so far (its cost cut in proportion)."""
    usage = response.usage
    if cap is None or usage.output_tokens <= cap:
        return response
    whole = usage.input_tokens + usage.output_tokens
    kept = usage.input_tokens + cap
    spent = Usage(
        input_tokens=usage.input_tokens, output_tokens=cap, cost_usd=usage.cost_usd * kept / whole
    )
    raise BudgetSpent(
        f"the scripted reply of {usage.output_tokens} output tokens was cut off at the {cap} "
        "output tokens the session's budgets had left",
        usage=spent,
    )


def _check_function(i: int, step: Step) -> None:
    """Refuse a step function that cannot be called with the conversation, and an exception
    class (called with the conversation, it returns an exception instead of raising one)."""
    if isinstance(step, type) and issubclass(step, BaseException):
        raise UsageError(
            f"scripted step #{i + 1} is the exception class {step.__name__}: pass an instance "
            f"to raise, such as {step.__name__}(...)"
        )
    if isinstance(step, ModelResponse | Exception):
        return
    signature = misfit(step)
    if signature is not None:
        raise UsageError(
            f"scripted step #{i + 1} is a function {signature}: a step function takes the "
            "conversation (one argument, the list of messages) and returns a ModelResponse"
        )


def misfit(function: Callable[..., object]) -> inspect.Signature | None:
    """The signature of `function` if it cannot be called with the conversation alone; None if
    it can, or has no signature to read (a builtin: met when it is called)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    try:
        signature.bind([])
    except TypeError:
        return signature
    return None
