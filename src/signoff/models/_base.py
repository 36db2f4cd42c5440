"""The `Model` protocol: one call per agent step."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

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
    """Everything one model call needs; `response_index` counts the session's earlier responses."""

    session_id: str
    agent: str
    instructions: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec]
    response_index: int


@runtime_checkable
class Model(Protocol):
    """Anything that turns a conversation into the next response; raise to fail the step."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The next response to `request`'s conversation; raise to fail the step."""
        ...
