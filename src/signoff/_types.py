"""Plain, serializable data types shared by every layer: principals, messages, requests, answers.

All are pydantic models (keyword-only); the ones that are persisted carry a `kind` discriminator.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictStr

__all__ = [
    "APP_PRINCIPAL",
    "Action",
    "AssistantMessage",
    "Decision",
    "InputRequest",
    "InputResponse",
    "Message",
    "ModelResponse",
    "Option",
    "Principal",
    "RequestKind",
    "RequestStatus",
    "ToolCall",
    "ToolResultMessage",
    "Usage",
    "UserMessage",
    "input_hash",
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Principal(_Model):
    """Who is acting: the caller of a turn, a requester or a responder."""

    authenticator: str
    principal_id: str
    principal_type: str = "user"
    issuer: str | None = None
    attributes: dict[str, Any] = Field(default_factory=dict)

    def same_as(self, other: Principal | None) -> bool:
        """Compare full identity (not attributes), as a response policy should."""
        return other is not None and (
            self.authenticator,
            self.issuer,
            self.principal_type,
            self.principal_id,
        ) == (other.authenticator, other.issuer, other.principal_type, other.principal_id)


APP_PRINCIPAL = Principal(authenticator="app", principal_id="signoff:app", principal_type="runtime")


class Usage(_Model):
    """Tokens and cost of one model response (or a sum of them)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
        )

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens


class ToolCall(_Model):
    """A call the model proposes; `id` is assigned by the engine when the model gives none."""

    name: str
    input: Any = Field(default_factory=dict)
    id: str | None = None


class ModelResponse(_Model):
    """What a model returns for one step: text and/or tool calls, with usage."""

    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)


class UserMessage(_Model):
    kind: Literal["user"] = "user"
    text: str


class AssistantMessage(_Model):
    kind: Literal["assistant"] = "assistant"
    text: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)


class ToolResultMessage(_Model):
    """The result of one call as the model sees it; `is_error` for errors and denials."""

    kind: Literal["tool"] = "tool"
    call_id: str
    tool_name: str
    content: Any
    is_error: bool = False


Message = Annotated[UserMessage | AssistantMessage | ToolResultMessage, Field(discriminator="kind")]

RequestKind = Literal["tool-approval", "question", "session-limit"]
RequestStatus = Literal["pending", "settled", "expired", "withdrawn"]


def input_hash(value: Any) -> str:
    """Hash of the canonical JSON of a call's input: binds an approval to the exact call."""
    canonical = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


class Option(_Model):
    id: str
    label: str
    description: str | None = None


class Action(_Model):
    """The exact call an approval is bound to."""

    call_id: str
    tool_name: str
    input: Any
    input_hash: str


class InputRequest(_Model):
    """A durable record of something a person must answer."""

    kind: RequestKind
    id: str
    session_id: str
    turn_id: str
    agent: str
    action: Action | None = None
    question: str | None = None
    options: list[Option] = Field(default_factory=list)
    allow_text: bool = False
    payload: Any = None
    source: Literal["policy", "tool", "guardrail", "ask"] = "policy"
    requested_by: Principal | None = None
    created_at: float
    expires_at: float | None = None
    status: RequestStatus = "pending"
    policy_error: str | None = None
    usage: Usage = Field(default_factory=Usage)

    @property
    def tool_name(self) -> str | None:
        return self.action.tool_name if self.action else None

    @property
    def call_id(self) -> str | None:
        return self.action.call_id if self.action else None

    @property
    def input(self) -> Any:
        return self.action.input if self.action else None


APPROVAL_OPTIONS = [
    Option(id="approve", label="Approve", description="Run the call as proposed."),
    Option(id="cancel", label="Deny", description="Do not run the call."),
]


class Decision(_Model):
    """Helix-style answer to a pending approval: approve or deny, with an optional reason."""

    id: StrictStr
    approved: StrictBool
    reason: StrictStr | None = None
    value: Any = None


class InputResponse(_Model):
    """Eve-style answer to one request: an option id (`approve` / `cancel`) or text."""

    request_id: StrictStr
    option_id: StrictStr | None = None
    text: StrictStr | None = None
    value: Any = None
