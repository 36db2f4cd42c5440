"""The SQLite store's transactions and its lock: the `BEGIN IMMEDIATE` transaction every write
runs in, SQLite's failures said as store errors naming the file, and the decorators that run a
store call whole under the store's lock (`serialised`), a read checked like a write (`reading`)."""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar, cast

from ..._exceptions import StoreBusy, StoreError, UsageError
from .._prompt import REQUEST_WAIT, is_prompt, wrote

if TYPE_CHECKING:
    from ._connection import Connection

__all__ = ["damaged", "failed", "immediate", "reading", "serialised"]

P = ParamSpec("P")
R = TypeVar("R")
C = TypeVar("C", bound="Connection")


@contextmanager
def immediate(conn: sqlite3.Connection, check: Callable[[], None], path: str) -> Iterator[None]:
    """One `BEGIN IMMEDIATE` transaction, after which `check` may still refuse it. A failure of
    SQLite itself (the file locked past busy_timeout, a full disk, a damaged file) is a
    `StoreError` naming the file at `path`; a constraint violation is left to the caller, which
    knows what it means. Made for an HTTP request (`promptly()`), it waits for the file's lock
    only `REQUEST_WAIT` seconds, then fails with `StoreBusy`, rather than hold the server's event
    loop the whole timeout."""
    prompt = is_prompt()
    begun = False
    try:
        _begin(conn, prompt)
        begun = True
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
        if prompt and not begun and _busy(exc):
            raise StoreBusy(
                f"{failed('write to', path, exc)} (another connection held the file's lock for "
                f"{REQUEST_WAIT:g}s)"
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


def _begin(conn: sqlite3.Connection, prompt: bool) -> None:
    """`BEGIN IMMEDIATE`, which waits for the file's write lock: briefly if `prompt`, with the
    connection's own busy timeout restored after."""
    if not prompt:
        conn.execute("BEGIN IMMEDIATE")
        return
    (patient,) = conn.execute("PRAGMA busy_timeout").fetchone()
    conn.execute(f"PRAGMA busy_timeout={min(int(patient), int(REQUEST_WAIT * 1000))}")
    try:
        conn.execute("BEGIN IMMEDIATE")
    finally:
        conn.execute(f"PRAGMA busy_timeout={int(patient)}")


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
    half-updated."""

    @functools.wraps(call)
    async def locked(store: C, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with store._lock:
            return _through(call(store, *args, **kwargs))

    return locked


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
