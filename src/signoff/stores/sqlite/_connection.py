"""The SQLite store's connection: the one `sqlite3` connection to its file, opened (and the
file's schema made or upgraded), checked to be the file it opened, and closed. `Connection` is
the base class of `SQLiteStore`'s reads, leases and writes; the transactions they run in and
the lock that gives the connection to one store call at a time are in `_transactions`."""

from __future__ import annotations

import asyncio
import ctypes
import os
import sqlite3
import threading
import time
import types
import urllib.parse
import weakref
from pathlib import Path
from typing import Any, Literal

from ..._exceptions import SchemaVersionError, StoreDamaged, StoreError, StoreGone
from ..._settings import flag, seconds
from .._base import FaultHook, older_schema
from .._codec import PerSession, Tail, Tails
from . import _forks
from ._files import beside, no_room, no_space, open_access, permitted, unopenable
from ._files import identity as _identity
from ._files import stamp as _stamp
from ._files import wal_files as _wal_files
from ._schema import (
    PAGE_SIZE,
    SCHEMA,
    STORE_SCHEMA,
    WAL_CHECKPOINT_PAGES,
    keep_request_deadlines,
    keep_session_initiators,
    keep_session_parents,
    keep_stream_heads,
    let_requests_hold_no_copy,
    names_missing,
    names_taken,
    order_children_by_expiry,
    schema_mark,
    upgrade_from_1,
)
from ._transactions import _busy, damaged, immediate
from ._url import path_from_url, refuse_undecoded

__all__ = ["READ_CHECK_EVERY", "Connection", "kept"]

READ_CHECK_EVERY = 0.1
"""Seconds a read may go without checking that the file is still the one opened. A `stat` costs
about as much as the cheapest read; a read this soon after the file changed is no staler than
one just before it, and writes and `wait_for_change`'s polls check every time."""


def kept(value: object, kind: type | types.UnionType, session_id: str, what: str) -> Any:
    """A number or hash a session's row keeps, checked: SQLite keeps whatever a hand edit puts
    in a column, and converting text would raise a bare ValueError or TypeError."""
    if isinstance(value, kind) or (kind is bytes and value is None):
        return value
    raise StoreDamaged(f"session {session_id!r} is damaged: its {what} is {value!r:.40}")


def _switch_to_wal(conn: sqlite3.Connection, timeout: float) -> None:
    """Put the file in WAL mode. SQLite refuses the switch at once while another connection
    writes to a file not yet in WAL (two processes opening a new file together), without calling
    its busy handler, so the switch is retried for up to the busy timeout as a write would wait."""
    deadline = time.monotonic() + timeout
    pause = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            busy = (exc.sqlite_errorcode & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
            if not busy or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _refuse_newer(path: str, conn: sqlite3.Connection, *, made_meta: bool = False) -> int:
    """The file's store schema (0 when it has none yet); a newer one than this signoff knows
    is a `SchemaVersionError`. `made_meta`: the `meta` table is this transaction's own."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        had_meta = not made_meta  # another program's `meta`, unless signoff's has no mark
    except sqlite3.OperationalError:
        row, had_meta = None, False  # no meta table yet: a new file
    if row is None and (taken := ["meta"] * had_meta + names_taken(conn)):
        # Every signoff writes its tables and their mark in one transaction.
        raise StoreError(
            f"{path} has no store schema mark but has tables of signoff's names "
            f"({', '.join(taken)}): a damaged store or another program's database, not written to"
        )
    found = 0 if row is None else schema_mark(path, row[0])
    if found > STORE_SCHEMA:
        raise SchemaVersionError(
            f"{path} has store schema {row[0]}; this signoff knows up to {STORE_SCHEMA}. "
            "Upgrade signoff."
        )
    return found


def _is_current(conn: sqlite3.Connection) -> bool:
    """Whether the file already has this signoff's schema: opening it then writes nothing, so a
    reader never waits for another process's write lock (in WAL mode readers need none)."""
    try:
        row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    except sqlite3.Error as exc:
        if _busy(exc):
            raise  # waited `busy_timeout` already: the transaction after would wait again
        return False  # a new file, or one the write transaction will name the fault of
    return row is not None and row[0] == str(STORE_SCHEMA)


_ABANDONED: set[tuple[int, int]] = set()
"""The database files (device, inode) whose connections `_abandon` left open in this process
(or in the process it was forked from: SQLite's record of the old -shm is inherited too)."""
_ABANDONED_CONNECTIONS: list[sqlite3.Connection] = []
_WRITERS: dict[tuple[int, int], weakref.WeakSet[Connection]] = {}
"""The stores writing each database file (device, inode) here (`_among_writers`), those of the
process this one was forked from too: SQLite's own records of their files come with them."""
_WRITERS_LOCK = threading.Lock()  # stores open and close in threads (`asyncio.to_thread`)


def _is_open(conn: sqlite3.Connection | None) -> bool:
    """Whether `conn` is a connection not closed (by its store, or behind its back)."""
    if conn is None:
        return False
    try:
        conn.total_changes  # noqa: B018  # a closed connection's raises ProgrammingError
    except sqlite3.ProgrammingError:
        return False
    return True


class Connection:
    """What every part of `SQLiteStore` stands on: its settings, its connection (opened, and the
    schema brought up to date, on first use), what it remembers of sessions and leases, and its
    fault hook."""

    def __init__(
        self,
        url: str = "sqlite:///.signoff/state.db",
        *,
        busy_timeout: float = 30.0,
        migrate: bool = True,
    ):
        self.url = url
        self.auto_migrate = flag("migrate", migrate)  # "no" upgraded the store it was to spare
        self.path = path_from_url(url)
        # SQLite takes it in whole milliseconds, as a C int: a day is well within that.
        self.busy_timeout = seconds("busy_timeout", busy_timeout, most=86_400, zero=True)
        self._conn: sqlite3.Connection | None = None
        # Held by each store call from its first statement to its last: the connection is
        # shared by every thread using this store (a runtime's async calls and its sync twins),
        # and SQLite keeps one transaction per connection. Reentrant: `conn` opens the file.
        self._lock = threading.RLock()
        self._fault: FaultHook | None = None
        # The fault hooks run by the store call under way, and how many of them an attempt of
        # it that a lock held elsewhere turned back ran already (`_hook`, `serialised`).
        self._hooks_run = self._hooks_fired = 0
        self._sk: PerSession[int] = PerSession()
        self._tails: Tails[Tail | None] = Tails()
        # The turn each recent session's head event is in and how many rows back a row names it
        # (what `_turn_at` reads), as this store wrote it, with the file's `data_version` then;
        # valid while that event is the head and no other connection has committed since.
        self._named: Tails[tuple[str, int, int]] = Tails()
        # Leases this store granted and not yet given back: session -> (token, expiry); and
        # the latest time a lease call gave, past which an unreleased one has lapsed.
        self._leased: dict[str, tuple[int, float]] = {}
        self._lease_now = 0.0
        # The sessions claims passed over for a damaged lease row, with what is wrong with it:
        # each is logged once, not at every claim.
        self._passed_over: dict[str, str] = {}
        self._opened: tuple[str, tuple[int, int] | None] | None = None
        self._checked = -READ_CHECK_EVERY  # when a read last found the file the one opened
        self._access = "rw"
        self._full = False  # opened read-only because its disk was full (`no_room`)
        self._stamp: tuple[int, int, int] | None = None  # the file as an immutable read saw it
        self._shm: tuple[int, int] | None = None  # the -shm a read-only connection reads through
        # The -wal and -shm a writing connection opened with: SQLite keeps both while any
        # connection has the file open, so one gone or new means a WAL no other process shares.
        self._wal: tuple[tuple[int, int] | None, tuple[int, int] | None] | None = None
        self._wal_paths = ("", "")  # where they are, resolved once (a `realpath` costs a write)
        # The store schema the file had when this store opened it: 0 for a new file.
        self.schema_found: int | None = None
        # `wait_for_change`'s shared poll, one per event loop (a `_store.Follows`).
        self._follows: dict[Any, Any] = {}

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        if self._conn is None:
            # In a thread: creating or upgrading the schema waits inside SQLite for another
            # connection's write lock, up to the busy timeout, which on the loop held its tasks.
            await asyncio.to_thread(self.open_sync)

    async def migrate(self) -> tuple[int, int]:
        """Open the file, creating or upgrading its schema; returns (before, after) as
        `PostgresStore.migrate` does: the schema it had when this store opened it (0 for a
        new file) and this signoff's."""
        if self._conn is None:
            await asyncio.to_thread(self.open_sync, upgrade=True)
        assert self.schema_found is not None
        return self.schema_found, STORE_SCHEMA

    async def schema_missing(self) -> list[str]:
        """The tables and indexes of this signoff's schema that the file lacks (`db status`)."""
        self._readable()
        try:
            return names_missing(self.conn)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read the schema of {self.path}: {exc}") from exc

    def open_sync(self, *, upgrade: bool | None = None) -> None:
        """Open the file; create or upgrade its schema if `upgrade` (default: the store's
        `migrate`), else refuse an older or missing one before writing anything."""
        if self._conn is not None:
            return
        with self._lock:
            if self._conn is None:
                self._open(upgrade)

    def _open(self, upgrade: bool | None) -> None:
        """`open_sync`, under the store's lock."""
        upgrade = self.auto_migrate if upgrade is None else upgrade
        upgrade = upgrade or self.path == ":memory:"  # always new: nothing else uses it
        if self.path != ":memory:":
            refuse_undecoded(self.url, self.path)
            if not upgrade and not os.path.exists(self.path):  # a dangling link too
                raise older_schema(self.path, 0, STORE_SCHEMA)  # and nothing is created
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the directory of {self.path}: {exc}") from exc
            if os.path.exists(self.path) and not os.path.isfile(self.path):
                raise StoreError(f"cannot open SQLite store {self.path}: {unopenable(self.path)}")
            on_disk = _identity(self.path)
            if on_disk is not None and on_disk in _ABANDONED:
                raise StoreGone(
                    f"the -wal or -shm file of {self.path} was deleted or replaced while this "
                    "process had it open: restart the process to open it (SQLite would read it "
                    "through the old ones here)"
                )
            if _forks.inherited(on_disk):
                raise _forks.refuse_inherited(self.path, "opened")
        self._open_as(open_access(self.path), upgrade)

    def _open_as(self, access: str, upgrade: bool) -> None:
        """`_open` once the file is found openable, with `access` (`open_access`)."""
        conn: sqlite3.Connection | None = None
        self._full = access != "rw" and permitted(self.path) and no_room(self.path)
        self._access = access
        if access == "immutable":
            self._stamp = _stamp(self.path)  # before opening: a change meanwhile reopens it
        elif access == "ro":
            self._shm = _identity(beside(self.path, "-shm"))
        try:
            conn = self._connect(access)
            if not _is_current(conn):  # checked before WAL mode is set: nothing is written
                # One snapshot, begun by a read (not by a statement naming a missing table):
                # a store another process makes meanwhile is seen whole or not at all.
                conn.execute("BEGIN").execute("SELECT count(*) FROM sqlite_master").fetchone()
                try:
                    found = _refuse_newer(self.path, conn)
                finally:
                    if conn.in_transaction:  # an error may have ended it
                        conn.execute("ROLLBACK")
                if not upgrade and found < STORE_SCHEMA:
                    raise older_schema(self.path, found, STORE_SCHEMA)
            if access == "rw":
                conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new file only; before WAL
                _switch_to_wal(conn, self.busy_timeout)
            conn.execute("PRAGMA synchronous=NORMAL")
            # Checkpoint every 256 pages (512 KB) and shrink the WAL back to that size after,
            # instead of SQLite's default of letting it reach and stay at about 4 MB.
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            conn.execute(f"PRAGMA journal_size_limit={WAL_CHECKPOINT_PAGES * PAGE_SIZE}")
            if self.path != ":memory:":
                where = os.path.abspath(self.path)
                self._opened = (where, _identity(where))
            found = STORE_SCHEMA
            if upgrade and not _is_current(conn):
                if access != "rw":
                    _refuse_newer(self.path, conn)  # writing it would not help: too new
                    fix = "open it once as a user who may write the file and its directory"
                    raise StoreError(
                        f"{self.path} is {self._refusal()} and has not this signoff's schema: "
                        + ("free space on its disk and open it again" if self._full else fix)
                    )
                found = self._set_up(conn)
        except BaseException as exc:
            if conn is not None:
                conn.close()
            if isinstance(exc, sqlite3.Error):
                if access == "rw" and no_space(self.path, exc):
                    if open_access(self.path) == "immutable":  # the disk filled as it opened
                        return self._open_as("immutable", upgrade)
                why = f"{unopenable(self.path) or exc}{damaged(exc)}{no_space(self.path, exc)}"
                raise StoreError(f"cannot open SQLite store {self.path}: {why}") from exc
            raise
        self._wal = None
        if access == "rw" and self._opened is not None:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # both exist now
            where = self._opened[0]
            self._wal_paths = (beside(where, "-wal"), beside(where, "-shm"))
            self._wal = _wal_files(self._wal_paths)
            self._among_writers(conn, self._opened[1])
        self._conn = conn
        self.schema_found = found
        if self._opened is not None:
            _forks.opened(self)
        if self.path == ":memory:":  # kept open by `close`: closed once the store is dropped
            weakref.finalize(self, conn.close)

    def _connect(self, access: str) -> sqlite3.Connection:
        """A connection to the file; a read-only one by a `file:` URI that lets SQLite write
        nothing, neither the file nor new -wal and -shm files."""
        # SQLite built with SQLITE_USE_URI (Debian's is) reads a name starting "file:" as a URI
        # even when not asked to: "./" keeps it the file the URL names.
        target, uri = ("./" if self.path.startswith("file:") else "") + self.path, False
        if access != "rw":
            target = f"file:{urllib.parse.quote(os.path.abspath(self._where()))}?mode=ro"
            target += "&immutable=1" if access == "immutable" else ""
            uri = True
        conn = sqlite3.connect(
            target,
            timeout=self.busy_timeout,
            isolation_level=None,
            check_same_thread=False,
            uri=uri,
        )
        conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        return conn

    def _set_up(self, conn: sqlite3.Connection) -> int:
        """Create the schema, or bring an older one up to date, in one write transaction;
        returns the schema the file had (0 for a new one, or one another process set up)."""
        with immediate(conn, self._writable, self.path):
            new = not conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='meta'"
            ).fetchone()
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            found = _refuse_newer(self.path, conn, made_meta=new)
            if found == 1:
                upgrade_from_1(conn)
            if 1 <= found < 4:
                keep_stream_heads(conn)
            if 1 <= found < 5:
                keep_request_deadlines(conn)
            if 1 <= found < 6:
                keep_session_parents(conn)
            if 1 <= found < 7:
                keep_session_initiators(conn)
            if 1 <= found < 8:
                order_children_by_expiry(conn)
            if 1 <= found < 11:
                let_requests_hold_no_copy(conn)
            for statement in SCHEMA.strip().split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema', ?) "
                "ON CONFLICT (key) DO UPDATE SET value=excluded.value",
                (str(STORE_SCHEMA),),
            )
        return 0 if new else found

    async def close(self) -> None:
        """Close the connection and forget what this store knew of the file and its sessions:
        the next use opens whatever file is at the path then (a backup restored meanwhile), whose
        row keys and last events are not the old file's. A `:memory:` store stays open: its
        sessions live there alone, for the next use (another runtime sharing the store, say)."""
        if self.path == ":memory:":
            return
        self._shut()

    def _shut(self) -> None:
        """`close`, which a store opened read-only runs too, to open the file anew writable."""
        if self._opened is not None and _forks.inherited(self._opened[1]):
            # The copy a forked child has: its connection is kept open (`_forks`), and its lock
            # may have come locked (a thread of the parent held it at the fork): forgotten only.
            _forks.shut(self)
            self._forget()
            return
        with self._lock:
            if self._conn is not None and self._conn not in _ABANDONED_CONNECTIONS:
                self._conn.close()
            _forks.shut(self)
            if self._opened is not None and self._opened[1] is not None:
                with _WRITERS_LOCK:
                    _WRITERS.get(self._opened[1], weakref.WeakSet()).discard(self)
            self._forget()

    def _forget(self) -> None:
        """Forget the file closed and what was known of it (`close`)."""
        self._conn = self._opened = self._wal = None
        self._sk = PerSession()
        self._tails = Tails()
        self._named = Tails()

    def _same_file(self, done: str = "written") -> None:
        """Refuse to write, or read, when the file at the store's path is no longer the one this
        store opened (deleted, or another moved over it): SQLite would go on with the orphaned
        file, which no other process uses, so answers it acknowledged would be lost and readers
        would never see another change. So does a writer's -wal or -shm deleted or replaced
        (`_abandon`). It costs a `stat` of the path, and of those two for a writer."""
        if self._opened is None:
            return
        where, identity = self._opened
        if identity is None or _identity(where) != identity:
            self._abandon(identity)
            raise StoreGone(
                f"{self.path} was deleted or replaced after this store opened it; nothing was "
                f"{done}. Close the store (or restart the process) to open the file there now."
            )
        if self._wal is not None and _wal_files(self._wal_paths) != self._wal:
            # Its WAL would be this process's alone: the commits of others, written to the
            # new one, lost when this one checkpoints over them.
            self._abandon(identity)
            raise StoreGone(
                f"the -wal or -shm file of {self.path} was deleted or replaced after this store "
                f"opened it; nothing was {done}, and what this process wrote to them before is "
                "lost. Restart the process to open the store anew."
            )

    def _among_writers(self, conn: sqlite3.Connection, identity: tuple[int, int] | None) -> None:
        """Count this store among the process's writers of the file. One here that opened it
        with another -wal or -shm (deleted or replaced since) means SQLite gives this
        connection that one's old -shm too: both are refused, that one's left open."""
        if identity is None:
            return
        with _WRITERS_LOCK:
            writers = _WRITERS.setdefault(identity, weakref.WeakSet())
            stale = [w for w in list(writers) if _is_open(w._conn) and w._wal != self._wal]
            if not stale:
                writers.add(self)
                return
        for writer in stale:
            writer._abandon(identity)
        conn.close()  # not the file's last connection here: SQLite checkpoints nothing
        raise StoreGone(
            f"the -wal or -shm file of {self.path} was deleted or replaced while this process "
            "had it open: restart the process to open it (SQLite would read it through the old "
            "ones here)"
        )

    def _abandon(self, identity: tuple[int, int] | None) -> None:
        """Leave this store's writing connection open for the life of the process: closed, as
        the file's last connection in this process, SQLite would write the WAL it has (the old
        one) over the database, and delete the -wal there by name, another process's new one
        with its commits. Its file is not opened again here: SQLite would share the old -shm."""
        conn = self._conn
        if self._access != "rw" or conn is None or conn in _ABANDONED_CONNECTIONS:
            return
        _ABANDONED_CONNECTIONS.append(conn)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(conn))  # never freed, so never closed
        if identity is not None:
            _ABANDONED.add(identity)

    def _writable(self) -> None:
        """Refuse a write, naming why, to a store opened read-only or deleted or replaced."""
        if self._access != "rw":
            why = (
                "SQLite cannot make the -wal and -shm files it writes through; nothing was "
                "written. The store takes writes again at its first call once the disk has room."
                if self._full
                else "it may not write the file, or create its -wal and -shm files in its "
                "directory; nothing was written. Check their owner and mode, or run as the user "
                "that owns the store."
            )
            raise StoreError(f"{self.path} is {self._refusal()}: {why}")
        if self._opened is not None and _forks.inherited(self._opened[1]):
            raise _forks.refuse_inherited(self.path, "written")
        self._same_file()

    def _refusal(self) -> str:
        """Why a store opened read-only may not write."""
        if self._full:
            return "on a full disk (no space left on the device)"
        return "read-only to this process"

    def _readable(self, every: float = READ_CHECK_EVERY) -> None:
        """Before a read: `_same_file` (at most every `every` seconds); and once a writer has
        opened a file this store reads as immutable (its -wal exists), read through the WAL;
        once one wrote and closed it since (it changed), or the writer read through closed (its
        -shm is gone or new), open it anew: neither connection would ever see another commit.
        Nothing when the store is closed: the read opens it, checking the file there then."""
        if self._conn is None:
            return
        where = self._where()
        if self._access == "ro" and _identity(beside(where, "-shm")) != self._shm:
            self._reopen()
        elif self._access == "immutable":
            if os.path.exists(beside(where, "-wal")):
                self._follow_writer()
            elif _stamp(where) != self._stamp:
                self._reopen()
        now = time.monotonic()
        if now - self._checked >= every:
            self._same_file("read")
            self._checked = now

    def _where(self) -> str:
        return self.path if self._opened is None else self._opened[0]

    def _wal_file(self) -> str:
        """The -wal file: the one the writing connection opened, found where its path led then
        (not from another directory after a `chdir`), else the one beside the file now."""
        return self._wal_paths[0] if self._wal is not None else beside(self._where(), "-wal")

    def _follow_writer(self) -> bool:
        """Swap the read-only connection for one reading the writer's -wal and -shm; until the
        writer has made its -shm too, keep reading the file as is. Returns whether it did."""
        shm = _identity(beside(self._where(), "-shm"))  # before opening: a change meanwhile reopens
        try:
            conn = self._connect("ro")
        except sqlite3.Error:
            return False
        try:
            conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        except sqlite3.Error:
            conn.close()
            return False
        old, self._conn, self._access, self._shm = self._conn, conn, "ro", shm
        if old is not None:
            old.close()
        return True

    def _reopen(self) -> None:
        """Open the file anew, read-only: through the -wal of a writer that has it, else as
        immutable as it is now. Not another file moved over it: `_same_file` refuses that."""
        where = self._where()
        if self._opened is not None and _identity(where) != self._opened[1]:
            return
        if os.path.exists(beside(where, "-wal")) and self._follow_writer():
            return
        stamp = _stamp(where)
        try:
            conn = self._connect("immutable")
        except sqlite3.Error:
            return
        old, self._conn, self._access, self._stamp = self._conn, conn, "immutable", stamp
        if old is not None:
            old.close()

    def set_fault_hook(self, hook: FaultHook | None) -> None:
        self._fault = hook

    def _mended(self) -> None:
        """At the start of a store call (under the lock, no connection taken yet): a file opened
        read-only whose mode (or its folder's) now lets this process write, or whose disk has
        room now, is opened anew, writable, by the call; else its writes were refused until the
        process restarted."""
        if self._conn is not None and self._access != "rw" and open_access(self.path) == "rw":
            self._shut()

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            self.open_sync()
        assert self._conn is not None
        return self._conn

    def _session_key(self, session_id: str, *, fresh: bool = False) -> int | None:
        """The session's row key, as remembered unless `fresh` (read anew: a write that adds a
        row of the session, lest it add one of a session another process deleted)."""
        sk = None if fresh else self._sk.get(session_id)
        if sk is None:
            row = self.conn.execute("SELECT sk FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is None:
                return None
            sk = self._sk[session_id] = int(row[0])
        return sk

    def _before(self, label: str) -> None:
        if self._fault is not None:
            self._hook("before", label)

    def _after(self, label: str) -> None:
        if self._fault is not None:
            self._hook("after", label)

    def _hook(self, when: Literal["before", "after"], label: str) -> None:
        """Run the fault hook, unless an attempt of this call that another connection's lock
        turned back ran it here already (`serialised` runs the call again from its start)."""
        assert self._fault is not None
        self._hooks_run += 1
        if self._hooks_run > self._hooks_fired:
            self._fault(when, label)
