"""`SessionState`: the fold of a session's events. Pure: no I/O, no clock, no randomness.

The snapshot form leaves out the conversation and the journals of tool calls (they live in the
events already), so a snapshot stays small however long the session grows and a workflow's step
costs the same however many came before it; the engine loads the conversation only when it
must call the model, and a call's journal only when its body runs.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ._conversation import MALFORMED, Conversation
from ._event_handlers import HANDLERS
from ._events import Event, EventType, is_activity, keeps_activity
from ._exceptions import SchemaVersionError, StoreError
from ._snapshot_fields import (
    check_fields,
    error_of,
    ids_of,
    last_of,
    paused_of,
    seq_of,
    session_of,
)
from ._state_parts import (
    CallState,
    CallStatus,
    RequestState,
    TurnState,
    TurnStatus,
    check_asked,
    check_kept,
    check_raised,
    dump_principal,
    kept_count,
    kept_usage,
    load_principal,
)
from ._turn_status import delegated_turn, runnable, starts_queued, turn_over, waits_for_retry
from ._types import InputRequest, Message, Principal, SessionStatus, Usage

__all__ = [
    "FOLD_VERSION",
    "CallState",
    "CallStatus",
    "RequestState",
    "SessionState",
    "SessionStatus",
    "TurnState",
    "delegated_turn",
    "fold",
    "of_this_fold",
    "runnable",
    "starts_queued",
    "turn_over",
    "waits_for_retry",
]

SNAPSHOT_VERSION = 2
"""Version of the snapshot form this signoff writes and the newest it reads. 2: calls keep their
journals out (read back from the events); an older signoff refuses such a snapshot by its
version. One of version 1 or before holds each journal whole, and still loads."""

FOLD_VERSION = 17
"""Version of the fold (`SessionState.apply`) that made this signoff's snapshots (their `fold`; none
is 1), raised whenever an event comes to fold otherwise: a session loads only from a snapshot of
this fold (`of_this_fold`). 2: a failed turn cancelled after is not `retryable`. 3: a `tool.started`
with a `policy_reason` gives its call that `decision`. 4: a call keeps its `tool.started`'s
`filled`. 5: the app's approval (a `runtime` principal's) grants no `once()` tool: a session it
granted one folds again without the grant, and asks a person. 6: a deadline's escalation is no
activity: the session's `updated_at` and TTL stay put. 7: a turn keeps the requests closed that no
drive went on with yet (`answered`): their call moving or the model's call drops them, a park does
not. 8: a turn keeps the subagent stopped on its share of the budgets until answered
(`share_spent`). 9: a mirror's `input.resolved` keeps the keys of `kept`, and an event's `via` marks
its key as given through mirrors above the session (0: to the session itself): a key a keyed vote
left in a subagent's session alone is a repeat in its parent. 10: an `input.repeated`'s `held_idem`
holds its key for a message's answer going down a mirror, until the answer's key (its `idem`, or a
mirror's `kept`) is recorded over it. 11: a `turn.failed` with `start_over` drops the turn's paused
parts: its retry asks afresh. 12: a turn keeps the last event its latest reply read (`read_seq`, a
`model.completed`'s `read_through`): a message that came while the model answered steers its calls.
13: a session is a call's child (`kids`) only by a delegate call's own step (marked `child`, or an
older one naming the child the call's key derives), not any step of its name. 14: a quorum's
approval settled holds every vote, the last one too (its settling's `approved_by`; a mirror's, those
of its subagent's request), as its stored row does. 15: a mirror closed unapproved (denied, expired)
holds the votes its subagent's request counted, as its close records them (`approved_by`). 16: a
passed TTL's record, and a delegated turn's cancel for one, are no activity (`keeps_activity`): the
session's `updated_at` stays its last activity, its `expires_at` the record's time (`lapsed_at`).
17: a session-limit request's `continue` raises the budgets to what its `input.requested`'s
`raise_to` says (as many sizes as the next model call needed when it was asked; `raised`), not
by one size of whatever size the answering deploy has."""


@dataclass(slots=True, kw_only=True)
class SessionState:
    """A session as folded from its events: status, current turn, requests, usage."""

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
    # Whether a turn's start dropped closed requests of earlier turns from `requests`: until
    # then it holds every request the session ever had, so an id it lacks names none of them.
    earlier_requests: bool = False
    approved_tools: set[str] = field(default_factory=set)
    model_responses: int = 0
    usage: Usage = field(default_factory=Usage)
    # The input tokens of its latest model response: the least the next call reads, while the
    # conversation sent grows (the budgets hold the call back when that alone would spend them).
    last_input_tokens: int = 0
    # What the children of its delegate calls spent (theirs and their own children's), recorded
    # as each call ended: its budgets count it, apart from `usage`, which a sum of the usage of
    # many sessions would otherwise count twice.
    delegated: Usage = field(default_factory=Usage)
    # The children of delegate calls that a turn's end left without a result (it was cancelled,
    # failed for good or replaced), whose spend is still to be counted in `delegated` by a
    # `subagent.spent` once their delegated turn ended: child session id -> the turn that
    # delegated to it. Counting a child removes it, so it is counted once.
    owed: dict[str, str] = field(default_factory=dict)
    # The children of delegate calls that ended with their figure short of some of their own
    # children's spend (still running elsewhere): child session id -> [the turn that delegated,
    # what its call's end counted], for a `subagent.spent` to add the rest once it is known.
    short: dict[str, list[Any]] = field(default_factory=dict)
    queued: list[dict[str, Any]] = field(default_factory=list)
    lapsed: bool = False  # its TTL passed and its requests were expired: it stays expired
    # Once lapsed, the time of the latest event since that `is_activity` (its expiry's record,
    # mostly): its `expires_at`, as the store's row keeps it.
    lapsed_at: float | None = None
    # What its parent's budgets had left when this child session was created (`max_tokens`,
    # `max_cost_usd`; from its `session.created`): its delegated turn stops once it spent that.
    headroom: dict[str, float] = field(default_factory=dict)
    # What the parent had spent then, by the same budgets: what it counts later, over this, its
    # other subagents spent since, and this child's share of the headroom is that much less.
    parent_spent: dict[str, float] = field(default_factory=dict)
    # `continue` answers to session-limit prompts an older signoff asked (no `raise_to`): each
    # raises every budget by its size. A budget is that many sizes more than its own,
    limit_grants: int = 0
    # or, if more, what a newer one's `continue`s raised it to (their requests' `raise_to`).
    raised: dict[str, Any] = field(default_factory=dict)
    # The newest idempotency keys recorded (`_idempotency`): key digest -> [digest of what it
    # asked, the turn its message was recorded in, or None while only its session is created].
    keys: dict[str, list[Any]] = field(default_factory=dict)
    # Responses recorded as `approval.candidate` pending whose policy verdict is not recorded
    # yet (the process may have died while the policy ran): candidate id -> its data and time.
    candidates: dict[str, dict[str, Any]] = field(default_factory=dict)
    # None when rebuilt from a snapshot: the engine loads it from the events on demand.
    conversation: Conversation | None = field(default_factory=lambda: Conversation())
    # The type, time and turn of the event at `seq`, the last one folded (None: not known, a
    # snapshot of an older signoff's): a store that lost commits can hold another event at that
    # seq, written again since, which the seq alone does not tell from this one (`shown`).
    last: tuple[EventType, float, str | None] | None = field(
        default=None, compare=False, repr=False
    )
    _shown: Event | None = field(default=None, init=False, compare=False, repr=False)
    # Its stored snapshot is of another fold (`load_state`): its next commit writes one anew.
    stale_snapshot: bool = field(default=False, init=False, compare=False, repr=False)

    def shown(self) -> Event | None:
        """The last event folded, without its data, for a store to check it still holds it
        (`EventsRewritten`, `Commit.expected_event`); None if not known. Made once a seq: each
        use of a cached state asks for it."""
        last, made = self.last, self._shown
        if made is not None and made.seq == self.seq:
            return made
        if last is None or not self.seq:
            return None
        made = Event(session_id=self.id, seq=self.seq, type=last[0], at=last[1], turn_id=last[2])
        self._shown = made
        return made

    @property
    def messages(self) -> list[Message] | None:
        """The whole model-visible conversation, or None when it is not loaded in full."""
        conv = self.conversation
        return None if conv is None or conv.partial else conv.messages

    # -- questions the engine and runtime ask --------------------------------------------

    @property
    def status(self) -> SessionStatus:
        """`idle` | `running` | `waiting` | `failed` | `cancelled`: the one status every surface
        shows (the store's summary too). `running` means there is work to do now, whether or not
        a process is doing it (answers accepted but not resumed, messages that waited); `waiting`
        only that nothing can go on until a person acts."""
        turn = self.turn
        if turn is None:
            return "idle"
        if runnable(self):
            return "running"
        status = turn.status
        if status == "completed":
            return "idle"
        return status

    @property
    def turn_status(self) -> TurnStatus | None:
        """The current turn's status as shown: `running`, not `waiting`, once the answers it
        waited on are in and it has work to do (`respond(resume=False)`)."""
        turn = self.turn
        if turn is None:
            return None
        return "running" if turn.status == "waiting" and runnable(self) else turn.status

    def pending_requests(self) -> list[InputRequest]:
        """Open requests in the order they were asked."""
        return [r.request for r in self.requests.values() if r.status == "pending"]

    @property
    def expires_at(self) -> float | None:
        """When the session's TTL passes if nothing happens before (None: it never does); once
        its lapse is recorded, when that was (the store's row says the same), not a TTL after
        the events that recorded it."""
        if self.ttl is None:
            return None
        if self.lapsed:
            end = self.updated_at if self.lapsed_at is None else self.lapsed_at
        else:
            end = self.updated_at + self.ttl
        return end if end - end == 0.0 else None  # an infinite TTL never passes (`ttl_end`)

    def expired(self, now: float) -> bool:
        """Whether the session's TTL has passed at `now` (or its lapse is recorded)."""
        if self.lapsed:
            return True
        expires = self.expires_at
        return expires is not None and now >= expires

    # -- the fold -------------------------------------------------------------------------

    def apply(self, event: Event) -> None:
        """Advance the state by one event; events must come in `seq` order."""
        if event.seq != self.seq + 1:
            # Damage (a row deleted by hand, a copy restored in part), not a newer signoff's
            # data: `SchemaVersionError` said to upgrade, which mends nothing.
            raise StoreError(
                f"session {self.id} is damaged: event seq {event.seq} does not follow {self.seq}"
            )
        self.seq = event.seq
        prior = None if self.last is None else self.last[0]
        self.last = (event.type, event.at, event.turn_id)
        active = is_activity(event.type, event.data)
        # Else its TTL runs on from the event before (`Driver.record` keeps the row's deadline).
        if active and not keeps_activity(event.type, event.data, prior):
            self.updated_at = event.at
        handler = HANDLERS[event.type]
        try:
            handler(self, event)
            if "held" in event.data and self.turn is not None:
                for call_id, verdict in event.data["held"].items():
                    if call_id in self.turn.calls:
                        self.turn.calls[call_id].held = dict(verdict)
        except MALFORMED as exc:
            raise StoreError(f"event {event.id} ({event.type}) is malformed: {exc!r}") from exc
        if active and self.lapsed:
            self.lapsed_at = event.at

    def to_snapshot(self, *, journals: bool = False) -> dict[str, Any]:
        """Serializable form of everything but the conversation and, unless `journals`, the
        journals of the calls (those the state holds: a turn that waits keeps them, `shadow`)."""
        turn = self.turn
        return {
            "v": SNAPSHOT_VERSION,
            "fold": FOLD_VERSION,  # an older signoff reads past it: it knows no such field
            "id": self.id,
            "agent": self.agent,
            "seq": self.seq,
            "created_at": self.created_at,
            "updated_at": self.updated_at,
            "ttl": self.ttl,
            "initiator": dump_principal(self.initiator),
            "parent": self.parent,
            "approved_tools": sorted(self.approved_tools),
            "model_responses": self.model_responses,
            "usage": self.usage.model_dump(),
            **({"last_input_tokens": n} if (n := self.last_input_tokens) else {}),
            # Left out while nothing was delegated: such a snapshot is as an older signoff's.
            **({} if self.delegated == Usage() else {"delegated": self.delegated.model_dump()}),
            **({"owed": dict(self.owed)} if self.owed else {}),
            **({"short": dict(self.short)} if self.short else {}),
            "queued": self.queued,
            "lapsed": self.lapsed,
            **({} if self.lapsed_at is None else {"lapsed_at": self.lapsed_at}),
            "limit_grants": self.limit_grants,
            **({"raised": dict(self.raised)} if self.raised else {}),
            **({"headroom": dict(self.headroom)} if self.headroom else {}),
            **({"parent_spent": dict(self.parent_spent)} if self.parent_spent else {}),
            "earlier_requests": self.earlier_requests,
            "keys": self.keys,
            "candidates": self.candidates,
            **({} if self.last is None else {"last": list(self.last)}),
            "requests": [
                {
                    "request": r.request.model_dump(mode="json"),
                    "status": r.status,
                    "outcome": r.outcome,
                    "resolution": r.resolution,
                    **({} if r.raise_to is None else {"raise_to": dict(r.raise_to)}),
                }
                for r in self.requests.values()
            ],
            "turn": None
            if turn is None
            else {
                "id": turn.id,
                "status": turn.status,
                "principal": dump_principal(turn.principal),
                "started_at": turn.started_at,
                "steps": turn.steps,
                "text": turn.text,
                **({} if turn.cut_off is None else {"cut_off": turn.cut_off}),
                "retryable": turn.retryable,
                "error": turn.error,
                "first_seq": turn.first_seq,
                "last_message_seq": turn.last_message_seq,
                "model_seq": turn.model_seq,
                **({} if turn.read_seq == turn.model_seq else {"read_seq": turn.read_seq}),
                "source": turn.source,
                **({} if turn.traceparent is None else {"traceparent": turn.traceparent}),
                **({"paused": list(turn.paused)} if turn.paused else {}),
                **({"answered": list(turn.answered)} if turn.answered else {}),
                **({} if turn.share_spent is None else {"share_spent": turn.share_spent}),
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
                        **({"journal": c.journal} if journals and c.journal is not None else {}),
                        "keyed": c.keyed,
                        "since": c.since,
                        "journaled": c.journaled,
                        **({"kids": dict(c.kids)} if c.kids else {}),
                        **({"held": c.held} if c.held is not None else {}),
                        **({"filled": c.filled} if c.filled is not None else {}),
                    }
                    for c in turn.calls.values()
                ],
            },
        }

    def copy(self, *, journals: bool = False, conversation: bool = False) -> SessionState:
        """What `from_snapshot(self.to_snapshot(journals=journals))` gives, without the JSON round
        trip: a state to apply events to that leaves this one untouched (the conversation left
        out unless `conversation`, and the calls' journals unless `journals`, so a copy without
        them costs the same however long they are)."""
        t, conv = self.turn, self.conversation
        turn = None
        if t is not None:
            turn = TurnState(
                id=t.id,
                status=t.status,
                principal=t.principal,
                started_at=t.started_at,
                steps=t.steps,
                text=t.text,
                cut_off=t.cut_off,
                retryable=t.retryable,
                error=t.error,
                first_seq=t.first_seq,
                last_message_seq=t.last_message_seq,
                model_seq=t.model_seq,
                read_seq=t.read_seq,
                source=t.source,
                traceparent=t.traceparent,
                paused=t.paused,
                answered=list(t.answered),
                share_spent=t.share_spent,
                calls={
                    k: CallState(
                        id=c.id,
                        tool_name=c.tool_name,
                        input=c.input,
                        status=c.status,
                        request_id=c.request_id,
                        decision=c.decision,
                        idempotency_key=c.idempotency_key,
                        edited_input=c.edited_input,
                        journal=list(c.journal) if journals and c.journal is not None else None,
                        keyed=c.keyed,
                        since=c.since,
                        journaled=c.journaled,
                        kids=dict(c.kids),
                        placed=dict(c.placed) if journals else {},
                        held=c.held,
                        filled=c.filled,
                    )
                    for k, c in t.calls.items()
                },
            )
        return SessionState(
            id=self.id,
            agent=self.agent,
            seq=self.seq,
            created_at=self.created_at,
            updated_at=self.updated_at,
            ttl=self.ttl,
            initiator=self.initiator,
            parent=self.parent,
            turn=turn,
            requests={
                k: RequestState(
                    request=r.request,
                    status=r.status,
                    outcome=r.outcome,
                    resolution=r.resolution,
                    raise_to=r.raise_to,
                )
                for k, r in self.requests.items()
            },
            approved_tools=set(self.approved_tools),
            model_responses=self.model_responses,
            usage=self.usage,
            last_input_tokens=self.last_input_tokens,
            delegated=self.delegated,
            owed=dict(self.owed),
            short=dict(self.short),
            queued=list(self.queued),
            lapsed=self.lapsed,
            lapsed_at=self.lapsed_at,
            limit_grants=self.limit_grants,
            raised=dict(self.raised),
            headroom=dict(self.headroom),
            parent_spent=dict(self.parent_spent),
            earlier_requests=self.earlier_requests,
            keys=dict(self.keys),
            candidates=dict(self.candidates),
            conversation=None if not conversation or conv is None else conv.copy(),
            last=self.last,
        )

    def detached(self) -> SessionState:
        """A whole copy for a caller to keep (`Runtime.state`), with the event data it holds (a
        call's input, an answer) copied too, so neither the runtime folding on nor the caller
        changing it changes the other. The frozen models it holds (messages, requests,
        principals) and the entries of the calls' journals are shared, not copied one by one:
        there are many, and the README asks callers to read them only."""
        state = self.copy(journals=True, conversation=True)
        for r in state.requests.values():
            r.resolution = _data(r.resolution)
        if (turn := state.turn) is not None:
            turn.error, turn.paused = _data(turn.error), tuple(_data(list(turn.paused)))
            for c in turn.calls.values():
                c.input, c.edited_input = _data(c.input), _data(c.edited_input)
                c.decision, c.held, c.filled = _data(c.decision), _data(c.held), _data(c.filled)
        state.keys, state.candidates = _data(state.keys), _data(state.candidates)
        state.queued, state.short = _data(state.queued), _data(state.short)
        return state

    @classmethod
    def from_snapshot(cls, data: dict[str, Any]) -> SessionState:
        """Rebuild a state from `to_snapshot()`; a malformed snapshot is a `StoreError`."""
        try:
            return cls._from_snapshot(data)
        except MALFORMED as exc:
            raise StoreError(f"a snapshot is malformed: {exc!r}") from exc

    @classmethod
    def _from_snapshot(cls, data: dict[str, Any]) -> SessionState:
        v = data.get("v", 0)
        if v > SNAPSHOT_VERSION:
            raise SchemaVersionError(
                f"snapshot of session {data.get('id')!r} has schema version {v}; this signoff "
                f"reads up to {SNAPSHOT_VERSION}"
            )
        check_fields(data)
        t = data["turn"]
        turn = None
        if t is not None:
            turn = TurnState(
                id=t["id"],
                status=t["status"],
                principal=load_principal(t["principal"]),
                started_at=t["started_at"],
                steps=t["steps"],
                text=t["text"],
                cut_off=c if isinstance(c := t.get("cut_off"), str) else None,
                retryable=t["retryable"],
                error=error_of(t["error"]),
                first_seq=t["first_seq"],
                last_message_seq=t.get("last_message_seq", 0),
                model_seq=(replied := t.get("model_seq", t.get("last_message_seq", 0))),
                read_seq=seq_of(t.get("read_seq", replied)),
                source=t.get("source", "message"),
                traceparent=p if isinstance(p := t.get("traceparent"), str) else None,
                paused=paused_of(t.get("paused", [])),
                answered=ids_of(t.get("answered", [])),
                share_spent=session_of(t.get("share_spent")),
                calls={c["id"]: _call_of(c, t) for c in t["calls"]},
            )
        state = cls(
            id=data["id"],
            agent=data["agent"],
            seq=data["seq"],
            created_at=data["created_at"],
            updated_at=data["updated_at"],
            ttl=data["ttl"],
            initiator=load_principal(data["initiator"]),
            parent=data["parent"],
            approved_tools=set(data["approved_tools"]),
            model_responses=data["model_responses"],
            usage=kept_usage(data["usage"]),
            last_input_tokens=kept_count(data.get("last_input_tokens", 0)),
            delegated=kept_usage(data.get("delegated", {})),
            owed=dict(data.get("owed", {})),
            short=dict(data.get("short", {})),
            queued=list(data.get("queued", [])),
            lapsed=data.get("lapsed", False),
            lapsed_at=data.get("lapsed_at"),
            limit_grants=data.get("limit_grants", 0),
            raised=dict(check_raised(data.get("raised", {}), "a snapshot's raised")),
            headroom=dict(data.get("headroom", {})),
            parent_spent=dict(data.get("parent_spent", {})),
            # A snapshot that does not say (an older signoff's) may have dropped some.
            earlier_requests=data.get("earlier_requests", True),
            keys={str(k): list(v) for k, v in data.get("keys", {}).items()},
            candidates=dict(data.get("candidates", {})),
            requests={
                r["request"]["id"]: RequestState(
                    request=InputRequest.model_validate(r["request"]),
                    status=r["status"],
                    outcome=r["outcome"],
                    resolution=r["resolution"],
                    raise_to=r.get("raise_to"),
                )
                for r in data["requests"]
            },
            turn=turn,
            conversation=None,
            last=last_of(data.get("last")),
        )
        for call in () if turn is None else turn.calls.values():
            check_asked(call, state.requests)
        return state


def of_this_fold(snapshot: Any) -> bool:
    """Whether a session may load from `snapshot`: not if it records another fold (none: 1), an
    older or a newer signoff's, whose events are folded again instead; anything else is read
    (and refused if it cannot be)."""
    return not isinstance(snapshot, dict) or snapshot.get("fold", 1) == FOLD_VERSION


def _data(value: Any) -> Any:
    """`value`, JSON as events hold it, with its objects and arrays copied."""
    if type(value) is dict:
        return {k: _data(v) if type(v) in _NESTED else v for k, v in value.items()}
    if type(value) is list:
        return [_data(v) if type(v) in _NESTED else v for v in value]
    return value


_NESTED = (dict, list)


def _call_of(c: dict[str, Any], turn: dict[str, Any]) -> CallState:
    """A call as a snapshot keeps it: without its journal, or with it whole (a waiting turn's,
    or an older signoff's, whose journal is read again from the turn's latest model response
    on, the one that made the call, should a copy of the state leave it out)."""
    if "journal" not in c:
        call = CallState(**c, journal=None)
    else:
        call = CallState(**{"since": turn.get("model_seq", turn["first_seq"]), **c})
        if "journaled" not in c:  # an older signoff's
            check_kept(call)  # the journal, before what is kept beside it is read from it
            call.kept_beside()
    check_kept(call)  # a damaged one is refused now, not once its body runs on it
    return call


def fold(events: Iterable[Event], state: SessionState | None = None) -> SessionState:
    """`state = reduce(apply, events)`; starts from an empty state named after the first event."""
    for event in events:
        if state is None:
            state = SessionState(id=event.session_id)
        state.apply(event)
    if state is None:
        raise ValueError("fold() needs at least one event or a starting state")
    return state
