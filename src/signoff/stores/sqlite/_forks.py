"""The SQLite files a forked child may not use: those its parent had open when it forked (a
store's, a channel state's). SQLite keeps one record per process of each file it has open and
the locks it holds on it and its -shm; a fork copies the record but not the locks. A connection
the child opened to such a file believed it held them and never took them, so the parent's
close, finding no other process, folded the WAL into the file and deleted its -wal and -shm
under the child, with the child's commits."""

from __future__ import annotations

import ctypes
import os
import sqlite3
import weakref
from typing import Any, Protocol

from ..._exceptions import UsageError

__all__ = ["INHERITED", "Holder", "inherited", "opened", "refuse_inherited", "shut"]


class Holder(Protocol):
    """What has a SQLite file open (a store, a channel state), as the fork hook reads it: its
    connection, and the file it opened with the file's (device, inode), None for memory."""

    @property
    def _conn(self) -> sqlite3.Connection | None: ...

    @property
    def _opened(self) -> tuple[str, tuple[int, int] | None] | None: ...

    @property
    def _lock(self) -> Any: ...  # a `threading.Lock` or `RLock`


INHERITED: set[tuple[int, int]] = set()
"""The database files (device, inode) a connection of a process this one was forked from had
open at the fork (of its parent's parent too)."""
_OPEN: weakref.WeakSet[Holder] = weakref.WeakSet()  # stores and states with a file open here
_KEPT: list[sqlite3.Connection] = []


def opened(holder: Holder) -> None:
    """Note that `holder` has its file open in this process."""
    _OPEN.add(holder)


def shut(holder: Holder) -> None:
    """Note that `holder` closed its file."""
    _OPEN.discard(holder)


def inherited(identity: tuple[int, int] | None) -> bool:
    """Whether the database file `identity` was open in a process this one was forked from."""
    return identity is not None and identity in INHERITED


def refuse_inherited(path: str, done: str, *, close: str = "the store (or runtime)") -> UsageError:
    """The error for a use of a file a process this one was forked from had open; `close` names
    what the parent should close before forking."""
    return UsageError(
        f"{path} was open in the process this one was forked from, which holds SQLite's locks "
        f"on it: a connection here would hold none, and that process's close would delete the "
        f"-wal and -shm under it; nothing was {done}. Close {close} before forking, or start "
        'the child with the "spawn" or "forkserver" method.'
    )


def _after_fork_in_child() -> None:
    """Note the files the parent had open; keep the connections to them that came with the fork
    from ever being closed here: closed as the file's last connection in this process, SQLite
    would fold the WAL it saw at the fork into the file and delete the -wal there by name.
    Their locks are made anew: one a thread of the parent held at the fork came locked, with no
    thread here to let it go, and the copy's refusals and close would wait on it for ever."""
    for holder in list(_OPEN):
        holder._lock._at_fork_reinit()
        conn, where = holder._conn, holder._opened
        if conn is None or where is None or where[1] is None:
            continue
        try:
            # A field read (sqlite3_total_changes takes no mutex a parent's thread may hold at
            # the fork); a closed connection's raises ProgrammingError.
            conn.total_changes  # noqa: B018
        except sqlite3.ProgrammingError:
            continue
        INHERITED.add(where[1])
        _KEPT.append(conn)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(conn))  # not freed at exit, so not closed


os.register_at_fork(after_in_child=_after_fork_in_child)
