"""`Leasing`: how a runtime holds a session's lease while it drives it: acquired (waiting a
while for another holder), confirmed before a tool body runs, renewed in the background (a
lease found lost stops the tool body or model call running under it), and released; and the
runtime's time (`now`), which leases, deadlines and event times alike go by: the store's clock
where it has one (PostgreSQL), so processes whose wall clocks differ agree."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import random
import sys
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from ._any_loop import AnyLoopEvent
from ._events import Event
from ._exceptions import LeaseLost, StoreError, UsageError, wrote_nothing
from ._settings import finite
from .stores import Store

__all__ = [
    "CLOCK_CHECK_EVERY",
    "CLOCK_RETRY",
    "LEASE_TTL_MAX",
    "LEASE_TTL_MIN",
    "Held",
    "Leasing",
    "lost_line",
]

log = logging.getLogger("signoff.runtime")

_WALL = time.time


def lost_line(session_id: str, token: int) -> str:
    """The one line logged (a warning) when a drive finds its lease lost: the drive stalled
    past the lease, or could not renew it in time, and another process may have the turn now;
    this one stops, having written nothing after losing it."""
    return (
        f"session {session_id}: lease {token} lost (the drive stalled past it or could not "
        "renew it); the turn is left to the process that takes it over"
    )


def awake_clock() -> Callable[[], float]:
    """A clock that never steps, yet counts the time the machine was suspended: leases went on
    lapsing meanwhile. `time.monotonic()` stops during a suspend on Linux and macOS, so a process
    resumed after an hour would time its leases an hour behind the database's clock: the ones it
    holds would be lapsed for every other process while it runs their calls."""
    if sys.platform == "linux":
        return partial(time.clock_gettime, time.CLOCK_BOOTTIME)
    if sys.platform == "darwin":  # macOS's CLOCK_MONOTONIC counts sleep; its monotonic() not
        return partial(time.clock_gettime, time.CLOCK_MONOTONIC)
    return time.monotonic


_AWAKE = awake_clock()

LEASE_TTL_MIN = 0.1
"""The shortest lease TTL, in seconds. A drive renews its lease every third of the TTL and gives
it up a tenth of the TTL before it lapses, so a renewal has about half the TTL to get through:
57 ms at 0.1 s, a few local round trips; at 1 ms a healthy store just a little slow (an fsync, a
pause of the event loop) would lose every lease."""

LEASE_TTL_MAX = 86_400.0
"""The longest lease TTL, in seconds (a day): a dead worker's sessions wait that long before
another worker may resume them, so a longer one only delays recovery."""


CLOCK_CHECK_EVERY = 60.0
"""How old, in seconds, a process's measurement of the database's clock may grow before it is
measured again: by the next call or lease renewal that finds it older, in the background, so no
call waits for it (a worker also measures it at every sweep). A step of the database's clock, or
a drift of this machine's from it, is judged by for that long at most while the process is used."""

CLOCK_RETRY = 10.0
"""Seconds before a measurement of the database's clock that failed is tried again."""


@dataclass(slots=True)
class Held:
    """A drive's lease as this process knows it. Once it is lost (taken over, or about to lapse
    with no renewal getting through), another process may run the call this one is running: the
    tool body or model call running under it (`body`) is cancelled, and the drive records nothing
    more (a model's response could not be recorded: waiting for it only costs)."""

    at: float  # when it was last known live (`_AWAKE()`)
    expires: float  # when it lapses unless renewed, by the lease clock (`Leasing.now`)
    lost: bool = False
    body: asyncio.Future[Any] | None = None  # the tool body or model call running, if any
    # The turn the drive runs and the last event it knows of: a renewal reads what other
    # processes recorded since (`Leasing._cancelled_elsewhere`), a cancel or a steer.
    drive: Callable[[], tuple[str | None, int]] | None = None
    read: int = 0  # the last event those renewals read: the next reads on from there
    # The last steering message of the drive's turn such a read found and signalled: signalled
    # again at each renewal while the drive has not read it (a model step begun before it
    # cleared the signal), without reading the messages after it again.
    steered: int = 0
    # The drive's turn, once such a read found it cancelled: its tool bodies run no further
    # step or question (`CallJournal`), as when the cancel was made in this process.
    cancelled: str | None = None
    # A commit that gives the lease back is on its way: a renewal refused meanwhile may have
    # met that release, not a takeover (a real one refuses the commit too, which says so).
    releasing: bool = False

    def renewed(self, asked_at: float, expires: float) -> None:
        """A renewal asked at `asked_at` (`_AWAKE()`) got through: the lease is known
        live from then, not from its slow answer, and its expiry never moves earlier."""
        self.at = max(self.at, asked_at)
        self.expires = max(self.expires, expires)

    def lose(self) -> None:
        self.lost = True
        if self.body is not None:
            self.body.cancel()  # a sync body's thread runs on: its result is discarded


class Leasing:
    """The lease half of `SessionRunner`, which sets these attributes."""

    store: Store
    clock: Callable[[], float]
    lease_ttl: float
    lease_wait: float
    _lease_offset: float  # the store's clock minus `_lease_base`'s: see `now`
    # The clock the store's is reckoned from (`_AWAKE`), or None to read `clock` as
    # it is: on SQLite, or a clock given to the runtime.
    _lease_base: Callable[[], float] | None
    _lease_due: float  # when (`_AWAKE()`) the store's clock is to be measured again
    _lease_check: asyncio.Task[None] | None  # that measurement, running in the background
    # Leases of ended drives the store refused to release: given back by the next drive here.
    _unreleased: dict[str, tuple[str, int]]
    # When each lease this process was just granted (and confirmed) lapses, by session:
    # `(token, expiry)`, taken by the drive that holds it (`_hold`).
    _expiries: dict[str, tuple[int, float]]
    _aborts: weakref.WeakValueDictionary[str, AnyLoopEvent]  # each session's abort signal
    # The drive here that holds each session's lease, or is asking for it (its owner): another
    # drive here waits for it to end, even once its lease lapsed in the store (a stall), as the
    # call it runs would otherwise run twice at once. Set by `_acquire` (or `_drive`, for a
    # lease given it), cleared by `_let_go`.
    _holders: dict[str, str]
    # Give-backs of leases asked for by answers settling past their call's end (`_drop_ahead`).
    _giving_back: set[asyncio.Task[None]]

    def _unmeasured(self) -> None:
        """No measurement of the store's clock yet: `clock` is read as it is until `open`."""
        self._lease_offset = 0.0
        self._lease_base = None
        self._lease_due = math.inf
        self._lease_check = None

    def now(self) -> float:
        """The time this runtime stamps and judges by (events, deadlines, session TTLs, leases,
        ages): on PostgreSQL the database's clock, as this process reckons it, so processes
        whose wall clocks differ agree on when anything lapses; else its `clock`."""
        base = self._lease_base
        if base is not None:
            return base() + self._lease_offset
        now = self.clock()
        if type(now) is float and now - now == 0.0:  # finite, checked cheaply: read often
            return now
        if not finite(now):
            # A datetime or text was a bare TypeError deep in a write; NaN "session already
            # exists" (NULL stored); an object an AttributeError from the store.
            if inspect.iscoroutine(now):  # a plain clock calling an async one: never awaited
                now.close()
            raise UsageError(
                f"clock returned {now!r}, not a time in seconds (a finite number, as "
                "time.time() returns)"
            )
        return now

    async def _sync_lease_clock(self) -> None:
        """Measure how far the store's clock is from ours (again at every sweep of a worker, and
        in any process once the measurement is old: `_check_lease_clock`), so a clock stepped
        since is caught up with."""
        server_time = getattr(self.store, "server_time", None)
        # SQLite: every process shares this machine's clock. A clock given to the runtime (a
        # test's) is taken as the shared one: every process using the store is given it too.
        if server_time is None or (self.clock is not _WALL and self._lease_base is None):
            return
        # Reckoned from a clock that never steps, not the wall clock, which may be minutes off
        # the database's or stepped meanwhile (NTP, a virtual machine resumed): a lease another
        # process holds would look lapsed, sessions and requests expire early or late. It counts
        # a suspend (`_AWAKE`).
        before = _AWAKE()
        theirs = await server_time()
        after = _AWAKE()
        self._lease_offset = theirs - (before + after) / 2
        self._lease_base = _AWAKE
        self._lease_due = after + CLOCK_CHECK_EVERY

    def _check_lease_clock(self) -> None:
        """Measure the store's clock again in the background once the last measurement is
        `CLOCK_CHECK_EVERY` old, so a process used for days catches up with a step of the
        database's clock or a drift from it; the call that finds it due does not wait for it."""
        if self._lease_base is None or _AWAKE() < self._lease_due:
            return  # no store clock (SQLite, a given clock), or measured lately
        check = self._lease_check
        if check is not None and not check.done() and not check.get_loop().is_closed():
            return  # being measured (a loop closed meanwhile never will)
        self._lease_check = asyncio.create_task(self._recheck_lease_clock())

    async def _recheck_lease_clock(self) -> None:
        """`_sync_lease_clock`, in the background: a failure keeps the last measurement."""
        try:
            await self._sync_lease_clock()
        except Exception as exc:  # the store failing: kept as it was, tried again soon
            self._lease_due = _AWAKE() + CLOCK_RETRY
            log.warning(
                "measuring the database's clock again failed (tried again in %g s): %s",
                CLOCK_RETRY,
                exc,
            )
        finally:
            self._lease_check = None

    async def _stop_lease_check(self) -> None:
        """Stop a measurement of the store's clock still running, before the store closes."""
        check = self._lease_check
        self._lease_check = None
        if check is None or check.done():
            return
        loop = check.get_loop()
        if loop is asyncio.get_running_loop():
            check.cancel()
            await asyncio.wait({check})
        else:  # another thread's loop (the sync bridge's, say): Task.cancel is not thread-safe
            with contextlib.suppress(RuntimeError):  # a closed loop never runs it again
                loop.call_soon_threadsafe(check.cancel)

    async def _release(self, session_id: str, owner: str, token: int) -> None:
        """Give a drive's lease back; one the store refuses is kept for the next try. Another
        lease of the session kept so (a dead drive's) is not forgotten: a keyed retry's creation
        gives back a lease of its own owner, which the store may never have granted."""
        stale = self._unreleased.get(session_id)
        if stale == (owner, token):
            del self._unreleased[session_id]
        try:
            await self.store.release_lease(session_id, owner, token)
        except StoreError:
            if stale is None or stale == (owner, token) or stale[1] < token:
                self._unreleased[session_id] = (owner, token)
            raise

    async def _acquire(self, session_id: str, owner: str, wait: float | None = None) -> int | None:
        """The session's lease, waiting `wait` seconds (`lease_wait` if None) for its holder."""
        stale = self._unreleased.get(session_id)
        if stale is not None:  # this process's own dead drive: not a holder to wait for
            await self._release(session_id, *stale)
        deadline = time.monotonic() + (self.lease_wait if wait is None else wait)
        delay = 0.005
        while True:
            token = await self._try_acquire(session_id, owner)
            if token is not None or time.monotonic() >= deadline:
                return token
            # Jitter: waiters that started together must not all retry in lockstep.
            await asyncio.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 0.2)

    async def _try_acquire(self, session_id: str, owner: str) -> int | None:
        """One ask for the session's lease, confirmed; None if not granted. Another drive here
        holding it is waited for as another process's would be, even once its lease lapsed: it
        still runs (its renewal may yet keep the lease)."""
        if self._holders.setdefault(session_id, owner) != owner:
            return None
        token = None
        try:
            now = self.now()
            try:
                got = await self.store.acquire_lease(session_id, owner, self.lease_ttl, now)
            except asyncio.CancelledError as exc:
                if not wrote_nothing(exc):  # cancelled waiting for a SQLite file's lock
                    await self._give_back_unseen(session_id, owner)
                raise
            if got is not None and await self._confirmed(session_id, owner, got, now):
                token = got  # else born expired, and another owner took it meanwhile
        finally:
            if token is None:
                self._let_go(session_id, owner)
        return token

    async def _give_back_unseen(self, session_id: str, owner: str) -> None:
        """Give back the lease a call stopped while asking for it may have been granted all the
        same (the answer on its way), which no drive will use: its owner takes it again (a store
        grants an owner its own lease again) and releases it, so the session is not left
        unrunnable for its TTL. Failing that, it lapses."""
        with contextlib.suppress(StoreError):
            token = await self.store.acquire_lease(session_id, owner, self.lease_ttl, self.now())
            if token is not None:
                await self.store.release_lease(session_id, owner, token)

    def _give_back_after(
        self,
        session_id: str,
        owner: str,
        settling: set[asyncio.Task[Any]],
        unanswered: Callable[[], bool],
    ) -> None:
        """`_give_back_unseen`, in the background once the tasks `settling` a call's answers end
        (their commits asking for its lease), if one's ask is still `unanswered` then."""

        async def given_back() -> None:
            await asyncio.wait(settling)
            if unanswered():
                await self._give_back_unseen(session_id, owner)

        task = asyncio.create_task(given_back())
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    def _let_go(self, session_id: str, owner: str) -> None:
        """The drive of `owner` no longer holds the session here (see `_holders`)."""
        if self._holders.get(session_id) == owner:  # only its owner removes it: no race
            del self._holders[session_id]

    async def _confirmed(self, session_id: str, owner: str, token: int, granted: float) -> bool:
        """`_still_held`, for a lease just granted to this process: one that cannot be confirmed
        (the store failing) is given back (or kept in `_unreleased` for the next drive here), as
        a worker's claim gives one back, so the session is not left unrunnable for its TTL."""
        try:
            return await self._still_held(session_id, owner, token, granted)
        except (StoreError, asyncio.CancelledError):
            with contextlib.suppress(StoreError):
                await self._release(session_id, owner, token)
            raise

    async def _still_held(self, session_id: str, owner: str, token: int, granted: float) -> bool:
        """Whether a lease granted with the time `granted` is ours and live: one whose grant
        waited long (for a pool connection, say) expires early, so it is renewed first."""
        now = self.now()
        if now - granted >= self.lease_ttl / 3:
            if not await self.store.renew_lease(session_id, owner, token, self.lease_ttl, now):
                return False
            granted = now
        self._expiries[session_id] = (token, granted + self.lease_ttl)
        return True

    def _hold(self, session_id: str, token: int) -> Held:
        """The lease `token` on the session, which this process was just granted, as its drive
        holds it."""
        known = self._expiries.pop(session_id, None)
        if known is not None and known[0] == token:
            expires = known[1]
        else:  # not confirmed here (`_still_held`): granted at most a third of the TTL ago
            expires = self.now() + self.lease_ttl * 2 / 3
        return Held(_AWAKE(), expires)

    async def _confirm(self, session_id: str, owner: str, token: int, held: Held) -> None:
        """Before a tool body runs: a lease not known live for half its TTL (this process
        stalled: paused, swapped out) is renewed first, so a drive that lost it meanwhile does
        not run a call that the worker which took over may have run already."""
        if held.lost:
            raise LeaseLost(f"lease {token} on session {session_id!r} was lost")
        if _AWAKE() - held.at < self.lease_ttl / 2:
            return
        for _ in range(3):
            now, asked_at = self.now(), _AWAKE()
            if not await self.store.renew_lease(session_id, owner, token, self.lease_ttl, now):
                held.lose()
                raise LeaseLost(f"lease {token} on session {session_id!r} was taken over")
            if held.lost:  # given up by the renewals meanwhile: the drive records nothing more
                raise LeaseLost(f"lease {token} on session {session_id!r} was lost")
            held.renewed(asked_at, now + self.lease_ttl)
            # An answer that came only once the lease it renewed had lapsed again (the process
            # stalled while it was on its way) says nothing of now: another process may have
            # taken the lease over since. Asked again, that renewal fails if it did.
            if self.now() < now + self.lease_ttl - self.lease_ttl / 10:
                return
        held.lose()
        raise LeaseLost(
            f"lease {token} on session {session_id!r}: its renewals kept lapsing before their "
            "answers came"
        )

    async def _renew(
        self, session_id: str, owner: str, token: int, go_on: asyncio.Event, held: Held
    ) -> None:
        """Renew a drive's lease every third of its TTL until the drive ends (`go_on` cleared).
        A lease found taken over is lost for sure; one that failed to renew (the store
        unreachable) may still be live, and is retried until a margin (a tenth of the TTL)
        before its expiry: then it is given up, so the body running under it is stopped before
        any other process can claim the lease. Either way `held.lose()` stops the drive."""
        # Python 3.11's asyncio.wait_for (used by psycopg_pool while waiting for a connection)
        # can swallow a cancellation, so the loop also stops once `go_on` is cleared.
        margin = self.lease_ttl / 10
        pause = self.lease_ttl / 3
        failing = False  # the last renewal did not get through: the deadline below holds
        renewal: asyncio.Future[bool] | None = None
        asked = asked_at = 0.0  # the lease clock's (and `_AWAKE`'s) time `renewal` renews from
        # The read of what other processes recorded (`_cancelled_elsewhere`), beside the
        # renewals: awaited here, a slow store (a busy pool) held the loop past the lease's
        # deadline, and the body ran on while another process took the lease over.
        watch: asyncio.Future[None] | None = None
        try:
            while go_on.is_set():
                await asyncio.sleep(pause)
                if not go_on.is_set():
                    return
                now = self.now()
                self._check_lease_clock()  # a drive of hours still catches up with a step
                # When the lease is given up unless a renewal got through: `margin` before
                # its expiry, the time another process may claim it from.
                deadline = held.expires - margin
                if failing and now >= deadline:
                    self._lapsing(session_id, token, "no renewal got through in time", held)
                    return
                if renewal is None or renewal.done():
                    asked, asked_at = now, _AWAKE()
                    renewal = asyncio.ensure_future(
                        self.store.renew_lease(session_id, owner, token, self.lease_ttl, now)
                    )
                # else one given up is still stopping: waited on again, no second one started.
                # A renewal that hangs is given up at the deadline. One on schedule found past
                # it (this process stalled, its body with it) gets a short while: if no one
                # took the lease over meanwhile, it is still ours. One given up is cancelled
                # but not awaited: a psycopg query cancelled on a connection gone silent takes
                # up to 10 s to stop, and the body must not run on that long.
                wait = deadline - now
                if wait <= 0:
                    wait = self.lease_ttl / 10
                await asyncio.wait({renewal}, timeout=wait)
                try:
                    if not renewal.done():
                        renewal.cancel()
                        raise TimeoutError
                    live = renewal.result()  # CancelledError: one given up before has stopped
                except (StoreError, TimeoutError, asyncio.CancelledError) as exc:
                    why = str(exc) or "it timed out"
                    left = held.expires - margin - self.now()
                    if left <= 0:
                        self._lapsing(session_id, token, why, held)
                        return
                    # A dropped connection: try again soon, halfway to the deadline if it is
                    # near (a retry waking only at it gives the lease up untried: a renewal cut
                    # by operation_timeout just before it, say), and wake at it at the latest.
                    log.warning("renewing the lease on session %s failed: %s", session_id, why)
                    failing = True
                    ttl = self.lease_ttl
                    pause = min(ttl / 10, left / 2 if left >= ttl / 50 else left)
                    continue
                if not live:
                    if not held.releasing:
                        log.warning("session %s: lease %d was taken over", session_id, token)
                    held.lose()  # fenced: this drive can write nothing more
                    return
                held.renewed(asked_at, asked + self.lease_ttl)
                failing = False
                pause = self.lease_ttl / 3
                if watch is not None and watch.done():
                    watch.result()  # an error other than the store's is the drive's
                    watch = None
                if held.drive is not None and watch is None:
                    watch = asyncio.ensure_future(
                        self._cancelled_elsewhere(session_id, held.drive, held)
                    )
        finally:
            if watch is not None:
                watch.cancel()
                await asyncio.wait({watch})
                if not watch.cancelled():
                    watch.exception()  # seen: the drive is over
            if renewal is not None:
                # Stopped before the drive's lease is released, its connection back in the pool.
                renewal.cancel()
                await asyncio.wait({renewal})
                if not renewal.cancelled():
                    renewal.exception()  # seen: a failure is only that it failed

    async def _cancelled_elsewhere(
        self, session_id: str, drive: Callable[[], tuple[str | None, int]], held: Held
    ) -> None:
        """`_read_elsewhere` at a renewal: a store failing is read again at the next one."""
        with contextlib.suppress(StoreError):
            await self._read_elsewhere(session_id, drive, held)

    async def _read_elsewhere(
        self, session_id: str, drive: Callable[[], tuple[str | None, int]], held: Held
    ) -> None:
        """Set the session's abort signal once another process cancelled or steered the turn a
        drive here runs, as a cancel or steer made in this process does: a tool body waiting on
        `ctx.abort_signal` stops, and a cancel is marked (`Held.cancelled`), so the body runs
        no further step. Reads the events after the drive's last (and after those an earlier
        read read: however many messages queued up, it reads on to the head); a steer only
        while the drive has not read it (its model would have, and cleared the signal)."""
        turn, seq = drive()
        after = max(seq, held.read)
        head = None if turn is None else await self.store.head(session_id)
        if head is None:
            return
        steer = held.steered  # the last steering message of the turn found, read or not
        events: list[Event] = []
        while head != after:
            events = await self.store.read_events(
                session_id, after=after, limit=500, types=("turn.cancelled", "turn.message")
            )
            known = drive()[1]  # the drive may have read on meanwhile
            for e in events:
                if e.turn_id != turn:
                    continue
                if e.type == "turn.cancelled":
                    held.cancelled = turn
                elif not e.data.get("queued") and e.seq > known:
                    steer = e.seq
            if held.cancelled == turn or not events:
                break
            after = held.read = events[-1].seq  # a cancel behind a steer is looked for too
        held.steered = steer
        # Asked again: its model may have read the steer (and cleared the signal) meanwhile.
        steered = steer > drive()[1]
        if held.cancelled == turn or steered:
            abort = self._aborts.get(session_id)
            if abort is not None:
                abort.set()
        elif not events:  # read to the head: none of those types since
            held.read = max(after, head)

    def _lapsing(self, session_id: str, token: int, why: str, held: Held) -> None:
        """Give up a lease about to lapse with no renewal getting through: its drive stops
        while no other process can claim the lease yet."""
        log.warning(
            "session %s: lease %d about to lapse, no renewal getting through (%s); stopping "
            "its drive before another process may claim it",
            session_id,
            token,
            why,
        )
        held.lose()
