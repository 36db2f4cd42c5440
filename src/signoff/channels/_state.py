"""`ChannelState`: the SQLite file (or memory) where channels keep feed positions and memos,
and `off_loop`, which reads and writes it without stalling the event loop.

The file is marked with its layout (SQLite's `user_version`): a file of an older layout is
brought up to date in place, in one transaction, when it is opened; a newer one is refused.
Each file has an id of its own (`ChannelState.identity`), written in it by the first hub on it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import hashlib
import json
import logging
import math
import os
import re
import secrets
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from .._exceptions import SchemaVersionError, StoreError, UsageError
from ..stores.sqlite import _forks
from ..stores.sqlite._connection import _switch_to_wal
from ..stores.sqlite._files import identity as _file_identity
from ..stores.sqlite._files import unopenable
from ._webhook_urls import masked

__all__ = ["STATE_SCHEMA", "ChannelState", "make_room", "off_loop", "waiting_until"]

STATE_SCHEMA = 1
"""The layout of the state file: 1 keeps a channel's memos under its hub's name and its own;
0 (a file with no mark, written before) kept them under the channel's name alone, so two hubs
with a channel of the same name shared them."""

_POSITIONS = (
    "CREATE TABLE IF NOT EXISTS channel_positions "
    "(name TEXT PRIMARY KEY, after_id INTEGER NOT NULL)"
)
_MEMOS = (
    "CREATE TABLE channel_memos (hub TEXT NOT NULL, channel TEXT NOT NULL, key TEXT NOT NULL, "
    "value TEXT NOT NULL, PRIMARY KEY (hub, channel, key))"
)

# The memo, outside any hub and channel (no channel is named ""), holding the file's own id.
_ID = "state-id"

_DEADLINE: ContextVar[float | None] = ContextVar("signoff_channel_state_deadline", default=None)

_UNREADABLE = object()  # a memo's value that is not JSON

_CLOSE = "the channel state (or its hub)"  # what a refused forked child's parent should close

logger = logging.getLogger("signoff.channels")

P = ParamSpec("P")
R = TypeVar("R")


def _in_own_thread(call: Callable[[], R]) -> asyncio.Future[R]:
    """`call()` started in a thread of its own, its outcome in the future returned. Not the
    event loop's default executor, which anything may fill (a webhook's host lookup hung for
    minutes, a blocking tool) while the channels' state waits behind it; and not a pool kept
    for the process, whose idle threads a forked child would not have. Not a daemon: a write
    in flight ends before the interpreter exits."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[R] = loop.create_future()

    def deliver(setter: Callable[[Any], None], value: Any) -> None:
        def settle() -> None:
            if not future.done():
                setter(value)

        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits for it
            loop.call_soon_threadsafe(settle)

    def run() -> None:
        try:
            result = call()
        except BaseException as exc:  # handed to the awaiting task, as by `asyncio.to_thread`
            deliver(future.set_exception, exc)
        else:
            deliver(future.set_result, result)

    threading.Thread(target=run, name="signoff-channel-state").start()
    return future


MOST_THREADS = 4
"""Threads `off_loop` runs at once in an event loop: a state's calls take its lock one at a
time, so more add nothing but waiting threads (a burst of deliveries while another hub holds
the file started one each, 2,000 of them)."""

_SLOTS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
    weakref.WeakKeyDictionary()
)


async def _bounded(call: Callable[[], R]) -> R:
    """`call()` in a thread of its own once one of the loop's `MOST_THREADS` is free."""
    loop = asyncio.get_running_loop()
    slots = _SLOTS.get(loop)
    if slots is None:
        slots = _SLOTS[loop] = asyncio.Semaphore(MOST_THREADS)
    async with slots:
        return await _in_own_thread(call)


async def off_loop(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`fn(*args, **kwargs)` (`ChannelState` calls) in a thread of its own (`_in_own_thread`),
    in the caller's context (as `asyncio.to_thread`): waiting for another process's lock on
    the state file must not stall the event loop (HTTP, SSE, leases).

    A caller cancelled meanwhile still waits for the call to end before it sees the
    cancellation, so nothing it wrote lands after what is written next (or after a hub's
    lock is let go)."""
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    work = asyncio.ensure_future(_bounded(call))
    interrupted: asyncio.CancelledError | None = None
    while not work.done():
        try:
            await asyncio.shield(work)
        except asyncio.CancelledError as exc:
            interrupted = exc
        except BaseException:
            break
    if interrupted is not None:
        work.exception()  # retrieved: a failure the cancelled caller never sees is not logged
        raise interrupted
    return work.result()


@contextmanager
def waiting_until(deadline: float) -> Iterator[None]:
    """`ChannelState` calls made inside wait for the state (another thread's call, another
    process's lock on the file) only until `deadline` (a `time.monotonic()` time), then fail
    with a `StoreError`: what must answer in time (Slack's 3 s) is not held for `busy_timeout`."""
    token = _DEADLINE.set(deadline)
    try:
        yield
    finally:
        _DEADLINE.reset(token)


class ChannelState:
    """Where channels keep what must survive a restart: feed positions and small memos.

    A SQLite file (stdlib `sqlite3`), or memory with `":memory:"` (the default; an empty path, as
    `"$UNSET"` leaves it, is a `UsageError`, not SQLite's temporary file). A memo is a
    JSON value under `(channel, key)` of a `hub` (the name of the `ChannelHub` the channel runs
    in: same-named channels of differently named hubs sharing a file keep theirs apart; `""`
    outside any hub), e.g. the Slack message that shows a request; each write is synced to disk
    before it returns. A read or write waits up to `busy_timeout` seconds for another process's
    lock; any failure of SQLite (the file locked longer, a full disk) is a `StoreError`, and a
    file written by a newer signoff is a `SchemaVersionError`. A memo that is not JSON (damaged
    by hand or by a tool) is read as absent, its key logged once, so a channel goes on with its
    other memos; it stays in the file until written again or forgotten. So is a position that
    is no audit entry id (text, a fraction, below 0), logged.

    `identity()` names the file itself: hubs on one file share it, and hubs on other files
    (another machine's at the same path, say) do not.

    In a process forked while a state had its file open, a new state on that file and any call
    of the copy are a `UsageError` before anything is read or written (as for a SQLite store,
    `stores.sqlite._forks`): SQLite's locks on the file stayed in the parent, whose close would
    delete the -wal and -shm under the child.
    """

    def __init__(self, path: str | Path = ":memory:", *, busy_timeout: float = 5.0) -> None:
        if (
            isinstance(busy_timeout, bool)
            or not isinstance(busy_timeout, int | float)
            or not 0 <= busy_timeout < math.inf  # NaN passed to SQLite as a wait
        ):
            raise UsageError(f"busy_timeout must be seconds from 0, not {busy_timeout!r}")
        if isinstance(path, str | os.PathLike) and os.fspath(path) == "":
            # SQLite's private temporary database: lost on close, as if in memory
            raise UsageError("path must name a file, or be ':memory:', not ''")
        self.path = str(path)
        self.busy_timeout = busy_timeout
        self._lock = threading.Lock()
        self.closed = False
        self._unreadable: set[tuple[str, str, str]] = set()  # (hub, channel, key) logged
        self._id: str | None = None
        # The file opened (absolute) and its (device, inode); None for memory (`_forks`).
        self._opened: tuple[str, tuple[int, int] | None] | None = None
        if self.path != ":memory:" and _forks.inherited(_file_identity(self.path)):
            raise _forks.refuse_inherited(self.path, "opened", close=_CLOSE)
        conn: sqlite3.Connection | None = None
        make_room(self.path)
        # SQLite built with SQLITE_USE_URI (Debian's is) reads a name starting "file:" as a
        # URI even when not asked to: "./" keeps it the file the path names.
        target = ("./" if self.path.startswith("file:") else "") + self.path
        try:
            conn = sqlite3.connect(
                target, timeout=busy_timeout, check_same_thread=False, isolation_level=None
            )
            _switch_to_wal(conn, busy_timeout)  # two processes may create the file together
            # Every commit synced: a memo saved before Slack hears back survives a power cut.
            conn.execute("PRAGMA synchronous=FULL")
            _set_up(self.path, conn)
            if self.path != ":memory:":
                where = os.path.abspath(self.path)
                self._opened = (where, _file_identity(where))
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, OSError | sqlite3.Error):
                why = (unopenable(self.path) if isinstance(exc, sqlite3.Error) else None) or exc
                raise StoreError(f"cannot open the channel state {self.path}: {why}") from exc
            raise
        self._conn = conn
        if self._opened is not None:
            _forks.opened(self)

    def _inherited(self) -> bool:
        """Whether the file is one a process this one was forked from had open (`_forks`)."""
        return self._opened is not None and _forks.inherited(self._opened[1])

    @contextmanager
    def _using(self, what: str, done: str = "written") -> Iterator[sqlite3.Connection]:
        """The connection, one caller at a time; a failure of SQLite is a `StoreError`, a copy
        a forked child has of a state whose file was open then a `UsageError` (nothing was
        `done`). Inside `waiting_until`, the waits for this lock and the file's end at its
        deadline."""
        if self._inherited():
            raise _forks.refuse_inherited(self.path, done, close=_CLOSE)
        deadline = _DEADLINE.get()
        if deadline is None:
            self._lock.acquire()
        elif not self._lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise StoreError(f"channel state {self.path}: cannot {what}: busy past the deadline")
        try:
            conn = self._conn
            if deadline is None:
                yield conn
                return
            (patient,) = conn.execute("PRAGMA busy_timeout").fetchone()
            wait = int(max(0.0, deadline - time.monotonic()) * 1000)
            conn.execute(f"PRAGMA busy_timeout={min(int(patient), wait)}")
            try:
                yield conn
            finally:
                conn.execute(f"PRAGMA busy_timeout={int(patient)}")
        except sqlite3.Error as exc:
            raise StoreError(f"channel state {self.path}: cannot {what}: {exc}") from exc
        finally:
            self._lock.release()

    def identity(self) -> str:
        """The file's own id: random, written in it at the first call on it (a hub's start),
        also in a file an older signoff wrote, and read from it after. A copy of the file
        carries it; each state in memory has one of its own."""
        if self._inherited():  # the id read before the fork too: the copy answers nothing
            raise _forks.refuse_inherited(self.path, "read", close=_CLOSE)
        if self._id is None:
            with self._using("read its id", "read") as conn:
                self._id = _identity(self.path, conn)
        return self._id

    def position(self, name: str) -> int | None:
        """The last audit entry id `name` has handled, or None if it never ran; one that is
        no id from 0 (damaged by hand or by a tool) is read as absent, as a damaged memo is,
        and logged: the hub's start failed on it with a bare ValueError."""
        with self._using("read a position", "read") as conn:
            row = conn.execute(
                "SELECT after_id FROM channel_positions WHERE name=?", (name,)
            ).fetchone()
        if row is None:
            return None
        value = row[0]
        if isinstance(value, int) and value >= 0:
            return value
        logger.warning(
            "channel state %s: the position of %s cannot be read (%.60r); it is taken as "
            "absent until written again (a hub goes on as for a channel without one)",
            self.path,
            name,
            value,
        )
        return None

    def set_position(self, name: str, after_id: int) -> None:
        """Save that `name` has handled the audit trail up to entry `after_id`."""
        with self._using("save a position") as conn:
            conn.execute(
                "INSERT INTO channel_positions (name, after_id) VALUES (?, ?) "
                "ON CONFLICT(name) DO UPDATE SET after_id=excluded.after_id",
                (name, after_id),
            )

    def recall(self, channel: str, key: str, *, hub: str = "") -> Any:
        """The memo under `key` of `channel` (of `hub`), or None if there is none (or it cannot
        be read, logged)."""
        with self._using("read a memo", "read") as conn:
            row = conn.execute(
                "SELECT value FROM channel_memos WHERE hub=? AND channel=? AND key=?",
                (hub, channel, key),
            ).fetchone()
            value = _UNREADABLE if row is None else self._loaded(hub, channel, key, row[0])
        return None if value is _UNREADABLE else value

    def remember(self, channel: str, key: str, value: Any, *, hub: str = "") -> None:
        """Keep `value` (JSON) under `key` of `channel` (of `hub`), replacing any memo there."""
        with self._using("save a memo") as conn:
            conn.execute(
                "INSERT INTO channel_memos (hub, channel, key, value) VALUES (?, ?, ?, ?) "
                "ON CONFLICT(hub, channel, key) DO UPDATE SET value=excluded.value",
                (hub, channel, key, json.dumps(value, separators=(",", ":"))),
            )
            self._unreadable.discard((hub, channel, key))

    def memos(self, channel: str, prefix: str = "", *, hub: str = "") -> list[tuple[str, Any]]:
        """A channel's memos whose key starts with `prefix`, oldest first, but for those that
        cannot be read (logged)."""
        with self._using("read memos", "read") as conn:
            rows = conn.execute(
                "SELECT key, value FROM channel_memos WHERE hub=? AND channel=? "
                "AND substr(key, 1, length(?))=? ORDER BY rowid",
                (hub, channel, prefix, prefix),
            ).fetchall()
            found = [(str(k), self._loaded(hub, channel, str(k), value)) for k, value in rows]
        return [(key, value) for key, value in found if value is not _UNREADABLE]

    def _loaded(self, hub: str, channel: str, key: str, text: Any) -> Any:
        """A memo's value, or `_UNREADABLE` for one that is not JSON, logged once per key (a
        channel reads some at every poll): kept as it is, since a read does not write. Called
        holding the lock, which guards the keys logged."""
        try:
            return json.loads(text)
        except (ValueError, TypeError, RecursionError) as exc:
            if (hub, channel, key) not in self._unreadable:
                self._unreadable.add((hub, channel, key))
                logger.warning(
                    "channel state %s: the memo %s of channel %s (hub %r) cannot be read (%s); "
                    "it is taken as absent until written again",
                    self.path,
                    _shown(key),
                    channel,
                    hub,
                    exc,
                )
            return _UNREADABLE

    def forget(self, channel: str, key: str, *, hub: str = "") -> None:
        """Drop the memo under `key` of `channel` (of `hub`); nothing if there is none."""
        with self._using("delete a memo") as conn:
            conn.execute(
                "DELETE FROM channel_memos WHERE hub=? AND channel=? AND key=?",
                (hub, channel, key),
            )
            self._unreadable.discard((hub, channel, key))

    def close(self) -> None:
        """Close the file; later calls are a `StoreError`. The copy of a forked child leaves
        SQLite's connection open (`_forks` keeps it), its later calls still a `UsageError`."""
        if self._inherited():  # its lock may have come locked (a parent's thread held it)
            self.closed = True
            _forks.shut(self)
            return
        with self._lock:
            self._conn.close()
            self.closed = True
            _forks.shut(self)


def _shown(key: str) -> str:
    """A memo's key as a log line shows it: a URL in it (a webhook's) with its secrets masked."""
    try:
        return " ".join(str(masked(word)) for word in key.split(" "))
    except UsageError:  # no httpx to read a URL's login with
        return f"{key.partition(':')[0]}:<a URL>"


def make_room(path: str) -> None:
    """Create the directory of the state file at `path`; one that cannot be made (a file in
    the way, no permission) is a `StoreError`."""
    if path == ":memory:":
        return
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreError(f"cannot open the channel state {path}: {exc}") from exc


def _set_up(path: str, conn: sqlite3.Connection) -> None:
    """Create the tables of a new file, or bring an older layout up to date, in one write
    transaction (a crash leaves the file as it was); a file already current is only read."""
    if _layout(path, conn) == STATE_SCHEMA:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = _layout(path, conn)  # another process may have set it up meanwhile
        if found < STATE_SCHEMA:
            old = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='channel_memos'"
            ).fetchone()
            conn.execute(_POSITIONS)
            if old:
                _keep_memos_per_hub(conn)
            else:
                conn.execute(_MEMOS)
            conn.execute(f"PRAGMA user_version={STATE_SCHEMA}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def _identity(path: str, conn: sqlite3.Connection) -> str:
    """The file's own id, made now if it has none (a new file, or one an older signoff wrote):
    in one statement, so a crash leaves the file with it or without it, and processes opening
    the file at once all read the one written first. A value damaged (by hand, by a tool) is
    read as the hash of what it holds, the same for every process."""
    read = "SELECT value FROM channel_memos WHERE hub='' AND channel='' AND key=?"
    row = conn.execute(read, (_ID,)).fetchone()
    if row is None:
        conn.execute(
            "INSERT OR IGNORE INTO channel_memos (hub, channel, key, value) VALUES ('', '', ?, ?)",
            (_ID, json.dumps(secrets.token_hex(16))),
        )
        row = conn.execute(read, (_ID,)).fetchone()
        if row is None:  # written and gone: something else deletes it meanwhile
            raise StoreError(f"channel state {path}: its id could not be kept")
    text = row[0]
    try:
        value = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        value = None
    if isinstance(value, str) and re.fullmatch(r"[0-9a-f]{32}", value):
        return value
    return hashlib.sha256(repr(text).encode()).hexdigest()[:32]


def _layout(path: str, conn: sqlite3.Connection) -> int:
    """The file's layout mark; one newer than this signoff knows is refused."""
    (found,) = conn.execute("PRAGMA user_version").fetchone()
    if found > STATE_SCHEMA:
        raise SchemaVersionError(
            f"channel state {path} has layout {found}; this signoff knows up to "
            f"{STATE_SCHEMA}. Upgrade signoff."
        )
    if found < 0:
        raise StoreError(f"channel state {path} is damaged: its layout mark is {found}")
    return int(found)


def _keep_memos_per_hub(conn: sqlite3.Connection) -> None:
    """Layout 0 to 1: a channel's memos go to each hub that ran a channel of that name (its
    position `<hub>:<channel>` says so), in their order; a hub's own memos (under its position's
    name) and those of a channel no hub ran stay outside any hub."""
    conn.execute("ALTER TABLE channel_memos RENAME TO channel_memos_0")
    conn.execute(_MEMOS)
    names = [str(name) for (name,) in conn.execute("SELECT name FROM channel_positions")]
    rows = conn.execute("SELECT channel, key, value FROM channel_memos_0 ORDER BY rowid")
    for channel, key, value in rows.fetchall():
        hubs = [""]
        if channel not in names:
            suffix = f":{channel}"
            hubs = sorted({n[: -len(suffix)] for n in names if n.endswith(suffix)}) or [""]
        conn.executemany(
            "INSERT INTO channel_memos (hub, channel, key, value) VALUES (?, ?, ?, ?)",
            [(hub, channel, key, value) for hub in hubs],
        )
    conn.execute("DROP TABLE channel_memos_0")
