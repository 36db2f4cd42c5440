"""What a drive records: event specs and batches, the stored status and snapshots they lead
to, and the results a model reads for calls that did not run as proposed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from ._events import Event, EventType
from ._exceptions import SchemaVersionError, StoreError, UnknownSession
from ._journal_fold import journal_fold
from ._state import (
    CallState,
    SessionState,
    TurnState,
    fold,
    of_this_fold,
    runnable,
    turn_over,
)
from ._state_parts import kept_usage
from ._text import cut, is_blank
from ._types import InputRequest, Principal, Usage, reported_usage, usage_fields
from .stores import Resolve, Store

if TYPE_CHECKING:
    from ._agent import Agent
    from ._leasing import Held
    from ._tracing import Tracing
    from ._unrecorded import Unrecorded

__all__ = [
    "Answered",
    "PARK_TYPES",
    "SNAPSHOT_EVERY",
    "STATUS_TYPES",
    "Batch",
    "Changed",
    "DriverPart",
    "EventSpec",
    "TurnStopped",
    "billing",
    "denial",
    "dump_request",
    "ends_drive",
    "invalid_input",
    "load_journal",
    "load_state",
    "load_turn",
    "own_cancel",
    "ended_under",
    "new_id",
    "runnable",
    "shadow",
    "shown_recorded",
    "snapshot_after",
    "snapshot_due",
    "spent_in",
    "stored_status",
    "tells_a_person",
    "tool_result",
    "waited_for_a_person",
    "waiting_after",
    "with_usage",
]


def own_cancel(exc: BaseException) -> bool:
    """Whether `exc` is a CancelledError that a tool or model raised on its own, rather than the
    cancellation of the task driving the turn: the former is an error to record like any other."""
    task = asyncio.current_task()
    return isinstance(exc, asyncio.CancelledError) and not (task and task.cancelling())


PARK_TYPES = frozenset({"turn.waiting", "turn.completed", "turn.failed", "turn.cancelled"})
SNAPSHOT_EVERY = 64


STATUS_TYPES = PARK_TYPES | {
    "turn.started",
    "turn.resumed",
    "turn.message",
    "approval.settled",
    "input.resolved",
    "session.waiting",
}
"""Events that can change a session's stored status; the others happen while it runs."""


def tells_a_person(specs: Sequence[EventSpec], new_requests: Sequence[InputRequest]) -> bool:
    """Whether a commit opens a request, parks the turn on a person or closes a request: each
    may be shown (a reply carrying the request id, a channel's post, its message marked expired
    or withdrawn, a webhook) before the next commit, so it is synced like an answer, lest a
    power cut take back what a person saw. A close by the engine (a TTL that lapsed, a question
    its tool call left) is rare: the sync costs a turn nothing otherwise."""
    return bool(new_requests) or any(t in ("turn.waiting", "input.resolved") for t, _ in specs)


def stored_status(state: SessionState) -> str:
    """The status workers look for: `running` means a turn has work to do (or is doing it).
    It is `SessionState.status`, so the store's listings and every other surface agree."""
    return state.status


def snapshot_due(before: int, count: int) -> bool:
    """Every `SNAPSHOT_EVERY` events, so loading a session folds at most that many plus one
    commit; a short session (most parked ones) has none and is folded from its few events."""
    return before // SNAPSHOT_EVERY != (before + count) // SNAPSHOT_EVERY


def _due(state: SessionState, before: int, count: int) -> bool:
    """Whether a commit of `count` events on `state` writes a snapshot: when one is due, or
    when the store's is of another fold (`stale_snapshot`), which each load passes over to fold
    the session's events from the first, up to 64 events on otherwise (or for ever, idle)."""
    return state.stale_snapshot or snapshot_due(before, count)


def shadow(
    state: SessionState, events: Sequence[Event], before: int, *, journals: bool = False
) -> SessionState | None:
    """The state after `events`, built on a copy (with the calls' journals it holds, if
    `journals`), when a snapshot is due or the session's stored status may change."""
    due = any(e.type in STATUS_TYPES for e in events) or _due(state, before, len(events))
    if not due:
        return None
    copy = state.copy(journals=journals)
    for e in events:
        copy.apply(e)
    return copy


def shown_recorded(state: SessionState, specs: Sequence[EventSpec], at: float) -> SessionState:
    """`state` as recording `specs` at `at` leaves it, folded onto a copy for a read of what this
    process does not record (another agent's session, a store it may only read), written
    nowhere: its seq, last event and `updated_at` stay the store's, as no event is made up."""
    shown = state.copy(journals=True, conversation=True)
    turn_id = state.turn.id if state.turn is not None else None
    for i, (type_, data) in enumerate(specs, start=state.seq + 1):
        shown.apply(
            Event(session_id=state.id, seq=i, type=type_, at=at, turn_id=turn_id, data=data)
        )
    shown.seq, shown.last, shown.updated_at = state.seq, state.last, state.updated_at
    return shown


def snapshot_after(
    state: SessionState, events: Sequence[Event], before: int, after: SessionState | None
) -> dict[str, Any] | None:
    """The snapshot a commit of `events` writes, `after` them: one every `SNAPSHOT_EVERY`
    events, without the calls' journals (a step then costs the same however many came before
    it), except while the turn waits for a person, when nothing is journaled: it keeps them, so
    the resume reads them with the snapshot, not from their events. The commit that parks the
    turn writes one too when its journals are longer than that; so does the first commit on a
    state whose stored snapshot is of another fold (`stale_snapshot`)."""
    if after is None:
        return None
    due = _due(state, before, len(events))
    if after.turn is None or after.turn.status != "waiting" or state.turn is None:
        return after.to_snapshot() if due else None
    parks = any(e.type == "turn.waiting" for e in events)
    held = sum(len(c.journal or ()) for c in state.turn.calls.values())
    if not (due or (parks and held > SNAPSHOT_EVERY)):
        return None
    if not held:
        return after.to_snapshot()
    kept = shadow(state, events, before, journals=True)
    assert kept is not None  # it changes the stored status: a snapshot's state is built
    return kept.to_snapshot(journals=True)


def ends_drive(events: Sequence[Event], after: SessionState) -> bool:
    """Whether `Driver.drive` returns right after these events: the turn parked, failed in a way
    a retry can resume, or ended with no queued message to start the next one."""
    types = {e.type for e in events}
    if "turn.waiting" in types:
        return True
    return bool(types & {"turn.completed", "turn.cancelled", "turn.failed"}) and not runnable(after)


def waited_for_a_person(after: SessionState) -> bool:
    """Whether the turn as it stands after a drive's last commit waited for a person at some
    point (it holds a request): a store may then tidy up as the drive ends (`Commit.waited`)."""
    turn = after.turn
    return turn is not None and any(r.request.turn_id == turn.id for r in after.requests.values())


def waiting_after(state: SessionState, specs: Sequence[EventSpec]) -> list[EventSpec]:
    """`turn.waiting`, when the turn would park right after `specs`: nothing left to decide or
    run, something waiting for a person. Recorded with them, it saves the park a commit; the
    drive loop records it otherwise, on the same condition."""
    copy = state.copy()
    for i, (type_, data) in enumerate(specs):
        copy.apply(
            Event(
                session_id=state.id,
                seq=state.seq + i + 1,
                type=type_,
                at=state.updated_at,
                turn_id=copy.turn.id if copy.turn else None,
                data=data,
            )
        )
    turn = copy.turn
    if turn is None or turn.status in ("waiting", "completed", "cancelled", "failed"):
        return []
    statuses = {c.status for c in turn.calls.values()}
    if statuses & {"proposed", "approved", "denied", "decided", "running"}:
        return []
    if not statuses & {"requested", "awaiting", "asking"}:
        return []
    return [
        ("turn.waiting", {"on": "input", "request_ids": [r.id for r in copy.pending_requests()]})
    ]


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


async def load_state(store: Store, session_id: str) -> SessionState:
    """One snapshot plus the tail; the conversation is left out until the model needs it. A
    snapshot of another fold than this signoff's is not used: the events before the tail are
    folded instead (`_folded_before`), and the state is marked for its next commit to write one
    of this fold (`stale_snapshot`)."""
    loaded = await store.load(session_id)
    if loaded is None:
        raise UnknownSession(session_id)
    snapshot = loaded.snapshot
    if snapshot is None:
        state = None
    elif of_this_fold(snapshot):
        state = _from_snapshot(session_id, snapshot)
    else:
        state = await _folded_before(store, session_id, loaded.events, loaded.head)
        state.stale_snapshot = True
    if state is not None or loaded.events:
        state = fold(loaded.events, state)
    if loaded.head is not None and (0 if state is None else state.seq) != loaded.head:
        await _check_head(store, session_id, 0 if state is None else state.seq, loaded.head)
    if state is None:
        raise UnknownSession(session_id)
    if state.last is None:  # an older signoff's snapshot at the head: its event read alone
        for event in await store.read_events(session_id, after=state.seq - 1, limit=1):
            if event.seq == state.seq:
                state.last = (event.type, event.at, event.turn_id)
    return state


async def _folded_before(
    store: Store, session_id: str, tail: list[Event], head: int | None
) -> SessionState:
    """The state the session's events before `tail` fold to, read a page at a time (up to its
    `head` with no tail, as far as the log goes if that is not known): what a snapshot of
    another fold stood for, which this signoff's fold of the same events may not give. Its
    conversation is left out, as a snapshot's is."""
    upto = tail[0].seq - 1 if tail else head
    state = SessionState(id=session_id, conversation=None)
    while upto is None or state.seq < upto:
        limit = _TURN_PAGE if upto is None else min(_TURN_PAGE, upto - state.seq)
        events = await store.read_events(
            session_id, after=state.seq, limit=limit, max_bytes=_TURN_PAGE_BYTES
        )
        if not events:
            break  # short of `upto`: a gap, which the tail folded on or the head names
        for event in events:
            state.apply(event)
    return state


def _from_snapshot(session_id: str, snapshot: dict[str, Any]) -> SessionState:
    """The state a session's snapshot holds; a malformed one, or one of another session (a
    restore that mixed rows up), is a `StoreError` naming the session, so a worker serving many
    can say which one is damaged."""
    try:
        state = SessionState.from_snapshot(snapshot)
    except SchemaVersionError:
        raise  # it names the session already, and says to upgrade
    except StoreError as exc:
        raise StoreError(f"session {session_id!r}, its snapshot: {exc}") from exc
    if state.id != session_id:
        raise StoreError(
            f"session {session_id!r}, its snapshot: it is of session {state.id[:100]!r}"
        )
    return state


async def load_turn(store: Store, session_id: str, turn_id: str, first_seq: int) -> SessionState:
    """A state folded from one earlier turn's events alone, from its `turn.started` at
    `first_seq` to the next turn's, read a page at a time: what that turn came to."""
    damaged = StoreError(
        f"session {session_id!r} is damaged: event {first_seq} does not start turn {turn_id!r}"
    )
    state = SessionState(id=session_id, seq=first_seq - 1)
    while True:
        events = await store.read_events(
            session_id, after=state.seq, limit=_TURN_PAGE, max_bytes=_TURN_PAGE_BYTES
        )
        for event in events:
            if event.seq == first_seq and (event.type, event.turn_id) != ("turn.started", turn_id):
                raise damaged
            if event.type == "turn.started" and event.seq != first_seq:
                return state  # the next turn: this one ended before it
            state.apply(event)
        if not events:
            break
    if state.turn is None:
        raise damaged
    return state


@dataclass(frozen=True, slots=True)
class Answered:
    """The turn a call's answers went to, or that its retry or resume found (its id and first
    event), and who gave them (the person it serves): what that call is told once the turn is
    over, rather than a later turn's result (`ended_under`). `keyed`: a message sent with an
    idempotency key, told that turn even when the next is its sender's own, as its repeat is."""

    turn_id: str
    first_seq: int
    by: Principal | None
    keyed: bool = False


def _same_person(a: Principal | None, b: Principal | None) -> bool:
    """Whether two turns serve one person (by identity, not attributes; None is no one)."""
    return a is None if b is None else b.same_as(a)


async def ended_under(
    store: Store,
    state: SessionState,
    began: TurnState | None,
    own: str | None = None,
    answered: Answered | None = None,
) -> SessionState | None:
    """The turn `began` as it ended, when it was cancelled or failed for good under a drive
    that then ran the turn a queued message started (`state`'s), or completed when it is the
    turn the caller's own message started or retried (`own`) and the later turn serves someone
    else: what that drive's caller is told, rather than the other turn's result (another person's
    answer; one its sender queued behind it is the caller's to read). A call that answered
    (`answered`) is told the turn it answered in the same way, whatever turn its drive found
    first, unless the later turn is one the one who answered started (and its message had no
    idempotency key). None if that turn is
    still the session's, or completed otherwise (it drove a turn its message queued behind,
    and is told its own)."""
    if answered is not None:
        turn_id, first_seq, own = answered.turn_id, answered.first_seq, answered.turn_id
    elif began is not None:
        turn_id, first_seq = began.id, began.first_seq
    else:
        return None
    if state.turn is None or state.turn.id == turn_id:
        return None
    ended = await load_turn(store, state.id, turn_id, first_seq)
    turn = ended.turn
    if turn is None or not turn_over(turn):
        return None
    if turn.status != "completed":
        return ended
    if turn.id != own:
        return None
    if answered is not None and answered.keyed:
        return ended
    caller = turn.principal if answered is None else answered.by
    return None if _same_person(state.turn.principal, caller) else ended


_TURN_PAGE = 256
_TURN_PAGE_BYTES = 1 << 20
_JOURNAL_PAGE = 4096
"""Events a journal's read-back takes per query (`_TURN_PAGE_BYTES` of them at most): a
workflow's steps are small, and 256 at a time made 80 round trips of 20,000 steps."""


async def load_journal(
    store: Store, state: SessionState, call: CallState, *, held: tuple[CallState, int] | None = None
) -> None:
    """Read back the journal of `call`, one of `state`'s turn's calls that holds none (a
    snapshot leaves journals out): its events from the call's `since` on, a page at a time, up
    to the event `state` is at (followed if it moves on meanwhile), or from `held`, the same
    call's journal as another state held it at an earlier event, on."""
    turn = state.turn
    assert turn is not None
    scratch = CallState(id=call.id, tool_name=call.tool_name, input=None, since=call.since)
    scratch.idempotency_key = call.idempotency_key  # which child an older entry names
    seq = call.since - 1
    if held is not None and held[0].journal is not None and held[0].since == call.since:
        kept, at = held
        if at <= state.seq:
            scratch.journal, scratch.keyed = list(kept.journal or ()), kept.keyed
            scratch.journaled, scratch.kids = kept.journaled, dict(kept.kids)
            seq = at
    while seq < state.seq:
        events = await store.read_events(
            state.id, after=seq, limit=_JOURNAL_PAGE, max_bytes=_TURN_PAGE_BYTES
        )
        if state.turn is not turn or turn.calls.get(call.id) is not call:
            return  # the call is gone meanwhile (the turn went on): nothing to read back
        if not events:
            raise StoreError(f"session {state.id!r} is damaged: event {seq + 1} is missing")
        for event in events:
            if event.seq > state.seq:
                break
            if event.seq != seq + 1:
                raise StoreError(f"session {state.id!r} is damaged: event {seq + 1} is missing")
            try:
                scratch = journal_fold(scratch, turn.id, event)
            except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
                raise StoreError(f"event {event.id} ({event.type}) is malformed: {exc!r}") from exc
            seq = event.seq
    if call.journal is not None:
        return  # read back meanwhile by another task
    if (scratch.keyed, scratch.journaled, scratch.kids) != (call.keyed, call.journaled, call.kids):
        raise StoreError(
            f"session {state.id!r} is damaged: the journal of call {call.id!r} read from its "
            f"events from event {call.since} on is not the one its state holds"
        )
    call.journal, call.placed = scratch.journal, scratch.placed


async def _check_head(store: Store, session_id: str, seq: int, head: int) -> None:
    """Refuse a session whose log ends elsewhere than its row's head says (a hand edit, a
    half-restored backup): its commits could never apply. A log past the head read before it
    may be a commit made meanwhile, so the head is read again."""
    if seq > head:
        now = await store.head(session_id)
        if now is not None and now >= seq:
            return
        head = head if now is None else now
    raise StoreError(
        f"session {session_id!r} is damaged: its snapshot and events end at event {seq}, "
        f"but its session row's head is event {head}"
    )


class TurnStopped(Exception):
    """Internal: the turn ended under us (cancelled elsewhere); stop driving."""


EventSpec = tuple[EventType, dict[str, Any]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Batch:
    """Everything one append writes, when it must be computed from the latest state."""

    specs: Sequence[EventSpec]
    resolve: Sequence[Resolve] = ()
    new_requests: Sequence[InputRequest] = ()
    updated_requests: Sequence[InputRequest] = ()


def tool_result(
    call: CallState, status: str, result: Any, *, usage: Usage | None = None
) -> EventSpec:
    """A call's outcome; `usage` is what reviewing a call that did not run cost (`auto()`)."""
    data = {"call_id": call.id, "tool_name": call.tool_name, "status": status, "result": result}
    return ("tool.completed", data if usage is None else {**data, **usage_fields(usage)})


def with_usage(specs: Sequence[EventSpec], usage: Usage | None) -> list[EventSpec]:
    """`specs` with `usage` (what reviewing the decision they record cost: an `auto()` review)
    added to the first one's, which the session's usage and budgets count."""
    if usage is None or not specs:
        return list(specs)
    (kind, data), *rest = specs
    if "usage" in data:
        there = Usage(**data["usage"])
        usage = usage + (reported_usage(there) if data.get("cost_reported") else there)
    data = {k: v for k, v in data.items() if k != "cost_reported"}  # said again if still so
    return [(kind, {**data, **usage_fields(usage)}), *rest]


def spent_in(specs: Sequence[EventSpec]) -> EventSpec | None:
    """The `model.spent` counting what `specs` say was billed (their `usage`), or None when
    they count nothing; its cost is `cost_reported` when each of theirs was."""
    billed = [d for _, d in specs if "usage" in d]
    usage = sum((kept_usage(d["usage"], strict=False) for d in billed), Usage())
    if usage == Usage():  # nothing billed (a scripted model, a cached reply): nothing to count
        return None
    data: dict[str, Any] = {"usage": usage.model_dump()}
    if all(d.get("cost_reported") for d in billed):
        data["cost_reported"] = True
    return ("model.spent", data)


def billing(*usages: Usage | None) -> list[EventSpec]:
    """The `model.spent` counting `usages` (reviews no event of their answers records), if any."""
    spent = spent_in([("model.spent", usage_fields(u)) for u in usages if u is not None])
    return [] if spent is None else [spent]


def denial(decision: dict[str, Any]) -> dict[str, Any]:
    """The result a model sees for a call a person denied (or that was ignored or expired)."""
    by = decision.get("by")
    reason = decision.get("reason")
    if isinstance(reason, str) and is_blank(reason):  # recorded so before it was refused
        reason = None
    result: dict[str, Any] = {
        "denied": True,
        "reason": reason,
        "by": None if by is None else by.get("principal_id"),
    }
    outcome = decision.get("outcome")
    if outcome in ("ignored", "expired", "cancelled") and by is None:
        result["outcome"] = outcome
    elif reason:
        who = by.get("principal_id") if by else "the reviewer"
        # Quoted and attributed: the person who denied may not be the user.
        result["note"] = f'Written by {who}, who denied this call: "{reason}"'
    return result


SHOWN_ERRORS = 20
"""How many of an invalid input's errors its tool error lists (it counts the rest)."""


def invalid_input(exc: ValidationError) -> dict[str, Any]:
    """The tool error of input that failed validation: its first `SHOWN_ERRORS` errors, keys cut
    to 100 characters and messages to 500. Listed whole, a response of thousands of bad keys made
    a result of megabytes, past `max_result_bytes`, that the model read on every later call."""
    errors = exc.errors(include_url=False)
    shown: dict[str, Any] = {
        "error": "invalid input",
        "details": [
            {
                "loc": [cut(p, 100) if isinstance(p, str) else p for p in e["loc"]],
                "msg": cut(e["msg"], 500),
                "type": e["type"],
            }
            for e in errors[:SHOWN_ERRORS]
        ],
    }
    if len(errors) > SHOWN_ERRORS:
        shown["more_errors"] = len(errors) - SHOWN_ERRORS
    return shown


def dump_request(request: InputRequest) -> dict[str, Any]:
    return request.model_dump(mode="json", exclude_defaults=True)


class DriverPart:
    """What a part of `Driver` kept in its own module (`ModelStep`, `ToolCalls`) uses of it: the
    attributes `Driver.__init__` sets, and `Driver.record`'s signature for type checkers."""

    store: Store
    agent: Agent
    state: SessionState
    own_turn: str | None  # the turn this drive runs: `record` writes to no other unless told
    clock: Callable[[], float]
    abort_signal: asyncio.Event
    seen: int  # the last event the drive read or recorded itself (`Driver.position`)
    host: Any  # what delegate tools drive subagents through; read by a running call's journal
    lease_check: Callable[[], Awaitable[None]] | None  # raises LeaseLost; before a tool body
    cancel_check: Callable[[], Awaitable[None]] | None  # reads a cancel made elsewhere; a step's
    held: Held | None  # the drive's lease: a tool body runs as its `body`
    released: bool  # its last commit gave the lease back: it records nothing more
    # Outcomes of tool bodies that ran but the store failed to record, by idempotency key.
    unrecorded: Unrecorded
    # Verdicts of calls held behind a busy workflow call, by response and call id: the drive
    # asks again with them, not with a second (billed) review.
    deferred: dict[str, Any]
    tracing: Tracing  # starts the spans of model calls and tool bodies

    if TYPE_CHECKING:  # `Driver.record`

        async def record(
            self,
            specs: Sequence[EventSpec] | Callable[[SessionState], Sequence[EventSpec] | Batch],
            *,
            new_requests: Sequence[InputRequest] = (),
            resolve: Sequence[Resolve] = (),
            durable: bool = False,
            turn_id: str | None = None,
            billed: Sequence[EventSpec] = (),
        ) -> list[Event]: ...

        async def budget_left(self) -> dict[str, float]: ...  # `ModelStep.budget_left`


class Changed(Exception):
    """Internal (`unchanged`): the session moved on between the checks that decided a batch
    and its append."""
