"""`SessionRunner`: the part of the runtime that loads, caches, leases and drives sessions.

The in-process cache of session states is checked against the store's head before every use,
so nothing is trusted from memory that the store does not also hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, Self

from . import _creation
from ._agent import Agent, by_name
from ._audit_trail import record_tool_settings
from ._counts import Counts
from ._deadlines import due_batch, expiry_resolves, expiry_specs
from ._engine import Driver
from ._exceptions import (
    LeaseLost,
    ModelError,
    PartialAnswer,
    SessionBusy,
    SessionExpired,
    StoreError,
    UnknownAgent,
    UnknownSession,
    UsageError,
)
from ._idempotency import Keyed, seen
from ._leasing import LEASE_TTL_MAX, LEASE_TTL_MIN, Leasing, lost_line
from ._prompts import check_prompt, next_turn
from ._recording import Batch, Changed, EventSpec, cancelled_under, load_state, new_id, runnable
from ._results import GenerateResult, Outcome
from ._settings import flag, seconds, whole
from ._state import SessionState, TurnState, fold
from ._subagents import missing_targets
from ._sync import SyncBridge
from ._text import is_utf8
from ._tracing import tracing_for
from ._types import ModelResponse, Principal
from .models import ModelRequest
from .stores import Store, open_store

__all__ = ["SessionRunner", "check_session_id"]

log = logging.getLogger("signoff.runtime")

_told: set[str] = set()
"""The problems with a runtime's agents this process has logged (`missing_targets`)."""


def _unfinished(state: SessionState) -> bool:
    """Whether the session's turn still has work to do: running, or waiting on nothing but
    answers already accepted (`respond(resume=False)`)."""
    turn = state.turn
    return turn is not None and turn.status in ("running", "waiting") and runnable(state)


def check_session_id(session_id: object) -> None:
    """Refuse an id that is not text by name: one store found no such session, another raised.
    Text holding a lone surrogate names no session (no store can look it up): an unknown one."""
    if not isinstance(session_id, str):
        raise UsageError(f"session_id must be text, not {type(session_id).__name__}")
    if not is_utf8(session_id):
        raise UnknownSession(session_id)


class _NotRun:
    """The model of an agent this runtime only appends events for; it is never called."""

    def __init__(self, agent: str) -> None:
        self.agent = agent

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise ModelError(f"this runtime does not run agent {self.agent!r}")


class SessionRunner(Leasing):
    """Loads sessions, starts turns and drives them under a lease; `Runtime` builds on it."""

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
        if not callable(clock):  # else the first call failed, after the store was opened
            raise UsageError(f"clock must be a function returning the time, not {clock!r}")
        flag("inline", inline)  # "no" or 0 was read as true or false, unnoticed
        # 0 gives up on a busy session at once; NaN never gave up, nor raised SessionBusy.
        seconds("lease_wait", lease_wait, zero=True)
        whole("cache_size", cache_size, least=0)  # -1 emptied it, then a KeyError
        self.agents = by_name(agents)
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
        self._aborts: weakref.WeakValueDictionary[str, asyncio.Event] = (
            weakref.WeakValueDictionary()
        )
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        # Outcomes of tool bodies that ran but were not recorded (`ToolCalls.end_call`).
        self._unrecorded: dict[str, list[EventSpec]] = {}
        # Leases of ended drives the store refused to release: given back by the next drive here.
        self._unreleased: dict[str, tuple[str, int]] = {}
        self._expiries: dict[str, tuple[int, float]] = {}  # see `Leasing._hold`
        self._opened = False
        self._settings_due = self._settings_warned = False  # see `_record_settings`
        self._sync = SyncBridge()

    async def open(self) -> None:
        """Open the store; the first call does it, so only `async with` needs it named."""
        if not self._opened:
            await self.store.open()
            await self._sync_lease_clock()
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

    async def close(self) -> None:
        """Close the store; a later call opens it again. A `*_sync` call still running in
        another thread is stopped first (its lease given back; it raises `UsageError`)."""
        self._sync.stop_calls()  # `*_sync` calls in other threads first: see `close_sync`
        await self._close_store()
        self._sync.close()

    async def _close_store(self) -> None:
        """`close` but for the sync bridge, which `close_sync` runs this on: leases the store
        refused to take back are given back, then the store is closed."""
        await self._stop_lease_check()
        for session_id, (owner, token) in list(self._unreleased.items()):
            with contextlib.suppress(StoreError):  # else it lapses after its TTL
                await self._release(session_id, owner, token)
        await self.store.close()
        self._opened = False

    async def __aenter__(self) -> Self:
        await self.open()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def agent(self, name: str) -> Agent:
        """The agent called `name`, or an `UnknownAgent` naming the ones this runtime has."""
        spec = self.agents.get(name) if isinstance(name, str) else None  # a list is unhashable
        if spec is None:
            known = ", ".join(self.agents) or "none"
            raise UnknownAgent(f"unknown agent {name!r}; this runtime has: {known}")
        return spec

    async def _state(self, session_id: str) -> SessionState:
        """The session as its events fold it, checked against the store's head (a passed TTL
        not yet recorded is not applied: `Runtime.state` records it)."""
        return await self._state_at(session_id, None)

    async def _state_at(self, session_id: str, head: int | None) -> SessionState:
        """`_state`, checked against `head` if the caller just read it (with a lease) instead."""
        check_session_id(session_id)
        await self.open()
        cached = self._cache.get(session_id)
        if cached is not None:
            if head is None:
                head = await self.store.head(session_id)
            if head is None:
                raise UnknownSession(session_id)
            if head == cached.seq:
                self._remember(cached)  # another task may have dropped it while we awaited
                return cached
            try:
                # Drivers commit and apply under this lock: fold in only what none has applied.
                async with self._locks.setdefault(session_id, asyncio.Lock()):
                    tail = await self.store.read_events(session_id, after=cached.seq)
                    state = fold(tail, cached)
                self._remember(state)
                return state
            except Exception:
                self._cache.pop(session_id, None)
        state = await load_state(self.store, session_id)
        self._remember(state)
        return state

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
        lease: int | None = None,
        head: int | None = None,
    ) -> SessionState:
        """The session's state with its lapsed TTL and passed deadlines applied; `lease` is the
        caller's token on it, if any, and `head` the session's head when it was granted.
        `trust_cache` skips the store's head when nothing is due on the cached state: a stale
        cache makes the caller's append conflict instead."""
        check_session_id(session_id)
        now = self.now()
        cached = self._cache.get(session_id) if trust_cache else None
        if cached is not None and not cached.expired(now) and due_batch(cached, now) is None:
            return cached
        state = await self._state_at(session_id, head)
        if state.expired(now):
            await self._expire(state, lease)
        if due_batch(state, now) is not None:
            await self._append(
                session_id,
                lambda st: due_batch(st, self.now()) or Batch(specs=[]),
                durable=True,
                turn_id=state.turn.id if state.turn else None,
            )
            state = await self._state(session_id)
        return state

    async def _expire(self, state: SessionState, lease: int | None = None) -> None:
        """Record that the session's TTL passed (its open requests expire, its unfinished turn
        fails), then raise `SessionExpired`. A turn without open requests that another drive
        holds is left to the next look; the caller's own `lease` fences the record instead."""
        pending = state.pending_requests()
        specs = expiry_specs(state)
        if specs and (pending or lease is not None or not await self._busy(state.id)):
            driver = self._driver(state, lease)
            with contextlib.suppress(Exception):  # LeaseLost: another drive took it over
                await driver.record(specs, resolve=expiry_resolves(state))
            self._cache.pop(state.id, None)
        raise SessionExpired(state.id, [r.id for r in pending])

    def _driver(self, state: SessionState, token: int | None) -> Driver:
        return Driver(
            store=self.store,
            agent=self.agent(state.agent),
            state=state,
            lease_token=token,
            clock=self.now,
            abort_signal=self._aborts.setdefault(state.id, asyncio.Event()),
            lock=self._locks.setdefault(state.id, asyncio.Lock()),
            unrecorded=self._unrecorded,
            tracing=self._tracing,
            counts=self._counts,
        )

    async def _create(self, agent: Agent, auth: Principal | None, idem: Keyed | None = None) -> str:
        """Create a session; with an idempotency key, the one its id derives from, unless a call
        with the same key created it first (`_open_keyed` then checks it)."""
        return (await _creation.made(self, agent, auth, idem))[0]

    async def _open_keyed(
        self, agent: Agent, auth: Principal | None, idem: Keyed, *, opens: bool = False
    ) -> tuple[str, bool]:
        """The session a call with this idempotency key starts, created if it is not there yet,
        and whether the key recorded its first message already (the call is a repeat); a call
        that only `opens` the session repeats one that created it."""
        return (await _creation.open_keyed(self, agent, auth, idem, opens=opens))[:2]

    async def _start_session(
        self,
        agent: Agent,
        prompt: str,
        auth: Principal | None,
        *,
        source: str = "message",
        idem: Keyed | None = None,
    ) -> tuple[str, bool, tuple[str, int] | None]:
        """A new session with its first turn started on `prompt` and, if this runtime drives
        turns itself, leased to a drive's owner, all in one write: the session, whether the
        turn started (not if its idempotency key recorded that prompt already: a repeat), and
        the drive's lease (`_drive(leased=...)`). A session the key's first call created
        without starting the turn (an older signoff died between its two writes) has the turn
        started now."""
        check_prompt(prompt)
        first = (prompt, source)
        owner = f"{self.owner}:{new_id('drv')}" if self.inline else None
        if idem is None:
            session_id, _, token = await _creation.made(self, agent, auth, None, first, owner)
            return session_id, True, None if token is None or owner is None else (owner, token)
        session_id, repeat, created, token = await _creation.open_keyed(
            self, agent, auth, idem, first=first, owner=owner
        )
        if created:
            return session_id, True, None if token is None or owner is None else (owner, token)
        if repeat:
            return session_id, False, None
        started = await self._start_turn(session_id, prompt, auth, source=source, idem=idem)
        return session_id, started, None

    async def _start_turn(
        self,
        session_id: str,
        prompt: str,
        auth: Principal | None,
        *,
        source: str = "message",
        idem: Keyed | None = None,
    ) -> bool:
        """Start a turn with `prompt`; False (nothing recorded) when its idempotency key
        recorded it already."""
        check_prompt(prompt)
        # The cached state is trusted at first (a stale one makes the append below conflict,
        # and `start` then asks for a fresh look); it is checked against the store before a
        # message is refused on its account.
        fresh = False
        for _ in range(10):
            state = await self._checked(session_id, trust_cache=not fresh)
            if seen(state.keys, idem, session_id):
                return False
            pending = state.pending_requests()
            unfinished = _unfinished(state)
            if (pending or unfinished) and not fresh:
                fresh = True
                continue
            if pending:
                raise PartialAnswer(session_id, [r.id for r in pending])
            if unfinished:
                # Its calls (approved ones, one a dead process was running) must not be left
                # without results: the turn is finished first, never started over.
                if await self._busy(session_id):
                    raise SessionBusy(
                        f"session {session_id!r} is running a turn (in this process or "
                        "another); send() a message to steer it",
                        session_id,
                    )
                if not self.inline:
                    raise SessionBusy(
                        f"session {session_id!r} has a turn a worker has yet to run; "
                        "send() a message to steer it",
                        session_id,
                    )
                await self._drive(session_id)
                continue
            driver = self._driver(state, None)
            turn_id = new_id("trn")
            checked = state.seq
            who = None if auth is None else auth.model_dump()
            specs = next_turn(state, prompt, who, source, idem)

            def start(
                current: SessionState, checked: int = checked, specs: list[EventSpec] = specs
            ) -> list[EventSpec]:
                # Someone appended since the checks above (a turn, an open request): check again
                # rather than start a turn over theirs.
                if current.seq != checked:
                    raise Changed
                return specs

            try:
                await driver.record(start, turn_id=turn_id)
            except Changed:
                fresh = True
                continue
            except Exception:
                self._cache.pop(session_id, None)
                raise
            self._remember(driver.state)
            return True
        raise SessionBusy(
            f"session {session_id!r} kept changing under a new turn; try again", session_id
        )

    async def _busy(self, session_id: str) -> bool:
        token = await self.store.acquire_lease(session_id, self.owner, 1.0, self.now())
        if token is None:
            return True
        await self.store.release_lease(session_id, self.owner, token)
        return False

    async def _drive(
        self,
        session_id: str,
        *,
        outcomes: Sequence[Outcome] = (),
        retry: bool = False,
        claimed: tuple[str, int] | None = None,
        leased: tuple[str, int] | None = None,
        on_lost: Callable[[int], None] | None = None,  # told the token of a lease lost
    ) -> GenerateResult:
        """Drive the session's turn under a lease until it settles: one a worker `claimed`,
        one its creation took (`leased`), or else one acquired here. A lease lost is logged
        here (a warning, `lost_line`) unless `on_lost` is told of it."""
        check_session_id(session_id)  # before its lease is asked for
        if not self.inline and claimed is None:
            if retry:
                await self._mark_runnable(session_id)
            state = await self._state(session_id)
            if await self._recover(state):  # a waiting turn is no worker's to claim
                state = await self._state(session_id)
            busy = runnable(state, retry=retry)
            return self._result(state, outcomes, busy=busy)  # a worker runs it
        # A worker's drive that fails keeps its lease until it lapses: the session is retried
        # once per TTL, not claimed again at once by every worker in a loop.
        keep_on_error = claimed is not None
        granted = getattr(self.store, "granted_head", None)
        began: TurnState | None = None  # the live turn the first pass found (`cancelled_under`)
        for n in range(100):
            given = claimed or leased
            if given is not None:
                (owner, token), claimed, leased = given, None, None
            else:
                # One owner per drive, not per runtime: two tasks of this runtime must not
                # share (and so steal) the session's lease.
                owner = f"{self.owner}:{new_id('drv')}"
                acquired = await self._acquire(session_id, owner)
                if acquired is None:
                    state = await self._state(session_id)
                    return self._result(state, outcomes, busy=True)
                token = acquired
            # The session's head when this lease was granted, if the store read it then.
            head: int | None = None if granted is None else granted(session_id, token)
            span = self._tracing.drive(session_id)  # before the renewals: nothing to leak
            renewing = asyncio.Event()
            renewing.set()
            held = self._hold(session_id, token)
            renew = asyncio.create_task(self._renew(session_id, owner, token, renewing, held))
            driver: Driver | None = None
            failed = True
            lost = cancelled = False
            try:
                state = await self._checked(session_id, lease=token, head=head)
                if await self._recover(state):  # under the lease, its renewals running
                    state = await self._checked(session_id, lease=token)
                if n == 0 and state.turn is not None and state.turn.status != "cancelled":
                    began = state.turn
                span.begin(state, self.now())
                driver = self._driver(state, token)
                driver.traceparent = span.traceparent()
                driver.release_at_end = True
                driver.held = held
                held.drive = driver.position  # its renewals see a cancel made elsewhere
                driver.lease_check = partial(self._confirm, session_id, owner, token, held)
                state = await driver.drive(retry=retry)
                failed = False
            except LeaseLost as exc:
                # It stalled past its lease, or its renewals found it taken over or could not
                # get through before it lapsed (its tool body is cancelled then): another
                # worker drives the turn; this one wrote nothing after losing it (fencing).
                if on_lost is None:  # else the caller says it, in one line of its own
                    log.warning(lost_line(session_id, token))
                else:  # told now: reading the session again below may fail (a store failing)
                    on_lost(token)
                lost = True
                span.fail(exc)
            except asyncio.CancelledError:
                # Stopped from outside (a delegate call whose parent lost its lease, say), not
                # failed: the lease is given back, so the next drive need not wait out its TTL.
                cancelled = True
                raise
            except BaseException as exc:
                span.fail(exc)
                raise
            finally:
                try:
                    if not (failed or lost or cancelled) and driver is not None:
                        span.finish(driver.state)
                finally:
                    span.end()
                renewing.clear()  # ends the loop even if the cancel below is swallowed
                renew.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await renew
                if driver is not None:
                    self._remember(driver.state)
                if driver is not None and driver.released:
                    pass
                elif cancelled:
                    with contextlib.suppress(StoreError):  # kept in `_unreleased` for later
                        await self._release(session_id, owner, token)
                elif not (failed and keep_on_error):
                    await self._release(session_id, owner, token)
            retry = False
            if driver is not None and driver.released and not failed:
                # Its last commit gave the lease back: its state is the store's as of then, so
                # the head check `_state` makes would only cost a round trip.
                state = driver.state
            else:
                state = await self._state(session_id)
            if lost:
                return self._result(state, outcomes, busy=runnable(state))
            if not runnable(state):
                ended = await cancelled_under(self.store, state, began)
                return self._result(state if ended is None else ended, outcomes)
        raise RuntimeError("turn did not settle after 100 passes")  # pragma: no cover

    async def _recover(self, state: SessionState) -> bool:
        """Finish what a dead process left half done before the turn is driven; True if that
        recorded something (the state is then read again). Nothing to do at this layer."""
        return False

    async def _mark_runnable(self, session_id: str) -> None:
        """Ask the workers to retry a failed turn: it becomes `running` in the store."""
        state = await self._checked(session_id)
        turn = state.turn
        if turn is None or turn.status != "failed" or not turn.retryable:
            return
        await self._append(
            session_id,
            lambda st: (
                [("turn.resumed", {"reason": "retry"})]
                if st.turn is not None and st.turn.status == "failed"
                else []
            ),
            turn_id=turn.id,
        )

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
            error=None if turn is None else turn.error,
            retryable=False if turn is None else turn.retryable,
            outcomes=list(outcomes),
        )

    async def _append(
        self, session_id: str, build: Callable[[SessionState], Any], **kw: Any
    ) -> None:
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
                lock=self._locks.setdefault(state.id, asyncio.Lock()),
            )
        try:
            await driver.record(build, **kw)
        except Exception:
            self._cache.pop(session_id, None)
            raise
        self._remember(driver.state)
