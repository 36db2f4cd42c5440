"""The HTTP API's bodies: strict request models (camelCase) and the response views."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    WithJsonSchema,
    model_validator,
)
from pydantic.alias_generators import to_camel

from .._results import GenerateResult
from .._state import SessionState
from .._text import NOTHING_SAID, SAID, is_blank
from .._types import InputRequest, Principal, Usage
from ..stores import SessionSummary

__all__ = [
    "ApprovalItem",
    "Approvals",
    "CancelBody",
    "CreateSession",
    "GenerateBody",
    "OutcomeView",
    "QueuePage",
    "RequestRecord",
    "ResponseItem",
    "Responses",
    "SendMessage",
    "SessionItem",
    "SessionPage",
    "SessionView",
    "TurnResult",
    "TurnView",
    "idle_result",
    "session_page",
    "session_view",
    "turn_result",
    "without_inputs",
]


class _Body(BaseModel):
    """Request bodies: unknown fields are refused and no type is coerced."""

    model_config = ConfigDict(extra="forbid", strict=True, alias_generator=to_camel)

    @model_validator(mode="before")
    @classmethod
    def _unicode(cls, data: Any) -> Any:
        """JSON may escape a lone surrogate (`"\\ud800"`): it is not text, and cannot be stored."""
        stack = [data]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                try:
                    item.encode()
                except UnicodeEncodeError:
                    raise ValueError("text must be valid Unicode: found a lone surrogate") from None
            elif isinstance(item, dict):
                stack.extend(item.keys())
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
        return data


def _said(text: str) -> str:
    """A message must say something: whitespace, controls and invisible characters alone are
    refused, as `Runtime` refuses them (the schema says so with `SAID`)."""
    if is_blank(text):
        raise ValueError(NOTHING_SAID.format(what="the message"))
    return text


# A message: not empty, not only whitespace or invisible characters (`SAID`).
_Said = Annotated[
    StrictStr,
    AfterValidator(_said),
    WithJsonSchema({"type": "string", "minLength": 1, "pattern": SAID}),
]


class CreateSession(_Body):
    agent: StrictStr = Field(description="Name of the agent to talk to.")
    message: _Said | None = Field(
        default=None,
        min_length=1,
        description="First message; without it the session is only opened. Not blank.",
    )


class SendMessage(_Body):
    text: _Said = Field(min_length=1, description="The message. Not blank.")
    turn_policy: Literal["steer", "queue"] = "steer"


# What an answer needs, said by the schema and checked by the runtime, not here: the runtime
# refuses an unknown session, an unknown request and one who may not answer before the answer's
# shape (README, "Who may answer is checked first"), so the body checks only types.
_Id = Annotated[StrictStr, Field(json_schema_extra={"minLength": 1})]


class ResponseItem(_Body):
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": [name], "properties": {name: {"type": "string"}}}
                for name in ("optionId", "text")
            ]
        }
    )

    request_id: _Id
    option_id: StrictStr | None = None
    text: StrictStr | None = None
    value: Any = None
    edited_input: dict[str, Any] | None = Field(
        default=None, description="Approve with these arguments instead (the tool's schema)."
    )
    input_hash: StrictStr | None = Field(
        default=None, description="The `action.input_hash` the reviewer saw; refused if stale."
    )


class Responses(_Body):
    input_responses: list[ResponseItem] = Field(min_length=1)


class ApprovalItem(_Body):
    id: _Id
    approved: StrictBool
    reason: StrictStr | None = None
    value: Any = None
    edited_input: dict[str, Any] | None = None
    input_hash: StrictStr | None = None


class Approvals(_Body):
    approvals: list[ApprovalItem] = Field(min_length=1)
    agent: StrictStr | None = Field(
        default=None,
        description="The agent the caller means the session to be: another agent's session "
        "is refused (400 `usage_error`), settling nothing.",
    )


class GenerateBody(_Body):
    message: _Said | None = Field(
        default=None,
        min_length=1,
        description="The next turn's message; without it the session's turn is resumed (a "
        "retry after a failure). Not blank.",
    )
    agent: StrictStr | None = Field(
        default=None,
        description="The agent the caller means the session to be: another agent's session "
        "is refused (400 `usage_error`), running nothing.",
    )


class CancelBody(_Body):
    reason: StrictStr | None = None
    turn_id: StrictStr | None = Field(
        default=None,
        min_length=1,
        description="Cancel this turn only: once another has started, nothing is cancelled.",
    )


class DeleteBody(_Body):
    reason: StrictStr | None = None
    force: StrictBool = Field(
        default=False,
        description="Delete it unfinished too, its open requests with it: for a session no "
        "cancel can finish (a damaged one). Still 409 `session_busy` while a drive holds its "
        "lease; the deletion's audit entry says it was forced.",
    )


def _whole(value: Any) -> Any:
    """A JSON number with no fraction (`271.0`) as the integer it is: JSON Schema's `integer`
    takes it, so a body written to the schema is not refused. Anything else as it came."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return value


MAX_PRUNE = 10_000
"""The most sessions one `POST /v1/prune` deletes: each is a transaction, and a request waits for
them all (run it again for the rest, as `more` says)."""


class PruneBody(_Body):
    older_than: StrictFloat = Field(
        ge=0,
        allow_inf_nan=False,
        description="Delete the finished sessions last active more than this many seconds ago.",
    )
    limit: Annotated[StrictInt, BeforeValidator(_whole)] = Field(
        default=1000, ge=1, le=MAX_PRUNE, description="At most this many, the oldest first."
    )
    agent: StrictStr | None = Field(default=None, description="Only this agent's sessions.")
    reason: StrictStr | None = Field(
        default=None, description="Why, as each deletion's audit entry records it."
    )
    dry_run: StrictBool = Field(
        default=False, description="List the sessions it would delete; delete nothing."
    )


class Pruned(BaseModel):
    """What a prune did: the top-level sessions it deleted (oldest first), those it tried to
    delete (a session found live, or active since, is skipped, the next taken in its place),
    whether more were old enough past the last it tried, left for another run, and those of
    the tried it could not read to record their passed TTL (a forced deletion deletes one)."""

    model_config = ConfigDict(extra="forbid")

    deleted: list[str]
    listed: list[str]
    more: bool
    damaged: list[str]


class Deleted(BaseModel):
    """The sessions a deletion erased: the one asked for first, then its subagents'."""

    model_config = ConfigDict(extra="forbid")

    deleted: list[str]


class _View(BaseModel):
    model_config = ConfigDict(extra="forbid")


class OutcomeView(_View):
    """What became of one answer: `approved`, `cancelled`, `answered`, `counted` (a quorum
    vote), or a refusal by the response policy (`rejected`, `failed`, `timed-out`)."""

    request_id: str
    outcome: str
    applied: bool
    reason: str | None = None


class TurnResult(_View):
    """Where the turn stands after a call: `completed`, `waiting`, `failed`, ..."""

    session_id: str
    status: str
    turn_id: str | None
    text: str
    pending: list[InputRequest]
    outcomes: list[OutcomeView]
    error: dict[str, Any] | None
    retryable: bool
    replayed: bool = Field(
        default=False,
        description="True when the call repeated an earlier one with its `Idempotency-Key`: "
        "it started or sent nothing, and this is the turn the first call's message went to, "
        "as it stands now.",
    )
    queued: bool = Field(
        default=False,
        description="True when a sent message waits for the end of the turn this result "
        "reports (it came from someone other than the person the turn serves, or with "
        "`turnPolicy: queue`), or a generate call's message does (queued behind a message "
        "that waited): it starts a later turn, as its sender.",
    )
    cut_off: str | None = Field(
        default=None,
        description="Why the model's latest reply in the turn stopped short: `max_tokens` (its "
        "output limit or context window) or `content_filter` (a filter or refusal); `text` "
        "then ends in a partial answer. Null for a reply the model finished.",
    )
    cancelled: bool = Field(
        default=False,
        description="True when a cancel recorded the cancel of the turn this result reports; "
        "false for one that found that turn over (a cancel sent twice) or another the "
        "session's turn.",
    )


class TurnView(_View):
    id: str
    status: str
    text: str
    steps: int
    started_at: float
    error: dict[str, Any] | None
    retryable: bool
    cut_off: str | None = Field(
        default=None,
        description="Why the model's latest reply in the turn stopped short (`max_tokens`, "
        "`content_filter`), as the turn's result says: `text` then ends in a partial answer.",
    )


class SessionView(_View):
    id: str
    agent: str
    status: str
    seq: int
    created_at: float
    updated_at: float
    expires_at: float | None
    initiator: Principal | None
    usage: Usage
    delegated: Usage = Field(
        description="What the child sessions of its delegate calls spent (theirs and their own "
        "children's), counted against its budgets beside `usage`, its own model calls'"
    )
    turn: TurnView | None
    pending: list[InputRequest]


class QueuePage(_View):
    items: list[InputRequest]
    total: int
    limit: int
    offset: int


def without_inputs(request: InputRequest) -> InputRequest:
    """`request` as a light listing shows it: its call's input and its payload null, what binds
    an approval to them (`action.input_hash`) as it is."""
    action = request.action
    return request.model_copy(
        update={
            "action": None if action is None else action.model_copy(update={"input": None}),
            "payload": None,
        }
    )


class SessionItem(_View):
    """One session of a listing: enough to pick it, not its history (`seq` its last event)."""

    id: str
    agent: str
    status: str
    seq: int
    created_at: float
    updated_at: float
    expires_at: float | None


class SessionPage(_View):
    items: list[SessionItem]
    total: int
    limit: int
    offset: int


def session_page(rows: list[SessionSummary], total: int, limit: int, offset: int) -> SessionPage:
    items = [
        SessionItem(
            id=r.id,
            agent=r.agent,
            status=r.status,
            seq=r.head,
            created_at=r.created_at,
            updated_at=r.updated_at,
            expires_at=r.expires_at,
        )
        for r in rows
    ]
    return SessionPage(items=items, total=total, limit=limit, offset=offset)


class RequestRecord(_View):
    request: InputRequest
    status: str
    outcome: str | None
    resolution: dict[str, Any] | None


def turn_result(r: GenerateResult) -> TurnResult:
    return TurnResult(
        session_id=r.session_id,
        status=r.status,
        turn_id=r.turn_id,
        text=r.text,
        pending=list(r.pending),
        outcomes=[
            OutcomeView(
                request_id=o.request_id, outcome=o.outcome, applied=o.applied, reason=o.reason
            )
            for o in r.outcomes
        ],
        error=r.error,
        retryable=r.retryable,
        replayed=r.replayed,
        queued=r.queued,
        cut_off=r.cut_off,
        cancelled=r.cancelled,
    )


def idle_result(s: SessionState, *, replayed: bool = False) -> TurnResult:
    """The result for a session that has no turn yet (or for a repeat of the call opening it)."""
    return TurnResult(
        session_id=s.id,
        status="idle",
        turn_id=None,
        text="",
        pending=[],
        outcomes=[],
        error=None,
        retryable=False,
        replayed=replayed,
    )


def session_view(s: SessionState) -> SessionView:
    t = s.turn
    return SessionView(
        id=s.id,
        agent=s.agent,
        status=s.status,
        seq=s.seq,
        created_at=s.created_at,
        updated_at=s.updated_at,
        expires_at=s.expires_at,
        initiator=s.initiator,
        usage=s.usage,
        delegated=s.delegated,
        turn=None
        if t is None
        else TurnView(
            id=t.id,
            status=s.turn_status or t.status,
            text=t.text,
            steps=t.steps,
            started_at=t.started_at,
            error=t.error,
            retryable=t.status == "failed" and t.retryable,  # not once resumed (`_session_cache`)
            cut_off=t.cut_off,
        ),
        pending=s.pending_requests(),
    )
