"""The SQLite store's transactions and its lock: the `BEGIN IMMEDIATE` transaction every write
runs in, SQLite's failures said as store errors naming the file, and the decorators that run a
store call whole under the store's lock (`serialised`), a read checked like a write (`reading`).

A write whose file another connection is writing does not wait inside SQLite, which would hold
the event loop (and every other task on it) for up to the busy timeout: `serialised` gives the
lock back and sleeps on the loop, then runs the call again from its start."""

from __future__ import annotations

import asyncio
import functools
import sqlite3
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

from ..._exceptions import StoreBusy, StoreError, UsageError, unwritten
from .._prompt import REQUEST_WAIT, is_prompt, wrote

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = [
    "Contended",
    "damaged",
    "failed",
    "immediate",
    "reading",
    "serialised",
    "waiting_for_lock",
]

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound="Connection")


_FIRST_PAUSE = 0.001
_LONGEST_PAUSE = 0.025
"""Seconds a write turned back by another connection's lock sleeps before it tries again:
doubling from the first to the longest, about as SQLite's own busy handler does."""

# Set by `serialised` to the busy timeout in milliseconds, restored after `BEGIN IMMEDIATE` finds
# the file free: a write under it never waits in SQLite for the lock, it raises `Contended`.
_WAITS_OUTSIDE: ContextVar[int | None] = ContextVar("signoff_sqlite_waits_outside", default=None)


_LOCK_WAITS: set[object] = set()
"""A token of each store call of this process, on any thread, that waits for a lock another
connection holds (`serialised`)."""


def waiting_for_lock() -> bool:
    """Whether a store call of this process waits for a lock another connection holds: a
    command that is to stop at once may give up such a write (`signoff.cli`'s Ctrl-C)."""
    return bool(_LOCK_WAITS)


class Contended(Exception):
    """`BEGIN IMMEDIATE` found the file's write lock held by another connection: nothing of the
    call was written, and `serialised` runs it again once the lock may be free."""

    def __init__(self, error: sqlite3.Error) -> None:
        super().__init__(str(error))
        self.error = error


@contextmanager
def immediate(conn: sqlite3.Connection, check: Callable[[], None], path: str) -> Iterator[None]:
    """One `BEGIN IMMEDIATE` transaction, after which `check` may still refuse it. A failure of
    SQLite itself (a full disk, a damaged file) is a `StoreError` naming the file at `path`; a
    constraint violation is left to the caller, which knows what it means. Inside `serialised`,
    a lock held elsewhere is `Contended` (the call waits for it on the event loop); elsewhere
    (a store's set-up as it opens) SQLite waits for it the busy timeout, in a thread: that wait
    counts as one for `waiting_for_lock`, so a Ctrl-C then ends the command at once, the
    transaction never begun (an upgrade interrupted so committed once the lock was free)."""
    try:
        waiting = object() if _WAITS_OUTSIDE.get() is None else None
        if waiting is not None:
            _LOCK_WAITS.add(waiting)
        try:
            _begin(conn)
        finally:
            _LOCK_WAITS.discard(waiting)
        try:
            check()
            yield
        except BaseException:
            if conn.in_transaction:  # SQLite rolls some failures back by itself
                conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
    except sqlite3.IntegrityError:
        raise
    except sqlite3.Error as exc:
        if _denied(exc):
            raise StoreError(
                f"SQLite write to {path} failed: this process may read the store but not write "
                f"it (check the owner and mode of the file, its -wal and -shm files and "
                f"directory): {exc}"
            ) from exc
        raise _refused("write to", path, exc) from exc
    wrote()


def _denied(exc: sqlite3.Error) -> bool:
    """Whether SQLite refused a write for want of permission (not for a file moved away)."""
    code = getattr(exc, "sqlite_errorcode", 0)  # only SQLite's own errors carry one
    return (code & 0xFF) == sqlite3.SQLITE_READONLY and code != sqlite3.SQLITE_READONLY_DBMOVED


def _refused(what: str, path: str, exc: sqlite3.Error) -> StoreError | UsageError:
    """The error for SQLite's `exc`: a `UsageError` for a call the `sqlite3` module refused
    before SQLite saw it (a value of a type it cannot bind), else a `StoreError` (`failed`)."""
    if isinstance(exc, sqlite3.ProgrammingError) and not hasattr(exc, "sqlite_errorcode"):
        return UsageError(f"SQLite {what} {path} refused: {exc}")
    return StoreError(failed(what, path, exc))


def failed(what: str, path: str, exc: sqlite3.Error) -> str:
    """What a store error says of SQLite's `exc`: which file it failed to `what` ("read"), as a
    process may have several stores open, and `damaged`."""
    return f"SQLite {what} {path} failed: {exc}{damaged(exc)}"


def damaged(exc: sqlite3.Error) -> str:
    """For an error saying the file is damaged (or no database), what to do."""
    code = getattr(exc, "sqlite_errorcode", 0) & 0xFF
    if code == sqlite3.SQLITE_NOTADB:
        return " (no SQLite database, or a damaged one: check the path, or restore a backup)"
    return " (the file is damaged: restore a backup)" if code == sqlite3.SQLITE_CORRUPT else ""


def _begin(conn: sqlite3.Connection) -> None:
    """`BEGIN IMMEDIATE`: inside `serialised`, without waiting (`Contended` if the file's write
    lock is held), the connection's own busy timeout restored after."""
    patient = _WAITS_OUTSIDE.get()
    if patient is None:
        conn.execute("BEGIN IMMEDIATE")
        return
    conn.execute("PRAGMA busy_timeout=0")
    try:
        conn.execute("BEGIN IMMEDIATE")
    except sqlite3.Error as exc:
        if _busy(exc):
            raise Contended(exc) from exc
        raise
    finally:
        conn.execute(f"PRAGMA busy_timeout={patient}")


def _busy(exc: sqlite3.Error) -> bool:
    """Whether SQLite gave up waiting for a lock another connection held."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


def reading(
    read: Callable[Concatenate[C, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[C, P], Coroutine[Any, Any, R]]:
    """A read outside any transaction, refused like a write once the file was deleted or
    replaced under the store (within `READ_CHECK_EVERY`), and whose failure of SQLite itself (a
    damaged file, an I/O error) is a `StoreError`, as it is for writes (`immediate`)."""

    @functools.wraps(read)
    async def guarded(store: C, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with store._lock:
            try:
                store._mended()
                store._readable()
                return _through(read(store, *args, **kwargs))
            except sqlite3.Error as exc:
                raise _refused("read", store.path, exc) from exc

    return guarded


def serialised(
    call: Callable[Concatenate[C, P], Coroutine[Any, Any, R]],
) -> Callable[Concatenate[C, P], Coroutine[Any, Any, R]]:
    """A store call run whole under the store's lock, so no other thread's statements land in
    its transaction, nor it reads their uncommitted writes or what the store remembers of them
    half-updated. While another connection holds the file's write lock, the call is run again
    after a sleep on the event loop, until the busy timeout (`REQUEST_WAIT` for an HTTP
    request's: then `StoreBusy`) has passed. A cancel can land only in that sleep, where the
    call wrote nothing: its `CancelledError` is marked so (`unwritten`)."""

    @functools.wraps(call)
    async def locked(store: C, /, *args: P.args, **kwargs: P.kwargs) -> R:
        patient = int(store.busy_timeout * 1000)
        fired, pause, deadline, waiting = 0, _FIRST_PAUSE, None, None
        try:
            while True:
                with store._lock:
                    store._mended()
                    waits = _WAITS_OUTSIDE.set(patient)
                    store._hooks_run, store._hooks_fired = 0, fired
                    try:
                        return _through(call(store, *args, **kwargs))
                    except Contended as exc:
                        # Fault hooks the turned-back attempt ran are not run again.
                        fired, turned_back = max(fired, store._hooks_run), exc.error
                    finally:
                        _WAITS_OUTSIDE.reset(waits)
                        store._hooks_run = store._hooks_fired = 0
                now = time.monotonic()
                if deadline is None:
                    prompt = is_prompt()
                    wait = min(store.busy_timeout, REQUEST_WAIT) if prompt else store.busy_timeout
                    deadline, waiting = now + wait, object()
                    _LOCK_WAITS.add(waiting)
                if now >= deadline:
                    raise _gave_up(store.path, turned_back, prompt, wait) from turned_back
                try:
                    await asyncio.sleep(min(pause, deadline - now))
                except asyncio.CancelledError as exc:
                    unwritten(exc)  # its transaction never began: nothing to give back
                    raise
                pause = min(pause * 2, _LONGEST_PAUSE)
        finally:
            _LOCK_WAITS.discard(waiting)

    return locked


def _gave_up(path: str, exc: sqlite3.Error, prompt: bool, waited: float) -> StoreError:
    """The error of a write that waited `waited` seconds for another connection's lock: it never
    began its transaction, so it wrote nothing (`unwritten`)."""
    said = (
        f"{failed('write to', path, exc)} (another connection held the file's lock for {waited:g}s)"
    )
    return unwritten(StoreBusy(said) if prompt else StoreError(said))


def _through(coro: Coroutine[Any, Any, R]) -> R:
    """Run a store call that never suspends to its end, here: one that did would hold the lock
    across the await, and a call of another task on this thread would then share it."""
    try:
        coro.send(None)
    except StopIteration as done:
        return cast(R, done.value)
    coro.close()
    name = getattr(coro, "__qualname__", "a SQLite store call")
    raise RuntimeError(f"{name} awaited while holding the SQLite store's lock")
