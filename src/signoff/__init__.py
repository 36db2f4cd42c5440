"""signoff: a Python runtime for AI agents that stop for people.

Tool calls can be gated by approval policies; the turn parks durably in the store and resumes
exactly where it stopped when someone answers, in any process.
"""

from typing import TYPE_CHECKING

from . import models, stores
from ._agent import Agent, Limits
from ._answers import MAX_TEXT_BYTES
from ._approval import (
    ApprovalContext,
    ApprovalPolicy,
    ApprovalStatus,
    Approved,
    Denied,
    Guardrail,
    SessionAuth,
    SessionInfo,
    Verdict,
    always,
    never,
    once,
    policy,
    predicate,
    tool_policy,
)
from ._ask import ask_question
from ._audit_trail import AuditEntries, AuditProblem
from ._audit_trail import verify_export as verify_audit_export
from ._auto import Criteria, auto
from ._events import SCHEMA_VERSION, Event
from ._exceptions import (
    AnswerError,
    AppendConflict,
    BudgetSpent,
    ConflictingAnswer,
    IdempotencyKeyReused,
    InvalidAnswer,
    LeaseLost,
    ModelError,
    NotAllowed,
    PartialAnswer,
    RemoteError,
    RequestClosed,
    SchemaVersionError,
    SessionBusy,
    SessionError,
    SessionExpired,
    SessionLimitReached,
    SignoffError,
    StaleAnswer,
    StepFailed,
    StoreBusy,
    StoreError,
    StoreGone,
    StoreUnavailable,
    TooLarge,
    UnknownAgent,
    UnknownRequest,
    UnknownSession,
    UsageError,
)
from ._response import (
    Allowed,
    ApprovalSpec,
    Rejected,
    RequestInfo,
    ResponseContext,
    ResponseInfo,
)
from ._results import GenerateResult, Outcome
from ._runtime import Runtime
from ._state import SessionState
from ._subagents import delegate
from ._tool_context import ReplayError, ToolContext
from ._tool_signals import ApprovalRequired, InputUnavailable, QuestionWithdrawn
from ._tools import Tool, tool
from ._types import (
    APP_PRINCIPAL,
    Action,
    Answer,
    AssistantMessage,
    ChildRef,
    Decision,
    InputRequest,
    InputResponse,
    Message,
    ModelResponse,
    Option,
    Principal,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)
from .stores._audit import AuditEntry

__version__ = "0.1.0"

_CLIENT_NAMES = ("AsyncClient", "Client", "LiveSession")

if TYPE_CHECKING:
    # Type checkers see the client's classes as they are, and no `__getattr__`, which would make
    # every name of the module, a misspelt one too, pass as `object`.
    from ._client import AsyncClient, Client, LiveSession
else:

    def __getattr__(name: str) -> object:
        """`so.Client`, `so.AsyncClient`, `so.LiveSession`: the HTTP client, imported on first
        use (it needs httpx, which the `server` extra brings)."""
        if name in _CLIENT_NAMES:
            try:
                from . import _client
            except ImportError as exc:  # pragma: no cover - depends on the environment
                raise UsageError(
                    "the signoff HTTP client needs httpx: pip install 'signoff[server]'"
                ) from exc
            return getattr(_client, name)
        raise AttributeError(f"module 'signoff' has no attribute {name!r}")


__all__ = [
    "APP_PRINCIPAL",
    "MAX_TEXT_BYTES",
    "SCHEMA_VERSION",
    "Action",
    "Agent",
    "Allowed",
    "Answer",
    "AnswerError",
    "AppendConflict",
    "ApprovalContext",
    "ApprovalPolicy",
    "ApprovalRequired",
    "ApprovalSpec",
    "ApprovalStatus",
    "AuditEntries",
    "AuditEntry",
    "AuditProblem",
    "Approved",
    "AsyncClient",
    "AssistantMessage",
    "BudgetSpent",
    "Client",
    "ChildRef",
    "ConflictingAnswer",
    "Criteria",
    "Decision",
    "Denied",
    "Event",
    "GenerateResult",
    "Guardrail",
    "IdempotencyKeyReused",
    "InputRequest",
    "InputResponse",
    "InputUnavailable",
    "InvalidAnswer",
    "LeaseLost",
    "Limits",
    "LiveSession",
    "Message",
    "ModelError",
    "RemoteError",
    "ModelResponse",
    "NotAllowed",
    "Option",
    "Outcome",
    "PartialAnswer",
    "QuestionWithdrawn",
    "ReplayError",
    "Principal",
    "Rejected",
    "RequestClosed",
    "RequestInfo",
    "ResponseContext",
    "ResponseInfo",
    "Runtime",
    "SchemaVersionError",
    "SessionAuth",
    "SessionBusy",
    "SessionError",
    "SessionExpired",
    "SessionInfo",
    "SessionLimitReached",
    "SessionState",
    "SignoffError",
    "StaleAnswer",
    "StepFailed",
    "TooLarge",
    "StoreBusy",
    "StoreError",
    "StoreGone",
    "StoreUnavailable",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolResultMessage",
    "UnknownAgent",
    "UnknownRequest",
    "UnknownSession",
    "Usage",
    "UsageError",
    "UserMessage",
    "Verdict",
    "__version__",
    "always",
    "ask_question",
    "auto",
    "delegate",
    "models",
    "never",
    "once",
    "policy",
    "predicate",
    "stores",
    "tool",
    "tool_policy",
    "verify_audit_export",
]
