"""signoff: a Python runtime for AI agents that stop for people.

Tool calls can be gated by approval policies; the turn parks durably in the store and resumes
exactly where it stopped when someone answers, in any process.
"""

# ruff: noqa: F405  # `__all__` names what `_exports` gives type checkers by `*`

from typing import TYPE_CHECKING

__version__ = "0.1.0"

_CLIENT_NAMES = ("AsyncClient", "Client", "LiveSession")

if TYPE_CHECKING:
    # Type checkers see every name as it is, and no `__getattr__`, which would make every name
    # of the module, a misspelt one too, pass as `object`.
    from ._client import AsyncClient, Client, LiveSession
    from ._exports import *  # noqa: F403
else:

    def __getattr__(name: str) -> object:
        """Each exported name, imported on first use (`_exports`, all at once), so that a
        process importing `signoff` pays nothing until it uses it: the `signoff` command can
        then stop cleanly on a Ctrl-C while it loads. `so.Client`, `so.AsyncClient` and
        `so.LiveSession`, the HTTP client, need httpx, which the `server` extra brings."""
        if name in _CLIENT_NAMES:
            try:
                from . import _client
            except ImportError as exc:  # pragma: no cover - depends on the environment
                from ._exceptions import UsageError

                raise UsageError(
                    "the signoff HTTP client needs httpx: pip install 'signoff[server]'"
                ) from exc
            return getattr(_client, name)
        if name in __all__:
            from . import _exports

            exported = {n: getattr(_exports, n) for n in _exports.__all__}
            globals().update(exported)
            return exported[name]
        raise AttributeError(f"module 'signoff' has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(globals()) | set(__all__))


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
    "EventsRewritten",
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
    "RequestKind",
    "RequestStatus",
    "RequestInfo",
    "ResponseContext",
    "ResponseInfo",
    "Runtime",
    "SchemaVersionError",
    "SessionAuth",
    "SessionBusy",
    "SessionDeleted",
    "SessionError",
    "SessionExpired",
    "SessionInfo",
    "SessionLimitReached",
    "SessionStatus",
    "SessionWaiting",
    "SessionState",
    "SignoffError",
    "StaleAnswer",
    "StepFailed",
    "TooLarge",
    "StoreBusy",
    "StoreDamaged",
    "StoreError",
    "StoreGone",
    "StoreUnavailable",
    "SubagentOrphaned",
    "SubagentSession",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolResultMessage",
    "TurnStatus",
    "UnknownAgent",
    "UnknownRequest",
    "UnknownSession",
    "UnknownTool",
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
