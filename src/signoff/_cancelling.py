"""`Cancelling`: `Runtime.cancel`, which stops a session's turn, withdraws its open requests and
cancels the subagents it waits on, retrying when the turn moves under it."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING, cast

from . import _child_sessions
from ._answers import checked_cancel
from ._call_guards import closes_stop
from ._cancel_batch import CancelBatch
from ._cancellation import expiring, stop_calls
from ._deletion import Deletion
from ._exceptions import RequestClosed, SessionBusy, SessionExpired, UnknownSession
from ._mirrors import following_mirrors
from ._recording import TurnStopped, load_turn
from ._results import GenerateResult
from ._session_cache import check_session_id
from ._state import turn_over
from ._types import Principal

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = ["Cancelling"]


class Cancelling(Deletion):
    """Cancels turns; `Runtime` builds on it."""

    @closes_stop
    @following_mirrors
    async def cancel(
        self,
        session_id: str,
        reason: str | None = None,
        *,
        principal: Principal | None = None,
        turn_id: str | None = None,
    ) -> GenerateResult:
        """Cancel the running or waiting turn, or one a retry could resume (it failed on a
        model error, say); its open requests are withdrawn. `principal`, who cancels, is
        recorded with the cancellation (in the audited `turn.cancelled`). With `turn_id`, only
        that turn is cancelled: once another has started, the session is reported as it is,
        nothing cancelled (a cancel sent again, or from a page shown before, stops no later
        turn); the result's `cancelled` says whether this call cancelled the turn it reports.
        Passed deadlines of the turn it cancels (its subagents' behind its mirrors too) are
        recorded with the cancel, in its commit: their requests read expired, and the turn one
        resumed is never left runnable in between (the call it approved never runs).
        A session past its TTL raises `SessionExpired`, as every call does; one whose turn a
        live drive runs on past it (a tool slower than the TTL) is not idle, so not past it:
        that turn is cancelled."""
        await self.open()
        rt = cast("Runtime", self)  # `_child_sessions` works on the whole runtime
        principal, by = checked_cancel(reason, turn_id, principal)
        check_session_id(session_id)  # before it is looked up: a list is no key
        # A delegated turn a passed TTL above it ends: no one's activity, nor its subagents'.
        expiry = session_id in expiring.get()
        began: tuple[str, int] | None = None  # the turn to cancel: not one that followed it
        for _ in range(20):
            state = await self._state(session_id)
            if state.expired(self.now()):
                # Records what the TTL left unfinished, and raises; unless a live drive runs
                # the turn on, which is then cancelled as any running turn is.
                await self._expire(state)
            turn = state.turn
            if began is not None and (turn is None or turn.id != began[0]):  # ended meanwhile
                return self._earlier_result(state, await load_turn(self.store, session_id, *began))
            if turn_id is not None and (turn is None or turn.id != turn_id):
                return self._result(state)  # not (or no longer) the session's turn
            if turn is None or turn_over(turn):
                if turn is not None and turn.status == "cancelled":
                    # A cancel that died before reaching the turn's subagents: finish it.
                    for child in _child_sessions.delegated(state):
                        with contextlib.suppress(UnknownSession):
                            await _child_sessions.cancel_orphan(rt, await self._state(child))
                # And one that died before counting what they spent, or the rest of a child
                # whose call counted it short of a grandchild (any turn's end leaves that).
                if await _child_sessions.count_owed(rt, await self._state(session_id)):
                    state = await self._state(session_id)
                return self._result(state)
            began = (turn.id, turn.first_seq)
            # Children its calls created and did not journal (their process died in between):
            # the cancel owes and cancels them as it does the journaled ones.
            made = [c for c in _child_sessions.unjournaled(state) if await self.store.head(c)]
            # Passed deadlines, as any call records them (their requests, and the mirrors of
            # its subagents' they closed, read expired, not withdrawn), in the cancel's own
            # commit: none before it leaves the turn a deadline resumed runnable, for a worker
            # to claim or a crash to leave, and the call a deadline approved never runs.
            build = await CancelBatch.of(self, state, reason, by, made, expiry=expiry)
            # Only where the session's agent is: else refused (`UnknownAgent`), nothing recorded.
            driver = self._driver(state, None)
            try:
                recorded = await driver.record(build, durable=True)
            except RequestClosed:
                self._cache.pop(session_id, None)
                if build.built_on is not None:  # rows changed behind the log's back: no retry
                    await self._rows_agree(session_id, build.built_on, build.resolves())
                continue
            except TurnStopped:
                self._cache.pop(session_id, None)
                continue
            if not recorded:  # the turn ended meanwhile: report it as it is now
                self._cache.pop(session_id, None)
                continue
            self._remember(driver.state)
            # Only once recorded: a cancel the store refused leaves the turn, and its calls, going.
            abort = self._aborts.pop(session_id, None)
            if abort is not None:
                stop_calls(abort)
            kids = dict.fromkeys([*_child_sessions.children(build.withdrawn), *build.delegated])
            reset = expiring.set(expiring.get() | (set(kids) if expiry else set()))
            try:
                for child in kids:  # subagents under this turn: waiting on a person, or running
                    with contextlib.suppress(UnknownSession, SessionExpired):
                        await _child_sessions.cancel_delegated(
                            rt, session_id, child, reason, principal
                        )
            finally:
                expiring.reset(reset)
            await build.keep_late(self, session_id)
            # A subagent cancelled on its own: its parent's delegate call goes on.
            await _child_sessions.after_close(rt, driver.state)
            return dataclasses.replace(await self._after_cancel(driver.state), cancelled=True)
        raise SessionBusy(f"could not cancel session {session_id!r}", session_id)
