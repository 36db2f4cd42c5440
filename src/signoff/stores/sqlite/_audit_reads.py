"""The SQLite store's reads of the audit trail: its entries, page by page (a session's event
entries read with their events), the heads of its streams and what verification compares."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from ..._exceptions import StoreDamaged
from .._audit import (
    AUDITED_STORED,
    DAMAGED,
    AuditEntry,
    LogShape,
    StoredSnapshot,
    entry_stream,
    entry_type,
    loaded_data,
    numbered_on,
    stored_snapshot,
)
from ._connection import Connection
from ._schema import EARLIER_JOIN
from ._transactions import reading

__all__ = ["AuditReads"]


class AuditReads(Connection):
    """`SQLiteStore`'s reads of the audit trail."""

    @reading
    async def audit(
        self,
        *,
        stream: str | None = None,
        after_id: int = 0,
        limit: int = 1000,
        sessions: Sequence[str] | None = None,
        others: bool = False,
        upto_id: int | None = None,
    ) -> list[AuditEntry]:
        # An entry of a session's event keeps only its place and hash: its type, time and data
        # are read from the event, so the chain also covers the event log itself; `prev` is the
        # hash of the entry before it in its stream.
        sql = (
            # No foreign keys stop a hand edit deleting a session's row: its entries are named.
            "SELECT a.id, COALESCE(s.id, a.stream, 'session #' || a.sk || ' (its row is gone)'), "
            "a.n, COALESCE(e.type, a.type), "
            "COALESCE(e.at, a.at), a.seq, CASE WHEN a.sk IS NULL THEN a.data ELSE e.data END, "
            "COALESCE(p.hash, q.hash), a.hash, p1.data, p2.data FROM audit a "
            "LEFT JOIN sessions s ON s.sk = a.sk "
            "LEFT JOIN events e ON e.sk = a.sk AND e.seq = a.seq" + EARLIER_JOIN + " "
            "LEFT JOIN audit p ON a.sk IS NOT NULL AND p.sk = a.sk AND p.n = a.n - 1 "
            "LEFT JOIN audit q ON a.stream IS NOT NULL AND q.stream = a.stream AND q.n = a.n - 1 "
            "AND q.n > 0 "
            "WHERE a.id>? AND a.n>0"
        )
        params: list[Any] = [after_id]
        past = sk = None
        if upto_id is not None:
            sql += " AND a.id<=?"
            params.append(upto_id)
        if stream is not None:
            sk = self._session_key(stream)
            sql += " AND a.stream=?" if sk is None else " AND a.sk=?"
            params.append(stream if sk is None else sk)
            if sessions is None and not others:
                # One stream, read in its index's order, `n`, which is its order of ids: by
                # id, each page read and sorted the whole rest of the stream (100,000 entries
                # read page by page took 9.6 s). Past an entry of it, from that entry's `n`.
                past = self._stream_place(after_id, sk, stream)
        if sessions is not None:
            sql += (
                " AND a.sk IS NOT NULL AND a.sk IN (SELECT sk FROM sessions WHERE id IN "
                f"({','.join('?' * len(sessions))}))"
            )
            params += sessions
        if others:
            sql += " AND s.sk IS NULL"  # no session row: another stream's, or its row is gone
        rows = None
        if past is not None and stream is not None:
            rows = self.conn.execute(
                f"{sql} AND a.n>? ORDER BY a.n LIMIT ?", [*params, past, limit]
            ).fetchall()
            if not self._in_place(rows, past, limit, sk, stream):
                # An `n` a hand edit left out of its place (text, which sorts after every
                # number, skipped the next page past it): this page is read by id, in the
                # order of the whole trail's reads, which name that entry in its place.
                rows = None
        if rows is None:
            rows = self.conn.execute(f"{sql} ORDER BY a.id LIMIT ?", [*params, limit]).fetchall()
        entries = []
        for i, st, n, t, at, seq, d, prev, h, *earlier in rows:
            entries.append(
                AuditEntry(
                    id=i,
                    stream=entry_stream(st, i),
                    n=_entry_number(n),
                    type=entry_type(t),
                    at=_entry_time(at),
                    seq=None if seq is None else _entry_number(seq),
                    data=loaded_data(d, earlier),
                    prev=None if prev is None else _entry_hash(prev),
                    hash=_entry_hash(h),
                )
            )
        return entries

    def _stream_place(self, after_id: int, sk: int | None, stream: str) -> int | None:
        """The `n` of the entry `after_id` of the stream (`sk`, a session's, else `stream`), 0
        for none yet (`after_id` 0), or None if that entry is not the stream's."""
        if after_id == 0:
            return 0
        row = self.conn.execute(
            "SELECT n, sk, stream FROM audit WHERE id=?", (after_id,)
        ).fetchone()
        if row is None or not isinstance(row[0], int):
            return None
        mine = row[1] == sk if sk is not None else row[1] is None and row[2] == stream
        return row[0] if mine else None

    def _in_place(
        self, rows: Sequence[Sequence[Any]], past: int, limit: int, sk: int | None, stream: str
    ) -> bool:
        """Whether `rows`, a page of the stream read by `n` past its entry numbered `past`, are
        its next entries by id too: numbered on one by one (`numbered_on`), and a last page
        ending at the head its session row or head row keeps (a last entry renumbered below
        `past`, as to 0.5, is in no page read by `n`)."""
        if not numbered_on([(r[0], r[2]) for r in rows], past):
            return False
        if len(rows) == limit:
            return True
        if sk is not None:
            head = self.conn.execute("SELECT audit_n FROM sessions WHERE sk=?", (sk,)).fetchone()
        else:
            head = self.conn.execute(
                "SELECT seq FROM audit WHERE stream=? AND n=0", (stream,)
            ).fetchone()
        return head is not None and head[0] == past + len(rows)

    @reading
    async def audit_window(self, *, after_id: int = 0, limit: int = 1000) -> int | None:
        row = self.conn.execute(
            "SELECT max(id) FROM (SELECT id FROM audit WHERE id>? ORDER BY id LIMIT ?)",
            (after_id, limit),
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    @reading
    async def audit_heads(
        self, *, stream: str | None = None, others: bool = False
    ) -> dict[str, tuple[int, str | None]]:
        # Sessions keep theirs in the session row, other streams in their head row (n = 0).
        sessions = "SELECT id, audit_n, audit_hash FROM sessions WHERE audit_n > 0"
        streams = "SELECT stream, seq, hash FROM audit WHERE stream IS NOT NULL AND n = 0"
        if stream is not None:
            sessions += " AND id=:stream"
            streams += " AND stream=:stream"
        sql = streams if others else f"{sessions} UNION ALL {streams}"
        return _heads(self.conn.execute(sql, {"stream": stream}))

    @reading
    async def audit_sessions(
        self, *, after: str = "", limit: int = 100
    ) -> dict[str, tuple[int, str | None]]:
        # A hash kept with no entry counted is no head, as `audit_heads` reads it.
        sql = (
            "SELECT id, audit_n, CASE WHEN audit_n > 0 THEN audit_hash END FROM sessions "
            "WHERE id > ? ORDER BY id LIMIT ?"
        )
        return _heads(self.conn.execute(sql, (after, limit)))

    @reading
    async def audited_events(self, sessions: Sequence[str]) -> dict[str, list[tuple[int, str]]]:
        sql = (
            "SELECT s.id, e.seq, e.type FROM sessions s JOIN events e ON e.sk = s.sk "
            f"WHERE s.id IN ({','.join('?' * len(sessions))}) "
            f"AND e.type IN ({','.join('?' * len(AUDITED_STORED))}) ORDER BY s.id, e.seq"
        )
        found: dict[str, list[tuple[int, str]]] = {}
        for sid, seq, code in self.conn.execute(sql, [*sessions, *AUDITED_STORED]):
            found.setdefault(sid, []).append((seq, entry_type(code)))
        return found

    @reading
    async def log_ends(self, sessions: Sequence[str]) -> dict[str, tuple[int, int]]:
        sql = (
            "SELECT s.id, s.head, (SELECT max(e.seq) FROM events e WHERE e.sk = s.sk) "
            f"FROM sessions s WHERE s.id IN ({','.join('?' * len(sessions))})"
        )
        return {
            sid: (_seq_or(head), _seq_or(last))
            for sid, head, last in self.conn.execute(sql, list(sessions))
        }

    @reading
    async def log_shapes(self, sessions: Sequence[str]) -> dict[str, LogShape]:
        # One pass over each session's events by the primary key: their count, sum and lowest
        # seq come with the highest, which alone was one seek.
        sql = (
            # `total`, not `sum`: a float, where a hand-edited seq made `sum` fail the whole
            # verification with "integer overflow" (`_sum_or` takes only what it holds exactly).
            "SELECT s.id, s.head, max(e.seq), count(e.seq), min(e.seq), total(e.seq) "
            "FROM sessions s LEFT JOIN events e ON e.sk = s.sk "
            f"WHERE s.id IN ({','.join('?' * len(sessions))}) GROUP BY s.sk"
        )
        return {
            sid: LogShape(
                head=_seq_or(head),
                last=_seq_or(last),
                count=count,
                low=_seq_or(low),
                total=_sum_or(total),
            )
            for sid, head, last, count, low, total in self.conn.execute(sql, list(sessions))
        }

    @reading
    async def snapshots(self, sessions: Sequence[str]) -> dict[str, StoredSnapshot]:
        sql = (
            "SELECT s.id, n.seq, n.data FROM sessions s JOIN snapshots n ON n.sk = s.sk "
            f"WHERE s.id IN ({','.join('?' * len(sessions))})"
        )
        return {
            sid: stored_snapshot(sid, seq, data)
            for sid, seq, data in self.conn.execute(sql, list(sessions))
        }


def _entry_number(value: object) -> int:
    """An audit entry's number or event seq: SQLite keeps whatever a hand edit puts in a column,
    and one that is no whole number reads as `DAMAGED`, which verification names as damage."""
    return value if isinstance(value, int) and not isinstance(value, bool) else DAMAGED


def _sum_or(value: object) -> int:
    """A sum of seqs as `total()` reads it for `log_shapes`: the whole number it is, if a float
    holds it exactly, else -1 (a seq that is no whole number, or a sum past 2**53)."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**53:
        return int(value)
    return -1


def _seq_or(value: object) -> int:
    """A seq as read for `log_ends` and `log_shapes`: 0 for none, -1 for what a hand edit left
    that is none."""
    if value is None:
        return 0
    return value if isinstance(value, int) and not isinstance(value, bool) else -1


def _entry_time(value: object) -> float:
    """An entry's time: what a hand edit left that is no number (SQLite keeps text in a REAL
    column) reads as NaN, which matches no hash, so verification names that entry instead of
    failing on it; a missing one reads as 0."""
    if value is None:
        return 0.0
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return math.nan


def _entry_hash(value: object) -> str:
    """An audit entry's hash as hex; one a hand edit left that is not bytes reads as its text,
    which matches no hash, so verification names that entry instead of failing on it."""
    if isinstance(value, bytes | memoryview):
        return bytes(value).hex()
    return str(value)


def _heads(rows: Iterable[tuple[Any, Any, Any]]) -> dict[str, tuple[int, str | None]]:
    """Chain heads `(n, hash)` by stream. What a hand edit left that is no whole number reads as
    `DAMAGED` and a hash that is not bytes as its text, as an entry's do: verification names
    that session's head and goes on to the others, rather than stopping at it. A session id or
    stream that is no text (a BLOB) is `StoreDamaged`: sessions are paged by their ids."""
    return {
        _head_stream(i): (_entry_number(n), None if h is None else _entry_hash(h))
        for i, n, h in rows
    }


def _head_stream(value: object) -> str:
    """A chain head's session id or stream, else `StoreDamaged`."""
    if isinstance(value, str):
        return value
    raise StoreDamaged(f"an audit chain's session or stream is damaged: its id is {value!r:.40}")
