"""Request deadlines: what happens to an approval nobody decided in time.

`on_timeout="deny"` (the default) closes it as `expired` and the model is told it timed out,
never that a person denied it; `"approve"` is an explicit opt-in, which runs that call but is
no person's grant (`once()` asks again); `"escalate"` hands it to a
named group (the response policy sees `request.escalated_to`) and lifts the deadline.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from ._cancellation import for_expiry, withdrawal
from ._events import EXPIRED, Event, is_activity
from ._recording import Batch, EventSpec, billing, shown_recorded, spent_in
from ._state import SessionState
from ._types import InputRequest, Usage
from .stores import Resolve, SessionSummary, StoredRequest

__all__ = [
    "EXPIRED",
    "RESUMPTIONS",
    "TIMED_OUT",
    "after_deadline",
    "closed_by_deadline",
    "due_batch",
    "expiry_resolves",
    "expiry_specs",
    "in_time",
    "in_flight",
    "is_due",
    "is_lapsed",
    "lapse",
    "records_expiry",
    "resumed_by_deadline",
    "state_after_deadlines",
    "state_after_expiry",
    "stored_after_deadline",
    "stored_after_expiry",
    "summary_after_expiry",
]

TIMED_OUT = "no one decided before the deadline"


def is_due(request: InputRequest, now: float) -> bool:
    """Whether `request` is open and its deadline has passed by `now` (the deadline itself
    counts as passed), so the next touch of its session closes or escalates it."""
    return (
        request.status == "pending"
        and request.expires_at is not None
        and (request.expires_at <= now)
    )


def after_deadline(request: InputRequest, now: float) -> InputRequest | None:
    """`request` as its passed deadline leaves it, before anyone has recorded that: escalated to
    its group with the deadline lifted, or `None` once it can no longer be answered."""
    if not is_due(request, now):
        return request
    if request.on_timeout == "escalate" and request.escalated_to is None:
        return request.model_copy(update={"escalated_to": request.escalate_to, "expires_at": None})
    return None


def stored_after_deadline(stored: StoredRequest, now: float) -> StoredRequest:
    """A stored request as its passed deadline leaves it before anyone has recorded that, as
    `after_deadline` shows it in the queue: escalated, or closed as `expired`."""
    if not is_due(stored.request, now):
        return stored
    shown = after_deadline(stored.request, now)
    if shown is not None:
        return replace(stored, request=shown)
    request = stored.request
    resolution = {"outcome": "expired", "reason": TIMED_OUT, "on_timeout": request.on_timeout}
    return replace(
        stored,
        request=request.model_copy(update={"status": "expired"}),
        status="expired",
        outcome="expired",
        resolution=resolution,
    )


def state_after_deadlines(state: SessionState, now: float) -> SessionState:
    """`state` as recording its requests' passed deadlines (`due_batch`) leaves it, before
    anyone has (a session of an agent this process does not run, a store it may only read):
    escalated, or closed, the turn then `running` as the fold leaves it, with nothing written;
    `state` itself when none has passed."""
    batch = due_batch(state, now)
    return state if batch is None else shown_recorded(state, batch.specs, now)


def state_after_expiry(state: SessionState, now: float) -> SessionState:
    """`state` as recording its passed TTL (`expiry_specs`) leaves it, before anyone has (a
    session of an agent this process does not run, a store it may only read): its open
    requests expired, its unfinished turn failed for good; `state` itself when nothing is to
    record. Its seq, `updated_at` and `expires_at` stay the store's: no event is made up."""
    specs = expiry_specs(state) if state.expired(now) else []
    if not specs:
        return state
    shown = shown_recorded(state, specs, now)
    # Its `expires_at` the store's (`runnable` reads the turn's end).
    shown.lapsed, shown.lapsed_at = state.lapsed, state.lapsed_at
    return shown


def stored_after_expiry(stored: StoredRequest, now: float) -> StoredRequest:
    """A stored open request as its session's passed TTL leaves it before anyone has recorded
    that (a store this process may only read, another agent's session): `expired`, as
    `expiry_resolves` records it. One of a subagent whose own TTL has not passed lies below a
    session's that did, whose expiry cancels the subagent's turn: withdrawn, as that records it."""
    if stored.status != "pending":
        return stored
    own = stored.session_expires_at
    if own is None or own > now:
        closed = withdrawal(stored.request.id, "the parent session expired", None)
        return replace(
            stored,
            request=stored.request.model_copy(update={"status": closed.status}),
            status=closed.status,
            outcome=closed.outcome,
            resolution=closed.resolution,
        )
    return replace(
        stored,
        request=stored.request.model_copy(update={"status": "expired"}),
        status="expired",
        outcome="expired",
        resolution={"outcome": "expired"},
    )


def due_batch(state: SessionState, now: float) -> Batch | None:
    """The events that close or escalate every request of `state` whose deadline passed."""
    specs: list[EventSpec] = []
    resolves: list[Resolve] = []
    updated = []
    for r in state.pending_requests():
        if not is_due(r, now):
            continue
        expired: dict[str, Any] = {
            "request_id": r.id,
            "outcome": "expired",
            "status": "expired",
            "reason": TIMED_OUT,
            "on_timeout": r.on_timeout,
        }
        if r.on_timeout == "escalate" and r.escalated_to is None:
            specs.append(
                (
                    "approval.candidate",
                    {
                        "request_id": r.id,
                        "call_id": r.call_id,
                        "outcome": "escalated",
                        "to": r.escalate_to,
                        "reason": TIMED_OUT,
                    },
                )
            )
            updated.append(r.model_copy(update={"escalated_to": r.escalate_to, "expires_at": None}))
            continue
        if r.on_timeout == "approve" and r.kind == "tool-approval":
            specs.append(
                (
                    "approval.settled",
                    {
                        "request_id": r.id,
                        "call_id": r.call_id,
                        "decision": "approve",
                        "by": None,
                        "reason": "approved automatically when the deadline passed "
                        "(on_timeout='approve')",
                        "auto": "timeout",
                    },
                )
            )
        specs.append(("input.resolved", expired))
        resolves.append(
            Resolve(
                request_id=r.id,
                status="expired",
                outcome="expired",
                resolution={"outcome": "expired", "reason": TIMED_OUT, "on_timeout": r.on_timeout},
            )
        )
    if not specs:
        return None
    return Batch(specs=specs, resolve=resolves, updated_requests=updated)


RESUMPTIONS = ("turn.waiting", "session.waiting", "input.resolved")
"""The types of the events `resumed_by_deadline` reads the newest of: a turn parking
(`turn.waiting`, or `session.waiting` once the session is idle) and a request closing. A store
lists the running sessions whose newest event of these is an `input.resolved`, for a sweep to
read only those."""


def closed_by_deadline(event: Event) -> bool:
    """Whether `event` closes a request because its deadline passed (denied or approved on
    timeout): `due_batch`'s record, or a parent's mirror of a subagent's."""
    data = event.data
    return (
        event.type == "input.resolved"
        and data.get("outcome") == "expired"
        and data.get("reason") == TIMED_OUT
    )


def resumed_by_deadline(newest: Sequence[Event]) -> bool:
    """Whether the last of `newest` (a session's newest events of `RESUMPTIONS`' types, oldest
    first) closed a request for its passed deadline: a deadline's record (a sweep's, a
    listing's) last made the turn runnable, not a person, and the turn has not parked since,
    so the drive that record started, whatever it wrote, never finished (its process died)."""
    return bool(newest) and closed_by_deadline(newest[-1])


def expiry_specs(state: SessionState) -> list[EventSpec]:
    """What records a session's passed TTL: its open requests expire, and its unfinished turn
    fails for good, so the store no longer lists it `running` (or `waiting`) with no one to
    run it; the failure's reason keeps the session expired after the events move it on."""
    specs: list[EventSpec] = [
        (
            "input.resolved",
            {"request_id": r.id, "outcome": "expired", "status": "expired", "reason": EXPIRED},
        )
        for r in state.pending_requests()
    ]
    turn = state.turn
    if turn is not None and turn.status in ("running", "waiting"):
        error = {"code": "session_expired", "message": "the session's TTL passed"}
        specs.append(("turn.failed", {"error": error, "retryable": False, "reason": EXPIRED}))
    return specs


def in_flight(state: SessionState) -> bool:
    """Whether a drive may be at work on the session's unfinished turn, so that its passed TTL
    waits for no drive to hold its lease (a tool slower than the TTL is not idleness). With a
    request open, only while a call of it is neither done nor waiting on a person (a tool
    running beside an approval asked for); one whose every unfinished call waits is idle."""
    turn = state.turn
    if turn is None or turn.status not in ("running", "waiting"):
        return False
    if not state.pending_requests():
        return True
    return any(c.status not in _WAITING_OR_DONE for c in turn.calls.values())


_WAITING_OR_DONE = frozenset({"requested", "awaiting", "asking", "done"})


def records_expiry(specs: Sequence[EventSpec], after: SessionState | None) -> bool:
    """Whether `specs` only record the session's passed TTL (`expiry_specs`), or the cancel of
    its delegated turn that a passed TTL above it makes (`for_expiry`: its requests withdrawn,
    the turn cancelled), beside what is no activity (what its subagents spent): time did that,
    not anyone, so the store keeps the session's last activity (`Commit.activity`), which a
    prune ages its tree by, whoever looked first."""
    cancel = for_expiry(specs)
    expiry = False
    for type_, data in specs:
        if not is_activity(type_, data):
            continue
        if type_ in ("input.resolved", "turn.failed") and data.get("reason") == EXPIRED:
            expiry = True
        elif not (cancel and _cancels(type_, data)):
            return False
    return cancel or (expiry and after is not None and after.lapsed)


def _cancels(type_: str, data: dict[str, Any]) -> bool:
    """Whether the event is one a turn's cancel records (`cancel_specs`)."""
    if type_ == "input.resolved":
        return data.get("outcome") == "cancelled" and data.get("status") == "withdrawn"
    return type_ in ("turn.cancelled", "session.waiting")


def expiry_resolves(state: SessionState) -> list[Resolve]:
    """The store's side of `expiry_specs`: each open request closes as `expired`."""
    return [
        Resolve(
            request_id=r.id,
            status="expired",
            outcome="expired",
            resolution={"outcome": "expired"},
        )
        for r in state.pending_requests()
    ]


def is_lapsed(row: SessionSummary, now: float) -> bool:
    """Whether a listed session's TTL passed with its turn unfinished, so the next touch of it
    records the expiry (`expiry_specs`)."""
    return (
        row.status in ("running", "waiting")
        and row.expires_at is not None
        and (row.expires_at <= now)
    )


def summary_after_expiry(
    row: SessionSummary,
    now: float,
    running_on: Collection[str] = (),
    freed: Collection[str] = (),
) -> SessionSummary:
    """A listed session as its passed TTL leaves it before anyone has recorded that (a store
    this process may only read, another agent's session): its turn failed. One of
    `running_on` (a live drive runs its turn on past the TTL, a slow tool) is shown as it is.
    One waiting only on requests whose passed deadlines close them (`freed`) is `running`,
    as recording those leaves it (`state_after_deadlines`)."""
    if is_lapsed(row, now) and row.id not in running_on:
        return replace(row, status="failed")
    if row.status == "waiting" and row.id in freed:
        return replace(row, status="running")
    return row


def lapse(
    state: SessionState, now: float, held: bool, first: Sequence[EventSpec] = ()
) -> Batch | None:
    """What a commit on `state` that answers or judges a request records instead once the
    session's TTL passed at `now` (a slow policy checked the answer meanwhile): `first`, then
    the expiry, as a reading of the session records it. Any other event of that commit would be
    activity, which renews the TTL, so the expired session would live on. None while it lives,
    or while a live drive runs its turn on past the TTL (`held`: `_held_past_ttl`)."""
    if held or not state.expired(now):
        return None
    return Batch(specs=[*first, *expiry_specs(state)], resolve=expiry_resolves(state))


def in_time(
    clock: Callable[[], float],
    batch: Batch,
    late: list[str],
    held: bool,
    owed: Usage | None = None,
) -> Callable[[SessionState], Batch]:
    """`batch`, which settles requests, built on the state it commits on: a deadline or TTL that
    passed meanwhile (an edit's approval policy may be slow) wins, as while a response policy
    runs, and what it closes is recorded instead; `late` then names the requests answered. A
    TTL passed while a live drive runs the turn on (`held`: `_held_past_ttl`) is no expiry.
    What reviews of the edits cost is billed all the same: the batch's, and `owed`, of the
    call's other answers, which no commit of theirs records once this one wins."""
    ids = {r.request_id for r in batch.resolve}
    spent = spent_in([*batch.specs, *billing(owed)])

    def build(state: SessionState) -> Batch:
        now = clock()
        expiry = lapse(state, now, held, () if spent is None else [spent])
        if expiry is not None:
            late[:] = sorted(ids)
            return expiry
        late[:] = [r.id for r in state.pending_requests() if r.id in ids and is_due(r, now)]
        due = due_batch(state, now) if late else None
        if due is None:
            return batch
        return due if spent is None else replace(due, specs=[*due.specs, spent])

    return build
