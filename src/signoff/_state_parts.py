"""The parts a `SessionState` is made of: its turn (`TurnState`), the turn's tool calls
(`CallState`, with the statuses a call moves through) and its input requests (`RequestState`),
and what an approval's events make of an open request (which `LiveSession` folds alike).
Apart from `_state` so the event handlers of `_event_handlers`, below it, can build them."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any, Literal

from ._types import InputRequest, Principal, Usage

__all__ = [
    "CHILD_KEY",
    "CHILD_STEP",
    "CallState",
    "CallStatus",
    "RequestState",
    "TurnState",
    "TurnStatus",
    "call_key",
    "candidate_applied",
    "check_asked",
    "check_kept",
    "check_raised",
    "child_id",
    "dump_principal",
    "kept_count",
    "kept_usage",
    "load_principal",
    "settled_applied",
]

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


_GAP_MAX = 65_536
"""How far past a positional journal's end an entry may land: steps run together leave gaps
(one journaled before those claimed earlier), never this many; a damaged event's huge position
would otherwise fill memory with empty places."""


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
    # None in a state read from a snapshot or copied, which leave it out (a workflow's journal
    # grows with every step): `load_journal` reads it back from the events after `since`.
    journal: list[dict[str, Any] | None] | None = field(default_factory=list)
    keyed: bool = False  # the journal's `index` is the occurrence of a name, not a position
    since: int = 0  # the event that made this call (its `model.completed`), or one before it
    journaled: bool = False  # an entry was recorded (a first entry says how they are keyed)
    # The `ask` verdict of a call held back behind a workflow call of its response (`reason`,
    # `error`, `auto`), recorded so a later drive asks for it as decided, not anew.
    held: dict[str, Any] | None = None
    # What validation filled in of the input the model left out when the body first ran (its
    # `tool.started`'s `filled`: a `default_factory`'s id), which a re-run of an ungated call gets;
    # or the input's whole JSON form, in a one-item list, where those by their places are not it.
    filled: dict[str, Any] | list[Any] | None = None
    # The entries of child sessions (a delegate call's `subagent.session` steps, `_child`), by
    # `p` and position or `n` and occurrence (in the order first recorded), with their child
    # (None: not a child's id now): `subagents()` without the journal.
    kids: dict[str, str | None] = field(default_factory=dict)
    # Where each entry of a keyed journal is, by kind, name and occurrence: recording one is
    # then a look-up, not a scan of every entry (a call of N steps cost N² as they were folded).
    placed: dict[tuple[str, str, Any], int] = field(default_factory=dict, repr=False, compare=False)

    def record(self, index: int, entry: dict[str, Any]) -> None:
        """Journal `entry` (a new dict, kept as it is): in a keyed journal as occurrence `index`
        of its kind and name (in the order recorded), in an older positional one at position
        `index`. Without the journal (`journal` None) only what is kept beside it changes (a
        position too far past the journal's end is then refused as the journal is read back,
        `load_journal`)."""
        if self.keyed:
            kind, name = entry["kind"], entry["name"]
            key = (kind, name, index)
            hash(key)  # a damaged index is refused before anything changes
            entry["n"] = index
            self.journaled = True
            if name == CHILD_STEP and kind == "step":
                self.kids[f"n{index}"] = _child(entry, self.idempotency_key)
            journal, placed = self.journal, self.placed
            if journal is None:
                return
            # `placed_at`, without a call when `placed` indexes the journal (each step folded)
            at = placed.get(key) if len(placed) == len(journal) else self.placed_at(key)
            if at is not None:
                journal[at] = entry
                return
            placed[key] = len(journal)
            journal.append(entry)
            return
        if (
            not isinstance(index, int)
            or isinstance(index, bool)
            or index < 0
            or (self.journal is not None and index > len(self.journal) + _GAP_MAX)
        ):
            raise ValueError(f"journal position {index!r} of call {self.id!r} is out of range")
        self.journaled = True
        child = _child(entry, self.idempotency_key)  # positions sort them: one replaced drops
        if child is None:
            self.kids.pop(f"p{index}", None)
        else:
            self.kids[f"p{index}"] = child
        if self.journal is None:
            return
        while len(self.journal) <= index:
            self.journal.append(None)
        self.journal[index] = entry

    def placed_at(self, key: tuple[str, str, Any]) -> int | None:
        """The position of the keyed entry `key` (kind, name, occurrence), None if not journaled;
        `placed` is built again first if it does not index the journal as it is (a state built
        from a snapshot)."""
        assert self.journal is not None
        if len(self.placed) != len(self.journal):
            self.placed = {}
            for i in reversed(range(len(self.journal))):  # the first of two alike wins
                e = self.journal[i]
                if e is not None:
                    self.placed[(e["kind"], e["name"], e.get("n"))] = i
        return self.placed.get(key)

    def subagents(self) -> list[str]:
        """The child sessions this delegate call journaled creating (`tool.step`
        `subagent.session`), in the journal's order: positional entries come before keyed ones
        (a call is keyed from its first entry on, or from a later start by an older signoff)."""
        placed = sorted((int(k[1:]), v) for k, v in self.kids.items() if k[0] == "p")
        keyed = [v for k, v in self.kids.items() if k[0] == "n"]
        return [v for v in [*(v for _, v in placed), *keyed] if v is not None]

    def kept_beside(self) -> None:
        """Set what is kept beside the journal (`journaled`, `kids`) from the journal itself, for
        a call read from an older snapshot, which held the journal whole."""
        assert self.journal is not None
        self.journaled = any(self.journal)
        self.kids = {}
        for i, e in enumerate(self.journal):
            if e is None:
                continue
            if "n" in e:
                if e["kind"] == "step" and e["name"] == CHILD_STEP:
                    self.kids[f"n{e['n']}"] = _child(e, self.idempotency_key)
            elif (child := _child(e, self.idempotency_key)) is not None:
                self.kids[f"p{i}"] = child


def check_kept(call: CallState) -> None:
    """Refuse (`ValueError`) a call read from a snapshot whose journal, or what is kept beside
    it, has a form the fold never gives it: loaded, the damage would surface only as the body
    ran (a bare TypeError, or a failure recorded as the tool's own outcome)."""
    since, kids, journal = call.since, call.kids, call.journal
    if type(since) is not int or since < 0:
        raise ValueError(f"call {call.id!r}: since is {since!r}, not an event's seq")
    if type(call.journaled) is not bool or type(call.keyed) is not bool:
        raise ValueError(f"call {call.id!r}: journaled and keyed are not true or false")
    if not isinstance(kids, dict) or not all(
        isinstance(k, str)
        and (k[1:].isdigit() if k[:1] == "p" else k[:1] == "n")
        and (v is None or isinstance(v, str))
        for k, v in kids.items()
    ):
        raise ValueError(f"call {call.id!r}: its child sessions are {str(kids)[:100]}")
    if journal is None:
        return
    if not isinstance(journal, list):
        raise ValueError(f"call {call.id!r}: its journal is a {type(journal).__name__}")
    for i, e in enumerate(journal):
        if e is not None and not _entry(e):
            raise ValueError(f"call {call.id!r}: journal entry {i} is {str(e)[:100]}")


def check_asked(call: CallState, requests: Container[str]) -> None:
    """Refuse (`ValueError`) a call read from a snapshot whose journal holds a question naming
    a request the snapshot does not hold: the fold records the two together and keeps every
    request of the turn the call is in (a new turn drops closed ones with the old calls), so
    loaded, the tool would be told the question was withdrawn, which nothing withdrew."""
    for i, e in enumerate(call.journal or ()):
        if e is not None and e.get("kind") == "ask" and e["request_id"] not in requests:
            raise ValueError(
                f"call {call.id!r}: journal entry {i} asks request {e['request_id'][:100]!r}, "
                "which is not in the snapshot"
            )


def _entry(e: object) -> bool:
    """Whether `e` is a journal entry as the fold records one: a step and its result (and its
    error, if it failed), or a question and its request, keyed by a whole occurrence `n` or by
    position. (Exact types: a snapshot's JSON gives no others, and a journal may hold tens of
    thousands.)"""
    if type(e) is not dict:
        return False
    name, n, kind = e.get("name", 0), e.get("n", 0), e.get("kind")
    if (name is not None and type(name) is not str) or type(n) is not int or n < 0:
        return False
    if kind == "step":  # a failure is replayed from its error, an object (`raise_recorded`)
        error = e.get("error")
        return "result" in e and (error is None or type(error) is dict)
    return kind == "ask" and type(e.get("request_id")) is str


def kept_count(value: object) -> int:
    """A count of tokens as a snapshot keeps it (`last_input_tokens`); `ValueError` for one
    signoff never writes (negative, a fraction, text), which would give budget back."""
    if type(value) is not int or value < 0:
        raise ValueError(f"a count of tokens is {str(value)[:40]}")
    return value


def kept_usage(value: object, *, strict: bool = True) -> Usage:
    """What a session spent as a snapshot keeps it (or, not `strict`, as an event records it,
    whose numbers older signoffs may have written otherwise); `ValueError` for usage signoff
    never records (negative, or text), which would give the session's budgets back."""
    usage = Usage.model_validate(value, strict=strict)
    if min(usage.input_tokens, usage.output_tokens, usage.cost_usd) < 0:
        raise ValueError(f"usage is negative: {usage!r}")
    return usage


CHILD_STEP = "subagent.session"
"""The step of a delegate call that creates its child session; its result is the child's id."""

CHILD_KEY = "subagent"
"""The name a delegate call's child session id derives from, within the call's idempotency key."""


def call_key(session_id: str, response: int, call_id: str) -> str:
    """The idempotency key of a new tool call: its session, the number of the model response
    that asked for it and its id, joined by `:`, each with `%` and `:` escaped (`%25`, `%3A`) so
    that no key, nor a named one (`ctx.idempotency_key(name)` adds `:name`), is another call's.
    Parts holding neither character read as written (as an older signoff's keys did)."""
    return ":".join((_escaped(session_id), str(response), _escaped(call_id)))


def _escaped(part: str) -> str:
    """`part` with `%` and `:` percent-encoded, so that it holds no `:` and decodes uniquely."""
    return part.replace("%", "%25").replace(":", "%3A")


def child_id(key: str) -> str:
    """The child session of the delegate call whose idempotency key (`CHILD_KEY`'s) is `key`."""
    return "ses_" + hashlib.sha256(key.encode()).hexdigest()[:20]


def _child(entry: dict[str, Any], call_key: str | None) -> str | None:
    """The child session an entry journaled creating, if it is a delegate call's: marked so
    (`child`, which a tool's own `ctx.step` of that name cannot give), or, as an older signoff
    journaled it unmarked, naming the child the call's key derives (`child_id`). Any other
    session an entry names is not the call's child, to cancel with it or bill it for."""
    result = entry.get("result")
    if entry.get("name") != CHILD_STEP or not isinstance(result, str):
        return None
    if entry.get("child") is True:
        return result
    derived = None if call_key is None else child_id(f"{call_key}:{CHILD_KEY}")
    return result if result == derived else None


@dataclass(slots=True, kw_only=True)
class RequestState:
    request: InputRequest
    status: str = "pending"
    outcome: str | None = None
    resolution: dict[str, Any] | None = None
    # A session-limit request's: what its `continue` raises the session's budgets to, by
    # budget, decided when it was asked (its `input.requested`'s `raise_to`); None, an older
    # signoff's, raises them by a size.
    raise_to: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.raise_to is not None:
            check_raised(self.raise_to, "a request's raise_to")


def check_raised(v: Any, what: str) -> dict[str, Any]:
    """`v`, budgets a `continue` raises to (a request's `raise_to`, `SessionState.raised`):
    `max_tokens` a count, `max_cost_usd` a finite number, neither below 0; else `ValueError`."""
    if type(v) is not dict or not all(
        (type(x) is int or (type(x) is float and k == "max_cost_usd" and math.isfinite(x)))
        and k in ("max_tokens", "max_cost_usd")
        and x >= 0
        for k, x in v.items()
    ):
        raise ValueError(f"{what} is {str(v)[:80]}")
    return v


@dataclass(slots=True, kw_only=True)
class TurnState:
    id: str
    status: TurnStatus = "running"
    principal: Principal | None = None
    started_at: float = 0.0
    steps: int = 0
    text: str = ""
    cut_off: str | None = None  # why the latest model reply stopped short (`ModelResponse`)
    calls: dict[str, CallState] = field(default_factory=dict)
    retryable: bool = False
    error: dict[str, Any] | None = None
    first_seq: int = 0
    last_message_seq: int = 0
    model_seq: int = 0  # the latest model.completed
    # The last event its latest reply read (`read_through`, else that reply's own): a message
    # after it steers, though it came before the reply was recorded.
    read_seq: int = 0
    source: str = "message"
    # The W3C trace context of the last traced drive that parked the turn (`_tracing`).
    traceparent: str | None = None
    # The parts of the model's reply being made that the provider paused (`model.paused`
    # data, in order): a drive resumed after a crash continues from them.
    paused: tuple[dict[str, Any], ...] = ()
    # The ids of its requests closed that no drive went on with yet (their call has not moved
    # since, nor the model been called), in the order closed: what its next drive may go on
    # with, which that drive's trace names (`_tracing`).
    answered: list[str] = field(default_factory=list)
    # The subagent whose delegate call ended with it stopped on this session's share of its
    # budgets (`tool.completed`'s `share_spent`): the model steps ask to raise them until a
    # person answers (or a model reply is made).
    share_spent: str | None = None

    @property
    def steered(self) -> bool:
        """A steering message arrived that the model has not read yet."""
        return self.last_message_seq > self.read_seq


def dump_principal(p: Principal | None) -> dict[str, Any] | None:
    return None if p is None else p.model_dump()


def load_principal(d: dict[str, Any] | None) -> Principal | None:
    return None if d is None else Principal.model_validate(d)


def candidate_applied(request: InputRequest, d: dict[str, Any]) -> InputRequest:
    """An open request as an `approval.candidate` leaves it: a quorum's counted vote adds its
    voter, an escalation names the group and lifts the deadline (`LiveSession` folds it too)."""
    if d.get("outcome") == "counted":
        by = d.get("by") or {}
        approved_by = [*request.approved_by, str(by.get("principal_id"))]
        return request.model_copy(update={"approved_by": approved_by})
    if d.get("outcome") == "escalated":
        return request.model_copy(update={"escalated_to": d.get("to"), "expires_at": None})
    return request


def settled_applied(request: InputRequest, d: dict[str, Any]) -> InputRequest:
    """An open approval as the record approving it leaves it: with every vote of its quorum, the
    last one too, as its row holds them (`approval.settled`'s `approved_by`). A mirror's close
    (`input.resolved`) records its subagent's request's votes however it closed (fold 15; an
    older signoff's close of one not approved records none). Fold 14; `LiveSession` folds it too."""
    votes = d.get("approved_by")
    approved = d.get("decision") == "approve" or d.get("outcome") == "approved"
    if request.kind != "tool-approval" or not isinstance(votes, list):
        return request
    if not approved and request.child is None:
        return request
    return request.model_copy(update={"approved_by": [str(v) for v in votes]})
