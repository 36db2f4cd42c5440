"""The `Model` protocol: one call per agent step."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .._exceptions import ModelError, UsageError
from .._types import Message, ModelResponse, Usage

__all__ = ["Model", "ModelRequest", "PausedPart", "ToolSpec", "not_a_model_class", "reply_to"]


def not_a_model_class(model: object, what: str) -> None:
    """Refuse a model class given for a model (`model=OpenAIChat`): its `complete` is there, but
    unbound, so each call failed with "complete() missing 1 required positional argument"."""
    if isinstance(model, type):
        raise UsageError(
            f"{what} is the class {model.__name__}, not a model: pass one, {model.__name__}(...)"
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A tool as a model is shown it: its name, what it does and the JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class PausedPart:
    """A part of a reply the provider paused (Anthropic's `pause_turn`: a long server-tool loop)
    and was asked to continue: journaled as it arrives (`model.paused`), so a turn resumed after
    a crash continues from it instead of asking, and paying, for it again.

    `model` names who made it (a model given another's parts starts over), `data` is the model's
    own JSON to continue from, and `usage` what the provider billed for it.
    """

    model: str
    data: dict[str, Any]
    usage: Usage


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """Everything one model call needs; `response_index` counts the session's earlier responses.

    `max_output_tokens` is what the session's budgets (`Limits.max_tokens`, `max_cost_usd` at
    the model's output price, a subagent's share of its parent's) leave for the reply, None for
    no bound: a model caps its reply there and raises `BudgetSpent` when the reply stopped at it.
    `budgeted`: a budget (`max_tokens` or `max_cost_usd`, its own or its share of its parent's)
    bounds the session, even where it leaves the output unbounded (free output under a cost
    budget): a reply whose usage the budgets cannot count then fails the call. A request with
    `max_output_tokens` counts as budgeted too.

    A model whose reply comes in parts hands each paused part to `on_pause` (the engine journals
    it) before asking for the next, and then leaves what that part cost out of its response's
    usage and its errors': it was counted when journaled. `on_pause` returns the output cap of
    the next part (what the budgets leave once the part is counted and the next part's input, at
    least the part's own, is held back; None: no bound), which the model caps it at too, or
    raises `BudgetSpent` when they leave none: the model lets that end its reply. `paused` holds
    the parts journaled of this reply before the process stopped, in order: the model continues
    from the last of them (the budgets counted them already, and `max_output_tokens` holds back
    the last one's input), or ignores them to start over. A reply that can go on no further
    from its parts (too many) raises `ModelError` with `start_over`: the turn fails, and its
    retry asks afresh, given none of them. Other models ignore all three.
    """

    session_id: str
    agent: str
    instructions: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec]
    response_index: int
    max_output_tokens: int | None = None
    paused: Sequence[PausedPart] = ()
    on_pause: Callable[[PausedPart], Awaitable[int | None]] | None = None
    budgeted: bool = False

    def __post_init__(self) -> None:
        cap = self.max_output_tokens
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise UsageError(f"ModelRequest: max_output_tokens must be None or >= 1, not {cap!r}")
        if not isinstance(self.budgeted, bool):  # "no" would pass for true
            raise UsageError(f"ModelRequest: budgeted must be a bool, not {self.budgeted!r}")


@runtime_checkable
class Model(Protocol):
    """Anything that turns a conversation into the next response; raise to fail the step."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The next response to `request`'s conversation; raise to fail the step."""
        ...


async def reply_to(
    complete: Callable[[ModelRequest], Awaitable[Any]], request: ModelRequest
) -> Any:
    """`complete(request)` awaited. A model of one's own whose `complete` is a plain `def` returns
    its reply itself, which no `await` takes: a `ModelError` saying to make it `async`, rather
    than Python's "object ModelResponse can't be used in 'await' expression"."""
    reply: object = complete(request)
    if not inspect.isawaitable(reply):
        raise ModelError(
            f"the model's complete() returned {type(reply).__name__}, not an awaitable: a "
            "model's complete is an async def (the Model protocol's)"
        )
    return await reply
