"""The PostgreSQL store's reads of the audit trail: its entries, the chain heads and the
audited events, event logs and snapshots `verify_audit` checks them against."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._audit import (
    AUDITED_STORED,
    AuditEntry,
    LogShape,
    StoredSnapshot,
    entry_stream,
    entry_type,
    loaded_data,
    numbered_on,
    stored_snapshot,
)
from ._connections import Conn, Connections, storable
from ._sql import EARLIER_COLUMNS, EARLIER_JOIN

__all__ = ["AuditReads"]


class AuditReads(Connections):
    """`PostgresStore`'s reads of the audit trail."""

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
        s = self._s

        async def body(conn: Conn) -> list[AuditEntry]:
            # An entry of a session's event keeps only its place and hash: its type, time and
            # data are read from the event, so the chain also covers the event log itself;
            # `prev` is the hash of the entry before it in its stream.
            # Its session and the entry before it are looked up by key (`LATERAL ... LIMIT 1`):
            # a join the planner may hash reads every session or entry for each page.
            sql = (
                "SELECT a.id, COALESCE(x.id, a.stream), a.n, COALESCE(e.type, a.type), "
                "COALESCE(e.at, a.at), a.seq, a.sk, a.data::text, e.data, "
                f"COALESCE(p.hash, q.hash), a.hash, {EARLIER_COLUMNS} FROM {s}.audit a "
                f"LEFT JOIN LATERAL (SELECT y.sk, y.id FROM {s}.sessions y WHERE y.sk = a.sk "
                "LIMIT 1) x ON true "
                f"LEFT JOIN {s}.events e ON e.sk = a.sk AND e.seq = a.seq"
                f"{EARLIER_JOIN.format(s=s)} "
                f"LEFT JOIN LATERAL (SELECT p.hash FROM {s}.audit p WHERE a.sk IS NOT NULL "
                "AND p.sk = a.sk AND p.n = a.n - 1 LIMIT 1) p ON true "
                f"LEFT JOIN LATERAL (SELECT q.hash FROM {s}.audit q WHERE a.stream IS NOT NULL "
                "AND q.stream = a.stream AND q.n = a.n - 1 AND q.n > 0 LIMIT 1) q ON true "
                "WHERE a.id>%s AND a.n>0"
            )
            params: list[Any] = [after_id]
            past = sk = None
            if upto_id is not None:
                sql += " AND a.id<=%s"
                params.append(upto_id)
            if stream is not None:
                if not storable(stream):
                    return []
                sk = await self._session_key(conn, stream)
                sql += " AND a.stream=%s" if sk is None else " AND a.sk=%s"
                params.append(stream if sk is None else sk)
                if sessions is None and not others:
                    # One stream, read in its index's order, `n` (its order of ids), past the
                    # last entry's `n`: by id, a page read the rest of the stream, or of the
                    # trail, for its LIMIT, each page of a long stream longer.
                    past = await _stream_place(conn, s, after_id, sk, stream)
            if sessions is not None:
                # Their keys first: a plan for an unknown list of ids scans every entry.
                cur = await conn.execute(
                    f"SELECT sk FROM {s}.sessions WHERE id = ANY(%s)",
                    [[i for i in sessions if storable(i)]],
                )
                sql += " AND a.sk = ANY(%s)"
                params.append([int(sk) for (sk,) in await cur.fetchall()])
            if others:
                sql += " AND x.sk IS NULL"  # of no session row: another stream's
            rows = None
            if past is not None and stream is not None:
                cur = await conn.execute(
                    f"{sql} AND a.n>%s ORDER BY a.n LIMIT %s", [*params, past, limit]
                )
                rows = await cur.fetchall()
                if not await _in_place(conn, s, rows, past, limit, sk, stream):
                    rows = None  # an `n` a hand edit moved: this page by id, as all are read
            if rows is None:
                cur = await conn.execute(f"{sql} ORDER BY a.id LIMIT %s", [*params, limit])
                rows = await cur.fetchall()
            return [
                AuditEntry(
                    id=int(i),
                    stream=entry_stream(st, i),
                    n=int(n),
                    type=entry_type(t),
                    at=float(at) if at is not None else 0.0,
                    seq=None if seq is None else int(seq),
                    data=loaded_data(own, ()) if ask is None else loaded_data(ev, earlier),
                    prev=None if prev is None else bytes(prev).hex(),
                    hash=bytes(h).hex(),
                )
                for i, st, n, t, at, seq, ask, own, ev, prev, h, *earlier in rows
            ]

        return await self._read(body, "reading the audit trail")

    async def audit_window(self, *, after_id: int = 0, limit: int = 1000) -> int | None:
        async def body(conn: Conn) -> int | None:
            cur = await conn.execute(
                f"SELECT max(id) FROM (SELECT id FROM {self._s}.audit WHERE id>%s "
                "ORDER BY id LIMIT %s) w",
                (after_id, limit),
            )
            row = await cur.fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return await self._read(body, "reading the audit trail")

    async def audit_heads(
        self, *, stream: str | None = None, others: bool = False
    ) -> dict[str, tuple[int, str | None]]:
        # Sessions keep theirs in the session row, other streams in their head row (n = 0).
        sessions = f"SELECT id, audit_n, audit_hash FROM {self._s}.sessions WHERE audit_n > 0"
        streams = (
            f"SELECT stream, seq, hash FROM {self._s}.audit WHERE stream IS NOT NULL AND n = 0"
        )
        if stream is not None:
            sessions += " AND id=%(stream)s" if storable(stream) else " AND false"
            streams += " AND stream=%(stream)s" if storable(stream) else " AND false"
        sql = streams if others else f"{sessions} UNION ALL {streams}"
        return await self._heads(sql, {"stream": stream})

    async def audit_sessions(
        self, *, after: str = "", limit: int = 100
    ) -> dict[str, tuple[int, str | None]]:
        if not storable(after):
            return {}
        sql = (
            # A hash kept with no entry counted is no head, as `audit_heads` reads it.
            "SELECT id, audit_n, CASE WHEN audit_n > 0 THEN audit_hash END "
            f"FROM {self._s}.sessions "
            "WHERE id > %(after)s ORDER BY id LIMIT %(limit)s"
        )
        return await self._heads(sql, {"after": after, "limit": limit})

    async def audited_events(self, sessions: Sequence[str]) -> dict[str, list[tuple[int, str]]]:
        async def body(conn: Conn) -> dict[str, list[tuple[int, str]]]:
            s, ids = self._s, [i for i in sessions if storable(i)]
            sql = f"SELECT s.id, e.seq, e.type FROM {s}.sessions s JOIN {s}.events e ON e.sk = s.sk"
            sql += " WHERE s.id = ANY(%s) AND e.type = ANY(%s) ORDER BY s.id, e.seq"
            cur = await conn.execute(sql, (ids, list(AUDITED_STORED)))
            found: dict[str, list[tuple[int, str]]] = {}
            for sid, seq, code in await cur.fetchall():
                found.setdefault(sid, []).append((int(seq), entry_type(code)))
            return found

        return await self._read(body, "reading the audited events")

    async def log_ends(self, sessions: Sequence[str]) -> dict[str, tuple[int, int]]:
        async def body(conn: Conn) -> dict[str, tuple[int, int]]:
            s, ids = self._s, [i for i in sessions if storable(i)]
            sql = (
                f"SELECT s.id, s.head, (SELECT max(e.seq) FROM {s}.events e WHERE e.sk = s.sk) "
                f"FROM {s}.sessions s WHERE s.id = ANY(%s)"
            )
            cur = await conn.execute(sql, (ids,))
            return {
                sid: (int(head), 0 if last is None else int(last))
                for sid, head, last in await cur.fetchall()
            }

        return await self._read(body, "reading where the event logs end")

    async def log_shapes(self, sessions: Sequence[str]) -> dict[str, LogShape]:
        async def body(conn: Conn) -> dict[str, LogShape]:
            s, ids = self._s, [i for i in sessions if storable(i)]
            # One pass over each session's events by the primary key (LATERAL: never a scan of
            # all events joined): their count, sum and lowest seq come with the highest.
            sql = (
                "SELECT s.id, s.head, x.hi, x.n, x.lo, x.total "
                f"FROM {s}.sessions s CROSS JOIN LATERAL (SELECT max(e.seq) AS hi, "
                "count(*) AS n, min(e.seq) AS lo, sum(e.seq) AS total "
                f"FROM {s}.events e WHERE e.sk = s.sk) x WHERE s.id = ANY(%s)"
            )
            cur = await conn.execute(sql, (ids,))
            return {
                sid: LogShape(
                    head=int(head),
                    last=0 if last is None else int(last),
                    count=int(count),
                    low=0 if low is None else int(low),
                    total=0 if total is None else int(total),
                )
                for sid, head, last, count, low, total in await cur.fetchall()
            }

        return await self._read(body, "reading the shapes of the event logs")

    async def snapshots(self, sessions: Sequence[str]) -> dict[str, StoredSnapshot]:
        async def body(conn: Conn) -> dict[str, StoredSnapshot]:
            s, ids = self._s, [i for i in sessions if storable(i)]
            cur = await conn.execute(
                f"SELECT s.id, n.seq, n.data FROM {s}.sessions s JOIN {s}.snapshots n "
                "ON n.sk = s.sk WHERE s.id = ANY(%s)",
                (ids,),
            )
            return {
                sid: stored_snapshot(sid, int(seq), data) for sid, seq, data in await cur.fetchall()
            }

        return await self._read(body, "reading the snapshots")

    async def _heads(self, sql: str, params: dict[str, Any]) -> dict[str, tuple[int, str | None]]:
        async def body(conn: Conn) -> dict[str, tuple[int, str | None]]:
            cur = await conn.execute(sql, params)
            return {
                i: (int(n), None if h is None else bytes(h).hex())
                for i, n, h in await cur.fetchall()
            }

        return await self._read(body, "reading the audit chain heads")


async def _stream_place(
    conn: Conn, s: str, after_id: int, sk: int | None, stream: str
) -> int | None:
    """The `n` of the entry `after_id` of the stream (`sk`, a session's, else `stream`), 0 for
    none yet (`after_id` 0), or None if that entry is not the stream's."""
    if after_id == 0:
        return 0
    cur = await conn.execute(f"SELECT n, sk, stream FROM {s}.audit WHERE id = %s", [after_id])
    row = await cur.fetchone()
    if row is None:
        return None
    mine = row[1] == sk if sk is not None else row[1] is None and row[2] == stream
    return int(row[0]) if mine else None


async def _in_place(
    conn: Conn,
    s: str,
    rows: Sequence[Sequence[Any]],
    past: int,
    limit: int,
    sk: int | None,
    stream: str,
) -> bool:
    """Whether `rows`, a page of the stream read by `n` past its entry numbered `past`, are its
    next entries by id too: numbered on one by one (`numbered_on`), and a last page ending at
    the head its session row or head row keeps (a last entry renumbered below `past`
    is in no page read by `n`)."""
    if not numbered_on([(int(r[0]), r[2]) for r in rows], past):
        return False
    if len(rows) == limit:
        return True
    if sk is not None:
        cur = await conn.execute(f"SELECT audit_n FROM {s}.sessions WHERE sk = %s", [sk])
    else:
        cur = await conn.execute(f"SELECT seq FROM {s}.audit WHERE stream = %s AND n = 0", [stream])
    head = await cur.fetchone()
    return head is not None and head[0] == past + len(rows)
