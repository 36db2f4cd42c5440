"""`SessionCache`: the runtime's store, settings and live state, and its in-process cache of
session states, on which `SessionRunner` starts and drives turns (how it closes: `_closing`).

The in-process cache of session states is checked against the store's head, and the event it
ends at, before every use (a commit planned on one checks that event too), so nothing is trusted
from memory that the store does not also hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
import socket
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, Self

from ._agent import Agent, StandIn, by_name
from ._any_loop import AnyLoopEvent, AnyLoopLock
from ._audit_trail import record_tool_settings
from ._closing import Closing
from ._counts import Counts
from ._deadlines import due_batch, expiry_resolves, expiry_specs, in_flight, state_after_expiry
from ._engine import Driver
from ._events import Event
from ._exceptions import (
    EventsRewritten,
    ModelError,
    SessionExpired,
    StoreError,
    UnknownAgent,
    UnknownSession,
    UsageError,
)
from ._leasing import LEASE_TTL_MAX, LEASE_TTL_MIN
from ._recording import Batch, EventSpec, load_state, new_id
from ._results import GenerateResult, Outcome
from ._settings import flag, seconds, whole
from ._state import SessionState, fold
from ._subagents import missing_targets, unpriced_delegates
from ._sync import SyncBridge, checked_clock
from ._text import is_utf8
from ._tracing import DriveSpan, tracing_for
from ._types import ModelResponse
from ._unrecorded import Unrecorded
from .models import ModelRequest
from .stores import Store, open_store

__all__ = ["SessionCache", "check_agent_name", "check_session_id"]

log = logging.getLogger("signoff.runtime")

_told: set[str] = set()
"""The problems with a runtime's agents this process has logged (`missing_targets`)."""


def check_session_id(session_id: object) -> None:
    """Refuse an id that is not text by name: one store found no such session, another raised.
    Text holding a lone surrogate names no session (no store can look it up): an unknown one."""
    if not isinstance(session_id, str):
        raise UsageError(f"session_id must be text, not {type(session_id).__name__}")
    if not is_utf8(session_id):
        raise UnknownSession(session_id)


def check_agent_name(name: object) -> None:
    """Refuse an agent name that is not text by name: it is misuse, not an agent unknown."""
    if not isinstance(name, str):
        raise UsageError(f"agent must be text (an agent's name), not {type(name).__name__}")


class _NotRun(StandIn):
    """The model of an agent this runtime only appends events for; it is never called."""

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise ModelError(f"this runtime does not run agent {self.agent!r}")


class SessionCache(Closing):
    """Opens the store and loads sessions, cached and checked against the store's head, with
    their lapsed TTLs and passed deadlines applied; `SessionRunner` builds on it."""

    def __init__(
        self,
        agents: Sequence[Agent],
        store: str | Store | None = None,
        *,
        clock: Callable[[], float] = time.time,
        lease_ttl: float = 30.0,
        lease_wait: float = 10.0,
        cache_size: int = 1024,
        poll_interval: float = 0.2,
        inline: bool = True,
        tracer_provider: Any = None,
        trace_content: bool = False,
    ) -> None:
        """`inline=False` leaves running turns to workers (`Runtime.work`, `signoff worker`):
        calls return as soon as what they were given is recorded. OpenTelemetry spans go to
        `tracer_provider` or the global one, with content if `trace_content` (`_tracing`)."""
        # A lease of 0 s is expired when granted: every worker could claim it at once.
        seconds("lease_ttl", lease_ttl, least=LEASE_TTL_MIN, most=LEASE_TTL_MAX)
        seconds("poll_interval", poll_interval)
        # Else the first call failed, after the store was opened: a class's instances were the
        # time (an AttributeError in a write), an async one's coroutine (never awaited).
        checked_clock(clock)
        flag("inline", inline)  # "no" or 0 was read as true or false, unnoticed
        # 0 gives up on a busy session at once; NaN never gave up, nor raised SessionBusy.
        seconds("lease_wait", lease_wait, zero=True)
        whole("cache_size", cache_size, least=0)  # -1 emptied it, then a KeyError
        self.agents = by_name(agents)
        problem = unpriced_delegates(self.agents)
        if problem is not None:  # as `Agent` refuses such a budget over its own model
            raise UsageError(problem)
        # Not refused: a process may only record answers for an agent, or resume one whose
        # children ran elsewhere. But said at once, rather than by the model at the first call.
        for problem in missing_targets(self.agents):
            if problem not in _told:  # a process may build runtimes of these agents again
                _told.add(problem)
                log.warning("%s", problem)
        self.store = open_store(store)
        self.clock = clock
        self.lease_ttl = lease_ttl
        self.lease_wait = lease_wait
        self.poll_interval = poll_interval
        self.inline = inline
        self.tracer_provider = tracer_provider
        self.trace_content = trace_content
        self._cache_size = cache_size
        self._fresh()

    def _follow_wait(self, expires_at: float, recheck_at: float) -> float:
        """How long `events(follow=True)` waits on the store before it looks again: ten
        `poll_interval`s; on a store that notifies (whose shared re-check of the heads is the
        safety net) with the real clock, until the session's expiry or `recheck_at` (by
        `time.monotonic`) is due: waking sooner had each idle follower read about once a second."""
        least = self.poll_interval * 10
        if self.clock is not time.time or not hasattr(self.store, "changes_seen"):
            return least
        # The expiry is on `now()`'s clock (the database's), which may be minutes off this one.
        return max(least, min(expires_at - self.now(), recheck_at - time.monotonic()))

    def _fresh(self) -> None:
        """Start this runtime's live state anew: what it holds while in use, which no copy of it
        shares (`Runtime._replaced`), from its id and store clock to its caches, locks and loop."""
        self._tracing = tracing_for(self.tracer_provider, self.trace_content)
        self._counts = Counts()  # what this process did, for a metrics endpoint (`_counts`)
        self._unmeasured()  # the store's clock, see `now`
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{new_id('rt')}"
        self._cache: OrderedDict[str, SessionState] = OrderedDict()
        # Per session, only while in use (weak: none is kept for the sessions a process is done
        # with). A lock serializes this process's appends to one session: commit, then apply.
        # Both are shared by the app's loop and the `*_sync` twins' (`_any_loop`), and made under
        # `_per_session`, so two threads asking at once get the same one.
        self._aborts: weakref.WeakValueDictionary[str, AnyLoopEvent] = weakref.WeakValueDictionary()
        self._locks: weakref.WeakValueDictionary[str, AnyLoopLock] = weakref.WeakValueDictionary()
        self._per_session = threading.Lock()
        # This runtime's async calls running, by task, and those of them `close` cancelled.
        self._calls: dict[asyncio.Task[Any], int] = {}
        self._stopped: dict[asyncio.Task[Any], bool] = {}
        self._closing = 0  # closes under way: no call begins meanwhile (`_entered`)
        self._closes = 0  # closes begun: a follower begun before one stops (`since_close`)
        # Outcomes of tool bodies that ran but were not recorded (`ToolCalls.end_call`).
        self._unrecorded = Unrecorded()
        # Leases of ended drives the store refused to release: given back by the next drive here.
        self._unreleased: dict[str, tuple[str, int]] = {}
        self._expiries: dict[str, tuple[int, float]] = {}  # see `Leasing._hold`
        # The sessions drives of this runtime are running now, with how many each.
        self._driving: Counter[str] = Counter()
        # The lease a claimed drive that failed kept, by session, under the owner of the pass
        # that failed (a later pass takes one of its own): what the worker gives back or takes.
        self._kept_on_error: dict[str, tuple[str, int]] = {}
        self._kept_lapsing: set[str] = set()  # of those, the ones given up as they lapsed
        # Of those, an inline drive's, recording what it owes in the background (`_record_owed`).
        self._recorders: dict[str, asyncio.Task[None]] = {}
        # Of those, a subagent's, by the parent whose drive delegated to it (`_owed_below`).
        self._owed_for: dict[str, str] = {}
        self._holders: dict[str, str] = {}  # see `Leasing._holders`
        # See `Sweeps._say_refused`: by session, the error a read's drive was last refused
        # with; the oldest dropped past `REFUSED_KEPT`, and a session's once it is deleted.
        self._refused_drives: OrderedDict[str, str] = OrderedDict()
        self._giving_back: set[asyncio.Task[None]] = set()  # see `Leasing._giving_back`
        # Give-backs of the leases of claims a stopped worker did not wait for, which may
        # answer only much later (`Workers._give_back_later`).
        self._unanswered: set[asyncio.Task[None]] = set()
        self._opened = False
        self._settings_due = self._settings_warned = False  # see `_record_settings`
        self._sync = SyncBridge()

    async def open(self) -> None:
        """Open the store; the first call does it, so only `async with` needs it named."""
        if not self._opened:
            await self.store.open()
            try:
                await self._sync_lease_clock()
            except BaseException:
                with contextlib.suppress(Exception):  # the store's pool not left running
                    await self.store.close()
                raise
            self._settings_due = True
            self._opened = True
        else:
            self._check_lease_clock()
        if self._settings_due:
            await self._record_settings()

    async def _record_settings(self) -> None:
        """Record tool setting changes, so an admin can see when a tool stopped (or started)
        requiring approval. A store refusing writes (read-only, full) still opens, to be read:
        each call tries again first, so the change is recorded before any write made under it."""
        try:
            await record_tool_settings(self.store, self.agents.values(), self.now())
        except StoreError as exc:
            if not self._settings_warned:
                log.warning("tool settings not recorded yet (tried again at each call): %s", exc)
                self._settings_warned = True
            return
        self._settings_due = False

    async def __aenter__(self) -> Self:
        try:
            await self.open()
        except BaseException:
            await self.close()  # no `__aexit__` follows: nothing is left open (a pool's tasks)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def agent(self, name: str) -> Agent:
        """The agent called `name`, or an `UnknownAgent` naming the ones this runtime has."""
        check_agent_name(name)
        spec = self.agents.get(name)
        if spec is None:
            known = ", ".join(self.agents) or "none"
            raise UnknownAgent(f"unknown agent {name!r}; this runtime has: {known}")
        return spec

    async def _state(self, session_id: str) -> SessionState:
        """The session as its events fold it, checked against the store's head (a passed TTL
        not yet recorded is not applied: `Runtime.state` records it)."""
        return await self._state_at(session_id, None)

    async def _state_at(self, session_id: str, head: int | None) -> SessionState:
        """`_state`, checked against `head` instead if the caller just read it (a lease's grant,
        which checked the event the cached state ends at: `_shown`). A cached state is checked
        by the last event it folded, not its seq alone: a store that lost commits (a PostgreSQL
        crash) may have had those seqs written again by another process."""
        check_session_id(session_id)
        await self.open()
        cached = self._cache.get(session_id)
        if cached is not None:
            if head is None:
                try:
                    head = await self.store.head(session_id, shown=cached.shown())
                except EventsRewritten:
                    head = -1  # the store lost that event: loaded anew, as behind a head
            if head is None:
                raise UnknownSession(session_id)
            if head == cached.seq:
                self._remember(cached)  # another task may have dropped it while we awaited
                return cached
            if head < cached.seq:
                # The store went back (a restore over it, a schema made anew, a crash that lost
                # commits): what was folded here is no longer there, so the session is loaded
                # as it now stands.
                self._cache.pop(session_id, None)
                cached = None
        if cached is not None:
            try:
                # Drivers commit and apply under this lock: fold in only what none has applied.
                async with self._lock_of(session_id):
                    shown = cached.shown()  # raises `EventsRewritten` if written again meanwhile
                    tail = await self.store.read_events(session_id, after=cached.seq, shown=shown)
                    state = fold(tail, cached)
                self._remember(state)
                return state
            except Exception:
                self._cache.pop(session_id, None)
        state = await load_state(self.store, session_id)
        self._remember(state)
        return state

    def _shown(self, session_id: str) -> Event | None:
        """The last event the session's cached state folded, if any (`SessionState.shown`)."""
        cached = self._cache.get(session_id)
        return None if cached is None else cached.shown()

    def _remember(self, state: SessionState) -> None:
        self._cache[state.id] = state
        self._cache.move_to_end(state.id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    async def _checked(
        self,
        session_id: str,
        *,
        trust_cache: bool = False,
        lease: tuple[str, int] | None = None,
        head: int | None = None,
        probes: dict[str, bool] | None = None,
        span: DriveSpan | None = None,
        applied: list[bool] | None = None,
        here: bool = False,
        expired: list[bool] | None = None,
    ) -> SessionState:
        """The session's state with its lapsed TTL and passed deadlines applied; `lease` is the
        caller's lease on it (owner and token), if any, and `head` the session's head when it
        was granted. `trust_cache` skips the store's head when nothing is due on the cached
        state: a stale cache makes the caller's append conflict instead. `probes`: see
        `_busy`. `span`: the caller's drive's, which an expiry names (`_expire`). `applied` is
        given True when this call recorded passed deadlines (which may make the turn runnable),
        `expired` True when it recorded the session's expiry (then raising `SessionExpired`).
        `here`: those are recorded only where this runtime has the session's agent, else
        `UnknownAgent`, nothing recorded (a turn one resumed would have no one to drive it)."""
        check_session_id(session_id)
        now = self.now()
        cached = self._cache.get(session_id) if trust_cache else None
        if cached is not None and not cached.expired(now) and due_batch(cached, now) is None:
            return cached
        state = await self._state_at(session_id, head)
        if state.expired(now):
            await self._expire(state, lease, probes, span=span, expired=expired)
        if due_batch(state, now) is not None:
            if here:
                self.agent(state.agent)
            recorded = await self._append(
                session_id,
                lambda st: due_batch(st, self.now()) or Batch(specs=[]),
                durable=True,
                turn_id=state.turn.id if state.turn else None,
            )
            if recorded and applied is not None:
                applied.append(True)
            state = await self._state(session_id)
        return state

    async def _expire(
        self,
        state: SessionState,
        lease: tuple[str, int] | None = None,
        probes: dict[str, bool] | None = None,
        *,
        span: DriveSpan | None = None,
        expired: list[bool] | None = None,
    ) -> None:
        """Record that the session's TTL passed (`_record_expiry`) and raise `SessionExpired`;
        unless a live drive, not the caller's, runs its turn on (`_running_on`): the session is
        not idle, so not expired, and this returns, recording nothing, for the caller to go on
        as with any running turn. The caller's own `lease` fences the record instead."""
        if lease is None and await self._running_on(state, probes):
            return
        await self._record_expiry(state, lease, span=span, expired=expired)

    async def _record_expiry(
        self,
        state: SessionState,
        lease: tuple[str, int] | None,
        extra: Sequence[EventSpec] = (),
        *,
        span: DriveSpan | None = None,
        expired: list[bool] | None = None,
    ) -> NoReturn:
        """Record that the session's TTL passed (its open requests expire, its unfinished turn
        fails), with `extra` in the same commit, then raise `SessionExpired`. A drive's `span`
        names the turn as it found it and says how the expiry left it, as a drive that runs the
        turn does (docs/tracing.md); that drive, once it recorded it, is counted failed.
        `expired` is given True when this recorded it (not when another had, or took it over)."""
        pending = state.pending_requests()
        specs = expiry_specs(state)
        if span is not None:
            span.begin(state, self.now())
        left: SessionState | None = state  # as the session is left: nothing to record
        if specs:
            driver = self._driver(state, lease)
            left = None  # unknown, unless recorded
            with contextlib.suppress(Exception):  # LeaseLost: another drive took it over
                await driver.record([*specs, *extra], resolve=expiry_resolves(state))
                left = driver.state
                if expired is not None:
                    expired.append(True)
            if span is not None and left is not None:
                self._counts.drove(failed=True)
            self._cache.pop(state.id, None)
        if span is not None:
            span.finish(left)
        raise SessionExpired(state.id, [r.id for r in pending])

    def _driver(self, state: SessionState, lease: tuple[str, int] | None) -> Driver:
        """A driver of `state`, recording under `lease` (its owner and token) if given."""
        return Driver(
            store=self.store,
            agent=self.agent(state.agent),
            state=state,
            lease_token=None if lease is None else lease[1],
            lease_owner=None if lease is None else lease[0],
            clock=self.now,
            abort_signal=self._abort_of(state.id),
            lock=self._lock_of(state.id),
            unrecorded=self._unrecorded,
            tracing=self._tracing,
            counts=self._counts,
        )

    def _lock_of(self, session_id: str) -> AnyLoopLock:
        """The lock this process's appends to the session take, whichever loop they run on."""
        with self._per_session:
            return self._locks.setdefault(session_id, AnyLoopLock())

    def _abort_of(self, session_id: str) -> AnyLoopEvent:
        """The session's abort signal, which its tool bodies wait on and a cancel or steer from
        any thread sets (`stop_calls`)."""
        with self._per_session:
            return self._aborts.setdefault(session_id, AnyLoopEvent())

    async def _busy(self, session_id: str, probes: dict[str, bool] | None = None) -> bool:
        """Whether a drive holds the session's lease, here or in the store. `probes` holds the
        answers one listing already had, so it asks the store once a session."""
        if probes is not None and session_id in probes:
            return probes[session_id]
        busy = await self._probe(session_id)
        if probes is not None:
            probes[session_id] = busy
        return busy

    async def _probe(self, session_id: str) -> bool:
        if session_id in self._holders:  # a drive here, even one whose lease lapsed: not taken
            return True
        held = getattr(self.store, "lease_held", None)
        if held is not None:  # read: a listing writes nothing, and works where it may only read
            return bool(await held(session_id, self.now()))
        # A store without it: the lease is asked for and given back at once, a write.
        token = await self.store.acquire_lease(session_id, self.owner, 1.0, self.now())
        if token is None:
            return True
        await self.store.release_lease(session_id, self.owner, token)
        return False

    async def _running_on(self, state: SessionState, probes: dict[str, bool] | None = None) -> bool:
        """Whether a live drive holds the unfinished turn of `state` with work in flight
        (`in_flight`): past the TTL it runs on (a tool slower than the TTL), so the session is
        not idle, and its expiry is left to a look after that drive. `probes`: see `_busy`."""
        return in_flight(state) and await self._busy(state.id, probes)

    async def _held_past_ttl(self, state: SessionState) -> bool:
        """Whether the TTL of `state` has passed while a live drive runs its turn on
        (`_running_on`): not idle, so not expired, and a write settling its requests (built on
        the state it commits on, which cannot ask the lease) goes in as on any running turn."""
        return state.expired(self.now()) and await self._running_on(state)

    async def _ended(self, state: SessionState, now: float) -> SessionExpired | None:
        """The `SessionExpired` a follower of `state` meets at `now`: its TTL passed and no live
        drive runs its turn on (`_running_on`). None while it lives, or while a drive runs it on."""
        if not state.expired(now):
            return None
        try:
            if await self._running_on(state):
                return None
        except StoreError:  # a store this process may only read: it cannot tell
            pass
        return SessionExpired(state.id, [r.id for r in state.pending_requests()])

    async def _as_recorded(self, state: SessionState) -> SessionState:
        """`state` as recording its passed TTL leaves it (`state_after_expiry`), for a read of
        what this runtime could not record (another agent's session, a store it may only read);
        itself while its TTL has not passed, or while a live drive runs its turn on (`_ended`)."""
        now = self.now()
        if (
            not state.expired(now)
            or not expiry_specs(state)
            or await self._ended(state, now) is None
        ):
            return state
        return state_after_expiry(state, now)

    def _result(
        self, state: SessionState, outcomes: Sequence[Outcome] = (), *, busy: bool = False
    ) -> GenerateResult:
        turn = state.turn
        status: Any
        if busy:
            status = "running"
        else:
            status = state.turn_status or "idle"
        return GenerateResult(
            status=status,
            session_id=state.id,
            turn_id=None if turn is None else turn.id,
            text="" if turn is None else turn.text,
            pending=state.pending_requests(),
            # A copy: the caller's to change, not the cached state's (written to its snapshots).
            error=None if turn is None or turn.error is None else copy.deepcopy(turn.error),
            # Only while failed: a turn a retry resumed keeps its failure's flag until the model
            # answers (and one cancelled after did too, before fold 2).
            retryable=turn is not None and turn.status == "failed" and turn.retryable,
            outcomes=list(outcomes),
            cut_off=None if turn is None else turn.cut_off,
        )

    async def _append(
        self, session_id: str, build: Callable[[SessionState], Any], **kw: Any
    ) -> list[Event]:
        state = await self._state(session_id)
        if state.agent in self.agents:
            driver = self._driver(state, None)
        else:  # only recording (a subagent's mirror closed by a process without its parent)
            stand_in = Agent(name=state.agent, model=_NotRun(state.agent))
            driver = Driver(
                store=self.store,
                agent=stand_in,
                state=state,
                lease_token=None,
                clock=self.now,
                lock=self._lock_of(state.id),
            )
        try:
            events = await driver.record(build, **kw)
        except Exception:
            self._cache.pop(session_id, None)
            raise
        self._remember(driver.state)
        return events
