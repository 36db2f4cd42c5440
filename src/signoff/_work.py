"""The worker's side of `Runtime`: claiming sessions under a lease and driving them, with the
sweeps of `_sweeping` run between claims (`signoff worker`, `rt.work()`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Sequence

from ._call_guards import closes_stop
from ._child_closes import parents_to_claims
from ._exceptions import (
    SessionExpired,
    StoreError,
    StoreGone,
    UnknownAgent,
    UnknownSession,
    UsageError,
)
from ._kept_outcomes import KeptOutcomes, worker_drive
from ._leasing import lost_line
from ._settings import seconds, whole
from ._turn_leases import to_claims
from ._work_waits import Failing, Stopped, fit_pool, sleep_unless, unless_stopped
from .stores import Store

__all__ = ["Workers"]

log = logging.getLogger("signoff.worker")

CLAIM_GAP = 0.02  # seconds a worker waits after a claim that found nothing before the next
GIVE_BACK_AFTER = 0.5  # seconds a lease waits, after a second drive in a row the store failed
RELEASE_RETRY = 0.5  # seconds: the longest wait between tries to give such a lease back


class _GiveBacks:
    """The leases of a worker's drives that the store failed (its connection lost, say): each
    is given back once the store takes it, not kept until it lapses (the turn would wait a
    whole TTL after the store came back), after a wait that doubles with each failure of the
    same session in a row, up to the TTL: a session the store fails every time is retried
    less and less often, not claimed again in a loop."""

    def __init__(self, store: Store, ttl: float, stop: asyncio.Event) -> None:
        self.store, self.ttl, self.stop = store, ttl, stop
        self.failures: dict[str, int] = {}  # session: its drives failed in a row
        self.tasks: set[asyncio.Task[None]] = set()

    def worked(self, session_id: str) -> None:
        self.failures.pop(session_id, None)

    def failed(self, session_id: str, owner: str, token: int) -> float:
        """Give the lease back later; returns in how many seconds."""
        n = min(self.failures.pop(session_id, 0) + 1, 64)  # 2 ** 1024 is no float
        self.failures[session_id] = n  # the newest last: the oldest forgotten first
        if len(self.failures) > 10_000:
            del self.failures[next(iter(self.failures))]
        wait = 0.0 if n == 1 else min(self.ttl, GIVE_BACK_AFTER * 2 ** (n - 2))
        task = asyncio.create_task(self._give_back(session_id, owner, token, wait))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return wait

    async def _give_back(self, session_id: str, owner: str, token: int, wait: float) -> None:
        lapses = time.monotonic() + self.ttl  # its last renewal was before the failure
        await sleep_unless(self.stop, wait)
        delay = 0.05
        while True:
            try:  # nothing if it lapsed meanwhile and another worker took it (a newer token)
                await self.store.release_lease(session_id, owner, token)
            except StoreError as exc:  # the store still failing: it lapses by itself, else
                if self.stop.is_set() or time.monotonic() + delay >= lapses:
                    log.debug("session %s: lease %d not given back: %s", session_id, token, exc)
                    return
            else:
                log.info("session %s: lease %d given back", session_id, token)
                return
            await sleep_unless(self.stop, delay)
            delay = min(delay * 2, RELEASE_RETRY)


class Workers(KeptOutcomes):
    """Runs any process's turns: claims sessions with work, drives them, sweeps deadlines."""

    @closes_stop
    async def work(
        self,
        *,
        concurrency: int = 4,
        stop: asyncio.Event | None = None,
        idle_wait: float = 0.5,
        sweep_every: float = 5.0,
    ) -> None:
        """Run turns for any process (`signoff worker`): claim sessions that have work under a
        lease, drive them, and apply passed deadlines (the turns those make runnable, and a
        subagent's parent that a turn here lets go on, are left to the claims, whether or not the
        runtime is `inline`); returns once `stop` is set and the turns it was running have
        finished or parked (starting no message queued behind them: those are left to workers
        that go on), and the tool outcomes the store refused, kept in memory, are recorded:
        retried for `RECORD_KEPT_WITHIN` seconds, then a `StoreError` names those lost. Until
        then a session with such an outcome keeps its lease here (unless it lapsed first: see
        `RECORD_KEPT_WITHIN`) and is driven again until it is recorded, not given back for
        another worker to run the tool again. A claim or sweep that the store holds up (a locked
        file, the server down) is cut short by the stop, not waited for. Cancelled, it cancels
        the turns first (their leases given back), so none runs on once it is gone; a claim on
        its way is not waited for: its leases are given back once it answers."""
        whole("concurrency", concurrency, least=1)
        if stop is not None and not isinstance(stop, asyncio.Event):
            raise UsageError(f"stop must be an asyncio.Event or None, not {stop!r}")
        if not self.agents:  # it would claim and sweep only sessions of agents it has: none
            raise UsageError("this runtime has no agents: a worker of it would run no turns")
        # Zero or less would claim (or sweep) in a busy loop.
        seconds("idle_wait", idle_wait)
        seconds("sweep_every", sweep_every)
        await self.open()
        await fit_pool(self.store, concurrency)
        stop = stop or asyncio.Event()
        running: set[asyncio.Task[None]] = set()
        owner = f"{self.owner}:worker"
        last_sweep = 0.0
        wait = getattr(self.store, "wait_for_change", None)
        change_mark = getattr(self.store, "change_mark", None)  # for `wait`'s `since`
        last_empty = -1.0  # monotonic time of the last claim that found nothing
        mark: object = None
        claims, sweeps = Failing("claiming sessions"), Failing("applying passed deadlines")
        give_backs = _GiveBacks(self.store, self.lease_ttl, stop)
        retry_at = 0.0  # monotonic time before which claims that failed are not tried again
        gone: StoreGone | None = None  # the store's file replaced: only a restart mends it
        unsaved: list[str] = []  # tool outcomes kept that it stopped without recording
        try:
            while not stop.is_set() and gone is None:
                free = concurrency - len(running)
                if free > 0 and time.monotonic() >= retry_at:
                    # Every commit anywhere wakes every idle worker: a burst of notifications is
                    # coalesced into one claim per CLAIM_GAP instead of one claim per commit.
                    gap = last_empty + CLAIM_GAP - time.monotonic()
                    if gap > 0:
                        with contextlib.suppress(TimeoutError):
                            async with asyncio.timeout(gap):
                                await stop.wait()
                        if stop.is_set():
                            break
                    try:
                        # Changes made from here on (while this claims and sweeps) end the wait.
                        mark = None if change_mark is None else change_mark()
                        # Not waited for once told to stop (a locked file, the server down):
                        # its leases are given back when it answers (`_claim`).
                        async with unless_stopped(stop):
                            claimed = await self._claim(owner, free)
                    except Stopped:
                        break
                    except StoreGone as exc:
                        gone = exc
                        break
                    except StoreError as exc:  # the database restarting, say: try again later
                        retry_at = time.monotonic() + claims.failed(exc, idle_wait)
                        claimed = []
                    else:
                        claims.worked()
                    last_empty = -1.0 if claimed else time.monotonic()
                    if stop.is_set():  # told to stop while it claimed: no turn in flight yet
                        await self._give_back(claimed, owner)
                        break
                    for session_id, token in claimed:
                        log.info("claimed session %s (lease %d)", session_id, token)
                        task = asyncio.create_task(
                            self._work_on(
                                session_id, owner, token, stop.is_set, give_backs, unsaved
                            ),
                            name=session_id,  # named if the worker is stopped at once
                        )
                        running.add(task)
                        task.add_done_callback(running.discard)
                if time.monotonic() - last_sweep >= sweep_every:
                    last_sweep = time.monotonic()
                    # The turns it makes runnable are left to claims, even in a runtime that
                    # drives its own calls' turns: run `concurrency` at once, a `stop` heeded.
                    leaving = to_claims.set(True)
                    try:
                        async with unless_stopped(stop):  # cut short by a stop, as a claim
                            with contextlib.suppress(StoreError):  # kept until the next sweep
                                await self._sync_lease_clock()
                            await self.expire_due()
                    except Stopped:
                        break
                    except StoreGone as exc:
                        gone = exc
                        break
                    except StoreError as exc:  # the next sweep tries again; the worker goes on
                        sweeps.failed(exc, sweep_every)
                    except Exception:
                        log.exception("applying passed deadlines failed")
                    else:
                        sweeps.worked()
                    finally:
                        to_claims.reset(leaving)
                # Waits end by the next sweep, whatever `idle_wait` is (after CLAIM_GAP at least).
                to_sweep = max(last_sweep + sweep_every - time.monotonic(), CLAIM_GAP)
                nap = min(idle_wait, to_sweep)
                if len(running) >= concurrency:
                    await asyncio.wait(running, timeout=nap, return_when=asyncio.FIRST_COMPLETED)
                elif wait is not None and claims.since is None:
                    since = {} if mark is None else {"since": mark}
                    waiter = asyncio.ensure_future(wait(None, nap, **since))
                    stopper = asyncio.ensure_future(stop.wait())
                    try:
                        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    finally:  # a worker cancelled here leaves neither waiting
                        for f in (waiter, stopper):
                            f.cancel()
                    if waiter.done() and not waiter.cancelled() and waiter.exception() is not None:
                        # Changes cannot be waited for (the store failing): sleep, do not spin.
                        await sleep_unless(stop, nap)
                else:  # or until claims that failed are tried again
                    await sleep_unless(
                        stop, min(max(idle_wait, retry_at - time.monotonic()), to_sweep)
                    )
            if gone is not None:
                log.error("stopping: %s", gone)
            if running:
                log.info("stopping: waiting for %d running turn(s)", len(running))
                # Not a gather: cancelled meanwhile (a second Ctrl-C), this leaves them running
                # for the lines below to name and stop.
                await asyncio.wait(set(running))
                await asyncio.gather(*running, return_exceptions=True)
            # Leases of drives the store failed: given back now, once (`stop` ends their waits).
            await asyncio.gather(*give_backs.tasks, return_exceptions=True)
            # Outcomes the store refused before the stop, kept here: lost with the process.
            # (Those of inline drives here are recording already: `close` waits for them.)
            owed = [s for s in self._unrecorded.sessions() if s not in self._recorders]
            await asyncio.gather(*(self._record_kept(s, owner, unsaved) for s in owed))
        except BaseException:
            # Cancelled (a second Ctrl-C, a task's cancel) or broken: the turns it drives stop
            # with it, their leases given back, rather than run on unseen once it is gone.
            ids = sorted(task.get_name() for task in running if not task.done())
            if ids:  # a call cut short runs again where the session is taken over: say which
                more = f", and {len(ids) - 20} more" if len(ids) > 20 else ""
                log.warning(
                    "stopping now: interrupting %d running turn(s), their leases given back: %s%s",
                    len(ids),
                    ", ".join(ids[:20]),
                    more,
                )
            for task in (*running, *give_backs.tasks):
                task.cancel()
            await asyncio.gather(*running, *give_backs.tasks, return_exceptions=True)
            for session_id in self._unrecorded.sessions():
                log.error(
                    "stopping now: session %s: the outcome of %s ran but is not recorded (the "
                    "store refused it); lost unless this process drives the session again",
                    session_id,
                    ", ".join(self._unrecorded.of(session_id)),
                )
            raise
        if gone is not None:
            raise gone
        if unsaved:
            more = f", and {len(unsaved) - 20} more" if len(unsaved) > 20 else ""
            raise StoreError(
                f"the worker stopped with {len(unsaved)} tool outcome(s) the store did not record "
                f"(those tools run again where their sessions resume): "
                f"{'; '.join(unsaved[:20])}{more}"
            )

    async def _claim(self, owner: str, limit: int) -> list[tuple[str, int]]:
        """Claim up to `limit` sessions, keeping only leases that are ours and live: a claim that
        waited long was granted expiring early, and is renewed before it is driven. A lease that
        could not be confirmed (the store failing) is given back, so the next claim here or in
        another worker takes it at once, not once its TTL lapses; the others are still driven."""
        now = self.now()
        agents = list(self.agents)  # sessions of other agents are left to workers that have them
        # Not the sessions this process drives now: a drive's lease that lapsed while it stalled
        # (a loaded machine) is still its own to renew; claimed, a second drive here ran the
        # call its body was running again. (Told only when there are some.)
        busy = {"skip": sorted(self._driving)} if self._driving else {}
        asking = asyncio.ensure_future(
            self.store.claim(owner, self.lease_ttl, now, limit, agents=agents, **busy)
        )
        try:
            claimed = await asyncio.shield(asking)
        except asyncio.CancelledError:
            # The worker stopped with the claim on its way: granted all the same, its leases
            # are given back once it answers, not left to lapse with no drive of theirs; not
            # waited for here, as it may answer only much later (a locked file, the server
            # down), and a worker stopped at once must return at once.
            self._give_back_later(asking, owner)
            raise
        held: list[tuple[str, int]] = []
        try:
            for session_id, token in claimed:
                try:
                    if await self._still_held(session_id, owner, token, now):
                        held.append((session_id, token))
                except StoreError as exc:
                    log.warning(
                        "session %s: claimed but not confirmed, giving it back: %s", session_id, exc
                    )
                    with contextlib.suppress(StoreError):  # else it lapses: claimed after the TTL
                        await self.store.release_lease(session_id, owner, token)
        except asyncio.CancelledError:  # stopped while confirming: no drive takes any of them
            self._give_back_later(asking, owner)
            raise
        return held

    def _give_back_later(self, asking: asyncio.Future[list[tuple[str, int]]], owner: str) -> None:
        """`_give_back` the leases of a claim once it answers, in the background: the runtime's
        `close` waits only `ANSWER_WAIT` for it, then cancels it (its leases lapse)."""

        async def given_back() -> None:
            with contextlib.suppress(Exception):
                await self._give_back(await asking, owner)

        task = asyncio.create_task(given_back())
        self._unanswered.add(task)
        task.add_done_callback(self._unanswered.discard)

    async def _give_back(self, claimed: Sequence[tuple[str, int]], owner: str) -> None:
        """Give back, undriven, the leases of a claim that returned once its worker was told to
        stop: a worker that goes on takes them at once (one the store refuses lapses)."""
        for session_id, token in claimed:
            self._expiries.pop(session_id, None)  # its confirmation: no drive takes it now
            try:
                await self.store.release_lease(session_id, owner, token)
            except StoreError as exc:
                log.warning(
                    "session %s: claimed as the worker stopped; lease %d not given back (it "
                    "lapses in %.1fs): %s",
                    session_id,
                    token,
                    self.lease_ttl,
                    exc,
                )
            else:
                log.info("session %s: claimed as the worker stopped; given back", session_id)

    async def _work_on(
        self,
        session_id: str,
        owner: str,
        token: int,
        stopping: Callable[[], bool] | None = None,
        give_backs: _GiveBacks | None = None,
        unsaved: list[str] | None = None,
    ) -> None:
        """Drive a claimed session; once `stopping()`, the turn in flight is finished, and a
        message queued behind it left to another worker (a subagent's parent its turn lets go
        on is left to the claims, stopping or not). A drive the store failed has its lease given
        back by `give_backs`, if given, unless this runtime keeps outcomes of the session the
        store refused: it keeps the lease and records them (`_record_kept`), naming in `unsaved`
        those it could not (given back, another worker would run them again). A subagent's it
        delegated to are recorded so within the drive, its lease held (`worker_drive`). So is
        given back the lease of a drive whose subagent has work for an agent this one lacks."""
        lost: list[int] = []
        try:
            kept = [] if unsaved is None else unsaved
            with parents_to_claims(), worker_drive(stopping or _running, kept):
                result = await self._drive(
                    session_id, claimed=(owner, token), on_lost=lost.append, stopping=stopping
                )
            if give_backs is not None:
                give_backs.worked(session_id)
            if lost:
                # The session's status now is the work of whoever took the turn over, not ours:
                # only the loss is said (`_drive` said nothing of it, as it was told).
                log.warning(lost_line(session_id, lost[-1]))
            elif result.status == "failed":  # recorded, for a person to retry: say why
                error = result.error or {}
                log.warning(
                    "session %s: failed (%s: %s)%s",
                    session_id,
                    error.get("code", "error"),
                    error.get("message", ""),
                    "; retryable" if result.retryable else "",
                )
            elif result.status == "running" and stopping is not None and stopping():
                # Its turn ended; "running" would read as if this worker still ran one.
                log.info(
                    "session %s: its turn is done; what is queued behind it is left to another "
                    "worker, the lease given back",
                    session_id,
                )
            else:
                log.info("session %s: %s", session_id, result.status)
        except SessionExpired:
            # Its TTL passed between the claim and the drive, which recorded that: not a failure.
            log.info("session %s: expired; its expiry is recorded", session_id)
        except Exception as exc:
            # The lease the failed pass kept, under its own owner: a later pass of the drive
            # (a queued message's turn) takes one of its own.
            owner, token = self._kept_on_error.pop(session_id, (owner, token))
            lapsed = session_id in self._kept_lapsing
            self._kept_lapsing.discard(session_id)
            if lost:  # then the session could not be read again: the loss is what happened
                log.warning(lost_line(session_id, lost[-1]))
                log.info("session %s: after its lease was lost: %s", session_id, exc)
                return
            if isinstance(exc, UnknownSession) and exc.session_id == session_id:
                # Deleted (a prune, past its TTL) once the lease lapsed: nothing left to drive.
                log.info("session %s: deleted while claimed; nothing to drive", session_id)
                return
            if give_backs is not None and isinstance(exc, StoreError):
                if unsaved is not None and self._unrecorded.of(session_id):
                    log.warning(
                        "session %s: the store failed the turn in the worker: %s", session_id, exc
                    )
                    await self._record_kept(
                        session_id, owner, unsaved, stopping or _running, lapsed=lapsed
                    )
                    give_backs.worked(session_id)
                    return
                if not isinstance(exc, StoreGone):  # else only a restart mends it
                    wait = give_backs.failed(session_id, owner, token)
                    log.warning(
                        "session %s: the store failed the turn in the worker; its lease given "
                        "back in %.1fs (once the store takes it): %s",
                        session_id,
                        wait,
                        exc,
                    )
                    return
            if give_backs is not None and isinstance(exc, UnknownAgent):
                # A subagent's work for an agent this worker lacks (a split deployment), which
                # no worker with it drives yet: not a bug. Given back, claimed again less often
                # each time, until a worker with that agent has run the subagent's work.
                wait = give_backs.failed(session_id, owner, token)
                log.warning(
                    "session %s: not driven here: %s (a subagent's work, left to a worker with "
                    "its agent); its lease given back in %.1fs",
                    session_id,
                    exc,
                    wait,
                )
                return
            # A bug, not the store: the lease is kept until it lapses, and any worker retries
            # the session after the TTL (given back, it was claimed again at once, in a loop).
            log.exception(
                "session %s: the turn failed in the worker; retried once its lease expires (%.1fs)",
                session_id,
                self.lease_ttl,
            )


def _running() -> bool:
    """`stopping` of a worker that is not told to stop."""
    return False
