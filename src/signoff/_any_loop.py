"""A lock and an event that tasks of several event loops, in several threads, may share.

A runtime's async calls run on the app's loop while its `*_sync` twins run on the runtime's
bridge loop, in another thread (`_sync`): both use one session's lock (`Driver.record`) and abort
signal (`ToolContext.abort_signal`). asyncio's own bind to the first loop that waits on them:
another loop's task is then refused ("bound to a different event loop"), and a release or `set`
made on the other loop's thread completes a waiter's future without waking its loop, which may
sleep on for ever. Here each waiter is woken on its own loop (`call_soon_threadsafe`), and the
state is guarded by a thread lock held only for a few statements, never across an await.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Iterator
from typing import Literal

from ._exceptions import UsageError

__all__ = ["AnyLoopEvent", "AnyLoopLock", "blocked", "blocking", "waited_by"]

_blocked: dict[asyncio.AbstractEventLoop, int] = {}
_waited_by: dict[asyncio.Task[object], asyncio.AbstractEventLoop] = {}
# Locks left free with their waiters queued, as each waiter's loop was blocked: handed on to
# them once the loop runs again (`blocking`'s end).
_parked: dict[asyncio.AbstractEventLoop, set[AnyLoopLock]] = {}
_blocked_guard = threading.Lock()
DEADLOCK = (
    "a *_sync call made from async code needs the session's lock, which a task of the event "
    "loop that call blocks holds: it would wait for ever; await the async method instead"
)


def blocked(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether `loop`'s thread is blocked in a `*_sync` call (made from code that loop runs, a
    notebook's say): nothing runs on it until that call returns, so what is sent there to run
    (`call_soon_threadsafe`) runs after, and waiting for it from the call would be in vain."""
    with _blocked_guard:
        return loop in _blocked


@contextlib.contextmanager
def blocking() -> Iterator[asyncio.AbstractEventLoop | None]:
    """Mark the calling thread's running loop, if any, `blocked` while the block runs; the
    loop (None from plain code)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # plain code: no loop to mark
        yield None
        return
    with _blocked_guard:
        _blocked[loop] = _blocked.get(loop, 0) + 1
    try:
        yield loop
    finally:
        parked: set[AnyLoopLock] = set()
        with _blocked_guard:
            if _blocked[loop] == 1:
                del _blocked[loop]
                parked = _parked.pop(loop, parked)
            else:
                _blocked[loop] -= 1
        for lock in parked:
            lock._unpark()


@contextlib.contextmanager
def waited_by(loop: asyncio.AbstractEventLoop | None) -> Iterator[None]:
    """Mark the running task as the one a `*_sync` call made on `loop` (None: from plain code)
    waits for, blocking it: a lock a task of `loop` holds would never be released to it."""
    task = asyncio.current_task()
    if loop is None or task is None:
        yield
        return
    with _blocked_guard:
        _waited_by[task] = loop
    try:
        yield
    finally:
        with _blocked_guard:
            _waited_by.pop(task, None)


def _wake(fut: asyncio.Future[None]) -> bool:
    """Complete `fut` from any thread, on its loop; False if it cannot be woken (its loop is
    closed): nothing awaits it any more."""
    loop = fut.get_loop()
    try:
        running: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if loop is running:
        if not fut.done():
            fut.set_result(None)
        return True
    try:
        loop.call_soon_threadsafe(_settle, fut)
    except RuntimeError:  # its loop was closed
        return False
    return True


def _settle(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class AnyLoopLock:
    """An `asyncio.Lock` any loop's tasks may share: first come, first served, save that a
    waiter whose loop is blocked in a `*_sync` call lets those behind it go first; the lock is
    handed to the next waiter on release, on that waiter's loop. Not reentrant."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locked = False
        self._holder: asyncio.AbstractEventLoop | None = None  # the loop of the task holding it
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def locked(self) -> bool:
        return self._locked

    async def acquire(self) -> Literal[True]:
        loop = asyncio.get_running_loop()
        with self._guard:
            if not self._locked:
                self._locked, self._holder = True, loop
                return True
            holder = self._holder
            if holder is not loop and holder is not None:
                with _blocked_guard:
                    deadlock = _waited_by.get(asyncio.current_task()) is holder  # type: ignore[arg-type]
                if deadlock:
                    raise UsageError(DEADLOCK)
            fut: asyncio.Future[None] = loop.create_future()
            self._waiters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            with self._guard:
                try:
                    self._waiters.remove(fut)
                    handed = False
                except ValueError:
                    handed = True  # `release` handed the lock to this waiter meanwhile
            if handed:
                self.release()  # pass it on: this task gave up on it
            raise
        return True

    def _next(self) -> asyncio.Future[None] | None:
        """The first waiter whose loop is not `blocked`; None if every waiter's is, the lock
        then parked until one of those loops runs again (`blocking`). Handed the lock, a waiter
        of a loop blocked in a `*_sync` call could not run before that call returned, and that
        call may be what waits behind it, to take the lock now or again after one commit of
        its own. Passed over, a waiter keeps its place."""
        with _blocked_guard:
            for fut in self._waiters:
                if fut.get_loop() not in _blocked:
                    return fut
            for fut in self._waiters:
                _parked.setdefault(fut.get_loop(), set()).add(self)
        return None

    def release(self) -> None:
        """Hand the lock to the next waiter whose loop can still run it (`_next`), or free it."""
        if not self._locked:
            raise RuntimeError("Lock is not acquired.")
        self._hand_on()

    def _hand_on(self) -> None:
        """Give the held lock to the next waiter that can run (`_next`), or free it (its
        waiters left queued while their loops are blocked)."""
        while True:
            with self._guard:
                fut = self._next() if self._waiters else None
                if fut is None:
                    self._locked, self._holder = False, None
                    return
                self._waiters.remove(fut)  # handed over: it stays locked
                self._holder = fut.get_loop()
            if _wake(fut):
                return

    def _unpark(self) -> None:
        """A loop that blocked every waiter runs again: a lock left free meanwhile goes on to
        the next waiter (one taken meanwhile is handed on by its release)."""
        with self._guard:
            if self._locked or not self._waiters:
                return
            self._locked = True  # taken on the waiters' behalf, and handed on at once
        self._hand_on()

    async def __aenter__(self) -> None:
        await self.acquire()

    async def __aexit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        state = "locked" if self._locked else "unlocked"
        return f"<AnyLoopLock [{state}, waiters:{len(self._waiters)}]>"


class AnyLoopEvent(asyncio.Event):
    """An `asyncio.Event` any loop's tasks may wait on and any thread may set: each waiter is
    woken on its own loop."""

    def __init__(self) -> None:
        super().__init__()
        self._guard = threading.Lock()
        self._waiting: set[asyncio.Future[None]] = set()
        self._on = False  # asyncio.Event's own flag is left unused

    def is_set(self) -> bool:
        return self._on

    async def wait(self) -> Literal[True]:
        loop = asyncio.get_running_loop()
        with self._guard:
            if self._on:
                return True
            fut: asyncio.Future[None] = loop.create_future()
            self._waiting.add(fut)
        try:
            await fut
        finally:
            with self._guard:
                self._waiting.discard(fut)
        return True

    def set(self) -> None:
        with self._guard:
            if self._on:
                return
            self._on = True
            waiting = list(self._waiting)
        for fut in waiting:
            _wake(fut)

    def clear(self) -> None:
        with self._guard:
            self._on = False

    def __repr__(self) -> str:
        state = "set" if self.is_set() else "unset"
        return f"<AnyLoopEvent [{state}, waiters:{len(self._waiting)}]>"
