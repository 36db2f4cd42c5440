"""Appending to the SQLite store's audit streams that no session keeps the head of (tool
settings, dashboard sign-outs, deletions): each chained from its head row (`n = 0`), which
moves with it, so entries removed from a stream's end are noticed."""

from __future__ import annotations

import sqlite3

from ..._events import dumps
from .._audit import AuditRow, chain_hash
from ._connection import kept

__all__ = ["append_entry"]


def append_entry(
    conn: sqlite3.Connection,
    last: dict[str, tuple[int, str | None]],
    row: AuditRow,
    *,
    entry_id: int | None = None,
) -> bool:
    """Chain `row` onto its stream inside the caller's transaction; `last` holds the heads read
    so far in it. False (nothing written) when `row.after` is given and the stream moved.
    `entry_id`: the id to give it (else SQLite's next, one past the highest kept now)."""
    if row.stream not in last:
        # The head row first; if it went missing, the last entry.
        found = conn.execute(
            "SELECT CASE WHEN n = 0 THEN seq ELSE n END, hash FROM audit "
            "WHERE stream=? ORDER BY n = 0 DESC, n DESC LIMIT 1",
            (row.stream,),
        ).fetchone()
        last[row.stream] = (0, None) if found is None else _stream_head(row.stream, found)
    n, prev = last[row.stream]
    if row.after is not None and n != row.after:
        return False
    n += 1
    digest = chain_hash(
        prev, stream=row.stream, n=n, type=row.type, at=row.at, seq=None, data=row.data
    )
    cur = conn.execute(
        "INSERT INTO audit (id, stream, n, type, at, data, hash) VALUES (?,?,?,?,?,?,?)",
        (entry_id, row.stream, n, row.type, row.at, dumps(row.data), bytes.fromhex(digest)),
    )
    last[row.stream] = (n, digest)
    # A negative id: no gap among the ids readers page through (a ChannelHub waits).
    conn.execute(
        "INSERT INTO audit (id, stream, n, seq, hash) VALUES (?,?,0,?,?) "
        "ON CONFLICT (stream, n) WHERE stream IS NOT NULL "
        "DO UPDATE SET seq=excluded.seq, hash=excluded.hash",
        (-int(cur.lastrowid or 0), row.stream, n, bytes.fromhex(digest)),
    )
    return True


def _stream_head(stream: str, found: tuple[object, object]) -> tuple[int, str]:
    """A stream's chain head as its head row (or last entry) keeps it, checked: SQLite keeps
    whatever a hand edit puts in a column."""
    return kept(found[0], int, stream, "audit_n"), kept(found[1], bytes, stream, "audit_hash").hex()
