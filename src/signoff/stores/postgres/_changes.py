"""Waiting for changes on PostgreSQL: one connection per store and event loop LISTENs to the
`NOTIFY` every commit sends, and wakes the calls waiting on the session it names, so a wait needs
no polling of its own; one read of all followed sessions' heads per `poll_interval` is the safety
net against a lost notification, whatever the number of waits."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING

import psycopg

from ..._exceptions import StoreError, UnknownSession
from ._borrowed import sever

if TYPE_CHECKING:
    from ._connections import Conn

__all__ = ["CHECK_EVERY", "CHECK_WITHIN", "Listener"]

CHECK_EVERY = 10.0
"""Seconds between checks that the LISTEN connection still answers. A check also keeps it from
being ended by an `idle_session_timeout` longer than this."""

CHECK_WITHIN = 5.0
"""Seconds the LISTEN connection has to answer a check before it is given up for a new one."""


class Listener:
    """A store's LISTEN connection, kept open by a task of its own, and the calls waiting for a
    change it may announce."""

    def __init__(self, channel: str, connect: Callable[[], Awaitable[Conn]], name: str) -> None:
        self.channel = channel
        self._connect = connect
        self._name = name
        self._listener: asyncio.Task[None] | None = None
        self._listening = asyncio.Event()
        self._waiters: dict[str | None, set[asyncio.Future[bool]]] = {}
        # The waits given `after`, by the session and head they wait past, re-checked together
        # (`_rechecking`) by one task that runs while there are any.
        self._follows: dict[asyncio.Future[bool], tuple[str, int]] = {}
        self._recheck: asyncio.Task[None] | None = None
        self._recheck_every = 1.0
        # Changes announced so far (and reconnects, which may have missed some): a caller that
        # read it before its last look at the store waits only if nothing was announced since.
        self.seen = 0
        self.check_every = CHECK_EVERY
        self.check_within = CHECK_WITHIN

    async def wait(
        self,
        session_id: str | None,
        timeout: float,
        *,
        after: int | None,
        head: Callable[[str], Awaitable[int | None]],
        heads: Callable[[list[str]], Awaitable[dict[str, int]]],
        subscribe_within: float,
        poll_interval: float,
        since: int | None = None,
    ) -> bool:
        """`PostgresStore.wait_for_change`, given how to read a session's `head` (and many
        sessions' `heads` at once, for the shared re-check), how long the first wait lets the
        listener take to subscribe, and how often to re-check the heads; with `since` (a `seen`
        read earlier), it returns at once if anything was announced since then."""
        deadline = time.monotonic() + timeout  # the first wait's subscribing counts in it too
        self._ensure_listener()
        if not self._listening.is_set():
            # The first wait: let the listener subscribe first, so no change slips past it.
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow the caller's
            # cancellation, which left a cancelled ChannelHub waiting here for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(subscribe_within):
                    await self._listening.wait()
        following = after is not None and session_id is not None
        loop = asyncio.get_running_loop()
        while True:
            # Registered before the head is read: a change announced meanwhile is not missed.
            fut: asyncio.Future[bool] = loop.create_future()
            waiters = self._waiters.setdefault(session_id, set())
            waiters.add(fut)
            if following:
                assert session_id is not None and after is not None
                self._follows[fut] = (session_id, after)
                self._ensure_recheck(heads, poll_interval)
            try:
                if since is not None and self.seen != since:
                    return True  # announced while the caller was busy: no wait, nothing missed
                if following:
                    assert session_id is not None and after is not None
                    found = await head(session_id)
                    if found is None:
                        raise UnknownSession(session_id)
                    if found != after:  # past it, or behind it: the store lost what was read
                        return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                try:
                    async with asyncio.timeout(remaining):
                        if await asyncio.shield(fut):
                            return True
                except TimeoutError:
                    return False
                # The shared re-check could not vouch for this session: read its head again.
            finally:
                self._follows.pop(fut, None)
                waiters.discard(fut)
                if not waiters:
                    self._waiters.pop(session_id, None)

    def _ensure_recheck(
        self, heads: Callable[[list[str]], Awaitable[dict[str, int]]], every: float
    ) -> None:
        self._recheck_every = every
        if self._recheck is None or self._recheck.done():
            name = f"{self._name}-recheck"
            self._recheck = asyncio.get_running_loop().create_task(
                self._rechecking(heads), name=name
            )

    async def _rechecking(self, heads: Callable[[list[str]], Awaitable[dict[str, int]]]) -> None:
        """The safety net against a lost notification, shared by every wait given `after`: each
        `poll_interval`, one read of all their sessions' heads wakes those whose head moved on
        (or back: a server that crashed may lose the last commits its followers read).
        A session not found, or a failed read, has each of its waits read its own head again
        (which raises what it always did: `UnknownSession`, a `StoreError`)."""
        try:
            while self._follows:
                await asyncio.sleep(self._recheck_every)
                follows = [(f, w) for f, w in self._follows.items() if not f.done()]
                if not follows:
                    continue
                try:
                    found = await heads(sorted({sid for _, (sid, _) in follows}))
                except StoreError:
                    found = {}
                for fut, (sid, after) in follows:
                    seq = found.get(sid)
                    if not fut.done() and (seq is None or seq != after):
                        fut.set_result(seq is not None)
        except asyncio.CancelledError:
            raise  # stopped: `stop` wakes every wait
        except BaseException:
            for fut in self._follows:  # no wait may be left counting on a re-check that failed
                if not fut.done():
                    fut.set_result(False)
            raise

    async def stop(self) -> None:
        """Stop listening, and wake every call still waiting (the store is closing)."""
        listener, self._listener = self._listener, None
        recheck, self._recheck = self._recheck, None
        for task in (listener, recheck):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._listening.clear()
        self._wake_all()

    def _ensure_listener(self) -> None:
        if self._listener is None or self._listener.done():
            self._listener = asyncio.get_running_loop().create_task(self._listen(), name=self._name)

    async def _listen(self) -> None:
        """Keep one connection LISTENing; on reconnect, wake everyone: they may have missed some."""
        delay = 0.1
        while True:
            try:
                conn = await self._connect()
            except StoreError:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            try:
                await conn.execute(f'LISTEN "{self.channel}"')
                self._listening.set()
                self._wake_all()
                delay = 0.1
                async for note in self._notes(conn):
                    sid, _, _seq = note.rpartition(" ")
                    self._wake(sid)
            except (psycopg.Error, TimeoutError):  # lost, or gone silent
                pass
            finally:
                self._listening.clear()
                with contextlib.suppress(Exception):
                    await conn.close()
            # Backing off here too: a server that refuses LISTEN (a hot standby) would otherwise
            # get a new connection ten times a second from every process.
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)

    async def _notes(self, conn: Conn) -> AsyncIterator[str]:
        """The notifications `conn` receives. Every `check_every` seconds it must answer a
        query within `check_within`: a connection whose network went silent fails no read, and
        would leave every wait on it unwoken for ever. Past `check_within` it is cut under the
        check (`sever`), which fails at once: cancelling the check instead had psycopg wait 5 s
        more for the server to end a query it never received."""
        while True:
            async for note in conn.notifies(timeout=self.check_every):
                yield note.payload
            timer = asyncio.get_running_loop().call_later(self.check_within, sever, conn)
            try:
                await conn.execute("SELECT 1")
            finally:
                timer.cancel()

    def _wake(self, session_id: str) -> None:
        self.seen += 1
        for key in (session_id, None):
            for fut in self._waiters.get(key, ()):
                if not fut.done():
                    fut.set_result(True)

    def _wake_all(self) -> None:
        self.seen += 1
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_result(True)
