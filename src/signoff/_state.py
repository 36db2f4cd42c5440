"""`SessionState`: the fold of a session's events. Pure: no I/O, no clock, no randomness.

The snapshot form leaves out the conversation (it lives in the events already), so a snapshot
stays small however long the session grows; the engine loads the conversation only when it
must call the model.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

from ._events import SCHEMA_VERSION, Event
from ._exceptions import SchemaVersionError, StoreError
from ._types import (
    AssistantMessage,
    InputRequest,
    Message,
    Principal,
    ToolCall,
    ToolResultMessage,
    Usage,
    UserMessage,
)

__all__ = ["CallState", "CallStatus", "RequestState", "SessionState", "TurnState", "fold"]

CallStatus = Literal[
    "proposed",  # the model asked for it; no approval decision recorded yet
    "requested",  # an approval request is open for it
    "approved",  # a person approved it; it has not started
    "denied",  # denied, cancelled or ignored before it ran; its result is not recorded yet
    "running",  # tool.started recorded, no result yet
    "awaiting",  # the tool body asked for approval itself (ApprovalRequired)
    "asking",  # the tool body is parked on ctx.ask(); it re-runs (replaying) once answered
    "decided",  # that approval was settled; the decision becomes the result
    "done",  # tool.completed recorded
]

TurnStatus = Literal["running", "waiting", "completed", "failed", "cancelled"]

# What a handler or the snapshot loader raises on data of the wrong shape (pydantic's
# ValidationError is a ValueError); it reaches callers as a StoreError.
_MALFORMED = (KeyError, TypeError, ValueError, AttributeError, IndexError)

MESSAGE_EVENT_TYPES = ("turn.started", "turn.message", "model.completed", "tool.completed")


@dataclass(slots=True, kw_only=True)
class CallState:
    id: str
    tool_name: str
    input: Any
    status: CallStatus = "proposed"
    request_id: str | None = None
    decision: dict[str, Any] | None = None
    idempotency_key: str | None = None
    edited_input: Any = None
    journal: list[dict[str, Any] | None] = field(default_factory=list)

    def record(self, index: int, entry: dict[str, Any]) -> None:
        while len(self.journal) <= index:
            self.journal.append(None)
        self.journal[index] = entry


@dataclass(slots=True, kw_only=True)
class RequestState:
    request: InputRequest
    status: str = "pending"
    outcome: str | None = None
    resolution: dict[str, Any] | None = None


@dataclass(slots=True, kw_only=True)
class TurnState:
    id: str
    status: TurnStatus = "running"
    principal: Principal | None = None
    started_at: float = 0.0
    steps: int = 0
    text: str = ""
    calls: dict[str, CallState] = field(default_factory=dict)
    retryable: bool = False
    error: dict[str, Any] | None = None
    first_seq: int = 0
    last_message_seq: int = 0
    model_seq: int = 0  # the latest model.completed: a message after it is not read yet
    source: str = "message"

    @property
    def steered(self) -> bool:
        """A steering message arrived that the model has not read yet."""
        return self.last_message_seq > self.model_seq


@dataclass(slots=True, kw_only=True)
class SessionState:
    id: str
    agent: str = ""
    seq: int = 0
    created_at: float = 0.0
    updated_at: float = 0.0
    ttl: float | None = None
    initiator: Principal | None = None
    parent: str | None = None
    turn: TurnState | None = None
    requests: dict[str, RequestState] = field(default_factory=dict)
    approved_tools: set[str] = field(default_factory=set)
    model_responses: int = 0
    usage: Usage = field(default_factory=Usage)
    queued: list[dict[str, Any]] = field(default_factory=list)
    lapsed: bool = False  # its TTL passed and its requests were expired: it stays expired
    limit_grants: int = 0  # `continue` answers to session-limit prompts: each raises budgets
    # Responses recorded as `approval.candidate` pending whose policy verdict is not recorded
    # yet (the process may have died while the policy ran): candidate id -> its data and time.
    candidates: dict[str, dict[str, Any]] = field(default_factory=dict)
    # None when rebuilt from a snapshot: the engine loads it from the events on demand.
    conversation: Conversation | None = field(default_factory=lambda: Conversation())

    @property
    def messages(self) -> list[Message] | None:
        """The whole model-visible conversation, or None when it is not loaded in full."""
        conv = self.conversation
        return None if conv is None or conv.partial else conv.messages

    # -- questions the engine and runtime ask --------------------------------------------

    @property
    def status(self) -> str:
        """`idle` | `running` | `waiting` | `failed` | `cancelled`."""
        if self.turn is None or self.turn.status == "completed":
            return "idle"
        return self.turn.status

    def pending_requests(self) -> list[InputRequest]:
        """Open requests in the order they were asked."""
        return [r.request for r in self.requests.values() if r.status == "pending"]

    @property
    def expires_at(self) -> float | None:
        return None if self.ttl is None else self.updated_at + self.ttl

    def expired(self, now: float) -> bool:
        if self.lapsed:
            return True
        expires = self.expires_at
        return expires is not None and now >= expires

    # -- the fold -------------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Advance the state by one event; events must come in `seq` order."""
        if event.seq != self.seq + 1:
            raise SchemaVersionError(
                f"session {self.id}: event seq {event.seq} does not follow {self.seq}"
            )
        self.seq = event.seq
        self.updated_at = event.at
        handler = _HANDLERS[event.type]
        try:
            handler(self, event)
        except _MALFORMED as exc:
            raise StoreError(f"event {event.id} ({event.type}) is malformed: {exc!r}") from exc

    def to_snapshot(self) -> dict[str, Any]:
        """Serializable form of everything but the conversation."""
        turn = self.turn
        return {
            "v": SCHEMA_VERSION,
            "id": self.id,
            "agent": self.agent,
            "seq": self.seq,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "ttl": self.ttl,
            "initiator": _dump_principal(self.initiator),
            "parent": self.parent,
            "approved_tools": sorted(self.approved_tools),
            "model_responses": self.model_responses,
            "usage": self.usage.model_dump(),
            "queued": self.queued,
            "lapsed": self.lapsed,
            "limit_grants": self.limit_grants,
            "candidates": self.candidates,
            "requests": [
                {
                    "request": r.request.model_dump(mode="json"),
                    "status": r.status,
                    "outcome": r.outcome,
                    "resolution": r.resolution,
                }
                for r in self.requests.values()
            ],
            "turn": None
            if turn is None
            else {
                "id": turn.id,
                "status": turn.status,
                "principal": _dump_principal(turn.principal),
                "started_at": turn.started_at,
                "steps": turn.steps,
                "text": turn.text,
                "retryable": turn.retryable,
                "error": turn.error,
                "first_seq": turn.first_seq,
                "last_message_seq": turn.last_message_seq,
                "model_seq": turn.model_seq,
                "source": turn.source,
                "calls": [
                    {
                        "id": c.id,
                        "tool_name": c.tool_name,
                        "input": c.input,
                        "status": c.status,
                        "request_id": c.request_id,
                        "decision": c.decision,
                        "idempotency_key": c.idempotency_key,
                        "edited_input": c.edited_input,
                        "journal": c.journal,
                    }
                    for c in turn.calls.values()
                ],
            },
        }

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> SessionState:
        """Rebuild a state from `to_snapshot()`; a malformed snapshot is a `StoreError`."""
        try:
            return cls._from_snapshot(data)
        except _MALFORMED as exc:
            raise StoreError(f"a snapshot is malformed: {exc!r}") from exc

    @classmethod
    def _from_snapshot(cls, data: dict[str, Any]) -> SessionState:
        v = data.get("v", 0)
        if v > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"snapshot of session {data.get('id')!r} has schema version {v}; this signoff "
                f"reads up to {SCHEMA_VERSION}"
            )
        t = data["turn"]
        turn = None
        if t is not None:
            turn = TurnState(
                id=t["id"],
                status=t["status"],
                principal=_load_principal(t["principal"]),
                started_at=t["started_at"],
                steps=t["steps"],
                text=t["text"],
                retryable=t["retryable"],
                error=t["error"],
                first_seq=t["first_seq"],
                last_message_seq=t.get("last_message_seq", 0),
                model_seq=t.get("model_seq", t.get("last_message_seq", 0)),
                source=t.get("source", "message"),
                calls={c["id"]: CallState(**c) for c in t["calls"]},
            )
        return cls(
            id=data["id"],
            agent=data["agent"],
            seq=data["seq"],
            created_at=data["created_at"],
            updated_at=data["updated_at"],
            ttl=data["ttl"],
            initiator=_load_principal(data["initiator"]),
            parent=data["parent"],
            approved_tools=set(data["approved_tools"]),
            model_responses=data["model_responses"],
            usage=Usage(**data["usage"]),
            queued=list(data.get("queued", [])),
            lapsed=bool(data.get("lapsed", False)),
            limit_grants=int(data.get("limit_grants", 0)),
            candidates=dict(data.get("candidates", {})),
            requests={
                r["request"]["id"]: RequestState(
                    request=InputRequest.model_validate(r["request"]),
                    status=r["status"],
                    outcome=r["outcome"],
                    resolution=r["resolution"],
                )
                for r in data["requests"]
            },
            turn=turn,
            conversation=None,
        )


def fold(events: Iterable[Event], state: SessionState | None = None) -> SessionState:
    """`state = reduce(apply, events)`; starts from an empty state named after the first event."""
    for event in events:
        if state is None:
            state = SessionState(id=event.session_id)
        state.apply(event)
    if state is None:
        raise ValueError("fold() needs at least one event or a starting state")
    return state


def conversation(events: Iterable[Event], *, partial: bool = False) -> Conversation:
    """The model-visible conversation of a whole log (used when a snapshot left it out), or of
    its end from a `turn.started` on (`partial`): the same messages as the whole log's from
    that turn on, since a turn starts with no call open and nothing held back."""
    conv = Conversation(partial=partial)
    for event in events:
        conv.add(event)
    return conv


class Conversation:
    """Messages as the model sees them; a message that arrives while calls are still open is
    held back until their results are in, so results always follow their calls."""

    __slots__ = ("deferred", "messages", "open_calls", "partial", "turn_start")

    def __init__(self, *, partial: bool = False) -> None:
        # partial: built from a recent turn on (enough for a message window), not the whole log
        self.partial = partial
        self.turn_start = 0
        self.messages: list[Message] = []
        self.open_calls: set[str] = set()
        self.deferred: list[Message] = []

    def _say(self, message: Message) -> None:
        if self.open_calls:
            self.deferred.append(message)
        else:
            self.messages.append(message)

    def add(self, event: Event) -> None:
        d = event.data
        if event.type == "turn.started":
            self.open_calls.clear()
            self.messages.extend(self.deferred)
            self.deferred.clear()
            self.turn_start = len(self.messages)
            if d.get("message") is not None:
                self.messages.append(UserMessage(text=d["message"]))
        elif event.type == "turn.message":
            if not d.get("queued"):
                self._say(UserMessage(text=d["message"]))
        elif event.type == "model.completed":
            calls = [ToolCall(**c) for c in d.get("tool_calls", [])]
            self.messages.append(AssistantMessage(text=d.get("text", ""), tool_calls=calls))
            self.open_calls = {c.id for c in calls if c.id}
        elif event.type == "tool.completed":
            self.messages.append(
                ToolResultMessage(
                    call_id=d["call_id"],
                    tool_name=d["tool_name"],
                    content=d.get("result"),
                    is_error=d.get("status") not in ("ok", "decided"),
                )
            )
            self.open_calls.discard(d["call_id"])
            if not self.open_calls and self.deferred:
                self.messages.extend(self.deferred)
                self.deferred.clear()


def _dump_principal(p: Principal | None) -> dict[str, Any] | None:
    return None if p is None else p.model_dump()


def _load_principal(d: dict[str, Any] | None) -> Principal | None:
    return None if d is None else Principal.model_validate(d)


# -- one handler per event type ----------------------------------------------------------------


def _session_created(s: SessionState, e: Event) -> None:
    s.agent = e.data["agent"]
    s.created_at = e.at
    s.ttl = e.data.get("ttl")
    s.initiator = _load_principal(e.data.get("initiator"))
    s.parent = e.data.get("parent")


def _turn_started(s: SessionState, e: Event) -> None:
    if e.turn_id is None:
        raise StoreError(f"event {e.id} (turn.started) has no turn id")
    if e.data.get("dequeued"):
        s.queued = s.queued[1:]
    s.turn = TurnState(
        id=e.turn_id,
        principal=_load_principal(e.data.get("principal")),
        started_at=e.at,
        first_seq=e.seq,
        source=e.data.get("source", "message"),
    )
    # Requests of earlier turns are all closed by now; keep the state small.
    s.requests = {k: r for k, r in s.requests.items() if r.status == "pending"}
    if s.conversation is not None:
        s.conversation.add(e)


def _model_completed(s: SessionState, e: Event) -> None:
    turn = _turn(s, e)
    s.model_responses += 1
    usage = Usage(**e.data.get("usage", {}))
    s.usage = s.usage + usage
    turn.steps += 1
    turn.model_seq = e.seq
    turn.status = "running"
    turn.retryable = False
    turn.error = None
    text = e.data.get("text", "")
    if text:
        turn.text = text if not turn.text else f"{turn.text}\n\n{text}"
    turn.calls = {
        c["id"]: CallState(id=c["id"], tool_name=c["name"], input=c.get("input"))
        for c in e.data.get("tool_calls", [])
    }
    if s.conversation is not None:
        s.conversation.add(e)


def _tool_started(s: SessionState, e: Event) -> None:
    call = _call(s, e)
    call.status = "running"
    _revive(_turn(s, e))
    call.idempotency_key = e.data.get("idempotency_key")


def _tool_step(s: SessionState, e: Event) -> None:
    d = e.data
    _call(s, e).record(d["index"], {"kind": "step", "name": d["name"], "result": d.get("result")})


def _turn_message(s: SessionState, e: Event) -> None:
    d = e.data
    if d.get("queued"):
        s.queued.append({"message": d["message"], "principal": d.get("principal")})
        return
    if s.turn is not None and s.turn.id == e.turn_id:
        s.turn.last_message_seq = e.seq
    if s.conversation is not None:
        s.conversation.add(e)


def _tool_completed(s: SessionState, e: Event) -> None:
    call = _call(s, e)
    call.status = "done"
    _revive(_turn(s, e))
    if s.conversation is not None:
        s.conversation.add(e)


def _input_requested(s: SessionState, e: Event) -> None:
    turn = _turn(s, e)
    for raw in e.data["requests"]:
        request = InputRequest.model_validate(raw)
        s.requests[request.id] = RequestState(request=request)
        if request.child is not None:  # mirrored from a subagent: its delegate call waits
            if request.child.call_id in turn.calls:
                turn.calls[request.child.call_id].status = "asking"
            continue
        if request.action is None or request.action.call_id not in turn.calls:
            continue
        call = turn.calls[request.action.call_id]
        if request.source == "ask":
            entry = {"kind": "ask", "name": request.question, "request_id": request.id}
            call.record(request.index or 0, entry)
            call.status = "asking"
        else:
            call.request_id = request.id
            call.status = "awaiting" if request.source == "tool" else "requested"


def _turn_waiting(s: SessionState, e: Event) -> None:
    _turn(s, e).status = "waiting"


def _drop_candidates(s: SessionState, request_id: str) -> None:
    """A closed request has nothing left to evaluate."""
    for cid in [c for c, d in s.candidates.items() if d.get("request_id") == request_id]:
        del s.candidates[cid]


def _approval_candidate(s: SessionState, e: Event) -> None:
    d = e.data
    cid = d.get("candidate_id")
    if cid is not None:
        if d.get("outcome") == "pending":
            s.candidates[cid] = {**d, "at": e.at}
        else:
            s.candidates.pop(cid, None)
    req = s.requests.get(d["request_id"])
    if req is None or req.status != "pending":
        return
    if d.get("outcome") == "counted":
        by = d.get("by") or {}
        approved_by = [*req.request.approved_by, str(by.get("principal_id"))]
        req.request = req.request.model_copy(update={"approved_by": approved_by})
    elif d.get("outcome") == "escalated":
        req.request = req.request.model_copy(
            update={"escalated_to": d.get("to"), "expires_at": None}
        )


def _approval_settled(s: SessionState, e: Event) -> None:
    d = e.data
    _drop_candidates(s, d["request_id"])
    req = s.requests.get(d["request_id"])
    approve = d["decision"] == "approve"
    if req is not None and req.request.action is not None and approve:
        s.approved_tools.add(req.request.action.tool_name)
    if s.turn is None or d.get("call_id") not in s.turn.calls:
        return
    call = s.turn.calls[d["call_id"]]
    decision = {
        "approved": approve,
        "outcome": "approved" if approve else "cancelled",
        "reason": d.get("reason"),
        "by": d.get("by"),
    }
    if d.get("value") is not None:
        decision["value"] = d["value"]
    call.decision = decision
    if d.get("edited_input") is not None:
        call.edited_input = d["edited_input"]
    if call.status == "awaiting":
        call.status = "decided"
    elif call.status == "requested":
        call.status = "approved" if approve else "denied"


def _input_resolved(s: SessionState, e: Event) -> None:
    d = e.data
    _drop_candidates(s, d["request_id"])
    req = s.requests.get(d["request_id"])
    if req is None:
        return
    outcome = d["outcome"]
    req.status = d.get("status") or "settled"
    mine = req.request.child is None  # a subagent's budget or expiry is not this session's
    if mine and req.request.kind == "session-limit" and outcome == "answered":
        if (d.get("answer") or {}).get("option_id") == "continue":
            s.limit_grants += 1
    if mine and outcome == "expired" and d.get("reason") == "session expired":
        s.lapsed = True
    req.outcome = outcome
    req.resolution = d
    child = req.request.child
    if child is not None:  # a subagent's request, settled there: its delegate call re-runs
        call = None if s.turn is None else s.turn.calls.get(child.call_id)
        still_waiting = any(
            r.status == "pending"
            and r.request.child is not None
            and r.request.child.call_id == child.call_id
            for r in s.requests.values()
        )
        if call is not None and call.status == "asking" and not still_waiting:
            call.status = "running"
            assert s.turn is not None
            s.turn.status = "running"
        return
    action = req.request.action
    if action is None or s.turn is None or action.call_id not in s.turn.calls:
        return
    call = s.turn.calls[action.call_id]
    if req.request.source == "ask":
        still_asking = any(
            r.status == "pending"
            and r.request.source == "ask"
            and r.request.action is not None
            and r.request.action.call_id == call.id
            for r in s.requests.values()
        )
        if call.status == "asking" and not still_asking:
            call.status = "running"  # re-run the body; answered asks replay
            s.turn.status = "running"  # so its next park records a turn.waiting of its own
        return
    if call.status in ("requested", "awaiting") and outcome not in ("approved", "answered"):
        # withdrawn without an approval: the call never runs
        call.decision = {
            "approved": False,
            "outcome": outcome,
            "reason": d.get("reason"),
            "by": d.get("by"),
        }
        call.status = "denied" if call.status == "requested" else "decided"


def _turn_completed(s: SessionState, e: Event) -> None:
    _turn(s, e).status = "completed"


def _turn_failed(s: SessionState, e: Event) -> None:
    turn = _turn(s, e)
    turn.status = "failed"
    turn.retryable = bool(e.data.get("retryable"))
    turn.error = e.data.get("error")


def _turn_resumed(s: SessionState, e: Event) -> None:
    turn = _turn(s, e)
    if turn.status == "failed":  # a retry was asked for: the turn has work again
        turn.status = "running"


def _turn_cancelled(s: SessionState, e: Event) -> None:
    _turn(s, e).status = "cancelled"


def _session_waiting(s: SessionState, e: Event) -> None:
    pass


def _revive(turn: TurnState) -> None:
    """A call moving again means the turn runs again, unless it already ended."""
    if turn.status == "waiting":
        turn.status = "running"


def _turn(s: SessionState, e: Event) -> TurnState:
    if s.turn is None or s.turn.id != e.turn_id:
        raise SchemaVersionError(f"event {e.id} ({e.type}) refers to a turn that is not open")
    return s.turn


def _call(s: SessionState, e: Event) -> CallState:
    turn = _turn(s, e)
    try:
        return turn.calls[e.data["call_id"]]
    except KeyError:
        raise SchemaVersionError(f"event {e.id} ({e.type}) refers to an unknown call") from None


_HANDLERS = {
    "session.created": _session_created,
    "turn.started": _turn_started,
    "turn.message": _turn_message,
    "model.completed": _model_completed,
    "tool.started": _tool_started,
    "tool.step": _tool_step,
    "tool.completed": _tool_completed,
    "input.requested": _input_requested,
    "turn.waiting": _turn_waiting,
    "approval.candidate": _approval_candidate,
    "approval.settled": _approval_settled,
    "input.resolved": _input_resolved,
    "turn.completed": _turn_completed,
    "turn.failed": _turn_failed,
    "turn.resumed": _turn_resumed,
    "turn.cancelled": _turn_cancelled,
    "session.waiting": _session_waiting,
}
