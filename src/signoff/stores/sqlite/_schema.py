"""The SQLite store's schema: its tables, the version a file records in `meta`, the upgrades
from older schemas, and the page and WAL sizes a new file gets; `Connection.open_sync` applies
them."""

from __future__ import annotations

import re
import sqlite3

from ..._exceptions import StoreError
from .._codec import CHAIN_MAX, DEFLATE_ON_PREVIOUS, stored_type, unpack, unpack_event
from .._initiators import stored_initiator
from .._request_rows import stored_request

__all__ = [
    "CURRENT_TURN",
    "EARLIER_JOIN",
    "FIRST_TURN",
    "PAGE_SIZE",
    "REQUESTS",
    "REQUEST_COLUMNS",
    "REQUEST_JOIN",
    "SCHEMA",
    "STORE_SCHEMA",
    "WAL_CHECKPOINT_PAGES",
    "keep_request_deadlines",
    "keep_session_initiators",
    "keep_session_parents",
    "keep_stream_heads",
    "let_requests_hold_no_copy",
    "names_missing",
    "names_taken",
    "order_children_by_expiry",
    "rebuild_requests",
    "schema_mark",
    "upgrade_from_1",
]

STORE_SCHEMA = 11
"""2: audit entries point at their events, chain heads in the session rows. 3: event rows hold a
type code, a turn id only where it changes, and data that may be stored on the event before
(`_codec.DEFLATE_ON_PREVIOUS`); an older signoff reads none of that, so it refuses the file.
4: each tool-setting stream's chain head is kept in an audit row of its own (`n = 0`, the last
entry's number in `seq`, and a negative id, the negated id of an entry of its stream, so the ids
readers page through have no gaps), which an older signoff would list as an entry.
5: request rows keep their deadline (`expires_at`, indexed while pending), so a sweep reads only
the requests that are due; an older signoff would leave it stale.
6: session rows of subagents name their parent session (`parent`, its `sk`) and the parent's
turn that delegated to them (`parent_turn`), indexed by status, so a sweep lists only children
whose parent no longer waits for them; an older signoff would create children without them.
7: session rows name who started them (`initiator`, the identity as JSON, '' for no principal,
NULL when the first event does not say; `tenant`, a text tenant as JSON), each indexed, so
listings filter by who may see them in SQL; an older signoff would create sessions without them
(which only an admin then lists).
8: the index of children (`sessions_children`) is on their status and TTL deadline, so the
subagent sessions whose TTL passed are a range of it, not every running or waiting one (the
same index redefined, no new one). PostgreSQL indexes a copy of the deadline kept for children
only (its migration 11), lest the commits of every session with a TTL lose their in-place (HOT)
updates; SQLite has no such rule (a row outside a partial index changes none of it), so it
indexes `expires_at` itself and needs no schema 9 for that.
9: `channel_claims`, the claim a channel hub holds (owner, expiry) on delivering to a channel,
with the position it reached, so hubs in any process sharing the store deliver each entry once;
an older signoff would deliver beside the claimant.
10: subagent sessions are indexed by their parent (`sessions_by_parent`), so a deletion finds a
session's subagents' sessions at once: without it SQLite built a temporary index of every
session for each deletion, whose cost grew with the store. Its condition, `parent > 0` (every
key is), is one only a query saying so can use: the queries of children by status and deadline,
which say `parent IS NOT NULL`, keep to `sessions_children`.
11: every file lets a request row go without `data`: one upgraded from schema 1 by a signoff
before this one kept schema 1's `NOT NULL` on it (SQLite alters no constraint in place), so each
new request, whose row's `data` is NULL when its event holds it, was refused; its `requests` is
rebuilt, and any other file's left as is. An older signoff refuses the file, as any newer one.
A file already marked with this version is opened without running `SCHEMA` (so that opening
writes nothing), so any change to `SCHEMA` needs a new version."""

PAGE_SIZE = 2048
"""Bytes per page of a new file. Rows are small (event data is packed), and every table and
index costs at least a page, and each commit writes whole pages to the WAL."""

WAL_CHECKPOINT_PAGES = 256

EARLIER_JOIN = "".join(
    f" LEFT JOIN events p{i} ON substr(e.data, 1, 1) = x'{DEFLATE_ON_PREVIOUS:02x}' "
    f"AND p{i}.sk = e.sk AND p{i}.seq = e.seq - {i}"
    for i in range(1, CHAIN_MAX + 1)
)
"""The stored events an event `e` may be kept on (`p1.data`, `p2.data`), joined only if it is."""

REQUEST_COLUMNS = "r.id, r.data, e.data, r.idx, r.status, p1.data, p2.data"
REQUEST_JOIN = (
    "JOIN sessions s ON s.sk = r.sk LEFT JOIN events e ON r.data IS NULL AND e.sk = r.sk "
    "AND e.seq = r.seq" + EARLIER_JOIN
)
"""What reads a request row back (`stored_request`): its own copy, or the event holding it."""

CURRENT_TURN = (
    "(SELECT t.turn FROM events t WHERE t.sk = {sk} AND t.type IN "
    f"('{stored_type('turn.started')}', 'turn.started') ORDER BY t.seq DESC LIMIT 1)"
)
"""The id of the current turn of the session whose `sk` is `{sk}`: that its last
`turn.started` row names (a row names its turn where the turn changes), NULL before one."""

FIRST_TURN = CURRENT_TURN.replace("ORDER BY t.seq DESC", "ORDER BY t.seq")
"""The id of the first turn of the session whose `sk` is `{sk}` (a subagent's delegated turn),
NULL before one."""


REQUESTS = """CREATE TABLE IF NOT EXISTS requests (
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
    resolution BLOB,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS requests_pending ON requests (created_at) WHERE status = 'pending';
CREATE INDEX IF NOT EXISTS requests_due ON requests (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS requests_by_session ON requests (sk, status);
"""
"""The request rows' table and its indexes, as `SCHEMA` creates them (`rebuild_requests`)."""

SCHEMA = (
    """
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
    audit_hash BLOB,
    parent INTEGER,
    parent_turn TEXT,
    initiator TEXT,
    tenant TEXT
);
CREATE INDEX IF NOT EXISTS sessions_by_status ON sessions (status, updated_at);
CREATE INDEX IF NOT EXISTS sessions_children ON sessions (status, expires_at)
    WHERE parent IS NOT NULL;
CREATE INDEX IF NOT EXISTS sessions_by_parent ON sessions (parent) WHERE parent > 0;
CREATE INDEX IF NOT EXISTS sessions_by_initiator ON sessions (initiator);
CREATE INDEX IF NOT EXISTS sessions_by_tenant ON sessions (tenant) WHERE tenant IS NOT NULL;
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
"""
    + REQUESTS
    + """CREATE TABLE IF NOT EXISTS audit (
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
CREATE TABLE IF NOT EXISTS channel_claims (
    name TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires_at REAL NOT NULL,
    after_id INTEGER
);
"""
)


def schema_mark(path: str, value: object) -> int:
    """The store schema a file is marked with; a mark that is not a number, or not one any
    signoff wrote (they start at 1), is a damaged file."""
    try:
        found = int(str(value))
    except ValueError:
        found = 0
    if found < 1:
        raise StoreError(f"{path} is damaged: its store schema mark is {value!r}")
    return found


def upgrade_from_1(conn: sqlite3.Connection) -> None:
    """Schema 1 to 2, in the opening transaction: request rows keep their own copies (or none,
    where their event holds them), audit entries of sessions move to the compact form and the
    session rows learn their chain heads."""
    # NULL turn meant "no turn" in schema 1 and means "the turn of the event before" now.
    conn.execute("UPDATE events SET turn = '' WHERE turn IS NULL")
    conn.execute("ALTER TABLE sessions ADD COLUMN audit_n INTEGER NOT NULL DEFAULT 0")
    conn.execute("ALTER TABLE sessions ADD COLUMN audit_hash BLOB")
    rebuild_requests(conn)  # its `data` NOT NULL, and `requests_by_status`, go with the old
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


def rebuild_requests(conn: sqlite3.Connection) -> None:
    """`requests` made again as `REQUESTS` defines it, its rows kept, in the opening transaction:
    SQLite changes no column's constraints in place. Columns the old table lacks are NULL."""
    had = {row[1] for row in conn.execute("PRAGMA table_info(requests)")}
    table, *indexes = (s for s in REQUESTS.split(";") if s.strip())
    conn.execute("ALTER TABLE requests RENAME TO requests_old")
    conn.execute(table)
    kept = ", ".join(row[1] for row in conn.execute("PRAGMA table_info(requests)") if row[1] in had)
    conn.execute(f"INSERT INTO requests ({kept}) SELECT {kept} FROM requests_old")
    conn.execute("DROP TABLE requests_old")  # and its indexes, whose names `indexes` take
    for index in indexes:
        conn.execute(index)


def let_requests_hold_no_copy(conn: sqlite3.Connection) -> None:
    """Schema 10 (or older) to 11, in the opening transaction: a file an older signoff upgraded
    from schema 1 kept that schema's `requests.data NOT NULL`, which refuses every new request
    row held by its event (whose `data` is NULL); its table is rebuilt, any other left as is."""
    if any(row[1] == "data" and row[3] for row in conn.execute("PRAGMA table_info(requests)")):
        rebuild_requests(conn)


def keep_stream_heads(conn: sqlite3.Connection) -> None:
    """Schema 3 (or older, upgraded) to 4, in the opening transaction: each tool-setting stream
    gets the row keeping its chain head, from its last entry."""
    conn.execute(
        "INSERT INTO audit (id, stream, n, seq, hash) SELECT -id, stream, 0, n, hash FROM audit a "
        "WHERE stream IS NOT NULL AND n = (SELECT MAX(n) FROM audit b WHERE b.stream = a.stream)"
    )


def keep_request_deadlines(conn: sqlite3.Connection) -> None:
    """Schema 4 (or older, upgraded) to 5, in the opening transaction: request rows get their
    deadline column, filled for the open ones from the request each row holds."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(requests)")}
    if "expires_at" not in columns:  # a file marked older than it is may have it already
        conn.execute("ALTER TABLE requests ADD COLUMN expires_at REAL")
    rows = conn.execute(
        f"SELECT r.id, r.created_at, {REQUEST_COLUMNS} FROM requests r {REQUEST_JOIN} "
        "WHERE r.status = 'pending'"
    ).fetchall()
    deadlines = []
    for row in rows:
        try:
            deadline = stored_request(*row[2:7], unpack, *row[7:]).expires_at
        except StoreError:
            # Unreadable: a due one, so sweeps read it and report it, as they did before.
            deadline = row[1]
        if deadline is not None:
            deadlines.append((deadline, row[0]))
    conn.executemany("UPDATE requests SET expires_at=? WHERE id=?", deadlines)


def keep_session_parents(conn: sqlite3.Connection) -> None:
    """Schema 5 (or older, upgraded) to 6, in the opening transaction: each subagent's session
    row gets its parent, from the `session.created` event naming it, and the parent's turn
    current when the child was created (its last `turn.started` up to then)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(sessions)")}
    if "parent" not in columns:  # a file marked older than it is may have them already
        conn.execute("ALTER TABLE sessions ADD COLUMN parent INTEGER")
        conn.execute("ALTER TABLE sessions ADD COLUMN parent_turn TEXT")
    keys = dict(conn.execute("SELECT id, sk FROM sessions").fetchall())
    rows = conn.execute(
        "SELECT e.sk, e.data FROM events e WHERE e.seq = 1 AND e.type IN (?, 'session.created')",
        (stored_type("session.created"),),
    ).fetchall()
    parents = []
    for sk, data in rows:
        try:
            parent = unpack_event(data).get("parent")
        except (StoreError, AttributeError):
            continue  # unreadable: as a session of no parent, as sweeps read none of these
        if isinstance(parent, str) and parent in keys:
            parents.append((keys[parent], sk))
    conn.executemany("UPDATE sessions SET parent=? WHERE sk=?", parents)
    conn.execute(
        "UPDATE sessions SET parent_turn = (SELECT t.turn FROM events t WHERE t.sk = "
        "sessions.parent AND t.type IN (?, 'turn.started') AND t.at <= sessions.created_at "
        "ORDER BY t.seq DESC LIMIT 1) WHERE parent IS NOT NULL",
        (stored_type("turn.started"),),
    )


def keep_session_initiators(conn: sqlite3.Connection) -> None:
    """Schema 6 (or older, upgraded) to 7, in the opening transaction: each session row gets who
    started it, from its `session.created` event (NULL, unknown, where that cannot be read)."""
    columns = {row[1] for row in conn.execute("PRAGMA table_info(sessions)")}
    if "initiator" not in columns:  # a file marked older than it is may have them already
        conn.execute("ALTER TABLE sessions ADD COLUMN initiator TEXT")
        conn.execute("ALTER TABLE sessions ADD COLUMN tenant TEXT")
    rows = conn.execute(
        "SELECT s.sk, e.data FROM sessions s LEFT JOIN events e ON e.sk = s.sk AND e.seq = 1 "
        "AND e.type IN (?, 'session.created')",
        (stored_type("session.created"),),
    )
    filled = []
    for sk, data in rows:
        initiator, tenant = stored_initiator(data) if data is not None else (None, None)
        filled.append((initiator, tenant, sk))
    conn.executemany("UPDATE sessions SET initiator=?, tenant=? WHERE sk=?", filled)


def order_children_by_expiry(conn: sqlite3.Connection) -> None:
    """Schema 7 (or older, upgraded) to 8, in the opening transaction: the index of children by
    status is dropped, for `SCHEMA` to create it again on their status and deadline."""
    conn.execute("DROP INDEX IF EXISTS sessions_children")


SCHEMA_NAMES = tuple(re.findall(r"CREATE (?:UNIQUE )?(?:TABLE|INDEX) IF NOT EXISTS (\w+)", SCHEMA))
"""The tables and indexes `SCHEMA` creates, each only if none of its name exists."""


def names_taken(conn: sqlite3.Connection) -> list[str]:
    """Which of the names `SCHEMA` creates a file already uses: in one without signoff's mark,
    another program's tables (or a damaged store), which `SCHEMA` would leave as they are."""
    marks = ",".join("?" * len(SCHEMA_NAMES))
    rows = conn.execute(
        f"SELECT name FROM sqlite_master WHERE name IN ({marks}) ORDER BY name", SCHEMA_NAMES
    )
    return [row[0] for row in rows]


def names_missing(conn: sqlite3.Connection) -> list[str]:
    """Which of the tables and indexes `SCHEMA` creates a file with this signoff's mark lacks:
    one dropped by hand, which opening it does not make again, as its mark says it has them."""
    taken = set(names_taken(conn))
    return [name for name in SCHEMA_NAMES if name not in taken]
