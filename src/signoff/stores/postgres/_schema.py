"""The PostgreSQL store's schema: its versioned migrations, applied in order under an advisory
lock by `PostgresStore.migrate`."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Final

import psycopg
from psycopg.rows import TupleRow

from ..._exceptions import StoreError
from .._codec import stored_type, unpack, unpack_event
from .._initiators import stored_initiator
from .._request_rows import stored_request
from ._sql import REQUEST_COLUMNS, REQUEST_JOIN

__all__ = [
    "FILLS",
    "MIGRATIONS",
    "STORE_SCHEMA",
    "locked_version",
    "names_created",
    "names_missing",
    "names_taken",
    "shared",
]

MIGRATIONS: Final[list[tuple[int, str, str]]] = [
    (
        1,
        "sessions, events, snapshots, requests and leases",
        """
CREATE TABLE {s}.sessions (
    sk BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    agent TEXT NOT NULL,
    head BIGINT NOT NULL,
    status TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    updated_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION
);
CREATE TABLE {s}.events (
    sk BIGINT NOT NULL REFERENCES {s}.sessions (sk),
    seq BIGINT NOT NULL,
    type TEXT NOT NULL,
    turn TEXT,
    at DOUBLE PRECISION NOT NULL,
    v INTEGER NOT NULL,
    data JSON NOT NULL,
    PRIMARY KEY (sk, seq)
);
CREATE TABLE {s}.snapshots (
    sk BIGINT PRIMARY KEY REFERENCES {s}.sessions (sk),
    seq BIGINT NOT NULL,
    data JSON NOT NULL
);
CREATE TABLE {s}.requests (
    id TEXT PRIMARY KEY,
    sk BIGINT NOT NULL REFERENCES {s}.sessions (sk),
    agent TEXT NOT NULL,
    kind TEXT NOT NULL,
    tool TEXT,
    status TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    outcome TEXT,
    data JSON NOT NULL,
    resolution JSON
);
CREATE INDEX requests_by_status ON {s}.requests (status, created_at);
CREATE INDEX requests_by_session ON {s}.requests (sk, status);
CREATE TABLE {s}.leases (
    sk BIGINT PRIMARY KEY REFERENCES {s}.sessions (sk),
    owner TEXT NOT NULL,
    token BIGINT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL
);
""",
    ),
    (
        2,
        "the hash-chained audit trail; sessions by status for workers",
        """
CREATE TABLE {s}.audit (
    id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    stream TEXT NOT NULL,
    n BIGINT NOT NULL,
    type TEXT NOT NULL,
    at DOUBLE PRECISION NOT NULL,
    seq BIGINT,
    data JSON NOT NULL,
    prev TEXT,
    hash TEXT NOT NULL,
    UNIQUE (stream, n)
);
CREATE INDEX sessions_by_status ON {s}.sessions (status, updated_at);
""",
    ),
    (
        3,
        "packed event data, requests and audit entries that point at their events, chain heads "
        "in the session rows, turn ids only where they change, room for HOT updates",
        """
ALTER TABLE {s}.events
    ALTER COLUMN data TYPE BYTEA USING convert_to(data::text, 'UTF8'),
    ALTER COLUMN turn TYPE TEXT USING COALESCE(turn, '');
ALTER TABLE {s}.snapshots ALTER COLUMN data TYPE BYTEA USING convert_to(data::text, 'UTF8');
ALTER TABLE {s}.requests
    ADD COLUMN seq BIGINT,
    ADD COLUMN idx INTEGER,
    ALTER COLUMN data DROP NOT NULL,
    ALTER COLUMN data TYPE BYTEA USING convert_to(data::text, 'UTF8'),
    ALTER COLUMN resolution TYPE BYTEA USING convert_to(resolution::text, 'UTF8');
DROP INDEX {s}.requests_by_status;
CREATE INDEX requests_pending ON {s}.requests (created_at) WHERE status = 'pending';
ALTER TABLE {s}.sessions
    ADD COLUMN audit_n BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN audit_hash BYTEA;
ALTER TABLE {s}.audit
    ADD COLUMN sk BIGINT REFERENCES {s}.sessions (sk),
    ALTER COLUMN stream DROP NOT NULL,
    ALTER COLUMN type DROP NOT NULL,
    ALTER COLUMN at DROP NOT NULL,
    ALTER COLUMN data DROP NOT NULL,
    ALTER COLUMN hash TYPE BYTEA USING decode(hash, 'hex'),
    DROP CONSTRAINT audit_stream_n_key,
    DROP COLUMN prev;
UPDATE {s}.audit a SET sk = x.sk, stream = NULL, type = NULL, at = NULL, data = NULL
    FROM {s}.sessions x WHERE a.seq IS NOT NULL AND x.id = a.stream;
CREATE UNIQUE INDEX audit_by_session ON {s}.audit (sk, n) WHERE sk IS NOT NULL;
CREATE UNIQUE INDEX audit_by_stream ON {s}.audit (stream, n) WHERE stream IS NOT NULL;
UPDATE {s}.sessions x SET audit_n = a.n, audit_hash = a.hash FROM (
    SELECT DISTINCT ON (sk) sk, n, hash FROM {s}.audit WHERE sk IS NOT NULL ORDER BY sk, n DESC
) a WHERE a.sk = x.sk;
-- Without updated_at, a commit that keeps the status updates the session row in place (HOT).
DROP INDEX {s}.sessions_by_status;
CREATE INDEX sessions_by_status ON {s}.sessions (status);
-- Room on each page for the new versions of rows updated in place. Measured: leases are HOT
-- at any fill (small rows), and lower fills on sessions only cost parked sessions space.
ALTER TABLE {s}.sessions SET (fillfactor = 90);
ALTER TABLE {s}.snapshots SET (fillfactor = 70);
CREATE FUNCTION {s}.request_closed(request TEXT) RETURNS BOOLEAN LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'request % is no longer pending', request
        USING ERRCODE = 'SO409', DETAIL = request;
END
$$;
""",
    ),
    (
        4,
        "event rows hold a type code, a turn id only where it changes, and data that may be "
        "stored on the event before (an older signoff reads none of that, so it refuses them)",
        """
COMMENT ON TABLE {s}.events IS 'type: a one-letter code; turn: only where it changes; data: may '
    'be deflated on the event before (signoff stores/_codec.py)';
""",
    ),
    (
        5,
        "each tool-setting stream's audit chain head in an audit row of its own (n = 0, the last "
        "entry's number in seq, a negative id), so entries removed from its end are noticed",
        """
INSERT INTO {s}.audit (id, stream, n, seq, hash) OVERRIDING SYSTEM VALUE
    SELECT DISTINCT ON (stream) -id, stream, 0, n, hash FROM {s}.audit
    WHERE stream IS NOT NULL ORDER BY stream, n DESC;
""",
    ),
    (
        6,
        "request rows keep their deadline, indexed while pending, so a sweep reads only the "
        "requests that are due (filled for the open ones from the requests they hold)",
        """
ALTER TABLE {s}.requests ADD COLUMN expires_at DOUBLE PRECISION;
CREATE INDEX requests_due ON {s}.requests (expires_at)
    WHERE status = 'pending' AND expires_at IS NOT NULL;
""",
    ),
    (
        7,
        "subagent session rows name their parent and the parent's turn that delegated to them, "
        "indexed by status, so the orphan sweep lists only children no parent waits for",
        """
ALTER TABLE {s}.sessions ADD COLUMN parent BIGINT, ADD COLUMN parent_turn TEXT;
CREATE INDEX sessions_children ON {s}.sessions (status) WHERE parent IS NOT NULL;
""",
    ),
    (
        8,
        "session rows name who started them (identity and text tenant, each indexed), so "
        "listings filter by who may see them in SQL (filled from the sessions' first events)",
        """
-- Never updated after the insert: the indexes keep commits' updates of the row HOT.
ALTER TABLE {s}.sessions ADD COLUMN initiator TEXT, ADD COLUMN tenant TEXT;
CREATE INDEX sessions_by_initiator ON {s}.sessions (initiator);
CREATE INDEX sessions_by_tenant ON {s}.sessions (tenant) WHERE tenant IS NOT NULL;
""",
    ),
    (
        9,
        "the indexes of rows only ever appended (events, audit entries) fill their pages whole",
        """
-- Each key goes after the last of its session (or of the trail): a page split there leaves the
-- page before it at the fillfactor, which the default (90) left a tenth empty for inserts that
-- never come. Measured: 9% smaller when sessions take turns or follow one another, the same
-- when many overlap. Pages split from now on; an existing index shrinks only if rebuilt.
ALTER INDEX {s}.events_pkey SET (fillfactor = 100);
ALTER INDEX {s}.audit_pkey SET (fillfactor = 100);
ALTER INDEX {s}.audit_by_session SET (fillfactor = 100);
""",
    ),
    (
        10,
        "the index of subagent sessions is on their status and TTL deadline, so those whose "
        "TTL passed are a range of it (the open-request counts leave out their mirrors)",
        """
-- Redefined, not added: no index more to store. The price: a commit that moves a session's
-- deadline (every commit of one with a TTL, child or not) no longer updates its row in place
-- (HOT), leaving an entry in each of its indexes until a vacuum (bench/README, sweep.py).
DROP INDEX IF EXISTS {s}.sessions_children;
CREATE INDEX sessions_children ON {s}.sessions (status, expires_at) WHERE parent IS NOT NULL;
""",
    ),
    (
        11,
        "the index of subagent sessions is on their status and a copy of their TTL deadline kept "
        "for children only, so the commits of a top-level session with a TTL update it in place",
        """
-- An update is HOT only if no indexed column changes, whatever the row's parent: indexing
-- expires_at (migration 10) cost every session with a TTL its HOT updates. child_expires_at is
-- expires_at for a subagent session and NULL for any other, which no commit changes; every
-- statement writing expires_at writes it too. A nullable column is added without a rewrite.
DROP INDEX IF EXISTS {s}.sessions_children;
ALTER TABLE {s}.sessions ADD COLUMN child_expires_at DOUBLE PRECISION;
UPDATE {s}.sessions SET child_expires_at = expires_at
    WHERE parent IS NOT NULL AND expires_at IS NOT NULL;
CREATE INDEX sessions_children ON {s}.sessions (status, child_expires_at)
    WHERE parent IS NOT NULL;
""",
    ),
    (
        12,
        "channel claims: the hub delivering to a channel (owner, expiry) and the position it "
        "reached, so hubs in any process sharing the store deliver each entry once",
        """
CREATE TABLE {s}.channel_claims (
    name TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    after_id BIGINT
);
""",
    ),
    (
        13,
        "deleted sessions: the ids `delete_session` erased, so a call repeating the idempotency "
        "key one derives from starts nothing again",
        """
-- A bounded id (signoff's are 24 characters): no TOAST table, whose index alone is 8 KB.
CREATE TABLE {s}.deleted_sessions (
    id VARCHAR(255) PRIMARY KEY,
    at DOUBLE PRECISION NOT NULL
);
""",
    ),
    (
        14,
        "subagent sessions indexed by their parent, so a deletion finds a session's subagents' "
        "sessions without reading every session",
        """
-- No commit changes `parent`: the updates of a session's row stay in place (HOT). `parent > 0`
-- (every key is) is a condition only a query saying so can use: the reads of children by
-- status and deadline, which say `parent IS NOT NULL`, keep to `sessions_children`.
CREATE INDEX sessions_by_parent ON {s}.sessions (parent) WHERE parent > 0;
""",
    ),
    (
        15,
        "lease rows keep their TTL and when the server granted them, so a lease that lapsed "
        "while the server was down is left to its holder for one TTL after the server starts",
        """
-- Nullable, no default: added without a rewrite. A row granted before (NULL) is judged by its
-- expiry alone, as it was. Renewals leave both as granted (`takeable` in _sql.py).
ALTER TABLE {s}.leases ADD COLUMN ttl DOUBLE PRECISION, ADD COLUMN granted_at DOUBLE PRECISION;
""",
    ),
]
"""Versioned migrations, applied in order; `{s}` is the quoted schema name. Append, never edit.
A migration that SQL alone cannot complete has a step in `FILLS` too, run after its SQL in the
same transaction."""


async def _fill_request_deadlines(conn: psycopg.AsyncConnection[TupleRow], s: str) -> None:
    """Migration 6: each open request row gets the deadline of the request it holds."""
    cur = await conn.execute(
        f"SELECT r.id, r.created_at, {REQUEST_COLUMNS} FROM {s}.requests r "
        f"{REQUEST_JOIN.format(s=s)} WHERE r.status = 'pending'"
    )
    deadlines = []
    for row in await cur.fetchall():
        try:
            deadline = stored_request(*row[2:7], unpack, *row[7:]).expires_at
        except StoreError:
            # Unreadable: a due one, so sweeps read it and report it, as they did before.
            deadline = row[1]
        if deadline is not None:
            deadlines.append((deadline, row[0]))
    async with conn.cursor() as update:
        await update.executemany(f"UPDATE {s}.requests SET expires_at=%s WHERE id=%s", deadlines)


async def _fill_session_parents(conn: psycopg.AsyncConnection[TupleRow], s: str) -> None:
    """Migration 7: each subagent's session row gets its parent, from the `session.created`
    event naming it, and the parent's turn current when the child was created."""
    cur = await conn.execute(f"SELECT id, sk FROM {s}.sessions")
    keys: dict[str, int] = {str(i): int(k) for i, k in await cur.fetchall()}
    cur = await conn.execute(
        f"SELECT sk, data FROM {s}.events WHERE seq = 1 AND type IN (%s, 'session.created')",
        (stored_type("session.created"),),
    )
    parents = []
    for sk, data in await cur.fetchall():
        try:
            parent = unpack_event(data).get("parent")
        except (StoreError, AttributeError):
            continue  # unreadable: as a session of no parent, as sweeps read none of these
        if isinstance(parent, str) and parent in keys:
            parents.append((keys[parent], sk))
    async with conn.cursor() as update:
        await update.executemany(f"UPDATE {s}.sessions SET parent=%s WHERE sk=%s", parents)
    await conn.execute(
        f"UPDATE {s}.sessions c SET parent_turn = (SELECT t.turn FROM {s}.events t "
        "WHERE t.sk = c.parent AND t.type IN (%s, 'turn.started') AND t.at <= c.created_at "
        "ORDER BY t.seq DESC LIMIT 1) WHERE c.parent IS NOT NULL",
        (stored_type("turn.started"),),
    )


async def _fill_session_initiators(conn: psycopg.AsyncConnection[TupleRow], s: str) -> None:
    """Migration 8: each session row gets who started it, from its `session.created` event
    (NULL, unknown, where that cannot be read)."""
    cur = await conn.execute(
        f"SELECT x.sk, e.data FROM {s}.sessions x LEFT JOIN {s}.events e ON e.sk = x.sk "
        "AND e.seq = 1 AND e.type IN (%s, 'session.created')",
        (stored_type("session.created"),),
    )
    filled = []
    for sk, data in await cur.fetchall():
        initiator, tenant = stored_initiator(data) if data is not None else (None, None)
        filled.append((initiator, tenant, sk))
    async with conn.cursor() as update:
        await update.executemany(
            f"UPDATE {s}.sessions SET initiator=%s, tenant=%s WHERE sk=%s", filled
        )


FILLS: Final[dict[int, Callable[[psycopg.AsyncConnection[TupleRow], str], Awaitable[None]]]] = {
    6: _fill_request_deadlines,
    7: _fill_session_parents,
    8: _fill_session_initiators,
}
"""Steps in Python of the migrations of these versions, given the connection and `{s}`."""

STORE_SCHEMA: Final = MIGRATIONS[-1][0]
"""The store schema version this signoff creates and the newest it accepts."""

_CREATED = re.compile(r"CREATE (?:UNIQUE )?(TABLE|INDEX|FUNCTION) (?:\{s\}\.)?(\w+)")


def names_created(after: int) -> tuple[list[str], list[str]]:
    """The relations (tables, indexes) and the functions that the migrations past version
    `after` create by name, leaving out those the migrations up to it made (an index dropped
    and made anew): in a schema holding one already, another program's (a schema shared with
    it), on which a migration would stop."""
    made = {
        name
        for version, _, ddl in MIGRATIONS
        if version <= after
        for _, name in _CREATED.findall(ddl)
    }
    relations: list[str] = []
    functions: list[str] = []
    for version, _, ddl in MIGRATIONS:
        if version > after:
            for kind, name in _CREATED.findall(ddl):
                if name not in made:
                    (functions if kind == "FUNCTION" else relations).append(name)
    return relations, functions


_DROPPED = re.compile(r"DROP (TABLE|INDEX|FUNCTION) (?:IF EXISTS )?(?:\{s\}\.)?(\w+)")


def names_current() -> tuple[list[str], list[str]]:
    """The relations (tables, indexes) and the functions a schema at `STORE_SCHEMA` holds by
    the names its migrations give them: each one created and not dropped after."""
    kinds: dict[str, str] = {}
    for _, _, ddl in MIGRATIONS:
        for statement in ddl.split(";"):
            for kind, name in _CREATED.findall(statement):
                kinds[name] = kind
            for _, name in _DROPPED.findall(statement):
                kinds.pop(name, None)
    relations = sorted(name for name, kind in kinds.items() if kind != "FUNCTION")
    functions = sorted(name for name, kind in kinds.items() if kind == "FUNCTION")
    return relations, functions


async def names_missing(conn: psycopg.AsyncConnection[TupleRow], schema: str) -> list[str]:
    """Which tables, indexes and functions (`name()`) of a current schema `schema` lacks: one
    dropped by hand, which no migration makes again, as its version says it has them."""
    relations, functions = names_current()
    cur = await conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = ANY(%s) "
        "UNION SELECT p.proname || '()' FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s AND p.proname = ANY(%s)",
        (schema, relations, schema, functions),
    )
    found = {str(row[0]) for row in await cur.fetchall()}
    return [name for name in relations + [f"{name}()" for name in functions] if name not in found]


async def locked_version(conn: psycopg.AsyncConnection[TupleRow], schema: str, s: str) -> int:
    """The version of `schema` (`s` quoted) read under the migration's lock, as another process
    may have migrated it meanwhile; 0 where it has no `schema_version` table, or is not there.
    Looked up in `pg_class` by a query, whose snapshot sees a table another process committed
    while this one waited for the lock, as `to_regclass`'s cached lookup did not."""
    cur = await conn.execute(
        "SELECT 1 FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = 'schema_version'",
        (schema,),
    )
    if await cur.fetchone() is None:
        return 0
    cur = await conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {s}.schema_version")
    row = await cur.fetchone()
    return 0 if row is None else int(row[0])


async def names_taken(
    conn: psycopg.AsyncConnection[TupleRow], schema: str, before: int
) -> list[str]:
    """Which tables, indexes and functions (`name()`) the migrations past `before` create that
    `schema` holds already, by name, functions last."""
    relations, functions = names_created(before)
    cur = await conn.execute(
        "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = %s AND c.relname = ANY(%s) "
        "UNION SELECT p.proname || '()' FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace "
        "WHERE n.nspname = %s AND p.proname = ANY(%s)",
        (schema, relations, schema, functions),
    )
    names = [str(row[0]) for row in await cur.fetchall()]
    return sorted(names, key=lambda name: (name.endswith("()"), name))


def shared(schema: str, taken: list[str]) -> str:
    """Why a schema holding `taken` is not migrated, and what to do: on the first of them the
    migration stopped with PostgreSQL's word on it alone."""
    names = taken[0] if len(taken) == 1 else f"{', '.join(taken[:-1])} and {taken[-1]}"
    return (
        f"schema {schema!r} already holds {names}, which signoff's schema creates: another "
        "program's, in a schema shared with it; nothing was changed. Give signoff a schema of "
        'its own: leave ?schema= out of the URL for "signoff", or name an empty one '
        "(?schema=NAME)"
    )
