"""The `Model` protocol: one call per agent step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from .._exceptions import UsageError
from .._types import Message, ModelResponse

__all__ = ["Model", "ModelRequest", "ToolSpec"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolSpec:
    """A tool as a model is shown it: its name, what it does and the JSON schema of its input."""

    name: str
    description: str
    input_schema: dict[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelRequest:
    """Everything one model call needs; `response_index` counts the session's earlier responses.

    `max_output_tokens` is what the session's budgets (`Limits.max_tokens`, `max_cost_usd` at
    the model's output price, a subagent's share of its parent's) leave for the reply, None for
    no bound: a model caps its reply there and raises `BudgetSpent` when the reply stopped at it.
    """

    session_id: str
    agent: str
    instructions: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec]
    response_index: int
    max_output_tokens: int | None = None

    def __post_init__(self) -> None:
        cap = self.max_output_tokens
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise UsageError(f"ModelRequest: max_output_tokens must be None or >= 1, not {cap!r}")


@runtime_checkable
class Model(Protocol):
    """Anything that turns a conversation into the next response; raise to fail the step."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The next response to `request`'s conversation; raise to fail the step."""
        ...
