"""The sweeps of `Runtime`: applying passed request deadlines and lapsed TTLs across sessions
(`rt.expire_due()`, a worker's and a server's periodic sweep), and driving the turns they make
runnable, and those an earlier sweep made runnable but never finished driving (its process
died)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from contextvars import ContextVar

from ._call_guards import closes_stop
from ._child_closes import parents_left_to_holders
from ._deadlines import RESUMPTIONS, is_due, is_lapsed, resumed_by_deadline
from ._exceptions import SessionExpired, StoreError, UnknownSession, wrote_nothing
from ._messages import Messages
from ._queue_page import passing_page
from ._sweeps import deleted_meanwhile, one_of_many
from ._turn_leases import to_claims
from ._types import InputRequest
from .stores import PendingFilter, SessionSummary, promptly
from .stores._pending import first_seen
from .stores._prompt import is_prompt, wrote
from .stores._swept_rows import readable_sessions

__all__ = ["REFUSED_KEPT", "SWEEP_DRIVES", "SweepDrives", "Sweeps"]

log = logging.getLogger("signoff.worker")

_SWEEP_PAGE = 500  # open requests or sessions a sweep reads per query (tests patch it)
SWEEP_DRIVES = 4  # turns a sweep's deadlines made runnable that a runtime drives at once
REFUSED_KEPT = 1024  # sessions whose refused drives a runtime remembers it told of

_handing: ContextVar[Callable[[str, float | None], None] | None] = ContextVar(
    "signoff_sweep_drives", default=None
)
"""Set around a sweep loop's sweeps (`SweepDrives.handing`): the turns their deadlines make
runnable are handed to it, to run in the background, instead of driven inside the sweep."""

_LEFT = "session %s: stopping; its turn (its deadline recorded) is left to the next process's sweep"
_NOT_GONE_ON = "its recorded deadlines not gone on with"
_DRIVE_FAILED = "its passed deadlines recorded; driving its turn on failed"
"""What a sweep logs when the drive after a session's recorded deadlines fails (a later commit
of it refused, say), told apart from the deadlines' own record failing ("not applied")."""


def _takes(method: Callable[..., object], name: str) -> bool:
    """Whether a store's `method` names the keyword `name` (one written for an earlier
    signoff may not; one taking any keywords may ignore it)."""
    try:
        return name in inspect.signature(method).parameters
    except (TypeError, ValueError):  # no signature to read: asked as an earlier one
        return False


class SweepDrives:
    """The turns a sweep loop's deadlines made runnable (`serve` with no workers, on a runtime
    that drives turns itself), driven in the background, `SWEEP_DRIVES` at once: driven inside
    the sweep, a slow one held up every deadline passing after it until it ended. Once
    `stopping()` (a graceful stop), it starts no more drives: a turn whose deadline was
    recorded and whose drive had not started is left to the next process's sweep
    (`_left_undriven`)."""

    def __init__(self, runtime: Sweeps, stopping: Callable[[], bool] = lambda: False) -> None:
        self.runtime = runtime
        self.stopping = stopping
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.started: set[str] = set()  # the sessions whose drive holds a slot
        self.slots = asyncio.Semaphore(SWEEP_DRIVES)

    @contextlib.contextmanager
    def handing(self) -> Iterator[None]:
        """Hand the turns of the sweeps made within to this, not drive them there."""
        token = _handing.set(self.start)
        try:
            yield
        finally:
            _handing.reset(token)

    def start(self, session_id: str, lease_wait: float | None = None) -> None:
        """Drive the session's turn in the background, unless a drive of it here runs already
        (it goes on until the turn settles) or this is stopping; `lease_wait` as `_drive`'s."""
        if self.stopping():
            log.info(_LEFT, session_id)
        elif session_id not in self.tasks:
            task = asyncio.create_task(self._drive(session_id, lease_wait))
            self.tasks[session_id] = task
            task.add_done_callback(lambda _: self.tasks.pop(session_id, None))

    async def _drive(self, session_id: str, lease_wait: float | None) -> None:
        async with self.slots:
            if self.stopping():  # queued behind the others when the stop came
                log.info(_LEFT, session_id)
                return
            self.started.add(session_id)
            try:
                # Not `stopping=` as a worker's drive: a message queued behind the turn is
                # started here, as no other process would start it (no claims in a runtime that
                # drives its own turns, and a sweep goes on only with turns a deadline resumed).
                with parents_left_to_holders():
                    await self.runtime._drive(session_id, lease_wait=lease_wait)
            except SessionExpired:
                pass
            except Exception as exc:  # the deadline is recorded; the turn waits for the next call
                if not deleted_meanwhile(exc, session_id):
                    log.exception("session %s: continuing after its deadline failed", session_id)
            finally:
                self.started.discard(session_id)

    async def settle(self, grace: float) -> None:
        """Wait up to `grace` seconds for the turns being driven (not those queued behind
        them) to finish or park: a graceful stop. Cancelled (a forced stop), it leaves them to
        `aclose`."""
        running = [task for sid, task in self.tasks.items() if sid in self.started]
        if running and grace > 0:
            log.info(
                "stopping: waiting up to %gs for %d turn(s) its deadline sweep drives",
                grace,
                len(running),
            )
            await asyncio.wait(running, timeout=grace)

    async def aclose(self) -> None:
        """Stop the drives running (their leases given back) and wait for them."""
        cut = sorted(sid for sid, task in self.tasks.items() if sid in self.started)
        if cut:  # a call cut short runs again where the turn is taken up: say which
            log.warning(
                "stopping now: interrupting %d turn(s) its deadline sweep drives, their leases "
                "given back once they unwind (a plain tool's thread is waited for, its outcome "
                "recorded): %s",
                len(cut),
                ", ".join(cut),
            )
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Sweeps(Messages):
    """Applies passed deadlines and expiries across sessions, and drives the turns they free."""

    @closes_stop
    async def expire_due(self) -> int:
        """Apply every passed request deadline across sessions and resume their turns: all
        the deadlines are recorded first, then the turns driven `SWEEP_DRIVES` at once. On a
        runtime that drives its own turns, it also goes on with the turns an earlier sweep or
        listing recorded deadlines of but never finished driving (its process died first).

        Run it periodically (a worker does); returns how many sessions it touched: it recorded
        their deadlines or expiry, cancelled them as orphaned subagents, or went on with their
        turns (not one it only looked at, such as a turn a live drive runs on past its TTL).
        """
        await self.open()
        now = self.now()
        # Before this sweep records any: those it records it goes on with itself, below.
        left = await self._left_undriven(now) if self.inline and not to_claims.get() else []
        due: list[InputRequest] = []
        read: set[str] = set()  # a request listed again past a deleted one's cursor
        # Only the due ones, from an index, and only of the agents it has: those of others it
        # could not apply, and would read again at every sweep for as long as they stay open.
        # Paged by keyset: one closed meanwhile (another process) shifts no later one out.
        for agent in sorted(self.agents):
            after: tuple[float, str] | None = None
            while True:
                flt = PendingFilter(limit=_SWEEP_PAGE, after=after, due_by=now, agent=agent)
                what = "its passed deadline not applied"
                page, (listed, last) = await passing_page(self.store, flt, log=log, what=what)
                due += [r for r in first_seen(page, read) if is_due(r, now)]
                if listed < _SWEEP_PAGE:
                    break
                after = last
        lapsed = await self._lapsed(now, sorted(self.agents), passing=True)
        expired = await self._record_lapsed(lapsed, now)
        orphans = await self._sweep_orphans()
        applied = await self._apply_deadlines(due)
        again = {r.session_id for r in due}  # driven on by `_apply_deadlines` already
        left = [sid for sid in left if sid not in again]
        hand = _handing.get()
        if hand is not None:
            for sid in left:
                hand(sid, 0.0)
        else:
            await self._drive_all(left, lease_wait=0.0)
        return applied + expired + orphans + len(left)

    async def _left_undriven(self, now: float) -> list[str]:
        """The sessions of this runtime's agents whose turn a recorded deadline made runnable
        and that no drive has parked or ended since: the process that recorded it (a sweep, a
        listing) died, failed or stopped first, whatever its drive of the turn wrote meanwhile.
        Nothing else would meet them again in a runtime that drives its own turns: their
        requests are closed, so no sweep or listing lists them, and it makes no claims (a
        worker's claims take them). Told by the session's newest park or request closing
        (`resumed_by_deadline`), among those listed `running` with no drive holding their
        lease; one still held (a drive here or in another process, or a dead one's lease not
        lapsed yet) is left to that drive, or to a later sweep. A turn a person's answer
        resumed is its caller's to retry, as after any other crash."""
        left: list[str] = []
        for agent in sorted(self.agents):
            for row in await self._maybe_undriven(agent, now):
                if is_lapsed(row, now) or row.id in left:
                    continue
                with one_of_many(log, row.id, _NOT_GONE_ON):
                    if await self._left_by_deadline(row.id):
                        left.append(row.id)
        return left

    async def _left_by_deadline(self, session_id: str) -> bool:
        """Whether the turn of a session listed `running` is one a recorded deadline made
        runnable that no drive has parked or ended since, nor holds now: no drive of it here,
        its lease not held (`_busy`), and its newest park or request closing a deadline's
        (`resumed_by_deadline`). `_left_undriven`'s test, and a listing's for its page."""
        if session_id in self._driving or await self._busy(session_id):
            return False
        newest = await self.store.read_events(session_id, types=RESUMPTIONS, newest=1)
        return resumed_by_deadline(newest)

    async def _maybe_undriven(self, agent: str, now: float) -> list[SessionSummary]:
        """The running sessions of `agent` that a deadline may have left undriven: those the
        store tells no drive holds and whose newest park or request closing is a closing
        (`running_unheld`, one query a page), else every running one. Every page first:
        driving them would reorder the listing."""
        query = getattr(self.store, "running_unheld", None)
        rows: list[SessionSummary] = []
        offset, after = 0, None
        while True:
            if query is None:
                page = await self.store.sessions(
                    agent=agent, status="running", limit=_SWEEP_PAGE, offset=offset
                )
            else:
                page = await query(
                    agent,
                    now,
                    last_types=("input.resolved",),
                    among=RESUMPTIONS,
                    limit=_SWEEP_PAGE,
                    after=after,
                )
            rows += readable_sessions(page, log, "its recorded deadlines not gone on with")
            if len(page) < _SWEEP_PAGE:
                return rows
            offset, after = offset + _SWEEP_PAGE, page[-1].id

    async def _lapsed(
        self,
        now: float,
        agents: list[str] | None = None,
        *,
        passing: bool = False,
        ids: list[str] | None = None,
    ) -> list[SessionSummary]:
        """The running or waiting sessions (of `agents` only, if given: a sweep records only
        its own) whose TTL passed by `now` (claims skip those: nothing else records them): only
        those where the store can tell them, else every one. A row the store cannot read is a
        StoreError, or, `passing` (a sweep), logged and passed (`readable_sessions`). `ids`
        (a listing's page's sessions): only those where the store's query takes them, else
        the others too, for the caller to pass."""
        lapsed: list[SessionSummary] = []
        query = getattr(self.store, "lapsed_sessions", None)
        only: dict[str, object] = {} if agents is None else {"agents": agents}
        if ids is not None and query is not None and _takes(query, "ids"):
            only["ids"] = ids
        for status in ("running", "waiting") if query is None else ("",):
            # The store's lapsed ones by keyset: one that another process records meanwhile
            # shifts no later one out. (Every running or waiting session by offset, else.)
            offset, past = 0, dict[str, object]()
            while True:
                if query is None:
                    rows = await self.store.sessions(
                        status=status, limit=_SWEEP_PAGE, offset=offset
                    )
                else:
                    rows = await query(now, limit=_SWEEP_PAGE, **only, **past)
                lapsed += readable_sessions(
                    rows, log if passing else None, "its expiry not recorded"
                )
                if len(rows) < _SWEEP_PAGE:
                    break
                offset += _SWEEP_PAGE
                past = {"after": (rows[-1].expires_at, rows[-1].id)}
        return lapsed

    async def _running_past(
        self, rows: Sequence[SessionSummary], now: float, probes: dict[str, bool] | None = None
    ) -> set[str]:
        """The ids of `rows` whose TTL passed while a live drive runs their turn on (a tool
        slower than the TTL): not idle, so listed as the store holds them, not `failed`; their
        expiry is left to a look after that drive (`_expire`). A lease check each, for only
        those the TTL caught running, none for those in `probes` (`_busy`)."""
        held: set[str] = set()
        for row in rows:
            if row.status == "running" and is_lapsed(row, now):
                with contextlib.suppress(StoreError):  # a store this process may only read
                    if await self._busy(row.id, probes):
                        held.add(row.id)
        return held

    async def _sweep_orphans(self) -> int:
        """Cancel subagent turns whose parent no longer waits (the runtime knows subagents);
        returns how many."""
        return 0

    async def _record_lapsed(
        self, rows: Sequence[SessionSummary], now: float, probes: dict[str, bool] | None = None
    ) -> int:
        """Record the expiry of the sessions of `rows` (of agents this runtime has) whose TTL
        passed with their turn unfinished; returns how many it recorded (not one a live drive
        runs on past its TTL, nor one another process recorded first). `probes`: see `_busy`."""
        ids = [r.id for r in rows if is_lapsed(r, now) and r.agent in self.agents]
        recorded: list[bool] = []
        for sid in ids:
            with (
                contextlib.suppress(SessionExpired),
                one_of_many(log, sid, "its expiry not recorded"),
                parents_left_to_holders(),
            ):
                await self._checked(sid, probes=probes, expired=recorded)
        return len(recorded)

    async def _apply_deadlines(self, due: Sequence[InputRequest], *, listing: bool = False) -> int:
        """Record the passed deadlines of the sessions of `due` that this runtime runs, and go
        on with their turns; returns how many sessions that was. Each is recorded against the
        session's current state under a compare-and-set, so listings and sweeps racing in
        several processes apply one deadline once. Sessions of agents this runtime does not
        have are left to a process that has them (it could not go on with their turns). A
        `listing` is a read: one that cannot record them (a read-only store) shows them instead,
        and one the store refuses as busy records no more (each would wait as long)."""
        sessions = list(dict.fromkeys(r.session_id for r in due if r.agent in self.agents))
        if not listing:
            # Every deadline recorded before any turn is driven, then those turns beside each
            # other (or in a sweep loop's background): one after another, a slow turn held up
            # the deadlines of the sessions after it.
            recorded: list[str] = []
            for sid in sessions:
                with (
                    contextlib.suppress(SessionExpired),
                    one_of_many(log, sid, "its passed deadlines not applied"),
                    parents_left_to_holders(),
                ):
                    await self._checked(sid)  # records the expiries; the turn is runnable
                    recorded.append(sid)
                # A store that never suspends (SQLite's) held the loop for the whole sweep: a
                # server answered nothing, renewed no lease, while thousands were recorded.
                await asyncio.sleep(0)
            hand = _handing.get()
            if hand is not None:
                for sid in recorded:
                    hand(sid, None)
            else:
                await self._drive_all(recorded)
            return len(recorded)  # not one expired meanwhile (a sweep counted its expiry)
        # As a sweep: every deadline of the page recorded first, then their turns driven
        # `SWEEP_DRIVES` at once. One after another, a listing took as long as all their model
        # calls together, and each deadline waited for the turns before it.
        await self._drive_listed(await self._record_listed(sessions))
        return len(sessions)

    async def _record_listed(
        self, sessions: Sequence[str], *, what: str = "passed deadlines"
    ) -> list[str]:
        """A listing's half of `_apply_deadlines`: record the passed deadlines of `sessions`
        (this runtime's), driving no turn; returns those recorded, their turns runnable (not
        those it found expired: it records their expiry; `what`, what the listing records).
        One the store cannot record (a read-only store) is shown instead; once it refuses one
        as busy it records no more (each would wait as long)."""
        listed: list[str] = []
        for i, sid in enumerate(sessions):
            with contextlib.suppress(SessionExpired):
                try:
                    # its write leaves the request's later ones prompt
                    with promptly(is_prompt()), parents_left_to_holders():
                        await self._checked(sid)
                except StoreError as exc:  # a store this process may only read, say
                    log.warning("session %s: its %s not recorded: %s", sid, what, exc)
                    if wrote_nothing(exc):  # busy: the rest would wait as long, one by one
                        left = len(sessions) - i - 1
                        log.warning("%d more sessions' %s not recorded", left, what)
                        break
                    continue
                except UnknownSession as exc:
                    if not deleted_meanwhile(exc, sid):
                        raise
                    continue  # deleted since the page was read: the listing reads it again
                listed.append(sid)
            await asyncio.sleep(0)  # as above: the loop's other tasks run between them
        if listed:
            wrote()  # what the request does next waits as a worker does: it recorded something
        return listed

    async def _go_on_listed(
        self, recorded: Collection[str], page: Sequence[InputRequest], *, left: bool = True
    ) -> None:
        """Go on with the turns of the sessions a listing's `page` shows whose passed deadlines
        it recorded (`_record_listed`), and (`left`) of those whose expired request it shows
        that an earlier listing or sweep recorded and left undriven (`_left_on`), as a listing
        of the queue drives those its page meets: bounded by the page. Those it recorded and
        does not show are left runnable to the next listing showing them, a sweep
        (`_left_undriven`) or a worker's claims: driving every one, a listing after an outage
        made all their model calls before it answered."""
        ran = set(recorded)
        drive = list(dict.fromkeys(r.session_id for r in page if r.session_id in ran))
        await self._drive_listed(drive, left=await self._left_on(page, ran) if left else ())

    async def _left_on(self, page: Sequence[InputRequest], ran: Collection[str]) -> list[str]:
        """Of the sessions whose expired request `page` shows (of this runtime's agents, but
        those whose deadlines the listing recorded: `ran`), those whose turn a recorded deadline
        left undriven (`_left_of`), asking the store first which may be (`_maybe_left`, one
        query an agent): loading every one's state to tell, a listing of 500 expired requests
        whose turns had all ended took 2.8 s where it took 0.35 s (PostgreSQL)."""
        if not self.inline or to_claims.get():
            return []  # a worker's claims take them
        mine = {
            r.session_id: r.agent
            for r in page
            if r.status == "expired" and r.agent in self.agents and r.session_id not in ran
        }
        now = self.now()
        maybe: set[str] = set()
        for agent in sorted(set(mine.values())):
            ids = [sid for sid, of in mine.items() if of == agent]
            maybe.update(await self._maybe_left(agent, now, ids))
        return await self._left_of(sid for sid in mine if sid in maybe)

    async def _maybe_left(self, agent: str, now: float, ids: list[str]) -> set[str]:
        """Of `ids`, sessions of `agent` a read's page shows, those a recorded deadline may have
        left undriven: those the store lists among them (`running_unheld` with `ids`, one
        query a `_SWEEP_PAGE` of them), else every one (`_left_of` reads each). Not every
        running session of the agent, paged through, to keep the page's: a store's backlog of
        3,000 left turns cost each listing 6 queries and 0.1 s (SQLite)."""
        query = getattr(self.store, "running_unheld", None)
        if query is None or not _takes(query, "ids"):
            return set(ids)
        found: set[str] = set()
        for start in range(0, len(ids), _SWEEP_PAGE):
            some = ids[start : start + _SWEEP_PAGE]
            rows = await query(
                agent,
                now,
                last_types=("input.resolved",),
                among=RESUMPTIONS,
                ids=some,
                limit=len(some),
            )
            found.update(row.id for row in readable_sessions(rows, log, _NOT_GONE_ON))
        return found

    async def _left_of(self, sessions: Iterable[str]) -> list[str]:
        """Those of `sessions` a read shows (a listing's page, a session's own read) whose turn
        a recorded deadline left undriven (`_left_by_deadline`): `running`, of an agent this
        runtime has, where it drives its own turns; a read showing them goes on with them, as
        nothing else would in a runtime with neither a sweep nor a worker. A session it cannot
        tell of is logged and passed: the read is a read."""
        if not self.inline or to_claims.get():
            return []  # a worker's claims take them
        left: list[str] = []
        for sid in sessions:
            with contextlib.suppress(SessionExpired), one_of_many(log, sid, _NOT_GONE_ON):
                state = await self._state(sid)
                if state.agent not in self.agents or state.status != "running":
                    continue  # another process's, or its turn parked or ended since
                if await self._left_by_deadline(sid):
                    left.append(sid)
        return left

    async def _drive_listed(self, sessions: Sequence[str], left: Sequence[str] = ()) -> None:
        """Drive the turns a read's deadlines made runnable (`sessions`) and those it found a
        recorded deadline left undriven (`left`), `SWEEP_DRIVES` at once; any failure is
        logged, not raised: the read is a read, and the turn is retried later. A turn a
        recorded deadline resumed is not cut short (not `promptly`). One of `left` another
        drive holds is left to it, as a sweep leaves it: waiting `lease_wait` for it, the read
        showed it `running` all the same. A store refusing a drive (one this process may only
        read) is said once a session, not at every read showing it."""
        slots = asyncio.Semaphore(SWEEP_DRIVES)
        refused: dict[str, StoreError] = {}

        async def one(sid: str, lease_wait: float | None) -> None:
            async with slots:
                try:
                    await self._drive(sid, lease_wait=lease_wait)
                except SessionExpired:
                    pass
                except StoreError as exc:  # busy, down: a sweep or the next call goes on with it
                    refused[sid] = exc
                    return
                except Exception as exc:  # the deadline is recorded; the turn is retried later
                    if not deleted_meanwhile(exc, sid):
                        log.exception("session %s: continuing after its deadline failed", sid)
                self._refused_drives.pop(sid, None)

        with promptly(False), parents_left_to_holders():
            await asyncio.gather(
                *(one(sid, None) for sid in sessions),
                *(one(sid, 0.0) for sid in left if sid not in sessions),
            )
        self._say_refused(refused)

    def _say_refused(self, refused: dict[str, StoreError]) -> None:
        """Log the store's refusals of a read's drives (`_drive_listed`): one warning for those
        of sessions not told of (with that kind of error) since a drive of theirs last went
        through, naming the first's error, and a debug line each: a store this process may only
        read refused each at every read, 9 warnings a listing. Those told of are kept for the
        last `REFUSED_KEPT` sessions: a read-only runtime meets ever more."""
        told = self._refused_drives
        new = [sid for sid, exc in refused.items() if told.get(sid) != type(exc).__name__]
        for sid, exc in refused.items():
            told[sid] = type(exc).__name__
            told.move_to_end(sid)
            log.debug("session %s: continuing after its deadline failed: %s", sid, exc)
        while len(told) > REFUSED_KEPT:
            told.popitem(last=False)
        if new:
            several = len(new) > 1
            log.warning(
                "session %s%s: continuing after %s failed: %s (not logged again for "
                "%s until a drive of %s goes through)",
                new[0],
                f" and {len(new) - 1} more" if several else "",
                "their deadlines" if several else "its deadline",
                refused[new[0]],
                "these sessions" if several else "it",
                "theirs" if several else "it",
            )

    async def _drive_all(self, sessions: Sequence[str], lease_wait: float | None = None) -> None:
        """Drive the turns of `sessions`, whose passed deadlines are recorded, `SWEEP_DRIVES`
        at once; a failure of one is logged as the drive's (the deadlines stand) and the others
        go on, a failure of the store as a whole is raised once all ended. `lease_wait` as
        `_drive`'s (0: a session another drive holds is left to it)."""
        slots = asyncio.Semaphore(SWEEP_DRIVES)

        async def one(sid: str) -> None:
            async with slots:
                with (
                    contextlib.suppress(SessionExpired),
                    one_of_many(log, sid, _DRIVE_FAILED),
                ):
                    await self._drive(sid, lease_wait=lease_wait)

        with parents_left_to_holders():
            outcomes = await asyncio.gather(*(one(sid) for sid in sessions), return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
