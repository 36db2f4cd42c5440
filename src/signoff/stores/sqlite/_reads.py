"""The SQLite store's reads: sessions and their events, requests and the approval queue, and
the size of its files (the audit trail's are in `_audit_reads`). They run their queries on the
store's one connection, outside any write's `BEGIN IMMEDIATE` (a page of the queue and its
total in a read transaction)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from contextlib import closing
from typing import Any

from ..._events import Event, event_of_row
from ..._exceptions import StoreDamaged, UnknownSession
from ..._settings import check_read
from ..._types import InputRequest
from .._base import (
    Loaded,
    PendingFilter,
    RequestRow,
    SessionSummary,
    StoredRequest,
    lapsed_ancestors_sql,
)
from .._codec import (
    CHAIN_MAX,
    EventTexts,
    Stored,
    parse,
    stored_type,
    type_name,
    unpack,
    unpack_snapshot,
)
from .._initiators import InitiatorFilter, checked_filter
from .._pending import listing_order
from .._request_rows import REQUEST_ROW_COLUMNS, request_row, stored_request, stored_resolution
from .._session_rows import check_listing, session_expiry, session_summary
from .._shown import check_shown
from .._swept_rows import DamagedSession, swept_summary
from ._audit_reads import AuditReads
from ._connection import kept
from ._files import beside
from ._schema import CURRENT_TURN, FIRST_TURN, REQUEST_COLUMNS, REQUEST_JOIN
from ._transactions import reading

__all__ = ["Reads"]

_TURN = (
    "COALESCE(e.turn, (SELECT p.turn FROM events p WHERE p.sk = e.sk AND p.seq < e.seq "
    "AND p.turn IS NOT NULL ORDER BY p.seq DESC LIMIT 1))"
)
"""An event's turn id: its own, or that of the nearest event before it that names one."""


class Reads(AuditReads):
    """`SQLiteStore`'s reads."""

    @reading
    async def load(self, session_id: str) -> Loaded | None:
        conn = self.conn
        row = conn.execute(
            "SELECT sk, agent, head FROM sessions WHERE id=?", (session_id,)
        ).fetchone()
        if row is None:
            return None
        sk, agent, head = int(row[0]), str(row[1]), row[2]
        if not isinstance(head, int):  # SQLite keeps what a hand edit put there
            raise StoreDamaged(f"session {session_id!r} is damaged: its row's head is {head!r:.40}")
        self._sk[session_id] = sk
        snap_row = conn.execute("SELECT seq, data FROM snapshots WHERE sk=?", (sk,)).fetchone()
        after = 0
        snapshot = None
        if snap_row is not None:
            after = int(kept(snap_row[0], int, session_id, "snapshot seq"))
            snapshot = unpack_snapshot(snap_row[1], session_id, after)
        events = self._events(session_id, sk, after, None, None)
        return Loaded(
            session_id=session_id, agent=agent, snapshot=snapshot, events=events, head=head
        )

    @reading
    async def read_events(
        self,
        session_id: str,
        after: int = 0,
        *,
        limit: int | None = None,
        types: Sequence[str] | None = None,
        newest: int | None = None,
        max_bytes: int | None = None,
        shown: Event | None = None,
    ) -> list[Event]:
        check_read(after, limit, newest, max_bytes)
        if shown is None:
            sk = self._session_key(session_id)
            if sk is None:
                raise UnknownSession(session_id)
            return self._events(session_id, sk, after, limit, types, newest, max_bytes)
        conn = self.conn
        conn.execute("BEGIN")  # the check and the read see one snapshot of the file
        try:
            row = conn.execute(
                "SELECT s.sk, e.type, e.at, e.turn FROM sessions s LEFT JOIN events e "
                "ON e.sk = s.sk AND e.seq = ? WHERE s.id = ?",
                (shown.seq, session_id),
            ).fetchone()
            if row is None:
                raise UnknownSession(session_id)
            check_shown(session_id, shown, None if row[1] is None else row[1:])
            sk = int(row[0])
            return self._events(session_id, sk, after, limit, types, newest, max_bytes)
        finally:
            if conn.in_transaction:  # SQLite ends a transaction some failures break
                conn.execute("ROLLBACK")

    def _events(
        self,
        session_id: str,
        sk: int,
        after: int,
        limit: int | None,
        types: Sequence[str] | None,
        newest: int | None = None,
        max_bytes: int | None = None,
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
        with closing(self.conn.execute(sql, params)) as cursor:
            # Bounded by bytes, rows are stepped one at a time: those past the bound are never read.
            rows = cursor if max_bytes is not None else cursor.fetchall()
            held = 0
            for seq, code, named, at, v, data in rows:
                if named is None:
                    named = turn if events else self._turn_before(sk, seq)
                turn = named
                try:
                    type_, text = type_name(code), texts.text(seq, data)
                    event = event_of_row(session_id, seq, type_, at, named or None, parse(text), v)
                except StoreDamaged as exc:  # named by its session and seq, so it can be found
                    raise StoreDamaged(f"session {session_id!r}, event {seq}: {exc}") from exc
                held += len(text)
                events.append(event)
                if max_bytes is not None and held >= max_bytes:
                    break
        return events

    def _turn_before(self, sk: int, seq: int) -> str | None:
        """The turn named by the nearest event before `seq` that names one."""
        row = self.conn.execute(
            "SELECT turn FROM events WHERE sk=? AND seq<? AND turn IS NOT NULL "
            "ORDER BY seq DESC LIMIT 1",
            (sk, seq),
        ).fetchone()
        return None if row is None else str(row[0])

    def _stored_before(self, sk: int, seq: int) -> list[Stored | None]:
        """The stored data of the events just before `seq`, nearest first."""
        rows = dict(
            self.conn.execute(
                "SELECT seq, data FROM events WHERE sk=? AND seq BETWEEN ? AND ?",
                (sk, seq - CHAIN_MAX, seq - 1),
            ).fetchall()
        )
        return [rows.get(seq - i) for i in range(1, CHAIN_MAX + 1)]

    @reading
    async def head(self, session_id: str, *, shown: Event | None = None) -> int | None:
        sql = "SELECT head FROM sessions WHERE id=?"
        params: tuple[Any, ...] = (session_id,)
        if (
            shown is not None
        ):  # one statement: the head and the row at `shown.seq` as of one snapshot
            sql = (
                "SELECT s.head, e.type, e.at, e.turn FROM sessions s LEFT JOIN events e "
                "ON e.sk = s.sk AND e.seq = ? WHERE s.id = ?"
            )
            params = (shown.seq, session_id)
        row = self.conn.execute(sql, params).fetchone()
        if row is None:
            return None
        if shown is not None:
            check_shown(session_id, shown, None if row[1] is None else row[1:])
        return int(kept(row[0], int, session_id, "head"))

    @reading
    async def get_request(self, request_id: str) -> StoredRequest | None:
        row = self.conn.execute(
            f"SELECT r.outcome, r.resolution, s.expires_at, {REQUEST_COLUMNS} FROM requests r "
            f"{REQUEST_JOIN} WHERE r.id=?",
            (request_id,),
        ).fetchone()
        if row is None:
            return None
        request = stored_request(*row[3:8], unpack, *row[8:])
        return StoredRequest(
            request=request,
            status=row[7],
            outcome=row[0],
            resolution=stored_resolution(request_id, row[1], unpack),
            session_expires_at=session_expiry(row[2], request.session_id),
        )

    @reading
    async def request_session(self, request_id: str) -> str | None:
        row = self.conn.execute(
            "SELECT s.id FROM requests r JOIN sessions s ON s.sk = r.sk WHERE r.id=?",
            (request_id,),
        ).fetchone()
        return None if row is None else str(row[0])

    @reading
    async def stored_requests(
        self,
        *,
        session_id: str | None = None,
        after: str = "",
        limit: int = 1000,
        sessions: Sequence[str] | None = None,
    ) -> list[RequestRow]:
        where, params = "r.id > ?", [after]
        if session_id is not None:
            where += " AND s.id = ?"
            params.append(session_id)
        if sessions is not None:
            where += f" AND s.id IN ({','.join('?' * len(sessions))})"
            params += sessions
        rows = self.conn.execute(
            f"SELECT {REQUEST_ROW_COLUMNS}, {REQUEST_COLUMNS} FROM requests r {REQUEST_JOIN} "
            f"WHERE {where} ORDER BY r.id LIMIT ?",
            [*params, limit],
        ).fetchall()
        return [request_row(row, unpack) for row in rows]

    def _filter_sql(self, flt: PendingFilter) -> tuple[str, list[Any]]:
        return flt.where("?")

    @reading
    async def pending(self, flt: PendingFilter) -> list[InputRequest]:
        return self._listing(flt)

    @reading
    async def pending_keys(self, flt: PendingFilter) -> list[tuple[float, str, str]]:
        """Each row `pending(flt)` lists as `(created_at, id, session id)`, its data unread:
        how a reader in the background (a sweep, a hub starting) passes a row it cannot read."""
        rows = self._listed(flt, "r.created_at, r.id, s.id", "JOIN sessions s ON s.sk = r.sk")
        # One whose created_at a hand edit made text sorts after every other (as SQLite orders
        # text after numbers) and has no key a cursor holds: left out, as it cannot be read.
        number = (int, float)
        return [(float(at), str(rid), str(sid)) for at, rid, sid in rows if type(at) in number]

    @reading
    async def count_pending(self, flt: PendingFilter) -> int:
        return self._count(flt)

    @reading
    async def pending_counted(self, flt: PendingFilter) -> tuple[list[InputRequest], int]:
        """`pending(flt)` and `count_pending(flt)` in one read transaction: in WAL mode it reads
        the snapshot its first statement took, so no other connection's commit falls between
        the page and its total. Nothing is awaited in it, so no write of this one does either."""
        conn = self.conn
        conn.execute("BEGIN")
        try:
            return self._listing(flt), self._count(flt)
        finally:
            if conn.in_transaction:  # SQLite ends a transaction some failures break
                conn.execute("ROLLBACK")

    def _listing(self, flt: PendingFilter) -> list[InputRequest]:
        rows = self._listed(flt, REQUEST_COLUMNS, REQUEST_JOIN)
        return [stored_request(*row[:5], unpack, *row[5:]) for row in rows]

    def _listed(self, flt: PendingFilter, columns: str, join: str) -> list[Any]:
        """The rows `flt` lists, as `columns` of `requests r` and `join`: the page and its keys
        (`pending_keys`) in one order, which reading a damaged page in halves relies on."""
        clause, params = self._filter_sql(flt)
        # Else SQLite scans every pending request in the order asked for, to skip sorting.
        due = flt.due_by is not None and flt.status == "pending"
        return self.conn.execute(
            f"SELECT {columns} FROM requests r "
            f"{'INDEXED BY requests_due ' if due else ''}{join}"
            f"{clause} ORDER BY {listing_order('?')} LIMIT ? OFFSET ?",
            [*params, flt.limit, flt.offset],
        ).fetchall()

    def _count(self, flt: PendingFilter) -> int:
        clause, params = self._filter_sql(flt)
        row = self.conn.execute(
            f"SELECT COUNT(*) FROM requests r JOIN sessions s ON s.sk=r.sk{clause}", params
        ).fetchone()
        return int(row[0])

    @reading
    async def sessions(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        initiated_by: InitiatorFilter | None = None,
    ) -> list[SessionSummary]:
        """Sessions, most recently active first."""
        return self._sessions(agent, status, limit, offset, initiated_by)

    @reading
    async def count_sessions(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        initiated_by: InitiatorFilter | None = None,
    ) -> int:
        """How many sessions `sessions` would list with no limit."""
        return self._count_sessions(agent, status, initiated_by)

    @reading
    async def sessions_counted(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        initiated_by: InitiatorFilter | None = None,
    ) -> tuple[list[SessionSummary], int]:
        """`sessions()` and `count_sessions()` in one read transaction, as `pending_counted`:
        no commit falls between the page and its total."""
        conn = self.conn
        conn.execute("BEGIN")
        try:
            return (
                self._sessions(agent, status, limit, offset, initiated_by),
                self._count_sessions(agent, status, initiated_by),
            )
        finally:
            if conn.in_transaction:  # SQLite ends a transaction some failures break
                conn.execute("ROLLBACK")

    def _sessions(
        self,
        agent: str | None,
        status: str | None,
        limit: int,
        offset: int,
        initiated_by: InitiatorFilter | None,
    ) -> list[SessionSummary]:
        check_listing(agent, status, limit, offset)  # SQLite took a negative limit as none
        clause, params = _session_filter(agent, status, initiated_by)
        sql = (
            "SELECT id, agent, status, head, created_at, updated_at, expires_at FROM sessions"
            f"{clause} ORDER BY updated_at DESC, sk DESC LIMIT ? OFFSET ?"
        )
        return [session_summary(row) for row in self.conn.execute(sql, [*params, limit, offset])]

    def _count_sessions(
        self, agent: str | None, status: str | None, initiated_by: InitiatorFilter | None
    ) -> int:
        clause, params = _session_filter(agent, status, initiated_by)
        row = self.conn.execute(f"SELECT COUNT(*) FROM sessions{clause}", params).fetchone()
        return int(row[0])

    @reading
    async def orphaned_children(
        self,
        agents: Sequence[str],
        *,
        limit: int = 100,
        offset: int = 0,
        after: str | None = None,
    ) -> list[SessionSummary | DamagedSession]:
        """Running or waiting sessions of `agents` created for a parent whose turn that created
        them may be over: the parent gone, idle, cancelled or failed, or on a later turn (see
        `cancel_orphan`, which decides on each), by id, past the id `after`. Only those still on
        that delegated turn: a later one is the child's own. From the index of children by
        status."""
        if not agents:
            return []
        past = "" if after is None else "AND c.id > ? "
        sql = (
            "SELECT c.id, c.agent, c.status, c.head, c.created_at, c.updated_at, c.expires_at "
            "FROM sessions c LEFT JOIN sessions p ON p.sk = c.parent "
            "WHERE c.parent IS NOT NULL AND c.status IN ('running', 'waiting') "
            f"AND c.agent IN ({','.join('?' * len(agents))}) {past}AND CASE WHEN (p.sk IS NULL "
            "OR p.status NOT IN ('running', 'waiting') OR c.parent_turn IS NULL "
            f"OR c.parent_turn IS NOT {CURRENT_TURN.format(sk='p.sk')}) "
            # Still on its delegated turn: a later one, a message to the child started, is its
            # own, which the sweep leaves alone (and would read the child to find out, always).
            # Looked up only for the children the parent's side picks (CASE: in this order).
            f"THEN {CURRENT_TURN.format(sk='c.sk')} IS {FIRST_TURN.format(sk='c.sk')} END "
            "ORDER BY c.id LIMIT ? OFFSET ?"
        )
        params = [*agents, *([] if after is None else [after]), limit, offset]
        return [swept_summary(row) for row in self.conn.execute(sql, params)]

    @reading
    async def lapsed_sessions(
        self,
        now: float,
        *,
        limit: int = 100,
        offset: int = 0,
        agents: Sequence[str] | None = None,
        after: tuple[float, str] | None = None,
        ids: Sequence[str] | None = None,
    ) -> list[SessionSummary | DamagedSession]:
        """Running or waiting sessions (of `agents` only, and of `ids` only, if given) whose
        TTL passed by `now`, soonest expired first (then by id), past `after` (a session's
        expires_at and id)."""
        if (agents is not None and not agents) or (ids is not None and not ids):
            return []
        only = "" if agents is None else f"AND agent IN ({','.join('?' * len(agents))}) "
        only += "" if ids is None else "AND id IN (SELECT value FROM json_each(?)) "
        past = "" if after is None else "AND expires_at >= ? AND (expires_at > ? OR id > ?) "
        sql = (
            "SELECT id, agent, status, head, created_at, updated_at, expires_at FROM sessions "
            f"WHERE status IN ('running', 'waiting') AND expires_at <= ? {only}{past}"
            "ORDER BY expires_at, id LIMIT ? OFFSET ?"
        )
        cursor = [] if after is None else [after[0], after[0], after[1]]
        listed = [] if ids is None else [json.dumps(list(ids))]
        params = [now, *(agents or ()), *listed, *cursor, limit, offset]
        return [swept_summary(row) for row in self.conn.execute(sql, params)]

    @reading
    async def lapsed_ancestors(self, now: float) -> list[str]:
        """The sessions with open requests above (parent, grandparent, ...) a running or waiting
        subagent session whose TTL passed by `now`, or holding an open request past its
        deadline: the only ones whose mirrors can show as expired (or past a deadline)
        unrecorded. From a range of the index of children by status and deadline, and the index
        of deadlines; none, mostly."""
        sql = lapsed_ancestors_sql("?")
        return [str(row[0]) for row in self.conn.execute(sql, (now, now))]

    # -- sizes (benchmarks, dashboard) --------------------------------------------------------

    def file_bytes(self) -> int:
        """Bytes on disk: the database file plus its WAL and shared-memory files."""
        if self.path == ":memory:":
            return 0
        where = self._where()  # the file opened, not another one after a `chdir`
        return sum(
            os.path.getsize(p)
            for p in (where, beside(where, "-wal"), beside(where, "-shm"))
            if os.path.exists(p)
        )


def _session_filter(
    agent: str | None, status: str | None, initiated_by: InitiatorFilter | None
) -> tuple[str, list[Any]]:
    """The WHERE clause (and its parameters) of a session listing's filters."""
    check_listing(agent, status)
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("agent", agent), ("status", status)):
        if value is not None:
            where.append(f"{column}=?")
            params.append(value)
    if initiated_by is not None:
        condition, more = checked_filter(initiated_by).where("?", "sessions")
        where.append(condition)
        params += more
    return (" WHERE " + " AND ".join(where)) if where else "", params
