"""The engine: runs one turn forward from a state, one recorded step at a time.

Each step decides the next action from the state alone, does it, and appends the events that
record it. Whatever is recorded is never done again: a replay reads the record instead.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from ._agent import Agent
from ._any_loop import AnyLoopLock
from ._candidate_keys import closing_ends
from ._counts import Counts
from ._deadlines import due_batch, records_expiry
from ._events import Event, is_activity
from ._exceptions import (
    AppendConflict,
    ChildHeld,
    LeaseLost,
    StoreError,
    history_lost,
    wrote_nothing,
)
from ._idempotency import sent_here
from ._leasing import Held
from ._model_step import ModelStep
from ._recording import (
    Batch,
    EventSpec,
    TurnStopped,
    ends_drive,
    load_journal,
    load_state,
    new_id,
    shadow,
    snapshot_after,
    spent_in,
    stored_status,
    tells_a_person,
    waited_for_a_person,
)
from ._snapshot_fields import ttl_end
from ._state import SessionState, starts_queued
from ._tool_calls import ToolCalls
from ._trace_resumes import parked_by
from ._tracing import OFF, Tracing
from ._types import InputRequest
from ._unrecorded import Unrecorded
from .stores import Commit, Resolve, Store

__all__ = ["APPEND_PATIENCE", "Driver"]

# An append that others' appends to the session keep beating is tried again for this long (in
# seconds, from its first try), however many times it loses: it is refused with `AppendConflict`
# only once contention has lasted this long without a let-up.
APPEND_PATIENCE = 30.0
# Between tries, a pause drawn at random from 0 up to this first bound, doubled on each loss
# up to the last (full jitter): appends of several processes that conflicted do not meet again.
_PAUSE_FIRST, _PAUSE_MOST = 0.002, 0.1
# Conflicts in a row that no append by others explains (the head the store reports back is the
# one the append expected): the store's refusal stands, it is not tried on.
_UNEXPLAINED = 3
# What a call may be in to be moved forward without a decision still to make (`Driver.execute`).
_READY = ("approved", "denied", "decided", "running")


class Driver(ToolCalls, ModelStep):
    """Drives one session's current turn while holding its lease.

    Deciding and running tool calls (`ToolCalls`) and calling the model (`ModelStep`) are
    mixed in from their own modules."""

    def __init__(
        self,
        *,
        store: Store,
        agent: Agent,
        state: SessionState,
        lease_token: int | None,
        lease_owner: str | None = None,
        clock: Callable[[], float] = time.time,
        abort_signal: asyncio.Event | None = None,
        lock: AnyLoopLock | None = None,
        unrecorded: Unrecorded | None = None,
        tracing: Tracing = OFF,
        counts: Counts | None = None,
    ) -> None:
        self.lock = lock or AnyLoopLock()  # the runtime's, which its loops share
        self.store = store
        self.agent = agent
        self.state = state
        # The turn this drive runs; what it records without naming a turn goes there. A reload
        # after a concurrent append may show another turn (one a person cancelled this one for
        # and started): never this drive's, so it records nothing into it.
        self.own_turn = None if state.turn is None else state.turn.id
        self.lease_token = lease_token
        self.lease_owner = lease_owner  # whom the lease was granted to: fenced with the token
        self.clock = clock
        self.abort_signal = abort_signal or asyncio.Event()
        # What delegate tools drive subagents through; the runtime sets it (see _subagents).
        self.host: Any = None
        # Set by whoever holds the lease for one drive: the commit that parks or ends the turn
        # also frees the lease (`released`), sparing a transaction; nothing is recorded after.
        self.release_at_end = False
        self.released = False
        # Set by a call that drives the turn its own commit makes runnable (`_own_turn`): the
        # owner such a commit asks the store to grant the lease to, with its TTL (None: none
        # now), and what is told of the token granted, with the time it was asked at; or, of
        # one that failed having certainly written nothing (`wrote_nothing`), that none was.
        self.grant: Callable[[], tuple[str, float] | None] | None = None
        self.on_grant: Callable[[int | None, float], Awaitable[None]] | None = None
        self.not_granted: Callable[[], None] | None = None
        # Set with the lease: awaited before a tool body runs, it raises `LeaseLost` if the
        # lease lapsed and was taken over while this process stalled.
        self.lease_check: Callable[[], Awaitable[None]] | None = None
        # Set with the lease: awaited before a step runs its function, it reads whether another
        # process cancelled the turn since this drive last read the log (`Held.cancelled`).
        self.cancel_check: Callable[[], Awaitable[None]] | None = None
        # Set with the lease: once its renewals find it lost, nothing more is recorded and the
        # tool body running (`ToolCalls.run_tool`) is cancelled.
        self.held: Held | None = None
        # Shared by the runtime's drivers: a call whose body ran but whose outcome the store
        # failed to take (a full disk) is recorded from here, not run again, by a later drive.
        self.unrecorded = Unrecorded() if unrecorded is None else unrecorded
        self.deferred = {}  # verdicts of calls waiting behind a workflow call (`ToolCalls`)
        self.tracing = tracing  # spans of model calls and tool bodies (`_tracing`)
        self.counts = Counts() if counts is None else counts  # the runtime's, for metrics
        # Set by a traced drive: its W3C trace context, kept with the `turn.waiting` that parks
        # the turn, so the drive that resumes it links to this one.
        self.traceparent: str | None = None
        # The state as a turn this drive ran failed for good, when it went on to the message
        # queued behind it: the drive is a failed one, and its span says that turn's failure.
        self.failed_turn: SessionState | None = None
        self.recorded = 0  # the seq of the last event this drive recorded
        # The last event this drive read or recorded itself (`position`): not `state.seq`, which
        # also moves when a read in this process folds others' events into the cached state.
        self.seen = state.seq
        # Set by a worker's drive: once it says so (the worker is stopping), a message queued
        # behind the turn is left to start in another drive, not started by this one.
        self.stopping: Callable[[], bool] | None = None

    def position(self) -> tuple[str | None, int]:
        """The turn this drive runs and the last event it read or recorded itself (`Held.drive`):
        a cancel or steer that a read in this process folded into the state is still unread."""
        return self.own_turn, self.seen

    # -- recording ----------------------------------------------------------------------------

    async def record(
        self,
        specs: Sequence[EventSpec] | Callable[[SessionState], Sequence[EventSpec] | Batch],
        *,
        new_requests: Sequence[InputRequest] = (),
        resolve: Sequence[Resolve] = (),
        durable: bool = False,
        turn_id: str | None = None,
        billed: Sequence[EventSpec] = (),
    ) -> list[Event]:
        """Append events for this drive's turn (or `turn_id`'s), retrying on a concurrent append
        by someone else; `TurnStopped` if that turn is no longer the session's current one.

        `specs` may be a function of the state, re-evaluated after a concurrent append. The
        commit is synced to disk when `durable`, and always when it `tells_a_person`. What the
        events (a function's: `billed`) say was spent is recorded alone (`model.spent`) when
        the turn stopped first: a reply billed is counted in the session's budgets whatever
        ended its turn.
        """
        tid = turn_id or self.own_turn
        spent: EventSpec | None = None  # once the turn stopped: what the events counted
        async with self.lock:
            if self.released:
                raise TurnStopped  # this drive gave its lease back with its last commit
            if self.held is not None and self.held.lost:
                raise LeaseLost(f"the lease on session {self.state.id!r} was lost")
            first, beaten, unexplained = time.monotonic(), 0, 0
            while True:
                state = self.state
                turn = state.turn
                if (
                    spent is None
                    and turn_id is None
                    and (turn is None or turn.id != tid or turn.status == "cancelled")
                ):
                    # Cancelled or replaced under us: record nothing more of the turn.
                    spent = spent_in(billed if callable(specs) else specs)
                    if spent is None:
                        raise TurnStopped
                now = self.clock()
                batch: Sequence[EventSpec]
                updated: Sequence[InputRequest]
                if spent is not None:  # bookkeeping, by no lease: it changes no turn
                    batch, updated, new_requests, resolve = [spent], (), (), ()
                else:
                    made = specs(state) if callable(specs) else specs
                    if isinstance(made, Batch):
                        batch, resolve, new_requests = made.specs, made.resolve, made.new_requests
                        updated = made.updated_requests
                    else:
                        batch, updated = made, ()
                if not batch:
                    return []
                # A request it closes ends the keyed answers still judged for it, in this commit.
                batch = [*batch, *closing_ends(state, batch, tid)]
                if state.parent is not None:
                    batch = sent_here(batch)
                if self.traceparent is not None:
                    batch = parked_by(batch, self.traceparent)
                events = [
                    Event(
                        session_id=state.id,
                        seq=state.seq + i + 1,
                        type=t,
                        at=now,
                        turn_id=tid,
                        data=d,
                    )
                    for i, (t, d) in enumerate(batch)
                ]
                before, planned_on = state.seq, state.shown()
                idle = not any(is_activity(t, d) for t, d in batch)
                after = shadow(state, events, before)
                timed = not idle and records_expiry(batch, after)
                snapshot = snapshot_after(state, events, before, after)
                release = (
                    self.release_at_end
                    and spent is None
                    and self.lease_token is not None
                    and after is not None
                    and ends_drive(events, after)
                )
                if self.held is not None:  # given back for good once it commits
                    self.held.releasing = release
                # A commit that leaves the session for the workers to claim (`running`), made
                # with no lease, grants one to the drive it is for, if one is asked for.
                ask = (
                    self.grant()
                    if self.grant is not None
                    and spent is None
                    and self.lease_token is None
                    and after is not None
                    and stored_status(after) == "running"
                    else None
                )
                try:
                    await self.store.commit(
                        commit := Commit(
                            session_id=state.id,
                            expected_seq=before,
                            events=events,
                            lease_token=self.lease_token if spent is None else None,
                            lease_owner=self.lease_owner if spent is None else None,
                            new_requests=new_requests,
                            updated_requests=updated,
                            resolve=resolve,
                            snapshot=snapshot,
                            durable=durable or tells_a_person(batch, new_requests),
                            status=None if after is None else stored_status(after),
                            # Bookkeeping, a deadline's escalation: the TTL runs on.
                            expires_at=state.expires_at
                            if idle
                            else self._expires_at(state, after, now, timed),
                            # nor is it activity, as a passed TTL recorded is not
                            activity=not (idle or timed),
                            release_lease=release,
                            waited=release and after is not None and waited_for_a_person(after),
                            expected_event=planned_on,
                            grant=None if ask is None else (*ask, now),
                        )
                    )
                except BaseException as exc:
                    if self.held is not None:  # the lease is still ours to lose, or lost
                        self.held.releasing = False
                    beaten_to_it = isinstance(exc, AppendConflict)
                    if ask is not None and self.not_granted is not None:
                        if beaten_to_it or wrote_nothing(exc):
                            self.not_granted()
                    if not beaten_to_it:
                        raise
                    losses = beaten + unexplained
                    await asyncio.sleep(
                        random.uniform(0, min(_PAUSE_MOST, _PAUSE_FIRST * 2**losses))
                    )
                    await self.reload()
                    if self.state.seq < before:
                        raise _went_back(self.state.id, self.state.seq, before) from exc
                    # Another event at that seq: the store lost commits, then took others'.
                    again = (
                        planned_on is not None
                        and self.state.seq == before
                        and self.state.shown() != planned_on
                    )
                    if again and before <= self.recorded:  # what this drive recorded is gone
                        raise _went_back(self.state.id, self.state.seq, before, again) from exc
                    if self.state.seq > before or again:
                        # Others appended first (or, once the store lost commits, wrote that
                        # seq again under a state cached here): try on, read anew.
                        beaten, unexplained = beaten + 1, 0
                    else:
                        unexplained += 1
                    _given_up(self.state.id, first, beaten, unexplained, exc)
                    continue
                # Applied only once committed, so a state object is never ahead of the store.
                for e in events:
                    state.apply(e)
                if snapshot is not None:
                    state.stale_snapshot = False
                self.recorded = state.seq
                read = 0 if self.held is None else self.held.read
                if before <= max(self.seen, read):  # no one else's event left unread under it
                    self.seen = state.seq
                if any(e.type == "turn.started" for e in events):
                    self.own_turn = tid  # this drive goes on with the turn it started
                self.released = release
                if ask is not None and self.on_grant is not None:
                    await self.on_grant(commit.granted, now)
                if spent is not None:
                    raise TurnStopped
                return events

    @staticmethod
    def _expires_at(
        state: SessionState, after: SessionState | None, now: float, timed: bool
    ) -> float | None:
        """When the session expires after this commit: its TTL from now, unless the commit
        records its expiry (it stays expired, and no worker is to claim it), or only what time
        did (`timed`: a delegated turn's cancel for a TTL passed above it), whose TTL runs on."""
        if state.ttl is None:
            return None
        if state.lapsed or (after is not None and after.lapsed):
            return now  # passed by the time anyone looks again
        return state.expires_at if timed else ttl_end(now, state.ttl)

    async def reload(self) -> None:
        """Rebuild the state from the store (snapshot plus tail) after a failed append, with the
        journals the state held read back (a body running may read its own at any time)."""
        held = self.state
        state = await load_state(self.store, held.id)
        turn, before = state.turn, held.turn
        if turn is not None and before is not None and turn.id == before.id:
            for call in list(turn.calls.values()):
                kept = before.calls.get(call.id)
                if call.journal is None and kept is not None and kept.journal is not None:
                    await load_journal(self.store, state, call, held=(kept, held.seq))
        self.state = state
        self.seen = state.seq
        self._steered_meanwhile()

    def _steered_meanwhile(self) -> None:
        """Set the abort signal when the turn holds a steering message its model has not read,
        as the `send` that steered sets it in its own process: one sent from another process
        (the server, or a runtime leaving its turns to workers) is learnt of only here."""
        turn = self.state.turn
        if turn is not None and turn.id == self.own_turn and turn.steered:
            self.abort_signal.set()

    # -- the loop -----------------------------------------------------------------------------

    async def drive(self, *, retry: bool = False) -> SessionState:
        """Run the turn until it completes, fails, is cancelled or waits for a person, and on to
        the messages queued behind a turn that ended for good; counted in `counts` if it
        recorded anything, failed if it raised or a turn failed (a cancelled drive is stopped,
        not failed)."""
        recorded = self.recorded
        self._steered_meanwhile()
        try:
            state = await self._forward(retry)
        except ChildHeld:  # stopped as if another held the turn: no failure
            if self.recorded != recorded:
                self.counts.drove(failed=False)
            raise
        except Exception:
            self.counts.drove(failed=True)
            raise
        # Not `state.seq`: that moves with what other processes appended and this drive read.
        if self.recorded != recorded:
            failed = state.turn is not None and state.turn.status == "failed"
            self.counts.drove(failed=failed or self.failed_turn is not None)
        return state

    async def _forward(self, retry: bool) -> SessionState:
        try:
            while True:
                turn = self.state.turn
                if turn is not None and turn.id != self.own_turn:
                    return self.state  # replaced under this drive: not its turn to run
                if starts_queued(self.state):  # the turn ended: the next message starts
                    if self.stopping is not None and self.stopping():
                        return self.state  # in a drive that goes on
                    await self.start_queued()
                    continue
                if turn is None or turn.status in ("completed", "cancelled"):
                    return self.state
                if turn.status == "failed":
                    if not (retry and turn.retryable):
                        return self.state  # a retry cannot lift max_steps or an unraisable budget
                    retry = False
                    await self.record(_resumed)
                    continue
                retry = False
                calls = list(turn.calls.values())
                ready = next((c for c in calls if c.status in _READY), None)
                proposed = [c for c in calls if c.status == "proposed"]
                # The calls go on in the response's order: one a crash cut short (`running`)
                # runs again before the later ones it left unstarted, as it ran uninterrupted.
                order = list(turn.calls)
                if proposed and (
                    ready is None or order.index(proposed[0].id) < order.index(ready.id)
                ):
                    if await self.evaluate(proposed):
                        continue
                if ready is not None:
                    await self.execute(ready)
                    continue
                if any(c.status in ("requested", "awaiting", "asking", "proposed") for c in calls):
                    if await self._past_deadlines() or await self._behind_mirrors():
                        continue  # closed (or escalated): the calls go on as it decided
                    if turn.status != "waiting":
                        ids = [r.id for r in self.state.pending_requests()]
                        await self.record([("turn.waiting", {"on": "input", "request_ids": ids})])
                    return self.state
                if await self.step_model():
                    if not starts_queued(self.state):
                        return self.state
                    # It failed for good (`max_steps`): a message queued behind it starts, in
                    # this drive, which counts the failure all the same.
                    if self.failed_turn is None:
                        self.failed_turn = self.state.copy()
        except TurnStopped:
            if self._cancelled_elsewhere():
                await self.reload()  # its span and the runtime's cache say the cancel
            return self.state

    async def _past_deadlines(self) -> bool:
        """Record, as the turn would park, the passed deadlines of its open requests (a slow
        tool of the same response ran past one), as a sweep records them: it parked `waiting`
        on a request no one could answer any more. Whether there were any."""
        if due_batch(self.state, self.clock()) is None:
            return False
        await self.record(lambda st: due_batch(st, self.clock()) or Batch(specs=[]), durable=True)
        return True

    async def _behind_mirrors(self) -> bool:
        """Record, as the turn would park, the passed deadlines behind its open mirrors (a
        subagent's, which the mirror shows but has none of its own) through the runtime
        (`host`), which closes the mirrors they closed; the turn goes on from the store as it
        then stands. Whether the store moved on (so no pass repeats on the same state)."""
        if self.host is None:
            return False
        seq = self.state.seq
        if not await self.host.behind_mirrors(self.state):
            return False
        await self.reload()
        return self.state.seq != seq

    def _cancelled_elsewhere(self) -> bool:
        """Whether the drive stopped on a cancel of its turn that another process recorded and
        a read of the log found (`Held.cancelled`), which the state does not show yet."""
        turn = self.state.turn
        return (
            self.held is not None
            and self.held.cancelled is not None
            and self.held.cancelled == self.own_turn
            and turn is not None
            and turn.id == self.own_turn
            and turn.status != "cancelled"
        )

    async def start_queued(self) -> None:
        """A message kept for after the turn starts the next turn. Decided on the state it is
        committed on: after a concurrent append (a prompt that started the queued message's turn
        itself) nothing is recorded, and the loop finds the turn no longer this drive's."""
        ended = self.own_turn

        def start(state: SessionState) -> list[EventSpec]:
            if state.turn is None or state.turn.id != ended or not starts_queued(state):
                return []
            queued = state.queued[0]
            data = {
                "message": queued["message"],
                "principal": queued.get("principal"),
                "source": queued.get("source", "message"),
                "dequeued": True,
            }
            return [("turn.started", data)]

        await self.record(start, turn_id=new_id("trn"))


def _resumed(state: SessionState) -> list[EventSpec]:
    """A retry's first commit under its lease, as `_mark_runnable` records it for the workers:
    the turn reads `running` while its model is asked again, so a message steers it rather than
    starting the next turn past it; nothing if the turn is no longer the failed, retryable one."""
    turn = state.turn
    if turn is None or turn.status != "failed" or not turn.retryable:
        return []
    return [("turn.resumed", {"reason": "retry"})]


def _given_up(sid: str, first: float, beaten: int, unexplained: int, exc: BaseException) -> None:
    """Raise `AppendConflict` once an append is to be tried no more: its conflicts went on for
    `APPEND_PATIENCE` seconds, or `_UNEXPLAINED` in a row came with no append by others."""
    if unexplained >= _UNEXPLAINED:
        raise AppendConflict(
            f"session {sid!r}: the store refused the append {unexplained} times in a row as a "
            f"conflict, with no other append to the session to explain it: {exc}"
        ) from exc
    took = time.monotonic() - first
    if took >= APPEND_PATIENCE:
        raise AppendConflict(
            f"session {sid!r}: beaten by others' appends {beaten} times in {took:.1f} s "
            f"(APPEND_PATIENCE is {APPEND_PATIENCE:g} s); the session is being appended to "
            "faster than this append can be read and made"
        ) from exc


def _went_back(session_id: str, head: int, before: int, again: bool = False) -> StoreError:
    """The store holds less of the session than this drive had recorded: it lost commits it had
    acknowledged (a PostgreSQL server that crashed, whose ordinary commits skip the WAL flush,
    or a restore), and (`again`) another process has written that seq since. What the drive
    would record next was planned from what is gone, so it stops and records nothing; the
    session goes on from what is stored, in a new drive."""
    where = (
        f"holds another event at the seq {before} this drive had recorded"
        if again
        else f"is at seq {head} in the store, behind the seq {before} this drive had recorded"
    )
    return history_lost(
        StoreError(
            f"session {session_id!r} {where}: the store lost commits it had acknowledged (a "
            "database server that crashed, or a restore); the drive stops, recording nothing, "
            "and the session is driven again from what is stored"
        )
    )
