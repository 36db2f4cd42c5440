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

from .._events import SCHEMA_VERSION, Event, dumps, loads
from .._exceptions import (
    AppendConflict,
    LeaseLost,
    RequestClosed,
    SchemaVersionError,
    StoreError,
    UnknownSession,
)
from .._types import InputRequest
from ._audit import AuditEntry, AuditRow, audit_rows, chain_hash, loaded_data, stored_data
from ._base import Commit, FaultHook, Loaded, PendingFilter, SessionSummary, StoredRequest

__all__ = ["SQLiteStore"]

STORE_SCHEMA = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    sk INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    agent TEXT NOT NULL,
    head INTEGER NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS sessions_by_status ON sessions (status, updated_at);
CREATE TABLE IF NOT EXISTS events (
    sk INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    turn TEXT,
    at REAL NOT NULL,
    v INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (sk, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshots (
    sk INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY,
    sk INTEGER NOT NULL,
    agent TEXT NOT NULL,
    kind TEXT NOT NULL,
    tool TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    outcome TEXT,
    data TEXT NOT NULL,
    resolution TEXT
);
CREATE INDEX IF NOT EXISTS requests_by_status ON requests (status, created_at);
CREATE INDEX IF NOT EXISTS requests_by_session ON requests (sk, status);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    stream TEXT NOT NULL,
    n INTEGER NOT NULL,
    type TEXT NOT NULL,
    at REAL NOT NULL,
    seq INTEGER,
    data TEXT NOT NULL,
    prev TEXT,
    hash TEXT NOT NULL,
    UNIQUE (stream, n)
);
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
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            with _immediate(conn):
                for statement in _SCHEMA.strip().split(";"):
                    if statement.strip():
                        conn.execute(statement)
                row = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
                if row is None:
                    conn.execute(
                        "INSERT INTO meta (key, value) VALUES ('schema', ?)", (str(STORE_SCHEMA),)
                    )
                elif int(row[0]) > STORE_SCHEMA:
                    raise SchemaVersionError(
                        f"{self.path} has store schema {row[0]}; this signoff knows up to "
                        f"{STORE_SCHEMA}. Upgrade signoff."
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
                self._insert_events(conn, sk, events)
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"session {session_id!r} already exists") from exc
        self._sk[session_id] = sk
        self._after("session.created")

    async def commit(self, commit: Commit) -> None:
        conn = self.conn
        label = commit.events[0].type if commit.events else "commit"
        self._before(label)
        if commit.durable:
            conn.execute("PRAGMA synchronous=FULL")
        try:
            with _immediate(conn):
                row = conn.execute(
                    "SELECT sk, head FROM sessions WHERE id=?", (commit.session_id,)
                ).fetchone()
                if row is None:
                    raise UnknownSession(commit.session_id)
                sk, head = int(row[0]), int(row[1])
                if head != commit.expected_seq:
                    raise AppendConflict(
                        f"session {commit.session_id!r} is at seq {head}, not {commit.expected_seq}"
                    )
                if commit.lease_token is not None:
                    lease = conn.execute("SELECT token FROM leases WHERE sk=?", (sk,)).fetchone()
                    if lease is None or int(lease[0]) != commit.lease_token:
                        raise LeaseLost(
                            f"lease {commit.lease_token} on session {commit.session_id!r} "
                            "was taken over"
                        )
                for r in commit.resolve:
                    cur = conn.execute(
                        "UPDATE requests SET status=?, outcome=?, resolution=? "
                        "WHERE id=? AND sk=? AND status='pending'",
                        (r.status, r.outcome, dumps(r.resolution), r.request_id, sk),
                    )
                    if cur.rowcount != 1:
                        raise RequestClosed(
                            f"request {r.request_id} is no longer pending", [r.request_id]
                        )
                for req in commit.new_requests:
                    conn.execute(
                        "INSERT INTO requests (id, sk, agent, kind, tool, status, created_at, "
                        "data) VALUES (?,?,?,?,?,?,?,?)",
                        (
                            req.id,
                            sk,
                            req.agent,
                            req.kind,
                            req.tool_name,
                            "pending",
                            req.created_at,
                            dumps(req.model_dump(mode="json", exclude_defaults=True)),
                        ),
                    )
                for req in commit.updated_requests:
                    conn.execute(
                        "UPDATE requests SET data=? WHERE id=? AND sk=?",
                        (dumps(req.model_dump(mode="json", exclude_defaults=True)), req.id, sk),
                    )
                if commit.events:
                    self._insert_events(conn, sk, commit.events)
                    self._insert_audit(conn, audit_rows(commit.events))
                    last = commit.events[-1]
                    conn.execute(
                        "UPDATE sessions SET head=?, updated_at=?, status=COALESCE(?, status), "
                        "expires_at=? WHERE sk=?",
                        (last.seq, last.at, commit.status, commit.expires_at, sk),
                    )
                if commit.snapshot is not None:
                    conn.execute(
                        "INSERT INTO snapshots (sk, seq, data) VALUES (?,?,?) "
                        "ON CONFLICT (sk) DO UPDATE SET seq=excluded.seq, data=excluded.data",
                        (sk, commit.snapshot["seq"], dumps(commit.snapshot)),
                    )
        except sqlite3.IntegrityError as exc:
            raise AppendConflict(f"session {commit.session_id!r}: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(f"SQLite commit failed: {exc}") from exc
        finally:
            if commit.durable:
                conn.execute("PRAGMA synchronous=NORMAL")
        self._after(label)

    @staticmethod
    def _insert_audit(conn: sqlite3.Connection, rows: Sequence[AuditRow]) -> None:
        last: dict[str, tuple[int, str | None]] = {}
        for row in rows:
            if row.stream not in last:
                found = conn.execute(
                    "SELECT n, hash FROM audit WHERE stream=? ORDER BY n DESC LIMIT 1",
                    (row.stream,),
                ).fetchone()
                last[row.stream] = (0, None) if found is None else (int(found[0]), found[1])
            n, prev = last[row.stream]
            n += 1
            digest = chain_hash(
                prev, stream=row.stream, n=n, type=row.type, at=row.at, seq=row.seq, data=row.data
            )
            conn.execute(
                "INSERT INTO audit (stream, n, type, at, seq, data, prev, hash) "
                "VALUES (?,?,?,?,?,?,?,?)",
                (row.stream, n, row.type, row.at, row.seq, stored_data(row), prev, digest),
            )
            last[row.stream] = (n, digest)

    async def record_audit(self, rows: Sequence[AuditRow]) -> None:
        """Append entries that no event carries (tool setting changes)."""
        conn = self.conn
        with _immediate(conn):
            self._insert_audit(conn, rows)

    async def audit(
        self, *, stream: str | None = None, after_id: int = 0, limit: int = 1000
    ) -> list[AuditEntry]:
        # An entry of a session's event keeps no copy of its data: it is read from the event,
        # so the chain also covers the event log itself.
        sql = (
            "SELECT a.id, a.stream, a.n, a.type, a.at, a.seq, "
            "CASE WHEN a.seq IS NULL THEN a.data ELSE e.data END, a.prev, a.hash FROM audit a "
            "LEFT JOIN sessions s ON a.seq IS NOT NULL AND s.id = a.stream "
            "LEFT JOIN events e ON e.sk = s.sk AND e.seq = a.seq WHERE a.id>?"
        )
        params: list[Any] = [after_id]
        if stream is not None:
            sql += " AND a.stream=?"
            params.append(stream)
        sql += " ORDER BY a.id LIMIT ?"
        params.append(limit)
        return [
            AuditEntry(
                id=i, stream=st, n=n, type=t, at=at, seq=seq, data=loaded_data(d), prev=prev, hash=h
            )
            for i, st, n, t, at, seq, d, prev, h in self.conn.execute(sql, params)
        ]

    @staticmethod
    def _insert_events(conn: sqlite3.Connection, sk: int, events: Sequence[Event]) -> None:
        conn.executemany(
            "INSERT INTO events (sk, seq, type, turn, at, v, data) VALUES (?,?,?,?,?,?,?)",
            [(sk, e.seq, e.type, e.turn_id, e.at, e.v, dumps(e.data)) for e in events],
        )

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
            snapshot = loads(snap_row[1])
        events = self._events(session_id, sk, after, None, None)
        return Loaded(session_id=session_id, agent=agent, snapshot=snapshot, events=events)

    async def read_events(
        self,
        session_id: str,
        after: int = 0,
        *,
        limit: int | None = None,
        types: Sequence[str] | None = None,
    ) -> list[Event]:
        sk = self._session_key(session_id)
        if sk is None:
            raise UnknownSession(session_id)
        return self._events(session_id, sk, after, limit, types)

    def _events(
        self,
        session_id: str,
        sk: int,
        after: int,
        limit: int | None,
        types: Sequence[str] | None,
    ) -> list[Event]:
        sql = "SELECT seq, type, turn, at, v, data FROM events WHERE sk=? AND seq>?"
        params: list[Any] = [sk, after]
        if types:
            sql += f" AND type IN ({','.join('?' * len(types))})"
            params.extend(types)
        sql += " ORDER BY seq"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(limit)
        return [
            Event.from_row(
                session_id=session_id,
                seq=seq,
                type=type_,
                turn_id=turn,
                at=at,
                v=v,
                data=loads(data),
            )
            for seq, type_, turn, at, v, data in self.conn.execute(sql, params)
        ]

    async def head(self, session_id: str) -> int | None:
        row = self.conn.execute("SELECT head FROM sessions WHERE id=?", (session_id,)).fetchone()
        return None if row is None else int(row[0])

    async def get_request(self, request_id: str) -> StoredRequest | None:
        row = self.conn.execute(
            "SELECT r.data, r.status, r.outcome, r.resolution, s.id FROM requests r "
            "JOIN sessions s ON s.sk = r.sk WHERE r.id=?",
            (request_id,),
        ).fetchone()
        if row is None:
            return None
        return StoredRequest(
            request=_request(row[0], row[1]),
            status=row[1],
            outcome=row[2],
            resolution=None if row[3] is None else loads(row[3]),
        )

    def _filter_sql(self, flt: PendingFilter) -> tuple[str, list[Any]]:
        return flt.where("?")

    async def pending(self, flt: PendingFilter) -> list[InputRequest]:
        clause, params = self._filter_sql(flt)
        rows = self.conn.execute(
            "SELECT r.data, r.status FROM requests r JOIN sessions s ON s.sk=r.sk"
            f"{clause} ORDER BY r.created_at, r.id LIMIT ? OFFSET ?",
            [*params, flt.limit, flt.offset],
        ).fetchall()
        return [_request(data, status) for data, status in rows]

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
                return 1
            held_by, token, expires_at = lease
            if held_by != "" and held_by != owner and expires_at > now:
                return None
            conn.execute(
                "UPDATE leases SET owner=?, token=?, expires_at=? WHERE sk=?",
                (owner, int(token) + 1, now + ttl, sk),
            )
            return int(token) + 1

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
        return claimed

    async def release_lease(self, session_id: str, owner: str, token: int) -> None:
        conn = self.conn
        sk = self._session_key(session_id)
        with _immediate(conn):
            conn.execute(
                "UPDATE leases SET owner='', expires_at=0 WHERE sk=? AND owner=? AND token=?",
                (sk, owner, token),
            )

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


def _request(data: str, status: str) -> InputRequest:
    raw = loads(data)
    if raw.get("v", SCHEMA_VERSION) > SCHEMA_VERSION:
        raise SchemaVersionError(f"request {raw.get('id')} was written by a newer signoff")
    raw["status"] = status
    return InputRequest.model_validate(raw)


@contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
