"""`Runtime`: the public facade. Starts and resumes turns, settles answers, lists the queue.

Nothing is held in memory between calls that the store does not also hold: the in-process cache
of session states is checked against the store's head, and the event it ends at, before every use.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any, NoReturn, Self, get_args

from . import _child_drives, _child_sessions, _subagents, stores
from ._answers import Reply as _Reply
from ._answers import check_principal
from ._answers import decisions as _decisions
from ._call_guards import closes_stop
from ._cancelling import Cancelling
from ._child_closes import parents_left_to_holders
from ._deadlines import expiry_specs, state_after_deadlines
from ._engine import Driver
from ._events import Event
from ._exceptions import (
    InvalidAnswer,
    SessionExpired,
    SessionLimitReached,
    StoreError,
    UnknownSession,
    UsageError,
)
from ._idempotency import keyed
from ._key_forms import keyed_in, keyed_start
from ._leasing import LEASE_TTL_MAX, LEASE_TTL_MIN
from ._message_places import Went
from ._mirrors import followed_state, following_mirrors
from ._prompts import check_prompt
from ._queue_page import queue_page
from ._recording import Answered, EventSpec
from ._results import GenerateResult
from ._session_cache import check_agent_name, check_session_id
from ._session_page import check_listing, session_page
from ._settings import check_page, finite, flag, seconds
from ._state import SessionState
from ._sync import blocking_doc, entered, twin
from ._tracing import DriveSpan
from ._turn_leases import to_claims
from ._types import (
    APP_PRINCIPAL,
    Decision,
    InputRequest,
    Principal,
    RequestKind,
    RequestStatus,
    SessionStatus,
)
from ._work import Workers
from .stores import PendingFilter, SessionSummary, Store
from .stores._base import created_before

__all__ = ["Runtime"]

log = logging.getLogger("signoff.worker")

_UNSET = (None, None, None, None, None, 100, 0)  # `Runtime.pending`'s keyword defaults


class Runtime(Cancelling):
    """Runs the turns of `agents` (a list of `Agent`) against a store, and answers, lists,
    follows and cancels them.

    `store` is a URL (`sqlite:///path.db`, `postgresql://…`) or a `Store`; by default the SQLite
    file `sqlite:///.signoff/state.db`, under the working directory. The first call opens it;
    close it with `async with Runtime(...) as rt:` or `await rt.close()`, or from plain code
    with `with Runtime(...) as rt:` or `rt.close_sync()`. `lease_ttl` and `lease_wait` are the
    seconds a drive's lease on a session lasts unrenewed and a call waits for a busy session,
    `cache_size` the session states kept in memory, `poll_interval` how often a follower
    polls a store that cannot notify, `clock` the time in seconds (a test's `ManualClock`);
    `inline`, `tracer_provider` and `trace_content` are below (`__init__`). Every call has a
    `*_sync` twin but `work`, a worker's loop (and `open`).
    """

    def with_store(self, store: str | Store) -> Self:
        """This runtime's agents and settings on another store (`--store`): only the store is
        replaced, so one that leaves its turns to workers (`inline=False`) still does."""
        return self._replaced(store=store)

    def _replaced(
        self,
        *,
        store: str | Store | None = None,
        lease_ttl: float | None = None,
        inline: bool | None = None,
    ) -> Self:
        """A copy of this runtime, of its class (a subclass's overrides kept), with every
        setting but those given, for the commands that run a runtime a module built (`signoff
        worker` leaves turns to claims). Nothing live is shared (`_fresh`); the store is, unless
        another is given, and a subclass's own attributes are copied as they are."""
        if lease_ttl is not None:
            seconds("lease_ttl", lease_ttl, least=LEASE_TTL_MIN, most=LEASE_TTL_MAX)
        if inline is not None:
            flag("inline", inline)
        replaced = copy.copy(self)
        replaced.agents = dict(self.agents)
        replaced.store = self.store if store is None else stores.open_store(store)
        replaced.lease_ttl = self.lease_ttl if lease_ttl is None else lease_ttl
        replaced.inline = self.inline if inline is None else inline
        replaced._fresh()
        return replaced

    def _driver(self, state: SessionState, lease: tuple[str, int] | None) -> Driver:
        driver = super()._driver(state, lease)
        driver.host = _subagents.RuntimeHost(self)  # delegate tools drive child sessions here
        return driver

    async def _drive(self, session_id: str, **kwargs: Any) -> GenerateResult:
        check_session_id(session_id)
        if kwargs.get("retry"):  # a subagent's failed turn whose result no one would read
            await _child_sessions.refuse_orphaned_retry(self, session_id)
        # A subagent's parent: its mirrors of what closed close first, lest a death lose them.
        try:
            await _child_sessions.before_drive(self, session_id)
        except asyncio.CancelledError:
            # Stopped before the drive took over the lease it was given (a worker's claim): it
            # is given back, as the drive would give it back, not left to lapse undriven.
            given = kwargs.get("claimed") or kwargs.get("leased")
            if given is not None:
                with contextlib.suppress(StoreError):  # else kept in `_unreleased` for later
                    await self._release(session_id, *given)
            raise
        # A subagent's parent may go on after it, and counts what it spent once it stopped.
        return await _child_drives.driven(self, session_id, super()._drive(session_id, **kwargs))

    async def _recover(self, state: SessionState) -> bool:
        recovered = await super()._recover(state)
        # Mirrors of child requests that closed unseen are closed before the parent runs.
        recovered = await _child_sessions.reconcile(self, state) or recovered
        # A child whose parent's turn ended meanwhile is cancelled, not run (by a worker, say).
        recovered = await _child_sessions.cancel_orphan(self, state) or recovered
        # Children its ended turns left whose spend is not counted yet (a process died first).
        return await _child_sessions.count_owed(self, state) or recovered

    async def _retry_refused(self, session_id: str) -> bool:
        return await _child_sessions.orphaned_retry(self, session_id)

    async def _undriven(self, session_id: str) -> bool:
        if not await super()._undriven(session_id):
            return False
        # Nor a subagent's turn whose delegate call its parent's live drive runs: that call
        # drives it (a drive of the parent resumed later takes the result of one driven here).
        state = await self._state(session_id)
        if state.parent is None:
            return True
        try:
            parent = await self._state(state.parent)
        except (UnknownSession, StoreError):  # the message is kept: driven here, not refused
            return True
        return session_id not in _child_sessions.delegated(parent) or not await self._busy(
            parent.id
        )

    async def _orphaned(self, state: SessionState) -> bool:
        # A child its parent's cancel missed (that process died): no answer is applied to it.
        return await _child_sessions.cancel_orphan(self, state)

    async def _sweep_orphans(self) -> int:
        # Children a parent's cancel missed (that process died): a sweep cancels them.
        return await _subagents.sweep_orphans(self)

    async def _record_expiry(
        self,
        state: SessionState,
        lease: tuple[str, int] | None,
        extra: Sequence[EventSpec] = (),
        *,
        span: DriveSpan | None = None,
        expired: list[bool] | None = None,
    ) -> NoReturn:
        kids = _child_sessions.awaited(state)  # before: recording the expiry moves `state` on
        # A parent's subagents are cancelled first and what they spent is counted in the same
        # commit as its expiry: a process dying in between leaves the expiry for the next look.
        spent = await _child_sessions.cancel_for_expiry(self, kids, state.id)
        if kids:  # recorded on the parent as it is now, whatever cancelling them appended
            state = await self._state(state.id)
        try:
            await super()._record_expiry(state, lease, [*extra, *spent], span=span, expired=expired)
        except SessionExpired:
            # A subagent's session expired: its parent's delegate call goes on without it.
            await _child_sessions.after_close(self, state)
            # A parent's: its subagents' turns are cancelled, their results never taken.
            await _child_sessions.cancel_expired(self, kids, state.id)
            raise

    @closes_stop
    @following_mirrors
    async def generate(
        self,
        agent: str | None = None,
        prompt: str | None = None,
        *,
        session_id: str | None = None,
        approvals: Sequence[Decision | Mapping[str, Any]] | None = None,
        auth: Principal | None = None,
        idempotency_key: str | None = None,
    ) -> GenerateResult:
        """Run a turn until it completes, fails or waits for a person; the one call that starts a
        session, sends it a prompt, settles its approvals or resumes it.

        With `approvals`, settle every pending request of the session in one call (no prompt
        beside them) and continue; a decision answers no question, so one open raises
        `PartialAnswer` (answer it with `respond`), as do more than the 1,000 requests one call
        answers (`respond` settles them in batches). With neither, resume the session's turn
        (a retry after a failure, or picking up a turn another process left); a turn that
        failed for good (`retryable` false: `max_steps`, a budget nobody can raise) is returned
        as it is, unless a message queued behind it has yet to start (its process died): the
        turn that message starts is run and returned. A prompt is refused while a turn runs
        (`SessionBusy`) or waits on a request (`PartialAnswer`), and, from someone other than
        the person it serves, while a turn a retry can resume waits for it (`SessionBusy`):
        `send` steers or queues it instead.
        With an `idempotency_key`, a call repeated with the same key (by the same `auth`) starts
        nothing: it returns the turn its prompt went to, as that turn stands now (`replayed`),
        or raises `IdempotencyKeyReused` if the key was given for another agent, prompt or
        message.
        """
        auth = check_principal(auth, "auth")
        await self.open()
        if idempotency_key is not None and prompt is None:
            raise UsageError("idempotency_key goes with a prompt: it keys the message it sends")
        if approvals is not None:
            if prompt is not None:
                raise InvalidAnswer(
                    "approvals must be sent on their own: this call carries a prompt too; "
                    "send the prompt in the next call"
                )
            if session_id is None:
                raise UsageError("approvals need the session_id they belong to")
            if agent is not None:  # as with a prompt: not settled under another agent's name
                await self._of_agent(session_id, agent)
            decisions = _decisions(approvals)
            if not decisions:
                raise InvalidAnswer("approvals is empty: answer the session's pending requests")
            answers = [
                _Reply(
                    d.id,
                    "approve" if d.approved else "cancel",
                    d.reason,
                    d.value,
                    d.edited_input,
                    d.input_hash,
                )
                for d in decisions
            ]
            judged: list[SessionState] = []
            turns: list[Answered] = []
            async with self._own_turn(session_id):
                outcomes = await self._settle(
                    session_id,
                    answers,
                    auth,
                    require_all=True,
                    only_approvals=True,
                    judged=judged,
                    turns=turns,
                )
                went_to = turns[0] if turns else None
                return await self._go_on(session_id, outcomes, judged, retry=True, answered=went_to)
        if session_id is None:
            if agent is None:
                raise UsageError("generate() needs an agent name for a new session")
            if prompt is None:
                raise UsageError("generate() needs a prompt to start a session")
            check_prompt(prompt)  # before the session is created
            spec = self.agent(agent)
            idem = await keyed_start(self.store, idempotency_key, auth, "start", agent, prompt)
            # The session and its first turn are one write.
            session_id, started, lease = await self._start_session(spec, prompt, auth, idem=idem)
            if not started:
                return await self._replay(session_id, idem)
            return await self._drive_first(session_id, idem, lease)
        if prompt is not None:  # checked before its key is made of it (a TypeError there)
            check_prompt(prompt)
        idem = await keyed_in(self, session_id, idempotency_key, auth, "message", prompt or "")
        if agent is not None:
            await self._of_agent(session_id, agent)
        if prompt is None:  # a retry or resume: told the turn it found (`_resuming`)
            found = await self._resuming(session_id)
            return await self._drive(session_id, retry=True, answered=found)
        went: list[Went] = []  # the turn its prompt started, or its place in the queue
        async with self._own_turn(session_id):
            if not await self._start_turn(session_id, prompt, auth, idem=idem, went=went):
                return await self._replay(session_id, idem, *went)
            return await self._drive_after(session_id, went[0], then_sender=idem is None)

    async def _of_agent(self, session_id: str, agent: str) -> None:
        """Refuse a call naming another agent than the session's, before it records anything."""
        check_agent_name(agent)
        state = await self._state(session_id)
        if state.agent != agent:
            raise UsageError(f"session {session_id!r} belongs to agent {state.agent!r}")

    @closes_stop
    async def create_session(
        self, agent: str, *, auth: Principal | None = None, idempotency_key: str | None = None
    ) -> str:
        """Open an empty session for `agent` and return its id; with an `idempotency_key`, a
        call repeated with it (by the same `auth`) returns the session the first one opened."""
        return (await self._open(agent, auth, idempotency_key))[0]

    async def _open(
        self, agent: str, auth: Principal | None, idempotency_key: str | None
    ) -> tuple[str, bool]:
        """`create_session`, and whether the call repeated one with its key (it opened none)."""
        auth = check_principal(auth, "auth")
        await self.open()
        spec = self.agent(agent)
        idem = await keyed_start(self.store, idempotency_key, auth, "open", agent)
        if idem is None:
            return await self._create(spec, auth), False
        return await self._open_keyed(spec, auth, idem, opens=True)

    @closes_stop
    @following_mirrors
    async def schedule(
        self,
        agent: str,
        prompt: str,
        *,
        session_id: str | None = None,
        idempotency_key: str | None = None,
    ) -> GenerateResult:
        """Run a turn with no person behind it, as the app principal (`APP_PRINCIPAL`): policies
        can skip approval for it (`session.auth.current`), `ask_question` answers `{"status":
        "unavailable"}` and a spent budget raises `SessionLimitReached` (nobody can answer or
        raise it). A `session_id` must be a session of `agent` (else `UsageError`), refused as
        `generate` is while its turn runs (`SessionBusy`) or a person's retryable turn waits. An
        `idempotency_key` (a job's run, say) makes a repeated call start nothing."""
        await self.open()
        went: list[Went] = []  # the turn its prompt started, or its place in the queue
        async with self._own_turn(session_id):  # a new session's creation leases it itself
            check_prompt(prompt)  # before the session is created, or a key made of it
            if session_id is None:
                spec = self.agent(agent)  # before a key is made of it too
                idem = keyed(idempotency_key, APP_PRINCIPAL, "start", agent, prompt)
                session_id, started, lease = await self._start_session(
                    spec, prompt, APP_PRINCIPAL, source="schedule", idem=idem
                )
            else:
                await self._of_agent(session_id, agent)  # else run as the session's own, unsaid
                idem = keyed(idempotency_key, APP_PRINCIPAL, "message", prompt)
                started = await self._start_turn(
                    session_id, prompt, APP_PRINCIPAL, source="schedule", idem=idem, went=went
                )
                lease = None
            if not started:
                result = await self._replay(session_id, idem, *went)
            elif went:  # a session's turn: its own, or one taking its prompt from the queue
                result = await self._drive_after(session_id, went[0], then_sender=idem is None)
            else:  # a new session's first turn, its own
                result = await self._drive_first(session_id, idem, lease)
        if result.status == "failed" and (result.error or {}).get("code") == (
            SessionLimitReached.code
        ):
            raise SessionLimitReached(str((result.error or {}).get("message")), session_id)
        return result

    @closes_stop
    async def pending(
        self,
        flt: PendingFilter | None = None,
        *,
        agent: str | None = None,
        tool_name: str | None = None,
        kind: RequestKind | None = None,
        session_id: str | None = None,
        older_than: float | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[InputRequest]:
        """Open requests across sessions, oldest first: those `flt` or else the keywords pick."""
        await self.open()
        if kind is not None and kind not in get_args(RequestKind):  # else silently nothing
            raise UsageError(
                f"kind must be one of {', '.join(get_args(RequestKind))}, not {kind!r}"
            )
        # NaN matched no request; an int no float holds overflowed.
        if older_than is not None and not (finite(older_than) and older_than >= 0):
            raise UsageError(f"older_than must be seconds from 0, not {older_than!r}")
        if flt is None:
            flt = PendingFilter(
                agent=agent,
                tool_name=tool_name,
                kind=kind,
                session_id=session_id,
                created_before=created_before(self.now(), older_than),
                live_at=self.now(),  # requests of expired sessions can no longer be answered
                limit=limit,
                offset=offset,
            )
        elif (agent, tool_name, kind, session_id, older_than, limit, offset) != _UNSET:
            raise UsageError("give a PendingFilter, or filter by keyword, not both")
        return (await self.pending_page(flt))[0]

    @closes_stop
    async def pending_page(self, flt: PendingFilter) -> tuple[list[InputRequest], bool]:
        """One page of the queue as of now, and whether the store may hold more past it.

        A request whose deadline has passed is never offered, even if no sweep has run yet:
        the page's passed deadlines are applied first (one listing, and no other query, when
        nothing is due). What this runtime cannot apply (another agent's) is shown as the
        deadline leaves it: escalated to its group, or left out; so a page can come back short
        while `more` still says to read on. A mirror shows its subagent's request's votes,
        escalation and deadline, so a deadline passed there leaves it out or escalated too; and
        so does a TTL passed by its subagent's session leave it out. A listing of `expired`
        requests records first the passed deadlines of the open ones it would list, and the
        passed TTLs of their sessions (those of this runtime's agents), so it lists them as
        `state()` shows them; one of every status (`status=None`) shows one it cannot record
        as `expired` (or escalated), one whose session's TTL passed unrecorded as `expired`,
        and one of a subagent's delegated turn below a session whose TTL passed unrecorded as
        `withdrawn`. The turns of those its page shows go on (4 at once): those whose deadlines
        it recorded and, where this runtime drives its own turns, those an earlier record left
        undriven; the others are left to a sweep, a worker's claims or the next listing
        showing them. A request row that does not read back (`StoreDamaged`) is logged and
        left out, in its place.
        """
        await self.open()
        if not isinstance(flt, PendingFilter):
            raise UsageError(f"the filter must be a stores.PendingFilter, not {type(flt).__name__}")
        check_page(flt.limit, flt.offset)
        # Else matched by no request: an empty queue, as if none were open (`pending(kind=)`
        # refuses it; a store takes any text, matching nothing).
        for name, value, known in (
            ("kind", flt.kind, get_args(RequestKind)),
            ("status", flt.status, get_args(RequestStatus)),
        ):
            if value is not None and value not in known:
                raise UsageError(
                    f"PendingFilter({name}=...) must be one of {', '.join(known)}, or None, "
                    f"not {value!r}"
                )
        return await queue_page(self, flt)

    @closes_stop
    async def sessions(
        self,
        *,
        agent: str | None = None,
        status: SessionStatus | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[SessionSummary]:
        """Sessions, most recently active first (`status`: idle, running, waiting, failed,
        cancelled). A TTL that passed with the turn unfinished is recorded first (the turn fails),
        or else shown so; passed deadlines only shown (`state`); filtered by `status` as shown.
        A row that does not read back (`StoreDamaged`) is logged and left out, in its place."""
        await self.open()
        check_page(limit, offset)
        check_listing(agent, status)
        return await session_page(self, agent, status, limit, offset, self.now(), {})

    @closes_stop
    async def state(self, session_id: str) -> SessionState:
        """The session's current state. Like a listing, it records a TTL that passed with the
        turn unfinished first (the turn fails, its requests expire), or shows it so if it cannot
        (another agent's, a store refusing the write), unless a live drive runs the turn on, and
        shows passed deadlines as recording leaves them, writing nothing: no reading it as
        waiting on answers no one can give (nor on an expired subagent's mirror). Its open
        mirrors show their subagents' requests' votes, escalation and deadline. It is the
        caller's own copy: the runtime's later calls leave it as it is, and changing it (but its
        calls' journals' entries, shared) changes nothing they decide (`detached`). A
        subagent's delegated turn that a passed TTL above it ended is recorded so too (its
        requests withdrawn), as an answer to them would record it."""
        state = await self._state(session_id)
        if state.expired(self.now()) and expiry_specs(state) and state.agent in self.agents:
            # A subagent's parent goes on after it, not waited for while another drive holds it.
            with contextlib.suppress(SessionExpired, StoreError), parents_left_to_holders():
                await self._checked(session_id)
            state = await self._state(session_id)
        else:
            # A read drives no turn: the parent's delegate call, which the child's expiry lets
            # go on, is left runnable for the next call or a worker, as `resume=False` leaves it.
            leaving = to_claims.set(True)
            try:
                if await self._record_ended_above(state):
                    state = await self._state(session_id)
                recorded = await self._record_expired_children(state)
            finally:
                to_claims.reset(leaving)
            if recorded:
                state = await self._state(session_id)
        shown = await self._as_recorded(state.detached())  # a copy: the cached one decides
        # Shown as recorded (no turn driven), before mirrors take deadlines listings do not see.
        shown = state_after_deadlines(shown, now := self.now())
        return await followed_state(self.store, shown, now)

    async def _record_ended_above(self, state: SessionState) -> bool:
        """Record the end of the subagent's delegated turn that a passed TTL above its session
        brought (`_orphaned`: the turn cancelled, its requests withdrawn), so a read offers no
        request that takes no answer. Looked for only while it has open requests the queue
        leaves out (one indexed count: `live_at`); returns whether it recorded."""
        if state.parent is None or not state.pending_requests() or state.agent not in self.agents:
            return False
        live = PendingFilter(session_id=state.id, live_at=self.now(), limit=1)
        if await self.store.count_pending(live):
            return False
        with contextlib.suppress(StoreError):  # a store this process may only read: as it is
            return await self._orphaned(state)
        return False

    async def _record_expired_children(self, state: SessionState) -> bool:
        """Record the passed TTL of the subagents the session's open mirrors were asked for,
        which closes those mirrors and lets the delegate call go on (`after_close`). Returns
        whether it recorded any."""
        now = self.now()
        recorded = False
        for child in _child_sessions.children(state.pending_requests()):
            try:
                kid = await self._state(child)
            except UnknownSession:
                continue
            if kid.expired(now) and expiry_specs(kid) and kid.agent in self.agents:
                with contextlib.suppress(SessionExpired, StoreError):  # refused: unrecorded
                    await self._checked(child)
                recorded = True
        return recorded

    # -- sync twins ---------------------------------------------------------------------------

    generate_sync = twin(generate)
    send_sync = twin(Workers.send)
    respond_sync = twin(Workers.respond)
    schedule_sync = twin(schedule)
    expire_due_sync = twin(Workers.expire_due)
    pending_sync = twin(pending)
    pending_page_sync = twin(pending_page)
    cancel_sync = twin(Cancelling.cancel)
    state_sync = twin(state)
    create_session_sync = twin(create_session)
    sessions_sync = twin(sessions)

    def events_sync(
        self, session_id: str, after: int = 0, *, shown: Event | None = None
    ) -> list[Event]:
        """The session's events after `seq`, without following (`shown` as `events` takes it)."""

        async def collect() -> list[Event]:
            return [e async for e in self.events(session_id, after, follow=False, shown=shown)]

        return self._sync.run(collect())

    def close_sync(self) -> None:
        # Not a `twin`: `close` shuts down the bridge a twin would run it on. Calls still
        # running there stop first, while the store is open to take their leases back.
        with self._closing_now():
            self._sync.stop_calls()
            self._sync.run(self._close_store())
            self._sync.close()

    close_sync.__doc__ = blocking_doc(Workers.close)

    def __enter__(self) -> Self:
        """Open the store as the first `*_sync` call would (a `with` block from plain code)."""
        entered(self._sync, self.open(), self.close_sync)
        return self

    def __exit__(self, *exc: object) -> None:
        """Close it with `close_sync`, however the block ended; a later call opens it again."""
        self.close_sync()
