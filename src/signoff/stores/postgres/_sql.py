"""The SQL text of the PostgreSQL store's hot paths, and the rows it is filled with: one
statement per commit or new session, short batches as VALUES of plain parameters."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, Final

from ..._events import Event
from .._audit import AUDIT_TYPES
from .._codec import (
    CHAIN_MAX,
    DEFLATE_ON_PREVIOUS,
    Tail,
    needs_previous,
    pack_event,
    stored_type,
    tail_of,
)

__all__ = [
    "AUDIT_APPEND",
    "AUDIT_LOCK",
    "AUDIT_RESEND",
    "CURRENT_TURN",
    "EARLIER_COLUMNS",
    "EARLIER_JOIN",
    "FIRST_TURN",
    "LEASE_GRANT",
    "NOW",
    "REQUEST_COLUMNS",
    "REQUEST_JOIN",
    "TURN",
    "TURN_NAMED_EVERY",
    "commit_sql",
    "create_sql",
    "event_rows",
    "named_turn",
    "rows_params",
    "rows_sql",
    "takeable",
]

TURN = (
    "COALESCE(e.turn, (SELECT p.turn FROM {s}.events p WHERE p.sk = e.sk AND p.seq < e.seq "
    "AND p.turn IS NOT NULL ORDER BY p.seq DESC LIMIT 1))"
)
"""An event's turn id: its own, or that of the nearest event before it that names one."""

CURRENT_TURN = (
    "(SELECT t.turn FROM {s}.events t WHERE t.sk = {sk} AND t.type IN "
    f"('{stored_type('turn.started')}', 'turn.started') ORDER BY t.seq DESC LIMIT 1)"
)
"""The id of the current turn of the session whose `sk` is `{sk}`: that its last
`turn.started` row names (a row names its turn where the turn changes), NULL before one."""

FIRST_TURN = CURRENT_TURN.replace("ORDER BY t.seq DESC", "ORDER BY t.seq")
"""The id of the first turn of the session whose `sk` is `{sk}` (a subagent's delegated turn),
NULL before one."""

_STREAM_HEAD = (
    "SELECT CASE WHEN a.n = 0 THEN a.seq ELSE a.n END AS n, a.hash FROM {s}.audit a "
    "WHERE a.stream = x.stream ORDER BY a.n = 0 DESC, a.n DESC LIMIT 1"
)
"""The chain head of the stream `x.stream` (no session's): its head row (`n = 0`, the last
entry's number in `seq`); if that went missing, its last entry."""

AUDIT_LOCK = "SELECT pg_advisory_xact_lock(hashtext(x)) FROM unnest(%s::text[]) x"
"""Lock the streams named, in their order, for the transaction: no session row serializes them."""

_WRITTEN = "(v.after IS NULL OR v.after = c.n)"

_WRITTEN_AGAIN = (
    "(v.after IS NULL AND NOT EXISTS (SELECT 1 FROM {s}.audit a WHERE a.stream = v.stream "
    "AND a.n > 0 AND a.type = v.type AND a.at = v.at AND a.data::text = v.data) "
    "OR v.after = c.n)"
)
"""`_WRITTEN` for entries sent again after a lost connection: one given no `after` is written only
if the stream does not hold it already (the first statement, which the server went on with,
may have committed it)."""


def _audit_append(written: str) -> str:
    return (
        "WITH RECURSIVE v AS (SELECT u.*, row_number() OVER (PARTITION BY u.stream ORDER BY u.k) "
        "AS j FROM unnest(%s::text[], %s::bigint[], %s::text[], %s::float8[], %s::text[], "
        "%s::bytea[], %s::bytea[]) WITH ORDINALITY u (stream, after, type, at, data, before, "
        "behind, k)), "
        # Each stream's entries in turn, from its head: (n, hash) after each, and if it is written.
        "c (stream, j, n, hash, written) AS ("
        "SELECT x.stream, 0::bigint, COALESCE(h.n, 0), h.hash, false "
        f"FROM (SELECT DISTINCT stream FROM v) x LEFT JOIN LATERAL ({_STREAM_HEAD}) h ON true "
        f"UNION ALL SELECT v.stream, v.j, c.n + CASE WHEN {written} THEN 1 ELSE 0 END, "
        f"CASE WHEN {written} THEN sha256(convert_to(COALESCE(encode(c.hash, 'hex'), '') "
        "|| E'\\n', 'UTF8') || v.before || convert_to((c.n + 1)::text, 'UTF8') || v.behind) "
        f"ELSE c.hash END, {written} FROM c JOIN v ON v.stream = c.stream AND v.j = c.j + 1), "
        "added AS (INSERT INTO {s}.audit (stream, n, type, at, data, hash) "
        "SELECT c.stream, c.n, v.type, v.at, v.data::json, c.hash FROM c "
        "JOIN v ON v.stream = c.stream AND v.j = c.j WHERE c.written ORDER BY v.k "
        "RETURNING id, stream, n, hash) "
        # A negative id, taking no identity value: no gap among the ids readers page through (a
        # ChannelHub waits on one).
        "INSERT INTO {s}.audit (id, stream, n, seq, hash) OVERRIDING SYSTEM VALUE "
        "SELECT DISTINCT ON (stream) -id, stream, 0, n, hash FROM added ORDER BY stream, n DESC "
        "ON CONFLICT (stream, n) WHERE stream IS NOT NULL "
        "DO UPDATE SET seq = excluded.seq, hash = excluded.hash"
    )


AUDIT_APPEND = _audit_append(_WRITTEN)
"""Chain entries onto their streams' heads, read here, hashing as `chain_hash` does from the
bytes `chain_parts` gives, and move the head rows. An entry with `after` is written only if
its stream then ends at that entry. Sent after `AUDIT_LOCK`, in the same message, so the heads
it reads are committed ones and no lock waits for the client."""

AUDIT_RESEND = _audit_append(_WRITTEN_AGAIN)
"""`AUDIT_APPEND` sent again after its connection was lost: it skips what the first wrote."""

TURN_NAMED_EVERY: Final = 64
"""An event row names its turn where the turn changes, and at least every 64 rows, so finding
an event's turn never looks further back than that (as on SQLite)."""

EARLIER_COLUMNS = ", ".join(f"p{i}.data" for i in range(1, CHAIN_MAX + 1))
EARLIER_JOIN = "".join(
    f" LEFT JOIN {{s}}.events p{i} ON substring(e.data from 1 for 1) = "
    f"'\\x{DEFLATE_ON_PREVIOUS:02x}'::bytea AND p{i}.sk = e.sk AND p{i}.seq = e.seq - {i}"
    for i in range(1, CHAIN_MAX + 1)
)
"""The stored events an event `e` may be kept on (`EARLIER_COLUMNS`), joined only if it is."""

REQUEST_COLUMNS = "r.id, r.data, e.data, r.idx, r.status, " + EARLIER_COLUMNS
REQUEST_JOIN = (
    "JOIN {s}.sessions s ON s.sk = r.sk LEFT JOIN {s}.events e ON r.data IS NULL "
    "AND e.sk = r.sk AND e.seq = r.seq" + EARLIER_JOIN
)


_ROWS_AS_VALUES: Final = 16
"""Batches of up to this many rows go as a VALUES list of plain parameters, which psycopg adapts
about ten times faster than arrays; longer ones as one array per column (`unnest`), so the
statement's text and its number of parameters stay bounded."""

_EVENT_COLUMNS: Final = (
    ("bigint", "text", "text", "float8", "int", "bytea"),
    "x(seq, type, turn, at, v, data)",
)
_AUDIT_COLUMNS: Final = (("bigint", "bigint", "bytea"), "x(n, seq, hash)")
_NEW_REQUEST_COLUMNS: Final = (
    ("text", "bigint", "int", "text", "text", "text", "float8", "bytea", "float8"),
    "x(id, seq, idx, agent, kind, tool, created_at, data, expires_at)",
)
_RESOLVE_COLUMNS: Final = (
    ("text", "text", "text", "bytea", "bytea", "int", "boolean"),
    "x(id, status, outcome, resolution, data, i, dup)",
)
_UPDATED_COLUMNS: Final = (("text", "bytea", "float8"), "x(id, data, expires_at)")


@functools.lru_cache(maxsize=512)
def rows_sql(n: int, columns: tuple[tuple[str, ...], str]) -> str:
    """A FROM item of `n` rows of `columns` (their types, and the alias naming them), filled by
    `rows_params`."""
    types, alias = columns
    if n <= _ROWS_AS_VALUES:
        row = "(" + ", ".join(f"%s::{t}" for t in types) + ")"
        return f"(VALUES {', '.join([row] * n)}) AS {alias}"
    return f"unnest({', '.join(f'%s::{t}[]' for t in types)}) AS {alias}"


def rows_params(rows: Sequence[Sequence[Any]]) -> list[Any]:
    """The parameters of `rows_sql` for these rows: row by row, or one list per column."""
    if len(rows) <= _ROWS_AS_VALUES:
        return [value for row in rows for value in row]
    return [list(column) for column in zip(*rows, strict=True)]


def event_rows(
    events: Sequence[Event], named: tuple[int | None, str | None], previous: Tail | None
) -> tuple[
    list[tuple[Any, ...]], tuple[int | None, str | None], Tail | None, tuple[str | bytes, ...]
]:
    """Events as rows of `_EVENT_COLUMNS`, the row naming the turn of the last of them, what
    the event after them may be stored on, and the stored data of the rows the first is stored
    on (none if it stands alone), which the commit checks at the head.

    `named` is the row naming the turn of the event they follow (its seq and turn; `(None,
    None)` for none). `type` is the type's one-letter code. `turn` is NULL when an event belongs
    to the turn of the row before it: a row names its turn ('' for none) where it changes from
    the row before, and when the row naming it is `TURN_NAMED_EVERY` rows back. `previous` is
    what the event they follow gives (a `Tail`); an audited event gives nothing, so altering
    one in the log is reported at its entry alone."""
    rows = []
    seq, turn = named
    on = None if previous is None else previous[0]
    for e in events:
        now = e.turn_id or ""
        same = now == turn and seq is not None and e.seq - seq < TURN_NAMED_EVERY
        if not same:
            seq, turn = e.seq, now
        data, on = pack_event(e.data, on)
        if e.type in AUDIT_TYPES:
            on = None
        rows.append(
            (
                e.seq,
                stored_type(e.type),
                None if same else now,
                e.at,
                e.v,
                data.encode() if isinstance(data, str) else data,
            )
        )
    checked = previous[1] if previous is not None and needs_previous(rows[0][5]) else ()
    return rows, (seq, turn), tail_of(on, [row[5] for row in rows], previous), checked


def named_turn(s: str, sk: str, head: str) -> str:
    """A query of the row naming the turn of event `head` of session `sk` (SQL expressions):
    the last at or before it that names one, as `(seq, turn)`; it looks back at most
    `TURN_NAMED_EVERY` rows."""
    return (
        f"SELECT p.seq, p.turn FROM {s}.events p WHERE p.sk = {sk} AND p.seq <= {head} "
        "AND p.turn IS NOT NULL ORDER BY p.seq DESC LIMIT 1"
    )


NOW: Final = "extract(epoch FROM statement_timestamp())::float8"
"""The database's clock, in seconds since the epoch, as of the statement's start."""

_STARTED: Final = (
    "extract(epoch FROM GREATEST(pg_postmaster_start_time(), "
    "pg_stat_get_bgwriter_stat_reset_time()))"
)
"""When the server last started, by its clock: its postmaster, or its restart of every process
after one crashed (which resets the shared statistics: so does a reset of them by hand)."""

LEASE_GRANT: Final = f"%s::float8, {NOW}"
"""The `ttl, granted_at` of a lease row granted now (migration 15), its TTL the parameter."""


def takeable(lease: str, lapsed: str = "<", taker: str | None = None) -> str:
    """SQL true when lease row `lease`, another owner's, may be taken at the time of its one
    parameter: its expiry is `lapsed` that time, and if it was granted before the server last
    started, one TTL of its own has passed since the start (by the server's clock). Its holder
    could not renew it while the server was down: a worker keeping the outcome of a tool that
    ran meanwhile takes it back first, so no other runs the tool again. A lease granted by an
    older signoff (no `granted_at`) is judged by its expiry alone, and one of `taker`'s (SQL
    naming the owner taking it, if given) too: that holder is the one the wait is for."""
    own = "" if taker is None else f"{lease}.owner = {taker} OR "
    return (
        f"({lease}.expires_at {lapsed} %s AND ({own}{lease}.granted_at IS NULL "
        f"OR {lease}.granted_at >= {_STARTED} OR {NOW} >= {_STARTED} + {lease}.ttl))"
    )


@functools.lru_cache(maxsize=64)
def create_sql(s: str, events: int, lease: bool, sync: bool, guard: bool = False) -> str:
    """`create_session`'s statement: the session row, its first events, its lease (token 1,
    as the first grant of `acquire_lease`), the announcement; no row answers (nothing written)
    for the id of a deleted session.

    With `guard` (an id derived from an idempotency key, or a subagent's, whose parent may be
    deleted meanwhile), `g` holds whether this statement's snapshot saw the session's row and
    its parent's, and `ks` and `kp` lock them: a row seen but gone once locked was deleted by a
    transaction that committed while this statement ran, after its snapshot was taken (so its
    `deleted_sessions` row is not seen here either). Nothing is written then; without the lock,
    the insert waited for that deletion on the id's unique index and then went through."""
    guarded = (
        f"g AS (SELECT EXISTS (SELECT 1 FROM {s}.sessions WHERE id = %s) AS s, "
        f"EXISTS (SELECT 1 FROM {s}.sessions WHERE id = %s) AS p), "
        f"ks AS (SELECT 1 FROM {s}.sessions WHERE id = %s FOR KEY SHARE), "
        f"kp AS (SELECT 1 FROM {s}.sessions WHERE id = %s FOR KEY SHARE), "
        if guard
        else ""
    )
    kept = (
        "AND (SELECT s FROM g) = EXISTS (SELECT 1 FROM ks) "
        "AND (SELECT p FROM g) = EXISTS (SELECT 1 FROM kp) "
        if guard
        else ""
    )
    deleted = "d.id = ANY(%s::text[])" if guard else "d.id = %s"
    return (
        f"WITH {guarded}i AS (INSERT INTO {s}.sessions (id, agent, head, status, created_at, "
        "updated_at, expires_at, initiator, tenant, parent, parent_turn, child_expires_at) "
        "SELECT %s,%s,%s,%s,%s,%s,%s,%s,%s, p.sk, "
        "CASE WHEN p.sk IS NOT NULL THEN COALESCE(%s::text, "
        + CURRENT_TURN.format(s=s, sk="p.sk")
        + ") END, CASE WHEN p.sk IS NOT NULL THEN %s::float8 END "
        f"FROM (SELECT 1) o LEFT JOIN {s}.sessions p ON p.id = %s "
        # A deleted session's id is not made again: nothing is written, and no row answers.
        f"WHERE NOT EXISTS (SELECT 1 FROM {s}.deleted_sessions d WHERE {deleted}) {kept}"
        "RETURNING sk), "
        f"e AS (INSERT INTO {s}.events (sk, seq, type, turn, at, v, data) "
        f"SELECT i.sk, x.* FROM i, {rows_sql(events, _EVENT_COLUMNS)}) "
        + (
            f", l AS (INSERT INTO {s}.leases (sk, owner, token, expires_at, ttl, granted_at) "
            f"SELECT i.sk, %s, 1, %s, {LEASE_GRANT} FROM i) "
            if lease
            else ""
        )
        + "SELECT pg_notify(%s, %s)"
        + (", set_config('synchronous_commit', %s, true)" if sync else "")
        + " FROM i"
    )


_LAST_TOKEN: Final = 2**63 - 1
"""A BIGINT's largest value: a lease token there has no next one to grant."""


@functools.lru_cache(maxsize=512)
def commit_sql(
    s: str,
    events: int,
    audit: int,
    new: int,
    resolve: int,
    updated: int,
    snapshot: bool,
    lease: bool,
    release: bool,
    sync: bool,
    owner: bool = False,
    checked: int = 0,
    shown: bool = False,
    grant: bool = False,
) -> str:
    """`commit`'s statement for a commit of this shape.

    `c` locks the session row (then `l` holds the lease row, in that order, as `claim` takes
    them); `t` finds the row naming the turn at the head; `g` holds the session's key only if
    head, audit chain head, lease (its token, and its owner with `owner`), (when it writes
    events, whose rows depend on it) the row naming the turn, and the stored data of the
    `checked` rows ending at the head (those its first event is deflated on) are as the
    commit expects, and every write reads it, so a commit that does not apply writes nothing.
    With `shown`, `h` holds whether the head event's time and type (code, or name as an older
    signoff stored it) are the ones the commit was planned on, and `g` requires it too. The
    answer is the state found and whether it applied (and the lease's owner, after the turn,
    and with `grant` the token `k` granted, and with `shown` what `h` holds, last);
    `request_closed()` raises, undoing all of it, if a request to resolve was not pending. With
    `grant` (a commit without a lease token), `k` grants the session's lease as `acquire_lease`
    does, unless another owner's is live: under the session row's lock, which a claim passes by.

    `t` sees the events as they were when the statement started. If it then waited for the row
    lock, events committed meanwhile are missing from it, but they moved the head too: `g` does
    not apply, and the turn answered is only a guess, checked by the next statement.
    """
    parts = [
        f"c AS (SELECT sk, head, audit_n, audit_hash FROM {s}.sessions WHERE id=%s FOR UPDATE)"
    ]
    check = (
        "c.head = %s::bigint AND c.audit_n = %s::bigint "
        "AND c.audit_hash IS NOT DISTINCT FROM %s::bytea"
    )
    parts.append(f"t AS ({named_turn(s, '(SELECT sk FROM c)', '(SELECT head FROM c)')})")
    if events:
        check += (
            " AND (SELECT seq FROM t) IS NOT DISTINCT FROM %s::bigint"
            " AND (SELECT turn FROM t) IS NOT DISTINCT FROM %s::text"
        )
    if lease:
        # A released lease (no owner) keeps its token for the next grant, but fences it. Locked
        # to read the row's newest version, as a takeover committed while `c` waited left it,
        # but only `FOR KEY SHARE`: a renewal (an UPDATE of no key) need not wait for the commit
        # (under load the lease lapsed meanwhile); a takeover waits for it at the session row.
        parts.append(
            f"l AS (SELECT CASE WHEN owner <> '' THEN token END AS token, owner FROM {s}.leases "
            "WHERE sk = (SELECT sk FROM c) FOR KEY SHARE)"
        )
        check += " AND (SELECT token FROM l) = %s::bigint"
        if owner:
            check += " AND (SELECT owner FROM l) = %s::text"
    if shown:
        parts.append(
            f"h AS (SELECT EXISTS (SELECT FROM {s}.events x, c WHERE x.sk = c.sk "
            "AND x.seq = c.head AND x.at = %s::float8 AND x.type IN (%s, %s)) AS same)"
        )
        check += " AND (SELECT same FROM h)"
    for i in range(checked):
        check += (
            f" AND (SELECT p.data FROM {s}.events p WHERE p.sk = c.sk "
            f"AND p.seq = c.head - {i}) = %s::bytea"
        )
    parts.append(f"g AS (SELECT c.sk FROM c WHERE {check})")
    if grant:
        parts.append(
            f"k AS (INSERT INTO {s}.leases AS l (sk, owner, token, expires_at, ttl, granted_at) "
            f"SELECT g.sk, %s, 1, %s, {LEASE_GRANT} FROM g ON CONFLICT (sk) DO UPDATE "
            "SET owner=excluded.owner, token=l.token + 1, expires_at=excluded.expires_at, "
            "ttl=excluded.ttl, granted_at=excluded.granted_at "
            f"WHERE (l.owner = '' OR l.owner = excluded.owner OR {takeable('l', '<=')}) "
            f"AND l.token < {_LAST_TOKEN} RETURNING l.token)"
        )
    if resolve:
        parts.append(f"y AS (SELECT * FROM {rows_sql(resolve, _RESOLVE_COLUMNS)})")
        parts.append(
            f"r AS (UPDATE {s}.requests q SET status=y.status, outcome=y.outcome, "
            "resolution=y.resolution, data=COALESCE(y.data, q.data) FROM g, y "
            "WHERE NOT y.dup AND q.id = y.id AND q.sk = g.sk AND q.status = 'pending' "
            "RETURNING q.id)"
        )
    if new:
        parts.append(
            f"n AS (INSERT INTO {s}.requests (id, sk, seq, idx, agent, kind, tool, status, "
            "created_at, data, expires_at) SELECT x.id, g.sk, x.seq, x.idx, x.agent, x.kind, "
            f"x.tool, 'pending', x.created_at, x.data, x.expires_at "
            f"FROM g, {rows_sql(new, _NEW_REQUEST_COLUMNS)})"
        )
    if updated:
        parts.append(
            f"w AS (UPDATE {s}.requests q SET data=x.data, expires_at=x.expires_at FROM g, "
            f"{rows_sql(updated, _UPDATED_COLUMNS)} WHERE q.id = x.id AND q.sk = g.sk)"
        )
    if events:
        parts.append(
            f"e AS (INSERT INTO {s}.events (sk, seq, type, turn, at, v, data) "
            f"SELECT g.sk, x.* FROM g, {rows_sql(events, _EVENT_COLUMNS)})"
        )
        if audit:
            parts.append(
                f"a AS (INSERT INTO {s}.audit (sk, n, seq, hash) "
                f"SELECT g.sk, x.* FROM g, {rows_sql(audit, _AUDIT_COLUMNS)})"
            )
        parts.append(
            f"u AS (UPDATE {s}.sessions x SET head=%s, "
            "updated_at=COALESCE(%s::float8, x.updated_at), "
            "status=COALESCE(%s, x.status), expires_at=%s, "
            # A child's copy of its deadline (migration 11); NULL, unchanged, for any other.
            "child_expires_at=CASE WHEN x.parent IS NOT NULL THEN %s::float8 END, "
            "audit_n=%s, audit_hash=%s "
            "FROM g WHERE x.sk = g.sk RETURNING pg_notify(%s, %s))"
        )
    if snapshot:
        parts.append(
            f"p AS (INSERT INTO {s}.snapshots (sk, seq, data) SELECT g.sk, %s, %s FROM g "
            "ON CONFLICT (sk) DO UPDATE SET seq=excluded.seq, data=excluded.data)"
        )
    if release:
        parts.append(
            f"f AS (UPDATE {s}.leases x SET owner='', expires_at=0 FROM g "
            "WHERE x.sk = g.sk AND x.token = %s)"
        )
    answer = "c.head, " + ("(SELECT token FROM l)" if lease else "NULL::bigint")
    answer += ", c.audit_n, c.audit_hash, EXISTS (SELECT FROM g), (SELECT seq FROM t)"
    answer += ", (SELECT turn FROM t)"
    if lease:
        answer += ", (SELECT owner FROM l)"
    if sync:
        answer += ", set_config('synchronous_commit', %s, true)"
    if resolve:
        # The first request, in the commit's order, that was not pending (or twice in it).
        answer += (
            f", (SELECT {s}.request_closed(z.id) FROM (SELECT y.id FROM y "
            "WHERE y.dup OR y.id NOT IN (SELECT id FROM r) ORDER BY y.i LIMIT 1) z "
            "WHERE EXISTS (SELECT FROM g))"
        )
    if grant:
        answer += ", (SELECT token FROM k)"
    if shown:
        answer += ", (SELECT same FROM h)"
    return "WITH " + ", ".join(parts) + " SELECT " + answer + " FROM c"
