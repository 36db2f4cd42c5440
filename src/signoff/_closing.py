"""`Closing`: how a runtime closes: the calls it still runs are stopped, the leases they and its
stopped workers hold are given back (or left to lapse after a bound), then the store is closed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from ._any_loop import blocked
from ._exceptions import StoreError
from ._leasing import Leasing
from ._sync import UNWIND, SyncBridge

__all__ = ["ANSWER_WAIT", "Closing"]

log = logging.getLogger("signoff.runtime")

ANSWER_WAIT = 0.5
"""Seconds `close` waits for a claim a stopped worker left on its way, to give its leases back:
one held up longer (a locked file, the server down) holds up no stop; its leases lapse."""


class Closing(Leasing):
    """The close half of `SessionCache`, which sets these attributes (`SessionCache._fresh`)."""

    _sync: SyncBridge  # runs the `*_sync` twins' calls, and `close_sync`'s close, on its loop
    _per_session: threading.Lock  # guards the call and close counts below
    # This runtime's async calls running, by task, and those of them `close` cancelled.
    _calls: dict[asyncio.Task[Any], int]
    _stopped: dict[asyncio.Task[Any], bool]
    _closing: int  # closes under way: no call begins meanwhile (`_entered`)
    _closes: int  # closes begun: a follower begun before one stops (`since_close`)
    # Give-backs of the leases of claims a stopped worker did not wait for (`Workers`).
    _unanswered: set[asyncio.Task[None]]
    _opened: bool

    async def close(self) -> None:
        """Close the store; a later call opens it again. A call of this runtime still running
        (a `*_sync` call in another thread, an async one on another task, a follower of
        `events`) is stopped first: its lease given back, it raises `UsageError`; a follower
        whose caller is busy with an event raises it at its next step."""
        with self._closing_now():
            self._sync.stop_calls()  # `*_sync` calls in other threads first: see `close_sync`
            await self._close_store()
            self._sync.close()

    @contextlib.contextmanager
    def _closing_now(self) -> Iterator[None]:
        """Refuse the calls begun while a close is under way (`_entered`); once it has
        returned, a call opens the store again."""
        with self._per_session:
            self._closing += 1
            self._closes += 1
        try:
            yield
        finally:
            with self._per_session:
                self._closing -= 1

    async def _close_store(self) -> None:
        """`close` but for the sync bridge, which `close_sync` runs this on: leases the store
        refused to take back are given back, then the store is closed."""
        await self._stop_async_calls()
        await self._record_before_close()
        await self._given_back()
        await self._stop_lease_check()
        for session_id, (owner, token) in list(self._unreleased.items()):
            with contextlib.suppress(StoreError):  # else it lapses after its TTL
                await self._release(session_id, owner, token)
        await self.store.close()
        self._opened = False

    async def _record_before_close(self) -> None:
        """Record the outcomes inline drives kept, before the store closes (`KeptOutcomes`)."""

    async def _given_back(self) -> None:
        """Wait (up to `UNWIND`) for the give-backs of leases that answers settling past their
        call asked for (`_give_back_after`), and (up to `ANSWER_WAIT`) for those of claims a
        stopped worker left on their way, while the store is still open; another loop's, and
        those still waiting then, are cancelled, their leases left to lapse: none runs on a
        closed store."""
        loop = asyncio.get_running_loop()
        for tasks, within in ((self._unanswered, ANSWER_WAIT), (self._giving_back, UNWIND)):
            mine = [task for task in tasks if task.get_loop() is loop]
            for task in tasks - set(mine):
                with contextlib.suppress(RuntimeError):  # its loop closed: it runs no more
                    task.get_loop().call_soon_threadsafe(task.cancel)
            if mine:
                _, late = await asyncio.wait(mine, timeout=within)
                for task in late:
                    task.cancel()
                if late and tasks is self._unanswered:
                    log.warning(
                        "%d claim(s) of a stopped worker still unanswered at close: the sessions "
                        "they took stay leased until their lease TTL passes",
                        len(late),
                    )

    async def _stop_async_calls(self) -> None:
        """Cancel this runtime's calls still running on other tasks (`closes_stop`), on any
        loop, and wait (up to `UNWIND`) for them to unwind, giving their leases back, while the
        store is still open. A loop blocked in the `*_sync` call closing it is not waited for:
        its calls unwind once that call returns."""
        here = asyncio.current_task()
        with self._per_session:
            calls = [t for t in self._calls if t is not here and not t.done()]
            self._stopped.update(dict.fromkeys(calls, True))
        loop = asyncio.get_running_loop()
        awaited: list[asyncio.Task[Any]] = []  # this loop's, and other running loops'
        for task in calls:
            there = task.get_loop()
            if there is loop:
                task.cancel()
                awaited.append(task)
                continue
            with contextlib.suppress(RuntimeError):  # a closed loop runs it no more
                there.call_soon_threadsafe(task.cancel)
                if there.is_running() and not blocked(there):
                    awaited.append(task)
        until = time.monotonic() + UNWIND
        while any(not t.done() for t in awaited) and time.monotonic() < until:
            await asyncio.sleep(0.005)  # polled: another loop's task cannot wake this one
