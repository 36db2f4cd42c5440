"""The embedded default store: one SQLite file in WAL mode, safe for several processes at once.

Every write is one `BEGIN IMMEDIATE` transaction, so writers queue on SQLite's lock rather than
fail half-way; the per-session head check and the request compare-and-set live in that same
transaction. Commits that acknowledge an answer run with `synchronous=FULL`.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .._events import Event, dumps
from .._exceptions import (
    AppendConflict,
    LeaseLost,
    RequestClosed,
    SchemaVersionError,
    StoreError,
    UnknownSession,
)
from .._types import InputRequest
from ._audit import AUDIT_TYPES, AuditEntry, AuditRow, chain_hash, chain_session, loaded_data
from ._base import (
    Commit,
    FaultHook,
    Loaded,
    PendingFilter,
    SessionSummary,
    StoredRequest,
    request_rows,
    stored_request,
)
from ._codec import (
    CHAIN_MAX,
    DEFLATE_ON_PREVIOUS,
    EventTexts,
    Stored,
    event_text,
    needs_previous,
    pack,
    pack_event,
    stored_type,
    type_name,
    unpack,
)

__all__ = ["SQLiteStore"]

STORE_SCHEMA = 2

PAGE_SIZE = 2048
"""Bytes per page of a new file. Rows are small (event data is packed), and every table and
index costs at least a page, and each commit writes whole pages to the WAL."""

WAL_CHECKPOINT_PAGES = 256

_TAILS_KEPT = 1024
"""Sessions whose last written event a store keeps at hand, to store the next one on it."""

TURN_NAMED_EVERY = 64
"""An event row names its turn when the turn changes, and at least every 64 rows, so finding
an event's turn never scans back further than that."""


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    sk INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    agent TEXT NOT NULL,
    head INTEGER NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    expires_at REAL,
    audit_n INTEGER NOT NULL DEFAULT 0,
    audit_hash BLOB
);
CREATE INDEX IF NOT EXISTS sessions_by_status ON sessions (status, updated_at);
CREATE TABLE IF NOT EXISTS events (
    sk INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    turn TEXT,
    at REAL NOT NULL,
    v INTEGER NOT NULL,
    data BLOB NOT NULL,
    PRIMARY KEY (sk, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshots (
    sk INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY,
    sk INTEGER NOT NULL,
    seq INTEGER,
    idx INTEGER,
    agent TEXT NOT NULL,
    kind TEXT NOT NULL,
    tool TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    outcome TEXT,
    data BLOB,
    resolution BLOB
);
CREATE INDEX IF NOT EXISTS requests_pending ON requests (created_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS requests_by_session ON requests (sk, status);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    sk INTEGER,
    stream TEXT,
    n INTEGER NOT NULL,
    seq INTEGER,
    type TEXT,
    at REAL,
    data TEXT,
    hash BLOB NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS audit_by_session ON audit (sk, n) WHERE sk IS NOT NULL;
CREATE UNIQUE INDEX IF NOT EXISTS audit_by_stream ON audit (stream, n) WHERE stream IS NOT NULL;
CREATE TABLE IF NOT EXISTS leases (
    sk INTEGER PRIMARY KEY,
    owner TEXT NOT NULL,
    token INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
"""


def _path_from_url(url: str) -> str:
    if not url.startswith("sqlite://"):
        raise StoreError(f"not a SQLite URL: {url!r} (expected sqlite:///path/to/file.db)")
    rest = url[len("sqlite://") :]
    if not rest.startswith("/"):
        raise StoreError(
            f"SQLite URL needs three slashes: sqlite:///relative or sqlite:////abs: {url!r}"
        )
    path = rest[1:]
    if not path:
        raise StoreError(f"SQLite URL names no file: {url!r}")
    return path


class SQLiteStore:
    """`Store` on one SQLite file (`sqlite:///path`); `sqlite:///:memory:` for throwaway use."""

    def __init__(self, url: str = "sqlite:///.signoff/state.db", *, busy_timeout: float = 30.0):
        self.url = url
        self.path = _path_from_url(url)
        self.busy_timeout = busy_timeout
        self._conn: sqlite3.Connection | None = None
        self._fault: FaultHook | None = None
        self._sk: dict[str, int] = {}
        self._tail: dict[int, tuple[int, tuple[str, int] | None]] = {}
        self._leased: set[tuple[str, int]] = set()

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        self.open_sync()

    def open_sync(self) -> None:
        if self._conn is not None:
            return
        if self.path != ":memory:":
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the directory of {self.path}: {exc}") from exc
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
            conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new file only; before WAL
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            # Checkpoint every 256 pages (512 KB) and shrink the WAL back to that size after,
            # instead of SQLite's default of letting it reach and stay at about 4 MB.
            conn.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
            conn.execute(f"PRAGMA journal_size_limit={WAL_CHECKPOINT_PAGES * PAGE_SIZE}")
            with _immediate(conn):
                conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
                row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                found = STORE_SCHEMA if row is None else int(row[0])
                if found > STORE_SCHEMA:
                    raise SchemaVersionError(
                        f"{self.path} has store schema {row[0]}; this signoff knows up to "
                        f"{STORE_SCHEMA}. Upgrade signoff."
                    )
                if found == 1:
                    _upgrade_from_1(conn)
                for statement in _SCHEMA.strip().split(";"):
                    if statement.strip():
                        conn.execute(statement)
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema', ?) "
                    "ON CONFLICT (key) DO UPDATE SET value=excluded.value",
                    (str(STORE_SCHEMA),),
                )
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite store {self.path}: {exc}") from exc
        self._conn = conn

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def set_fault_hook(self, hook: FaultHook | None) -> None:
        self._fault = hook

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            self.open_sync()
        assert self._conn is not None
        return self._conn

    def _session_key(self, session_id: str) -> int | None:
        sk = self._sk.get(session_id)
        if sk is None:
            row = self.conn.execute("SELECT sk FROM sessions WHERE id=?", (session_id,)).fetchone()
            if row is None:
                return None
            sk = self._sk[session_id] = int(row[0])
        return sk

    # -- writes -------------------------------------------------------------------------------

    async def create_session(
        self, session_id: str, agent: str, events: Sequence[Event], expires_at: float | None
    ) -> None:
        conn = self.conn
        at = events[0].at
        self._before("session.created")
        try:
            with _immediate(conn):
                cur = conn.execute(
                    "INSERT INTO sessions (id, agent, head, status, created_at, updated_at, "
                    "expires_at) VALUES (?,?,?,?,?,?,?)",
                    (session_id, agent, events[-1].seq, "idle", at, at, expires_at),
                )
                sk = int(cur.lastrowid or 0)
                tail = self._insert_events(conn, sk, events, None, None)
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"session {session_id!r} already exists") from exc
        self._sk[session_id] = sk
        self._remember_tail(sk, events[-1].seq, tail)
        self._after("session.created")

    async def commit(self, commit: Commit) -> None:
        conn = self.conn
        label = commit.events[0].type if commit.events else "commit"
        self._before(label)
        if commit.durable:
            conn.execute("PRAGMA synchronous=FULL")
        sk, tail = -1, None
        try:
            with _immediate(conn):
                row = conn.execute(
                    "SELECT s.sk, s.head, l.token, s.audit_n, s.audit_hash FROM sessions s "
                    "LEFT JOIN leases l ON l.sk = s.sk WHERE s.id=?",
                    (commit.session_id,),
                ).fetchone()
                if row is None:
                    raise UnknownSession(commit.session_id)
                sk, head = int(row[0]), int(row[1])
                if head != commit.expected_seq:
                    raise AppendConflict(
                        f"session {commit.session_id!r} is at seq {head}, not {commit.expected_seq}"
                    )
                if commit.lease_token is not None and (
                    row[2] is None or int(row[2]) != commit.lease_token
                ):
                    raise LeaseLost(
                        f"lease {commit.lease_token} on session {commit.session_id!r} "
                        "was taken over"
                    )
                for r in commit.resolve:
                    cur = conn.execute(
                        "UPDATE requests SET status=?, outcome=?, resolution=? "
                        "WHERE id=? AND sk=? AND status='pending'",
                        (r.status, r.outcome, pack(r.resolution), r.request_id, sk),
                    )
                    if cur.rowcount != 1:
                        raise RequestClosed(
                            f"request {r.request_id} is no longer pending", [r.request_id]
                        )
                if commit.new_requests:
                    conn.executemany(
                        "INSERT INTO requests (id, sk, seq, idx, agent, kind, tool, status, "
                        "created_at, data) VALUES (?,?,?,?,?,?,?,'pending',?,?)",
                        [
                            (
                                req.id,
                                sk,
                                *where,
                                req.agent,
                                req.kind,
                                req.tool_name,
                                req.created_at,
                                copy,
                            )
                            for req, where, copy in request_rows(commit, pack)
                        ],
                    )
                for req in commit.updated_requests:
                    conn.execute(
                        "UPDATE requests SET data=? WHERE id=? AND sk=?",
                        (pack(req.model_dump(mode="json", exclude_defaults=True)), req.id, sk),
                    )
                if commit.events:
                    tail = self._insert_events(
                        conn,
                        sk,
                        commit.events,
                        self._turn_at(sk, head),
                        self._previous(conn, sk, head),
                    )
                    n, digest = int(row[3]), None if row[4] is None else bytes(row[4])
                    n, digest = self._insert_session_audit(conn, sk, n, digest, commit.events)
                    last = commit.events[-1]
                    conn.execute(
                        "UPDATE sessions SET head=?, updated_at=?, status=COALESCE(?, status), "
                        "expires_at=?, audit_n=?, audit_hash=? WHERE sk=?",
                        (last.seq, last.at, commit.status, commit.expires_at, n, digest, sk),
                    )
                if commit.snapshot is not None:
                    conn.execute(
                        "INSERT INTO snapshots (sk, seq, data) VALUES (?,?,?) "
                        "ON CONFLICT (sk) DO UPDATE SET seq=excluded.seq, data=excluded.data",
                        (sk, commit.snapshot["seq"], pack(commit.snapshot)),
                    )
                if commit.release_lease and commit.lease_token is not None:
                    conn.execute(
                        "UPDATE leases SET owner='', expires_at=0 WHERE sk=? AND token=?",
                        (sk, commit.lease_token),
                    )
        except sqlite3.IntegrityError as exc:
            self._tail.pop(sk, None)
            raise AppendConflict(f"session {commit.session_id!r}: {exc}") from exc
        except sqlite3.Error as exc:
            self._tail.pop(sk, None)
            raise StoreError(f"SQLite commit failed: {exc}") from exc
        finally:
            if commit.durable:
                conn.execute("PRAGMA synchronous=NORMAL")
        if commit.events:
            self._remember_tail(sk, commit.events[-1].seq, tail)
        self._after(label)
        if commit.release_lease and commit.lease_token is not None:
            parked = any(e.type == "turn.waiting" for e in commit.events)
            self._given_back(commit.session_id, commit.lease_token, parked=parked)

    @staticmethod
    def _insert_session_audit(
        conn: sqlite3.Connection, sk: int, n: int, digest: bytes | None, events: Sequence[Event]
    ) -> tuple[int, bytes | None]:
        """Chain the audited events of a commit onto the session's stream, whose head the
        session row keeps; the entries hold no copy of the events, only their place and hash."""
        entries = chain_session(n, digest, events)
        if entries:
            conn.executemany(
                "INSERT INTO audit (sk, n, seq, hash) VALUES (?,?,?,?)",
                [(sk, *entry) for entry in entries],
            )
            n, _, digest = entries[-1]
        return n, digest

    async def record_audit(self, rows: Sequence[AuditRow]) -> None:
        """Append entries that no event carries (tool setting changes)."""
        conn = self.conn
        with _immediate(conn):
            last: dict[str, tuple[int, str | None]] = {}
            for row in rows:
                if row.stream not in last:
                    found = conn.execute(
                        "SELECT n, hash FROM audit WHERE stream=? ORDER BY n DESC LIMIT 1",
                        (row.stream,),
                    ).fetchone()
                    last[row.stream] = (0, None) if found is None else (found[0], found[1].hex())
                n, prev = last[row.stream]
                n += 1
                digest = chain_hash(
                    prev, stream=row.stream, n=n, type=row.type, at=row.at, seq=None, data=row.data
                )
                conn.execute(
                    "INSERT INTO audit (stream, n, type, at, data, hash) VALUES (?,?,?,?,?,?)",
                    (row.stream, n, row.type, row.at, dumps(row.data), bytes.fromhex(digest)),
                )
                last[row.stream] = (n, digest)

    async def audit(
        self, *, stream: str | None = None, after_id: int = 0, limit: int = 1000
    ) -> list[AuditEntry]:
        # An entry of a session's event keeps only its place and hash: its type, time and data
        # are read from the event, so the chain also covers the event log itself; `prev` is the
        # hash of the entry before it in its stream.
        sql = (
            "SELECT a.id, COALESCE(s.id, a.stream), a.n, COALESCE(e.type, a.type), "
            "COALESCE(e.at, a.at), a.seq, CASE WHEN a.sk IS NULL THEN a.data ELSE e.data END, "
            "COALESCE(p.hash, q.hash), a.hash, p1.data, p2.data FROM audit a "
            "LEFT JOIN sessions s ON s.sk = a.sk "
            "LEFT JOIN events e ON e.sk = a.sk AND e.seq = a.seq" + _EARLIER_JOIN + " "
            "LEFT JOIN audit p ON a.sk IS NOT NULL AND p.sk = a.sk AND p.n = a.n - 1 "
            "LEFT JOIN audit q ON a.stream IS NOT NULL AND q.stream = a.stream AND q.n = a.n - 1 "
            "WHERE a.id>?"
        )
        params: list[Any] = [after_id]
        if stream is not None:
            sk = self._session_key(stream)
            sql += " AND a.stream=?" if sk is None else " AND a.sk=?"
            params.append(stream if sk is None else sk)
        sql += " ORDER BY a.id LIMIT ?"
        params.append(limit)
        entries = []
        for i, st, n, t, at, seq, d, prev, h, *earlier in self.conn.execute(sql, params):
            entries.append(
                AuditEntry(
                    id=i,
                    stream=st,
                    n=n,
                    type=type_name(t) if t is not None else "",
                    at=at if at is not None else 0.0,
                    seq=seq,
                    data=loaded_data(None if d is None else event_text(d, earlier)),
                    prev=None if prev is None else bytes(prev).hex(),
                    hash=bytes(h).hex(),
                )
            )
        return entries

    def _turn_at(self, sk: int, head: int) -> tuple[str, int] | None:
        """The turn of the session's event `head` and how many events back a row names it."""
        row = self.conn.execute(
            "SELECT seq, turn FROM events WHERE sk=? AND seq<=? AND turn IS NOT NULL "
            "ORDER BY seq DESC LIMIT 1",
            (sk, head),
        ).fetchone()
        return None if row is None else (str(row[1]), head - int(row[0]))

    @staticmethod
    def _insert_events(
        conn: sqlite3.Connection,
        sk: int,
        events: Sequence[Event],
        turn_before: tuple[str, int] | None,
        previous: tuple[str, int] | None,
    ) -> tuple[str, int] | None:
        """Insert a commit's events; returns what the next event may be stored on. An audited
        event is never stored on, so altering one in the log is reported at its entry alone."""
        # `turn` is NULL when the event belongs to the turn of the event before it: only a
        # turn's first event names it ('' for none), and one in every TURN_NAMED_EVERY again.
        rows = []
        turn, since = turn_before or (None, 0)
        for e in events:
            named = e.turn_id or ""
            same = named == turn and since + 1 < TURN_NAMED_EVERY
            since = since + 1 if same else 0
            data, previous = pack_event(e.data, previous)
            if e.type in AUDIT_TYPES:
                previous = None
            rows.append((sk, e.seq, stored_type(e.type), None if same else named, e.at, e.v, data))
            turn = named
        conn.executemany(
            "INSERT INTO events (sk, seq, type, turn, at, v, data) VALUES (?,?,?,?,?,?,?)", rows
        )
        return previous

    def _previous(self, conn: sqlite3.Connection, sk: int, head: int) -> tuple[str, int] | None:
        """The text of the session's event `head` and how many events reading it needs, for the
        next event to be stored on; None if it cannot be read (that event then stands alone)."""
        known = self._tail.get(sk)
        if known is not None and known[0] == head:
            return known[1]
        rows: dict[int, Stored] = {}
        try:
            for seq, code, data in conn.execute(
                "SELECT seq, type, data FROM events WHERE sk=? AND seq BETWEEN ? AND ?",
                (sk, head - CHAIN_MAX, head),
            ):
                if seq == head and type_name(code) in AUDIT_TYPES:
                    return None
                rows[seq] = data
            if head not in rows:
                return None
            text = event_text(rows[head], [rows.get(head - i) for i in range(1, CHAIN_MAX + 1)])
        except StoreError:
            return None
        needs = 0
        while needs < CHAIN_MAX and needs_previous(rows.get(head - needs)):
            needs += 1
        return text, needs

    def _remember_tail(self, sk: int, seq: int, tail: tuple[str, int] | None) -> None:
        self._tail.pop(sk, None)
        if len(self._tail) >= _TAILS_KEPT:
            del self._tail[next(iter(self._tail))]
        self._tail[sk] = (seq, tail)

    def _stored_before(self, sk: int, seq: int) -> list[Stored | None]:
        """The stored data of the events just before `seq`, nearest first."""
        rows = dict(
            self.conn.execute(
                "SELECT seq, data FROM events WHERE sk=? AND seq BETWEEN ? AND ?",
                (sk, seq - CHAIN_MAX, seq - 1),
            ).fetchall()
        )
        return [rows.get(seq - i) for i in range(1, CHAIN_MAX + 1)]

    def _before(self, label: str) -> None:
        if self._fault is not None:
            self._fault("before", label)

    def _after(self, label: str) -> None:
        if self._fault is not None:
            self._fault("after", label)

    # -- reads --------------------------------------------------------------------------------

    async def load(self, session_id: str) -> Loaded | None:
        conn = self.conn
        row = conn.execute("SELECT sk, agent FROM sessions WHERE id=?", (session_id,)).fetchone()
        if row is None:
            return None
        sk, agent = int(row[0]), str(row[1])
        self._sk[session_id] = sk
        snap_row = conn.execute("SELECT seq, data FROM snapshots WHERE sk=?", (sk,)).fetchone()
        after = 0
        snapshot = None
        if snap_row is not None:
            after = int(snap_row[0])
            snapshot = unpack(snap_row[1])
        events = self._events(session_id, sk, after, None, None)
        return Loaded(session_id=session_id, agent=agent, snapshot=snapshot, events=events)

    async def read_events(
        self,
        session_id: str,
        after: int = 0,
        *,
        limit: int | None = None,
        types: Sequence[str] | None = None,
        newest: int | None = None,
    ) -> list[Event]:
        sk = self._session_key(session_id)
        if sk is None:
            raise UnknownSession(session_id)
        return self._events(session_id, sk, after, limit, types, newest)

    def _events(
        self,
        session_id: str,
        sk: int,
        after: int,
        limit: int | None,
        types: Sequence[str] | None,
        newest: int | None = None,
    ) -> list[Event]:
        # Without a type filter the rows are consecutive, so a NULL turn is the one before it
        # in the result; only the first row may need to look further back.
        turn_sql = _TURN if types else "e.turn"
        sql = f"SELECT e.seq, e.type, {turn_sql}, e.at, e.v, e.data FROM events e "
        sql += "WHERE sk=? AND seq>?"
        params: list[Any] = [sk, after]
        if types:
            stored = {stored_type(t) for t in types} | set(types)
            sql += f" AND type IN ({','.join('?' * len(stored))})"
            params.extend(sorted(stored))
        if newest is not None:  # the newest `newest` of them, still oldest first
            sql = f"SELECT * FROM ({sql} ORDER BY seq DESC LIMIT ?) ORDER BY seq"
            params.append(newest)
        else:
            sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        events: list[Event] = []
        turn: str | None = None
        texts = EventTexts(lambda seq: self._stored_before(sk, seq))
        for seq, code, named, at, v, data in self.conn.execute(sql, params).fetchall():
            if named is None:
                named = turn if events else self._turn_before(sk, seq)
            turn = named
            events.append(
                Event.from_row(
                    session_id=session_id,
                    seq=seq,
                    type=type_name(code),
                    turn_id=named or None,
                    at=at,
                    v=v,
                    data=texts.value(seq, data),
                )
            )
        return events

    def _turn_before(self, sk: int, seq: int) -> str | None:
        """The turn named by the nearest event before `seq` that names one."""
        row = self.conn.execute(
            "SELECT turn FROM events WHERE sk=? AND seq<? AND turn IS NOT NULL "
            "ORDER BY seq DESC LIMIT 1",
            (sk, seq),
        ).fetchone()
        return None if row is None else str(row[0])

    async def head(self, session_id: str) -> int | None:
        row = self.conn.execute("SELECT head FROM sessions WHERE id=?", (session_id,)).fetchone()
        return None if row is None else int(row[0])

    async def get_request(self, request_id: str) -> StoredRequest | None:
        row = self.conn.execute(
            f"SELECT r.outcome, r.resolution, {_REQUEST_COLUMNS} FROM requests r "
            f"{_REQUEST_JOIN} WHERE r.id=?",
            (request_id,),
        ).fetchone()
        if row is None:
            return None
        return StoredRequest(
            request=stored_request(*row[2:6], unpack, *row[6:]),
            status=row[5],
            outcome=row[0],
            resolution=None if row[1] is None else unpack(row[1]),
        )

    def _filter_sql(self, flt: PendingFilter) -> tuple[str, list[Any]]:
        return flt.where("?")

    async def pending(self, flt: PendingFilter) -> list[InputRequest]:
        clause, params = self._filter_sql(flt)
        rows = self.conn.execute(
            f"SELECT {_REQUEST_COLUMNS} FROM requests r {_REQUEST_JOIN}"
            f"{clause} ORDER BY r.created_at, r.id LIMIT ? OFFSET ?",
            [*params, flt.limit, flt.offset],
        ).fetchall()
        return [stored_request(*row[:4], unpack, *row[4:]) for row in rows]

    async def count_pending(self, flt: PendingFilter) -> int:
        clause, params = self._filter_sql(flt)
        row = self.conn.execute(
            f"SELECT COUNT(*) FROM requests r JOIN sessions s ON s.sk=r.sk{clause}", params
        ).fetchone()
        return int(row[0])

    # -- leases -------------------------------------------------------------------------------

    async def acquire_lease(
        self, session_id: str, owner: str, ttl: float, now: float
    ) -> int | None:
        conn = self.conn
        with _immediate(conn):
            sk = self._session_key(session_id)
            if sk is None:
                raise UnknownSession(session_id)
            row = conn.execute("SELECT owner, token, expires_at FROM leases WHERE sk=?", (sk,))
            lease = row.fetchone()
            if lease is None:
                conn.execute(
                    "INSERT INTO leases (sk, owner, token, expires_at) VALUES (?,?,1,?)",
                    (sk, owner, now + ttl),
                )
                token = 1
            else:
                held_by, token, expires_at = lease
                if held_by != "" and held_by != owner and expires_at > now:
                    return None
                token = int(token) + 1
                conn.execute(
                    "UPDATE leases SET owner=?, token=?, expires_at=? WHERE sk=?",
                    (owner, token, now + ttl, sk),
                )
        self._leased.add((session_id, token))
        return token

    async def renew_lease(
        self, session_id: str, owner: str, token: int, ttl: float, now: float
    ) -> bool:
        conn = self.conn
        sk = self._session_key(session_id)
        with _immediate(conn):
            cur = conn.execute(
                "UPDATE leases SET expires_at=? WHERE sk=? AND owner=? AND token=?",
                (now + ttl, sk, owner, token),
            )
            return cur.rowcount == 1

    async def sessions(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[SessionSummary]:
        """Sessions, most recently active first."""
        sql = "SELECT id, agent, status, head, created_at, updated_at, expires_at FROM sessions"
        where, params = [], []
        for column, value in (("agent", agent), ("status", status)):
            if value is not None:
                where.append(f"{column}=?")
                params.append(value)
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY updated_at DESC, sk DESC LIMIT ? OFFSET ?"
        return [
            SessionSummary(
                id=i, agent=a, status=st, head=h, created_at=c, updated_at=u, expires_at=x
            )
            for i, a, st, h, c, u, x in self.conn.execute(sql, [*params, limit, offset])
        ]

    async def claim(self, owner: str, ttl: float, now: float, limit: int) -> list[tuple[str, int]]:
        """Lease up to `limit` sessions that have work and no live lease: `(id, token)` each."""
        conn = self.conn
        claimed: list[tuple[str, int]] = []
        with _immediate(conn):
            rows = conn.execute(
                "SELECT s.sk, s.id, l.token FROM sessions s LEFT JOIN leases l ON l.sk = s.sk "
                "WHERE s.status = 'running' AND (l.sk IS NULL OR l.owner = '' OR l.expires_at < ?) "
                "ORDER BY s.updated_at LIMIT ?",
                (now, limit),
            ).fetchall()
            for sk, session_id, token in rows:
                new = 1 if token is None else int(token) + 1
                conn.execute(
                    "INSERT INTO leases (sk, owner, token, expires_at) VALUES (?,?,?,?) "
                    "ON CONFLICT (sk) DO UPDATE SET owner=excluded.owner, token=excluded.token, "
                    "expires_at=excluded.expires_at",
                    (sk, owner, new, now + ttl),
                )
                claimed.append((str(session_id), new))
        self._leased.update(claimed)
        return claimed

    async def release_lease(self, session_id: str, owner: str, token: int) -> None:
        conn = self.conn
        sk = self._session_key(session_id)
        with _immediate(conn):
            conn.execute(
                "UPDATE leases SET owner='', expires_at=0 WHERE sk=? AND owner=? AND token=?",
                (sk, owner, token),
            )
        self._given_back(session_id, token)

    def _given_back(self, session_id: str, token: int, *, parked: bool = False) -> None:
        """Forget a lease this store granted. When that parked a turn (it waits for a person)
        and no lease is left, fold the WAL into the database file: a session waiting for someone
        is in one file of live pages. A fold costs a checkpoint (its fsyncs) and SQLite's page
        cache, which a park can afford and back-to-back turns without a person should not pay:
        when a turn ends without parking, `wal_autocheckpoint` and `journal_size_limit` bound
        the WAL."""
        self._leased.discard((session_id, token))
        if parked and not self._leased:
            self._checkpoint_if_quiet()

    def _checkpoint_if_quiet(self) -> None:
        """Copy the WAL into the database file and truncate it, unless it is empty or another
        connection is reading or writing: the attempt never waits, so a busy file just keeps its
        WAL until the next quiet moment."""
        if self.path == ":memory:" or self._conn is None:
            return
        try:
            if os.path.getsize(self.path + "-wal") == 0:
                return
        except OSError:
            return
        conn = self._conn
        self._before("wal.fold")
        conn.execute("PRAGMA busy_timeout=0")
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error:
            pass  # busy or locked: another connection is at work, and will quiet down later
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        self._after("wal.fold")

    # -- change notifications (polling: SQLite has no NOTIFY) ---------------------------------

    async def wait_for_change(
        self,
        session_id: str | None,
        timeout: float,
        *,
        after: int | None = None,
        poll_interval: float = 0.05,
    ) -> bool:
        """Poll until a commit to `session_id` (any session if None) shows up; False on timeout.

        Given `after`, it returns at once if the session's head is already past it.
        """

        def mark() -> tuple[int, int]:
            if session_id is None:
                row = self.conn.execute("SELECT COUNT(*), COALESCE(SUM(head), 0) FROM sessions")
                count, total = row.fetchone()
                return int(count), int(total)
            head = self.conn.execute("SELECT head FROM sessions WHERE id=?", (session_id,))
            found = head.fetchone()
            if found is None:
                raise UnknownSession(session_id)
            return 0, int(found[0])

        start = mark()
        if after is not None and session_id is not None and start[1] > after:
            return True
        deadline = time.monotonic() + timeout
        while (remaining := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(poll_interval, remaining))
            if mark() != start:
                return True
        return False

    # -- sizes (benchmarks, dashboard) --------------------------------------------------------

    def file_bytes(self) -> int:
        """Bytes on disk: the database file plus its WAL and shared-memory files."""
        if self.path == ":memory:":
            return 0
        return sum(
            os.path.getsize(p)
            for p in (self.path, self.path + "-wal", self.path + "-shm")
            if os.path.exists(p)
        )


def _upgrade_from_1(conn: sqlite3.Connection) -> None:
    """Schema 1 to 2, in the opening transaction: request rows keep their own copies, audit
    entries of sessions move to the compact form and the session rows learn their chain heads."""
    # NULL turn meant "no turn" in schema 1 and means "the turn of the event before" now.
    conn.execute("UPDATE events SET turn = '' WHERE turn IS NULL")
    conn.execute("ALTER TABLE sessions ADD COLUMN audit_n INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE sessions ADD COLUMN audit_hash BLOB")
    conn.execute("ALTER TABLE requests ADD COLUMN seq INTEGER")
    conn.execute("ALTER TABLE requests ADD COLUMN idx INTEGER")
    conn.execute("DROP INDEX IF EXISTS requests_by_status")
    conn.execute("ALTER TABLE audit RENAME TO audit_1")
    conn.execute(
        "CREATE TABLE audit (id INTEGER PRIMARY KEY, sk INTEGER, stream TEXT, n INTEGER NOT NULL, "
        "seq INTEGER, type TEXT, at REAL, data TEXT, hash BLOB NOT NULL)"
    )
    rows = conn.execute(
        "SELECT a.id, s.sk, a.stream, a.n, a.seq, a.type, a.at, a.data, a.hash FROM audit_1 a "
        "LEFT JOIN sessions s ON a.seq IS NOT NULL AND s.id = a.stream ORDER BY a.id"
    ).fetchall()
    conn.executemany(
        "INSERT INTO audit (id, sk, stream, n, seq, type, at, data, hash) "
        "VALUES (?,?,?,?,?,?,?,?,?)",
        [
            (i, sk, None, n, seq, None, None, None, bytes.fromhex(h))
            if sk is not None
            else (i, None, stream, n, seq, type_, at, data, bytes.fromhex(h))
            for i, sk, stream, n, seq, type_, at, data, h in rows
        ],
    )
    conn.execute("DROP TABLE audit_1")
    conn.execute(
        "UPDATE sessions SET audit_n = a.n, audit_hash = a.hash FROM "
        "(SELECT sk, n, hash FROM audit WHERE sk IS NOT NULL AND n = "
        "(SELECT MAX(n) FROM audit b WHERE b.sk = audit.sk)) a WHERE a.sk = sessions.sk"
    )


_TURN = (
    "COALESCE(e.turn, (SELECT p.turn FROM events p WHERE p.sk = e.sk AND p.seq < e.seq "
    "AND p.turn IS NOT NULL ORDER BY p.seq DESC LIMIT 1))"
)
"""An event's turn id: its own, or that of the nearest event before it that names one."""

_EARLIER_JOIN = "".join(
    f" LEFT JOIN events p{i} ON substr(e.data, 1, 1) = x'{DEFLATE_ON_PREVIOUS:02x}' "
    f"AND p{i}.sk = e.sk AND p{i}.seq = e.seq - {i}"
    for i in range(1, CHAIN_MAX + 1)
)
"""The stored events an event `e` may be kept on (`p1.data`, `p2.data`), joined only if it is."""

_REQUEST_COLUMNS = "r.data, e.data, r.idx, r.status, p1.data, p2.data"
_REQUEST_JOIN = (
    "JOIN sessions s ON s.sk = r.sk LEFT JOIN events e ON r.data IS NULL AND e.sk = r.sk "
    "AND e.seq = r.seq" + _EARLIER_JOIN
)


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
