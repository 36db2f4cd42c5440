"""The SQLite store's schema: its tables, the version a file records in `meta`, the upgrade
from schema 1, and the page and WAL sizes a new file gets; `Connection.open_sync` applies them."""

from __future__ import annotations

import sqlite3

__all__ = [
    "PAGE_SIZE",
    "SCHEMA",
    "STORE_SCHEMA",
    "WAL_CHECKPOINT_PAGES",
    "keep_stream_heads",
    "upgrade_from_1",
]

STORE_SCHEMA = 4
"""2: audit entries point at their events, chain heads in the session rows. 3: event rows hold a
type code, a turn id only where it changes, and data that may be stored on the event before
(`_codec.DEFLATE_ON_PREVIOUS`); an older signoff reads none of that, so it refuses the file.
4: each tool-setting stream's chain head is kept in an audit row of its own (`n = 0`, the last
entry's number in `seq`, and a negative id, the negated id of an entry of its stream, so the ids
readers page through have no gaps), which an older signoff would list as an entry.
A file already marked with this version is opened without running `SCHEMA` (so that opening
writes nothing), so any change to `SCHEMA` needs a new version."""

PAGE_SIZE = 2048
"""Bytes per page of a new file. Rows are small (event data is packed), and every table and
index costs at least a page, and each commit writes whole pages to the WAL."""

WAL_CHECKPOINT_PAGES = 256


SCHEMA = """
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


def upgrade_from_1(conn: sqlite3.Connection) -> None:
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


def keep_stream_heads(conn: sqlite3.Connection) -> None:
    """Schema 3 (or older, upgraded) to 4, in the opening transaction: each tool-setting stream
    gets the row keeping its chain head, from its last entry."""
    conn.execute(
        "INSERT INTO audit (id, stream, n, seq, hash) SELECT -id, stream, 0, n, hash FROM audit a "
        "WHERE stream IS NOT NULL AND n = (SELECT MAX(n) FROM audit b WHERE b.stream = a.stream)"
    )
