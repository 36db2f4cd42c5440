"""`KeptOutcomes`: recording the tool outcomes the store refused, which this process keeps in
memory (`Unrecorded`), under the session's lease, so no other process runs those tools again: a
worker's drive's (`Workers._work_on`) and, in the background, an inline drive's (`_record_owed`)."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import Callable, Iterator

from ._child_closes import parents_to_claims
from ._exceptions import SessionExpired, StoreDamaged, StoreError, StoreGone, UnknownSession
from ._sweeping import Sweeps
from ._sync import UNWIND

__all__ = ["KEPT_RETRY", "RECORD_KEPT_WITHIN", "KeptOutcomes", "worker_drive"]

log = logging.getLogger("signoff.worker")
_inline_log = logging.getLogger("signoff.runtime")  # an inline drive's outcomes: not a worker's

KEPT_RETRY = 1.0  # seconds: the longest wait between tries to record an outcome kept

RECORD_KEPT_WITHIN = 60.0
"""Seconds a stopping worker keeps trying to record a session's tool outcomes that the store
refused (the database restarting, a full disk), kept in memory (`Unrecorded`), before it gives
them up as lost: it logs them as an error and fails (`signoff worker` exits 1). A second signal
stops it at once. A running worker tries until it records them, however long the store is down,
and gives up only this long after it is told to stop. It takes the session's lease again at each
try, and claims it no more: no other worker runs them again while that lease is live. One that
lapsed first (no renewal got through: a store frozen or hung past the TTL, not restarted)
another worker may take first, running the calls again with the same idempotency keys. A
runtime's `close` gives the outcomes its inline drives kept as long (`_record_before_close`)."""


_worker: contextvars.ContextVar[tuple[Callable[[], bool], list[str]] | None] = (
    contextvars.ContextVar("signoff_worker_drive", default=None)
)
"""A worker's `stopping` and `unsaved` (`_record_kept`'s), within its drive (`worker_drive`)."""


@contextlib.contextmanager
def worker_drive(stopping: Callable[[], bool], unsaved: list[str]) -> Iterator[None]:
    """Within, a worker drives a session it claimed, the tasks it starts (its tools') included:
    a subagent's outcomes the store refused are recorded in its drive, with its stop
    (`KeptOutcomes._kept_child`)."""
    reset = _worker.set((stopping, unsaved))
    try:
        yield
    finally:
        _worker.reset(reset)


class KeptOutcomes(Sweeps):
    """Records the outcomes kept in memory under the session's lease; `Workers` builds on it."""

    def _in_worker_drive(self) -> bool:
        """Whether this runs within a worker's drive (`worker_drive`), not a call's."""
        return _worker.get() is not None

    async def _kept_child(self, child: str, parent: str) -> bool:
        """A delegate call's subagent `child` kept its lease, owing outcomes the store refused:
        whether they were recorded, to drive the child again. A worker's drive (`worker_drive`)
        records them itself, with its stop (`_record_kept`), holding the parent's lease as it
        goes (its lease given back if it gives up); a call's fails at once, and they are
        recorded in the background, the parent's lease kept meanwhile (`_record_owed`)."""
        worker = _worker.get()
        if worker is None:
            self._record_owed(child, parent)
            return False
        stopping, unsaved = worker
        given_up = len(unsaved)
        owner = self._kept_on_error[child][0]
        lapsed = child in self._kept_lapsing
        await self._record_kept(child, owner, unsaved, stopping, lapsed=lapsed)
        if len(unsaved) == given_up:
            return True
        kept = self._kept_on_error.pop(child, None)
        self._kept_lapsing.discard(child)
        if kept is not None:
            with contextlib.suppress(StoreError):  # kept in `_unreleased` for later
                await self._release(child, *kept)
        return False

    def _record_owed(self, session_id: str, parent: str | None = None) -> None:
        """Record, in the background, the outcomes the store refused to an inline drive of the
        session, which kept its lease (`_kept_on_error`) for that: `_record_kept`, as a worker
        does, until `close` (`_record_before_close`). One recording them already takes that
        lease at its next try. Its drive goes on with the turn, as the call's would have. A
        subagent's `parent`, whose drive keeps its lease too, goes on once it is recorded
        (`_after_below`)."""
        if parent is not None:  # its parent's drive keeps its lease meanwhile (`_owed_below`)
            self._owed_for[session_id] = parent
        running = self._recorders.get(session_id)
        if running is not None and not running.done():
            return
        recording = self._record_inline(session_id, self._kept_on_error[session_id][0])
        # Not in the failed call's context (its turn, its tool's task): a drive of its own.
        task = asyncio.create_task(recording, context=contextvars.Context())
        self._recorders[session_id] = task

        def done(task: asyncio.Task[None]) -> None:
            if self._recorders.get(session_id) is task:
                del self._recorders[session_id]
                self._owed_for.pop(session_id, None)

        task.add_done_callback(done)

    async def _record_inline(self, session_id: str, owner: str) -> None:
        """`_record_kept` for `_record_owed`; once nothing is owed but it was not recorded
        (given up at `close`, a bug), the lease its last try kept is given back, not left to
        lapse."""
        try:
            owner = await self._after_below(session_id, owner)
            lapsed = session_id in self._kept_lapsing
            await self._record_kept(
                session_id, owner, [], lambda: self._closing > 0, lapsed=lapsed, inline=True
            )
        finally:
            kept = self._kept_on_error.get(session_id)
            if kept is not None and not self._unrecorded.of(session_id):
                del self._kept_on_error[session_id]
                self._kept_lapsing.discard(session_id)
                with contextlib.suppress(StoreError):  # kept in `_unreleased` for later
                    await self._release(session_id, *kept)

    async def _after_below(self, session_id: str, owner: str) -> str:
        """For a drive that kept its lease while subagents it delegated to owe outcomes: once
        their recordings end, go on with its turn under that lease, as its call would have.
        Returns the owner the lease is kept under, if kept (a drive failing again)."""
        self._driving[session_id] += 1  # this process's claims and sweeps leave it alone
        try:
            while below := self._owed_below(session_id):
                await self._keep_while(session_id, below)
                if self._closing:  # given up at `close`: its lease is given back, no drive begun
                    return owner
                kept = self._kept_on_error.pop(session_id, None)
                owner = owner if kept is None else kept[0]
                self._kept_lapsing.discard(session_id)
                try:
                    token = await self._try_acquire(session_id, owner)  # ours: taken again
                except StoreError as exc:  # given back as kept (`_record_inline`), not to lapse
                    if kept is not None:
                        self._kept_on_error[session_id] = kept
                    _inline_log.warning("session %s: its turn did not go on: %s", session_id, exc)
                    return owner
                if token is None:  # lapsed, and another drive took it
                    self._let_go(session_id, owner)
                    return owner
                try:
                    await self._drive(session_id, claimed=(owner, token))
                except StoreError as exc:  # kept if a subagent owes again (`_record_kept` else)
                    _inline_log.warning(
                        "session %s: the store failed the turn: %s", session_id, exc
                    )
                except Exception:
                    _inline_log.exception("session %s: its turn did not go on", session_id)
                    return owner
                finally:
                    self._let_go(session_id, owner)
                owner = self._kept_on_error.get(session_id, (owner, 0))[0]
            return owner
        finally:
            self._undrive(session_id)

    async def _keep_while(self, session_id: str, below: list[asyncio.Task[None]]) -> None:
        """Wait for the recordings `below`, taking the session's kept lease again before it
        lapses (nothing else renews it meanwhile): else another process resumes the turn, and
        its delegate call waits on the subagent whose outcome is being recorded."""
        while True:
            _, left = await asyncio.wait(below, timeout=min(KEPT_RETRY, self.lease_ttl / 3))
            kept = self._kept_on_error.get(session_id)
            if not left or self._closing:
                return
            if kept is None:  # not kept (a bug): nothing to take again
                continue
            owner = kept[0]
            with contextlib.suppress(StoreError):  # tried again at the next wait
                token = await self._try_acquire(session_id, owner)
                if token is not None:
                    self._let_go(session_id, owner)
                    self._kept_on_error[session_id] = (owner, token)
                    self._kept_lapsing.discard(session_id)

    def _owes(self, session_id: str, task: asyncio.Task[None]) -> bool:
        """Whether a recorder still runs with outcomes of its session unrecorded."""
        return not task.done() and bool(self._unrecorded.of(session_id))

    async def _record_before_close(self) -> None:
        """At `close`, while the store is open: the background recordings of outcomes inline
        drives kept (`_record_owed`) try for `RECORD_KEPT_WITHIN` seconds more, then give up,
        as a stopping worker does, logging as an error what stayed unrecorded (lost with the
        process: the next drive of the session runs it again). One still under way then (a
        drive that goes on with the turn) is stopped, as a call is, and so is another loop's."""
        loop = asyncio.get_running_loop()
        recorders = dict(self._recorders)
        deadline = loop.time() + RECORD_KEPT_WITHIN + 2 * KEPT_RETRY
        # Each notices the close within a wait between tries, then gives up in time. Waited
        # for only while it owes: one that recorded what it owed and went on with the turn (a
        # model step, a slow tool) is stopped at once, as a call is. One a drive of theirs
        # started meanwhile (a subagent's outcome refused) is waited for too.
        while owing := [
            t for s, t in recorders.items() if t.get_loop() is loop and self._owes(s, t)
        ]:
            left = deadline - loop.time()
            if left <= 0:
                break
            await asyncio.wait(owing, timeout=min(left, 0.05))
            recorders.update(self._recorders)
        recorders.update(self._recorders)
        late = {t for t in recorders.values() if t.get_loop() is loop and not t.done()}
        for task in recorders.values():
            if task in late:
                task.cancel()
            elif task.get_loop() is not loop:
                with contextlib.suppress(RuntimeError):  # its loop closed: it runs no more
                    task.get_loop().call_soon_threadsafe(task.cancel)
        if late:
            await asyncio.wait(late, timeout=UNWIND)  # their drives give their leases back
        for session_id, task in recorders.items():
            owed = self._unrecorded.of(session_id)
            if owed and (task in late or task.get_loop() is not loop):
                _inline_log.error(
                    "session %s: the outcome of %s ran but is not recorded (the store refused "
                    "it, and the runtime closed while it was recorded); lost unless this process "
                    "drives the session again",
                    session_id,
                    ", ".join(owed),
                )

    async def _record_kept(
        self,
        session_id: str,
        owner: str,
        unsaved: list[str],
        stopping: Callable[[], bool] = lambda: True,
        *,
        lapsed: bool = False,
        inline: bool = False,
    ) -> None:
        """Drive the session again until the store records the tool outcomes this runtime keeps
        of it (`Unrecorded`: the drive records them instead of running the bodies), with
        backoff, its lease held meanwhile: each try takes it again before the last lapses, and
        this worker claims it no more, so no other worker runs those bodies again, unless the
        lease lapsed first (`lapsed`: the drive gave it up, no renewal getting through): then
        another worker may take the session first and run them again, as the log says. A
        running worker tries until they are recorded; once `stopping()`, for
        `RECORD_KEPT_WITHIN` seconds more. What it could not record is logged as an error and
        named in `unsaved`. For an `inline` drive's (`_record_owed`) the same, until the
        runtime closes; its drives go on with the turn as the call's would have, a subagent's
        parent included (a worker leaves that to its claims)."""
        kept = self._unrecorded
        ran = ", ".join(kept.of(session_id))
        if not ran:
            return
        say = _inline_log if inline else log
        ends, ending, other = (
            ("the runtime closes", "closing", "process")
            if inline
            else ("the worker stops", "stopping", "worker")
        )
        deadline: float | None = None
        lapse = (
            f"; its lease lapsed (no renewal got through): another {other} may take the session "
            "first and run the call again, with the same idempotency key"
        )
        if stopping():
            deadline = time.monotonic() + RECORD_KEPT_WITHIN
            say.warning(
                "session %s: the store refused the outcome of %s, which ran; recording it "
                "before %s (trying for %.0fs)%s",
                session_id,
                ran,
                ends,
                RECORD_KEPT_WITHIN,
                lapse if lapsed else "",
            )
        else:
            say.warning(
                "session %s: the store refused the outcome of %s, which ran; the session is "
                "driven again until the outcome is recorded%s",
                session_id,
                ran,
                lapse if lapsed else ", its lease kept",
            )
        delay = 0.05
        self._driving[session_id] += 1  # this worker's claims leave it to this loop
        try:
            while True:
                token: int | None = None
                # A try whose drive failed in a later pass left the lease under that pass's owner.
                owner = self._kept_on_error.pop(session_id, (owner, 0))[0]
                self._kept_lapsing.discard(session_id)
                try:
                    token = await self._try_acquire(session_id, owner)  # ours: taken again
                    if token is None:  # another drive holds it: one here records them too
                        why = "another drive holds the session's lease"
                    else:
                        with (
                            contextlib.nullcontext() if inline else parents_to_claims(),
                            contextlib.nullcontext() if inline else worker_drive(stopping, unsaved),
                        ):
                            result = await self._drive(
                                session_id, claimed=(owner, token), stopping=stopping
                            )
                        if not kept.of(session_id):
                            say.info(
                                "session %s: the outcome of %s recorded (not run again); %s",
                                session_id,
                                ran,
                                result.status,
                            )
                            return
                        if result.status == "waiting":
                            # Parked on a person, its call maybe still open (a body asked a
                            # question after a step refused): not forgotten, or the drive going
                            # on with it once answered would run that step again.
                            say.warning(
                                "session %s: the turn waits on a person; the outcome kept of %s "
                                "is recorded by the drive here that goes on with it, if its "
                                "call is still open (lost if this process ends first)",
                                session_id,
                                ran,
                            )
                            return
                        # Recorded after all by the commit whose answer was lost, or the call
                        # ended otherwise (its turn cancelled, the session taken over).
                        say.warning(
                            "session %s: the outcome kept of %s is not needed (the session went "
                            "on past the call); %s",
                            session_id,
                            ", ".join(kept.forget(session_id)),
                            result.status,
                        )
                        return
                except (SessionExpired, UnknownSession) as exc:  # over: nothing runs it again
                    kept.forget(session_id)
                    say.warning("session %s: the outcome kept is not needed: %s", session_id, exc)
                    return
                except (StoreGone, StoreDamaged) as exc:  # only a restart (or a repair) mends it
                    why = str(exc)
                    break
                except StoreError as exc:  # the database still down, say: tried again
                    why = str(exc)
                    if token is not None and not kept.of(session_id):
                        # Recorded, then the store failed the turn after it: given back, as the
                        # lease of any drive the store failed (else it lapses).
                        say.warning(
                            "session %s: the outcome of %s recorded (not run again); then the "
                            "store failed the turn: %s",
                            session_id,
                            ran,
                            exc,
                        )
                        with contextlib.suppress(StoreError):  # kept in `_unreleased` for later
                            await self._release(session_id, owner, token)
                        return
                    say.debug("session %s: recording the outcome kept failed: %s", session_id, exc)
                except Exception as exc:  # a bug: not retried
                    why = f"{type(exc).__name__}: {exc}"
                    break
                finally:
                    self._let_go(session_id, owner)
                if not kept.of(session_id):  # recorded by that other drive here
                    return
                if deadline is None and stopping():
                    deadline = time.monotonic() + RECORD_KEPT_WITHIN
                    say.warning(
                        "session %s: the %s is %s; recording the outcome of %s is tried for "
                        "%.0fs more",
                        session_id,
                        "runtime" if inline else "worker",
                        ending,
                        ran,
                        RECORD_KEPT_WITHIN,
                    )
                if deadline is not None and time.monotonic() + delay >= deadline:
                    break
                await asyncio.sleep(delay)
                # Each try takes the lease again: tried before it lapses, while the store works.
                delay = min(delay * 2, KEPT_RETRY, self.lease_ttl / 3)
        finally:
            self._driving[session_id] -= 1
            if not self._driving[session_id]:
                del self._driving[session_id]
        names = kept.forget(session_id)
        if not names:  # recorded, then the turn failed otherwise
            say.error("session %s: the outcome of %s recorded; then: %s", session_id, ran, why)
            return
        unsaved.extend(f"{name} in session {session_id}" for name in names)
        say.error(
            "session %s: the outcome of %s ran but could not be recorded (%s): lost, and run "
            "again by the next drive of the session",
            session_id,
            ", ".join(names),
            why,
        )
