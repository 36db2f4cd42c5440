"""`SessionRunner`: the part of the runtime that starts sessions and their turns and drives the
turns under a lease (granted ahead by `TurnLeases`), on the sessions `SessionCache` loads."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from functools import partial

from . import _creation
from ._agent import Agent
from ._child_closes import delegating
from ._dropped_keys import sent_before
from ._engine import Driver
from ._events import Event
from ._exceptions import (
    ChildHeld,
    LeaseLost,
    PartialAnswer,
    SessionBusy,
    SessionExpired,
    StoreError,
    SubagentOrphaned,
    UnknownSession,
)
from ._idempotency import Keyed
from ._lapsed_trees import lapsed_in_tree
from ._leasing import lost_line
from ._message_places import InTurn, Went, queued_last
from ._prompts import check_prompt, next_turn
from ._recording import Answered, Changed, EventSpec, ended_under, new_id, runnable
from ._results import GenerateResult, Outcome
from ._session_cache import check_session_id
from ._state import SessionState, TurnState, turn_over, waits_for_retry
from ._turn_leases import TurnLeases, to_claims
from ._types import Principal

__all__ = ["SessionRunner"]

log = logging.getLogger("signoff.runtime")


def _unfinished(state: SessionState) -> bool:
    """Whether the session's turn still has work to do: running, or waiting on nothing but
    answers already accepted (`respond(resume=False)`)."""
    turn = state.turn
    return turn is not None and turn.status in ("running", "waiting") and runnable(state)


class SessionRunner(TurnLeases):
    """Loads sessions, starts turns and drives them under a lease; `Runtime` builds on it."""

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

    async def _retry_refused(self, session_id: str) -> bool:
        """Whether a retry of the session's failed turn would be refused (a subagent's delegated
        turn its parent no longer waits on: the runtime knows subagents): a message then waits
        for no retry, and starts the next turn."""
        return False

    async def _lapsed_above(self, state: SessionState) -> str | None:
        """The session above a subagent's (its parent, theirs...) that passed its TTL with its
        turn unfinished, recorded or not (`lapsed_in_tree`), if one did: that ended the
        subagent's conversation for good. None for a session no one delegated to, or whose
        parent was deleted since (no TTL of its own to tell)."""
        if state.parent is None:
            return None
        try:
            parent = await self._state(state.parent)
        except UnknownSession:
            return None
        ended = await lapsed_in_tree(parent, self.now(), self._state)
        return None if ended is None else ended.id

    async def _refuse_lapsed_tree(self, state: SessionState) -> None:
        """Refuse (`SubagentOrphaned`, nothing recorded) a message or prompt to a subagent's
        session whose conversation a passed TTL above it ended (`_lapsed_above`): a turn of it
        would be one no one can take up. Its own TTL is `_checked`'s (`SessionExpired`); its
        delegated turn's start is its parent's, never refused so."""
        ended = await self._lapsed_above(state)
        if ended is not None and state.parent is not None:
            raise SubagentOrphaned(state.id, state.parent, lapsed=ended)

    async def _behind_mirrors(self, state: SessionState) -> bool:
        """Record the passed deadlines and TTLs behind the session's open mirrors, going on with
        the subagents' turns they resumed, and close those mirrors; whether the session changed
        (`Answering` does: `record_behind_mirrors`). A bare runner knows no subagents."""
        return False

    async def _undriven(self, session_id: str) -> bool:
        """Whether a call of this runtime is to drive the session's runnable turn itself: it is
        inline, no worker's sweep runs it (`to_claims`), and no live drive holds the turn, here
        or in another process (one whose lease the call's own commit was granted is its own)."""
        return self.inline and not to_claims.get() and not await self._busy(session_id)

    async def _start_turn(
        self,
        session_id: str,
        prompt: str,
        auth: Principal | None,
        *,
        source: str = "message",
        idem: Keyed | None = None,
        delegated: bool = False,
        queue: bool = False,
        went: list[Went] | None = None,
    ) -> bool:
        """Start a turn with `prompt`; False (nothing recorded) when its idempotency key
        recorded it already, or, for the delegated turn, when it was started already. `went` is
        given where the prompt went: the turn started, or, when a message queued before it
        started that turn, its place in the queue behind it; sent before, where it went if the
        state no longer keeps its key (`sent_before`). A
        subagent's session's first turn is its delegate call's (`delegated`): a message finding
        none started yet is `SessionBusy`. So is one that waits behind a turn a retry can resume
        (`waits_for_retry`: it is `queue`d, or `auth` is not the person the turn serves)."""
        check_prompt(prompt)
        # The cached state is trusted at first (a stale one makes the append below conflict,
        # and `start` then asks for a fresh look); it is checked against the store before a
        # message is refused on its account.
        fresh = False
        for _ in range(10):
            try:
                state = await self._checked(session_id, trust_cache=not fresh)
            except SessionExpired:  # its TTL passed: a repeat of a prompt sent before replays
                state = await self._state(session_id)
                if not await sent_before(self.store, state, idem, None, auth, held=True, went=went):
                    raise
                return False
            if await sent_before(self.store, state, idem, None, auth, held=True, went=went):
                return False
            # Its delegate call, and its parent's cancel starting it to cancel (`_child_sessions`),
            # may both start it: one does, and the other, reading a turn, starts none after it.
            if delegated and state.turn is not None:
                return False
            if not delegated:  # its delegated turn is its parent's to start
                await self._refuse_lapsed_tree(state)
            # Its subagents' passed deadlines and TTLs, as `send` records them: a mirror they
            # closed holds the turn no more, whoever looked first (the turn they resumed is
            # finished below, then this prompt's starts).
            if await self._behind_mirrors(state):
                fresh = True
                continue
            pending = state.pending_requests()
            unfinished = _unfinished(state)
            # Created and not yet started by an older signoff's delegate call (two writes): a
            # message taking the first turn would leave the delegated task undone.
            unstarted = not delegated and state.parent is not None and state.turn is None
            held = (
                not delegated
                and waits_for_retry(state.turn, auth, queue=queue)
                and not await self._retry_refused(session_id)
            )
            if (pending or unfinished or unstarted or held) and not fresh:
                fresh = True
                continue
            if unstarted:
                raise SessionBusy(
                    f"session {session_id!r} is a subagent's whose delegated task has not "
                    "started yet: a message cannot start it; send it once the task has",
                    session_id,
                )
            if pending:
                raise PartialAnswer(session_id, [r.id for r in pending], prompt=True)
            if held:
                raise SessionBusy(
                    f"session {session_id!r} has a turn a retry can resume, which serves "
                    "someone else: it must end first (a retry or a cancel); send() the "
                    "message to have it wait for that",
                    session_id,
                )
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
            checked = state.seq, state.shown()
            who = None if auth is None else auth.model_dump()
            specs = next_turn(state, prompt, who, source, idem)

            def start(
                current: SessionState,
                checked: tuple[int, Event | None] = checked,
                specs: list[EventSpec] = specs,
            ) -> list[EventSpec]:
                # Someone appended since the checks above (a turn, an open request), or wrote
                # that seq again after the store lost commits: check again rather than start a
                # turn over theirs.
                if (current.seq, current.shown()) != checked:
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
            if went is not None:  # the turn started, which is the prompt's unless it queued
                first = driver.state.turn.first_seq if driver.state.turn is not None else 0
                went.append(queued_last(driver.state) if state.queued else InTurn(turn_id, first))
            return True
        raise SessionBusy(
            f"session {session_id!r} kept changing under a new turn; try again", session_id
        )

    async def _drive(
        self,
        session_id: str,
        *,
        outcomes: Sequence[Outcome] = (),
        retry: bool = False,
        claimed: tuple[str, int] | None = None,
        leased: tuple[str, int] | None = None,
        on_lost: Callable[[int], None] | None = None,  # told the token of a lease lost
        lease_wait: float | None = None,  # for the first lease; `self.lease_wait` if None
        stopping: Callable[[], bool] | None = None,
        own: str | None = None,  # the turn this call's message started, if it knows it
        answered: Answered | None = None,  # the turn its answers went to, or it resumes
    ) -> GenerateResult:
        """Drive the session's turn under a lease until it settles: one a worker `claimed`,
        one its creation took (`leased`), or else one acquired here. A lease lost is logged
        here (a warning, `lost_line`) unless `on_lost` is told of it. Once `stopping()` (a
        worker stopping), a turn that ends starts no message queued behind it: that is left,
        with the lease given back, to another drive."""
        check_session_id(session_id)  # before its lease is asked for
        if (not self.inline or to_claims.get()) and claimed is None:
            if retry:
                await self._mark_runnable(session_id)
            state = await self._state(session_id)
            if await self._recover(state):  # a waiting turn is no worker's to claim
                state = await self._state(session_id)
            # A worker runs it, or ran it on past the turn this call is told (`_driven_elsewhere`).
            return await self._driven_elsewhere(state, None, own, answered, outcomes, retry=retry)
        # A worker's drive that fails keeps its lease, for the worker to decide when the session
        # may be claimed again (`Workers._work_on`), not at once by every worker in a loop. An
        # inline one keeps it only while it owes outcomes the store refused (`_record_owed`).
        keep_on_error = claimed is not None
        granted = getattr(self.store, "granted_head", None)
        began: TurnState | None = None  # the live turn the first pass found (`ended_under`)
        first_is_own = leased is not None  # a new session's first turn: this call's own
        ahead = None
        if claimed is None and leased is None:
            # Taken by this call before the commit that made the turn runnable (`_own_turn`),
            # counted in `_driving` since: the drive's count takes over from it below.
            ahead = leased = await self._lease_ahead(session_id)
        # Known to this process while it runs: a worker here claims no session it drives,
        # even once the lease lapsed under a stall (`Workers._claim`).
        self._driving[session_id] += 1
        if ahead is not None:
            self._undrive(session_id)
        owner: str | None = None  # the owner of the lease this pass holds: see `_holders`
        try:
            for n in range(100):
                given = claimed or leased
                if given is not None:
                    (owner, token), claimed, leased = given, None, None
                    if self._holders.setdefault(session_id, owner) != owner:
                        # Claimed by a worker here in a race with another drive here, which
                        # holds the session or is asking for it: that one drives it.
                        with contextlib.suppress(StoreError):  # else kept in `_unreleased`
                            await self._release(session_id, owner, token)
                        state = await self._state(session_id)
                        return await self._driven_elsewhere(state, began, own, answered, outcomes)
                else:
                    # One owner per drive, not per runtime: two tasks of this runtime must not
                    # share (and so steal) the session's lease.
                    owner = f"{self.owner}:{new_id('drv')}"
                    acquired = await self._acquire(
                        session_id, owner, lease_wait if n == 0 else None
                    )
                    if acquired is None:
                        state = await self._state(session_id)
                        # A cancel that started the message queued behind this drive's turn, say.
                        return await self._driven_elsewhere(state, began, own, answered, outcomes)
                    token = acquired
                # The session's head when this lease was granted, if the store read it then.
                # Checked against the event this runtime's cached state ends at (`_state_at`).
                head: int | None = (
                    None
                    if granted is None
                    else granted(session_id, token, shown=self._shown(session_id))
                )
                span = self._tracing.drive(session_id)  # before the renewals: nothing to leak
                renewing = asyncio.Event()
                renewing.set()
                held = self._hold(session_id, token)
                renew = asyncio.create_task(self._renew(session_id, owner, token, renewing, held))
                driver: Driver | None = None
                failed = True
                lost = cancelled = expired = elsewhere = False
                try:
                    # An expiry it records names the span and says how it left the turn.
                    state = await self._checked(
                        session_id, lease=(owner, token), head=head, span=span
                    )
                    if await self._recover(state):  # under the lease, its renewals running
                        state = await self._checked(session_id, lease=(owner, token), span=span)
                    if n == 0 and state.turn is not None and not turn_over(state.turn):
                        began = state.turn
                        # A retry's call is the failed turn's own: it is told that turn, not
                        # the next person's its drive goes on to (`ended_under`).
                        if first_is_own or (retry and began.status == "failed"):
                            own = began.id
                    span.begin(state, self.now())
                    driver = self._driver(state, (owner, token))
                    driver.traceparent = span.traceparent()
                    driver.release_at_end = True
                    driver.held = held
                    held.drive = driver.position  # its renewals see a cancel made elsewhere
                    driver.lease_check = partial(self._confirm, session_id, owner, token, held)
                    driver.cancel_check = partial(
                        self._read_elsewhere, session_id, driver.position, held
                    )
                    driver.stopping = stopping
                    state = await driver.drive(retry=retry)
                    failed = False
                except ChildHeld:
                    # Not failed: the drive stops as if another held this turn, which goes on.
                    # A subagent's: its parent's drive stops too. One owing outcomes keeps its
                    # lease to record them, as for any failure.
                    if session_id in delegating.get() or self._unrecorded.of(session_id):
                        raise
                    elsewhere = True  # its subagent is driven elsewhere: the call waited enough
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
                except SessionExpired as exc:
                    # Its TTL passed, which this drive recorded: the session is over, and nothing
                    # is left for a worker to retry, so its lease (a worker's claim, a delegate
                    # call's on its child) is given back, not kept to lapse: till then deleting
                    # the session, or its parent's, was refused as busy.
                    expired = True
                    span.fail(exc)
                    raise
                except BaseException as exc:
                    span.fail(exc)
                    raise
                finally:
                    try:
                        if not (failed or lost or cancelled) and driver is not None:
                            # A turn it failed for good, not the queued message's turn it then ran.
                            span.finish(driver.failed_turn or driver.state)
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
                    elif cancelled or expired or elsewhere:
                        with contextlib.suppress(StoreError):  # kept in `_unreleased` for later
                            await self._release(session_id, owner, token)
                    elif not (failed and (keep_on_error or self._owes_any(session_id))):
                        await self._release(session_id, owner, token)
                    else:  # the worker's to give back, or to take again (`Workers._work_on`)
                        self._kept_on_error[session_id] = (owner, token)
                        if held.lost:  # given up as it was about to lapse: held no more
                            self._kept_lapsing.add(session_id)
                        else:
                            self._kept_lapsing.discard(session_id)
                        if not keep_on_error:  # an inline drive's: recorded in the background
                            self._record_owed(session_id)
                    self._let_go(session_id, owner)
                retry = False
                if driver is not None and driver.released and not failed:
                    # Its last commit gave the lease back: its state is the store's as of then, so
                    # the head check `_state` makes would only cost a round trip.
                    state = driver.state
                else:
                    state = await self._state(session_id)
                if lost or elsewhere or (stopping is not None and stopping()):
                    return await self._driven_elsewhere(state, began, own, answered, outcomes)
                if not runnable(state):
                    ended = await ended_under(self.store, state, began, own, answered)
                    return self._result(state if ended is None else ended, outcomes)
            raise RuntimeError("turn did not settle after 100 passes")  # pragma: no cover
        finally:
            if owner is not None:  # a pass whose lease could not be given back, say
                self._let_go(session_id, owner)
            self._undrive(session_id)

    async def _driven_elsewhere(
        self,
        state: SessionState,
        began: TurnState | None,
        own: str | None,
        answered: Answered | None,
        outcomes: Sequence[Outcome],
        *,
        retry: bool = False,
    ) -> GenerateResult:
        """What a call is told when another drive has the session's turn (it gave up waiting
        for the lease, lost it, or left it): the turn it began or answered once that ended under
        the other drive (`ended_under`), else the session's turn as it stands, `running` while
        it has something to do."""
        ended = await ended_under(self.store, state, began, own, answered)
        if ended is not None:
            return self._result(ended, outcomes)
        return self._result(state, outcomes, busy=runnable(state, retry=retry))

    async def _resuming(self, session_id: str) -> Answered | None:
        """The turn a retry or resume (`generate` with no prompt) finds not over, which its call
        is told once over rather than the next person's turn its drive goes on to, even when
        another drive took it meanwhile (`ended_under`); None if the turn has ended."""
        turn = (await self._state(session_id)).turn
        if turn is None or turn_over(turn):  # a failed turn a retry can resume is not over
            return None
        return Answered(turn.id, turn.first_seq, turn.principal)

    def _record_owed(self, session_id: str, parent: str | None = None) -> None:
        """Record, in the background, the outcomes the store refused to an inline drive of the
        session (a subagent's, of `parent`), which kept its lease for that, so no other process
        runs those tools again (`Workers` does, as a worker records its own). A bare runner
        leaves the lease to lapse."""

    async def _kept_child(self, child: str, parent: str) -> bool:
        """Whether the outcomes the store refused to the drive of a delegate call's subagent,
        which kept its lease, were recorded, to drive it again: no, they are recorded in the
        background (`_record_owed`); a worker's drive records them itself (`KeptOutcomes`)."""
        self._record_owed(child, parent)
        return False

    def _in_worker_drive(self) -> bool:
        """Whether this runs within a worker's drive, not a call's (`KeptOutcomes`)."""
        return False

    def _owed_below(self, session_id: str) -> list[asyncio.Task[None]]:
        """The background recordings still running of subagents the session's drive delegated
        to (`_record_owed`): while they run, its lease is kept too, or another process would
        resume its turn and drive the subagent, running the tool again."""
        return [
            task
            for child, task in self._recorders.items()
            if self._owed_for.get(child) == session_id and not task.done()
        ]

    def _owes_any(self, session_id: str) -> bool:
        """Whether outcomes the store refused are kept here of the session or, still being
        recorded, of a subagent its drive delegated to."""
        return bool(self._unrecorded.of(session_id) or self._owed_below(session_id))

    async def _after_cancel(self, state: SessionState) -> GenerateResult:
        """What a cancel that left `state` returns. In inline mode the message that waited for
        the cancelled turn's end starts now, as at any turn's end (a drive holding the lease goes
        on to it itself); a failure to drive it is logged: the cancel stands, the message waits
        for the next call."""
        result = self._result(state)
        if self.inline and state.queued:
            try:
                await self._drive(state.id, lease_wait=0.0)
            except Exception as exc:
                log.warning("session %s: the queued message did not start: %s", state.id, exc)
        return result

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
                if st.turn is not None
                and st.turn.id == turn.id
                and st.turn.status == "failed"
                and st.turn.retryable
                else []
            ),
            turn_id=turn.id,
        )
