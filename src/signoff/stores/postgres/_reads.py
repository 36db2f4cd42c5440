"""The PostgreSQL store's reads: sessions and their events, requests and the approval queue
(the audit trail's are in `_audit_reads`). Each is one read on a pooled connection, retried (twice
at most) if the connection is lost."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..._events import Event, event_of_row
from ..._exceptions import StoreDamaged, StoreError, UnknownSession
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
from .._codec import EventTexts, parse, stored_type, type_name, unpack, unpack_snapshot
from .._initiators import InitiatorFilter, checked_filter
from .._pending import listing_order
from .._request_rows import REQUEST_ROW_COLUMNS, request_row, stored_request, stored_resolution
from .._session_rows import check_listing, session_expiry, session_summary
from .._shown import check_shown
from .._swept_rows import DamagedSession, swept_summary
from ._audit_reads import AuditReads
from ._connections import Conn, Seen, storable
from ._sql import (
    CURRENT_TURN,
    EARLIER_COLUMNS,
    EARLIER_JOIN,
    FIRST_TURN,
    REQUEST_COLUMNS,
    REQUEST_JOIN,
    TURN,
    named_turn,
)

__all__ = ["Reads"]


class Reads(AuditReads):
    """`PostgresStore`'s reads."""

    async def load(self, session_id: str) -> Loaded | None:
        s = self._s
        if not storable(session_id):
            return None

        async def body(conn: Conn) -> Loaded | None:
            cur = await conn.execute(
                "SELECT s.sk, s.agent, n.seq, n.data, s.head, s.audit_n, s.audit_hash, t.seq, "
                f"t.turn FROM {s}.sessions s LEFT JOIN {s}.snapshots n ON n.sk = s.sk "
                f"LEFT JOIN LATERAL ({named_turn(s, 's.sk', 's.head')}) t ON true WHERE s.id=%s",
                (session_id,),
            )
            row = await cur.fetchone()
            if row is None:
                return None
            sk, agent = int(row[0]), str(row[1])
            # What the next commit to it guesses (checked by that commit).
            digest = None if row[6] is None else bytes(row[6])
            turn_seq = None if row[7] is None else int(row[7])
            self._remember(session_id, Seen(int(row[4]), int(row[5]), digest, turn_seq, row[8]))
            after = 0 if row[2] is None else int(row[2])
            snapshot = None if row[3] is None else unpack_snapshot(row[3], session_id, after)
            key, events = await self._events(conn, session_id, after, None, None)
            if key is None:  # deleted between the two statements
                return None
            if key != sk:  # its schema dropped, or made anew, between the two statements
                raise StoreError(
                    f"session {session_id!r} changed while it was read: its schema "
                    "made anew? Read it again"
                )
            return Loaded(
                session_id=session_id,
                agent=agent,
                snapshot=snapshot,
                events=events,
                head=int(row[4]),
            )

        return await self._read(body, f"loading session {session_id!r}")

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

        async def body(conn: Conn) -> list[Event]:
            if not storable(session_id):
                raise UnknownSession(session_id)
            key, events = await self._events(
                conn, session_id, after, limit, types, newest, max_bytes, shown
            )
            if key is None:
                raise UnknownSession(session_id)
            return events

        return await self._read(body, f"reading events of session {session_id!r}")

    async def _events(
        self,
        conn: Conn,
        session_id: str,
        after: int,
        limit: int | None,
        types: Sequence[str] | None,
        newest: int | None = None,
        max_bytes: int | None = None,
        shown: Event | None = None,
    ) -> tuple[int | None, list[Event]]:
        """The session's row key and its events after `after`, in one statement that finds the
        key by the session's id (None: no such session), and with `shown` the event at its seq
        (`check_shown`). A key kept from an earlier call could name another session's rows: its
        schema dropped and made anew meanwhile (a restore) reuses keys, and no call of this
        process need have met the gap."""
        s = self._s
        turn = TURN.format(s=s)
        if not types:
            # The rows are consecutive: one naming no turn has the turn of the row before it,
            # carried forward below, so only the first may need to look further back.
            turn = (
                "CASE WHEN e.turn IS NULL AND lag(e.seq) OVER (ORDER BY e.seq) IS NULL "
                f"THEN {turn} ELSE e.turn END"
            )
        rows = f"{s}.events e WHERE e.sk=k.sk AND e.seq>%s"
        params: list[Any] = [session_id, after]
        if types:  # rows keep a type's code, or its name if an older signoff wrote them
            rows += " AND e.type = ANY(%s)"
            params.append(sorted({stored_type(t) for t in types} | set(types)))
        if newest is not None:  # the newest `newest` of them, still oldest first
            rows = f"(SELECT * FROM {rows} ORDER BY e.seq DESC LIMIT %s) AS e"
            params.append(newest)
        elif max_bytes is not None:
            # Rows up to the one whose stored size brings them to `max_bytes` (stored data is
            # at most its JSON's size): the database sends no more than that. octet_length
            # reads a value's size without fetching it.
            rows = (
                "(SELECT * FROM (SELECT e.*, sum(octet_length(e.data)) OVER (ORDER BY e.seq) "
                f"AS held FROM {rows} ORDER BY e.seq LIMIT %s) AS e "
                "WHERE e.held - octet_length(e.data) < %s) AS e"
            )
            params.extend([limit, max_bytes])
        else:
            rows = f"(SELECT * FROM {rows}) AS e"
        sql = (
            f"SELECT e.seq, e.type, {turn}, e.at, e.v, e.data, {EARLIER_COLUMNS} FROM {rows}"
            f"{EARLIER_JOIN.format(s=s)} ORDER BY e.seq"
        )
        if limit is not None:
            sql += " LIMIT %s"
            params.append(limit)
        # The session's row, and its events joined to it: one row with no event if it has none
        # past `after`, none if there is no such session.
        key_sql = f"SELECT sk FROM {s}.sessions WHERE id=%s"
        o = 0  # where the event's columns start, after the key and those of `shown`'s row
        if shown is not None:
            key_sql = (
                f"SELECT s.sk, x.type, x.at, x.turn FROM {s}.sessions s LEFT JOIN {s}.events x "
                "ON x.sk = s.sk AND x.seq = %s WHERE s.id=%s"
            )
            params.insert(0, shown.seq)
            o = 3
        sql = (
            f"SELECT k.*, q.* FROM ({key_sql}) k LEFT JOIN LATERAL ({sql}) q ON true ORDER BY q.seq"
        )
        cur = await conn.execute(sql, params)
        events: list[Event] = []
        named: str | None = None
        rows_found = await cur.fetchall()
        if not rows_found:
            return None, events
        first = rows_found[0]
        key = int(first[0])
        if shown is not None:
            check_shown(session_id, shown, None if first[1] is None else first[1:4])
        found = rows_found if first[1 + o] is not None else []
        earlier: dict[int, Any] = {}

        def before(seq: int) -> Any:
            """The stored events `seq` may be kept on, as its row holds them (looked up only for
            an event the run read does not start with what it needs: seldom)."""
            if not earlier:
                earlier.update((int(row[1 + o]), row[7 + o :]) for row in found)
            return earlier[seq]

        texts = EventTexts(before)
        held = 0
        for row in found:
            seq, code, turn_id, at, v, data = row[1 + o : 7 + o]
            if max_bytes is not None and held >= max_bytes:
                break  # their JSON is larger than stored: the bound is kept on that too
            if turn_id is None and not types:
                turn_id = named
            named = turn_id
            try:
                type_, text = type_name(code), texts.text(int(seq), data)
                value = parse(text)
                event = event_of_row(
                    session_id, int(seq), type_, float(at), turn_id or None, value, int(v)
                )
            except StoreDamaged as exc:  # named by its session and seq, so it can be found
                raise StoreDamaged(f"session {session_id!r}, event {seq}: {exc}") from exc
            held += len(text)
            events.append(event)
        return key, events

    async def head(self, session_id: str, *, shown: Event | None = None) -> int | None:
        """The session's head. The state a commit guesses is read with it, so that the next
        commit to a session another process moved on needs no round trip to read it first;
        and with `shown`, the row at its seq (`check_shown`)."""
        s = self._s
        if not storable(session_id):
            return None
        columns = "s.head, s.audit_n, s.audit_hash, t.seq, t.turn"
        joined = f"LEFT JOIN LATERAL ({named_turn(s, 's.sk', 's.head')}) t ON true"
        params: tuple[Any, ...] = (session_id,)
        if shown is not None:
            columns += ", x.type, x.at, x.turn"
            joined += f" LEFT JOIN {s}.events x ON x.sk = s.sk AND x.seq = %s"
            params = (shown.seq, session_id)
        sql = f"SELECT {columns} FROM {s}.sessions s {joined} WHERE s.id=%s"

        async def body(conn: Conn) -> int | None:
            cur = await conn.execute(sql, params)
            row = await cur.fetchone()
            if row is None:
                return None
            head = self._moved(session_id, row)
            if shown is not None:
                check_shown(session_id, shown, None if row[5] is None else row[5:8])
            return head

        return await self._read(body, f"reading the head of session {session_id!r}")

    async def _session_heads(self, session_ids: Sequence[str]) -> dict[str, int]:
        """The heads of those of `session_ids` that are stored, in one read (the re-check
        `wait_for_change` shares among its waits)."""
        s = self._s
        ids = [sid for sid in session_ids if storable(sid)]
        if not ids:
            return {}

        async def body(conn: Conn) -> dict[str, int]:
            sql = f"SELECT id, head FROM {s}.sessions WHERE id = ANY(%s)"
            cur = await conn.execute(sql, (ids,))
            return {str(sid): int(head) for sid, head in await cur.fetchall()}

        return await self._read(body, f"reading the heads of {len(ids)} sessions")

    async def get_request(self, request_id: str) -> StoredRequest | None:
        if not storable(request_id):
            return None

        async def body(conn: Conn) -> StoredRequest | None:
            cur = await conn.execute(
                f"SELECT r.outcome, r.resolution, s.expires_at, {REQUEST_COLUMNS} "
                f"FROM {self._s}.requests r {REQUEST_JOIN.format(s=self._s)} WHERE r.id=%s",
                (request_id,),
            )
            row = await cur.fetchone()
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

        return await self._read(body, f"reading request {request_id!r}")

    async def request_session(self, request_id: str) -> str | None:
        if not storable(request_id):
            return None
        sql = f"SELECT s.id FROM {self._s}.requests r JOIN {self._s}.sessions s ON s.sk = r.sk "

        async def body(conn: Conn) -> str | None:
            row = await (await conn.execute(sql + "WHERE r.id=%s", (request_id,))).fetchone()
            return None if row is None else str(row[0])

        return await self._read(body, f"reading the session of request {request_id!r}")

    async def stored_requests(
        self,
        *,
        session_id: str | None = None,
        after: str = "",
        limit: int = 1000,
        sessions: Sequence[str] | None = None,
    ) -> list[RequestRow]:
        s = self._s
        if not storable(session_id, after):
            return []
        # The primary key's own collation, so each page is an index range after the last.
        where, params = "r.id > %s", list[Any]([after])
        if session_id is not None:
            where += " AND s.id = %s"
            params.append(session_id)
        if sessions is not None:
            where += " AND s.id = ANY(%s)"
            params.append([i for i in sessions if storable(i)])

        async def body(conn: Conn) -> list[RequestRow]:
            cur = await conn.execute(
                f"SELECT {REQUEST_ROW_COLUMNS}, {REQUEST_COLUMNS} FROM {s}.requests r "
                f"{REQUEST_JOIN.format(s=s)} WHERE {where} ORDER BY r.id LIMIT %s",
                [*params, limit],
            )
            return [request_row(row, unpack) for row in await cur.fetchall()]

        return await self._read(body, "reading request rows")

    def _filter_sql(self, flt: PendingFilter) -> tuple[str, list[Any]]:
        if not storable(flt.status, flt.agent, flt.tool_name, flt.kind, flt.session_id):
            return " WHERE false", []
        return flt.where("%s", f"{self._s}.")

    async def pending(self, flt: PendingFilter) -> list[InputRequest]:
        clause, params = self._filter_sql(flt)

        async def body(conn: Conn) -> list[InputRequest]:
            cur = await conn.execute(self._listing_sql(clause), [*params, flt.limit, flt.offset])
            return [stored_request(*row[:5], unpack, *row[5:]) for row in await cur.fetchall()]

        return await self._read(body, "listing pending requests")

    async def pending_keys(self, flt: PendingFilter) -> list[tuple[float, str, str]]:
        """Each row `pending(flt)` lists as `(created_at, id, session id)`, its data unread:
        how a reader in the background (a sweep, a hub starting) passes a row it cannot read."""
        clause, params = self._filter_sql(flt)
        join = f"JOIN {self._s}.sessions s ON s.sk = r.sk"
        sql = self._listing_sql(clause, columns="r.created_at, r.id, s.id", join=join)

        async def body(conn: Conn) -> list[tuple[float, str, str]]:
            cur = await conn.execute(sql, [*params, flt.limit, flt.offset])
            return [(float(at), str(rid), str(sid)) for at, rid, sid in await cur.fetchall()]

        return await self._read(body, "listing pending requests' keys")

    async def count_pending(self, flt: PendingFilter) -> int:
        clause, params = self._filter_sql(flt)

        async def body(conn: Conn) -> int:
            return await self._count(conn, clause, params)

        return await self._read(body, "counting pending requests")

    async def pending_counted(self, flt: PendingFilter) -> tuple[list[InputRequest], int]:
        """`pending(flt)` and `count_pending(flt)` as one statement, so of one snapshot: the
        count is the listing's InitPlan, each planned as when run alone. A page past the end
        holds no row to carry it, so that one is counted by a statement of its own."""
        clause, params = self._filter_sql(flt)
        sql = self._listing_sql(clause, f"({self._count_sql(clause)}), ")

        async def body(conn: Conn) -> tuple[list[InputRequest], int]:
            cur = await conn.execute(sql, [*params, *params, flt.limit, flt.offset])
            rows = await cur.fetchall()
            page = [stored_request(*row[1:6], unpack, *row[6:]) for row in rows]
            if rows:
                return page, int(rows[0][0])
            if flt.offset == 0 and flt.limit > 0:
                return page, 0  # nothing matched
            return page, await self._count(conn, clause, params)

        return await self._read(body, "listing pending requests")

    def _listing_sql(
        self, clause: str, before: str = "", *, columns: str = REQUEST_COLUMNS, join: str = ""
    ) -> str:
        """A page of `clause`'s requests, as `columns` (after `before`) of `requests r` and
        `join` (the request's event and session, by default): the page and its keys
        (`pending_keys`) in one order, which reading a damaged page in halves relies on."""
        s = self._s
        return (
            f"SELECT {before}{columns} FROM {s}.requests r "
            f"{join or REQUEST_JOIN.format(s=s)}{clause} "
            f"ORDER BY {listing_order('%s')} LIMIT %s OFFSET %s"
        )

    def _count_sql(self, clause: str) -> str:
        s = self._s
        return f"SELECT COUNT(*) FROM {s}.requests r JOIN {s}.sessions s ON s.sk=r.sk{clause}"

    async def _count(self, conn: Conn, clause: str, params: list[Any]) -> int:
        cur = await conn.execute(self._count_sql(clause), params)
        row = await cur.fetchone()
        return 0 if row is None else int(row[0])

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
        check_listing(agent, status, limit, offset)  # PostgreSQL refused a negative one
        clause, params = _session_filter(agent, status, initiated_by)

        async def body(conn: Conn) -> list[SessionSummary]:
            cur = await conn.execute(self._sessions_sql(clause), [*params, limit, offset])
            return [session_summary(row) for row in await cur.fetchall()]

        return await self._read(body, "listing sessions")

    async def count_sessions(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        initiated_by: InitiatorFilter | None = None,
    ) -> int:
        """How many sessions `sessions` would list with no limit."""
        clause, params = _session_filter(agent, status, initiated_by)

        async def body(conn: Conn) -> int:
            cur = await conn.execute(f"SELECT COUNT(*) FROM {self._s}.sessions{clause}", params)
            row = await cur.fetchone()
            return 0 if row is None else int(row[0])

        return await self._read(body, "counting sessions")

    async def sessions_counted(
        self,
        *,
        agent: str | None = None,
        status: str | None = None,
        limit: int = 100,
        offset: int = 0,
        initiated_by: InitiatorFilter | None = None,
    ) -> tuple[list[SessionSummary], int]:
        """`sessions()` and `count_sessions()` as one statement, so of one snapshot: the page
        joined to its count, each planned as when run alone (and the page sorted again: a join
        promises no order); a page past the end is the count's one row with no session."""
        check_listing(agent, status, limit, offset)
        clause, params = _session_filter(agent, status, initiated_by)
        sql = (
            "SELECT c.n, p.id, p.agent, p.status, p.head, p.created_at, p.updated_at, p.expires_at "
            f"FROM (SELECT COUNT(*) AS n FROM {self._s}.sessions{clause}) c "
            f"LEFT JOIN ({self._sessions_sql(clause, 'sk, ')}) p ON true "
            "ORDER BY p.updated_at DESC, p.sk DESC"
        )

        async def body(conn: Conn) -> tuple[list[SessionSummary], int]:
            cur = await conn.execute(sql, [*params, *params, limit, offset])
            rows = await cur.fetchall()
            page = [session_summary(row[1:]) for row in rows if row[1] is not None]
            return page, int(rows[0][0])

        return await self._read(body, "listing sessions")

    def _sessions_sql(self, clause: str, before: str = "") -> str:
        return (
            f"SELECT {before}id, agent, status, head, created_at, updated_at, expires_at "
            f"FROM {self._s}.sessions{clause} "
            "ORDER BY updated_at DESC, sk DESC LIMIT %s OFFSET %s"
        )

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
        s = self._s
        if (agents is not None and not agents) or (ids is not None and not ids):
            return []
        only = "" if agents is None else "AND agent = ANY(%s) "
        only += "" if ids is None else "AND id = ANY(%s) "
        past = ""
        if after is not None:
            past = 'AND expires_at >= %s AND (expires_at > %s OR id COLLATE "C" > %s) '
        cursor = [] if after is None else [after[0], after[0], after[1]]

        async def body(conn: Conn) -> list[SessionSummary | DamagedSession]:
            cur = await conn.execute(
                "SELECT id, agent, status, head, created_at, updated_at, expires_at "
                f"FROM {s}.sessions WHERE status IN ('running', 'waiting') AND expires_at <= %s "
                f'{only}{past}ORDER BY expires_at, id COLLATE "C" LIMIT %s OFFSET %s',
                (
                    now,
                    *([] if agents is None else [list(agents)]),
                    *([] if ids is None else [list(ids)]),
                    *cursor,
                    limit,
                    offset,
                ),
            )
            return [swept_summary(row) for row in await cur.fetchall()]

        return await self._read(body, "listing sessions whose TTL passed")

    async def lapsed_ancestors(self, now: float) -> list[str]:
        """The sessions with open requests above (parent, grandparent, ...) a running or waiting
        subagent session whose TTL passed by `now`, or holding an open request past its
        deadline: the only ones whose mirrors can show as expired (or past a deadline)
        unrecorded. From a range of the index of children by status and deadline (the copy of
        it children keep, `child_expires_at`), and the index of deadlines; none, mostly."""
        sql = lapsed_ancestors_sql("%s", f"{self._s}.", "child_expires_at")

        async def body(conn: Conn) -> list[str]:
            cur = await conn.execute(sql, (now, now))
            return [str(row[0]) for row in await cur.fetchall()]

        return await self._read(body, "listing sessions above a subagent whose TTL passed")

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
        s = self._s
        if not agents:
            return []
        past = "" if after is None else "AND c.id > %s "

        async def body(conn: Conn) -> list[SessionSummary | DamagedSession]:
            cur = await conn.execute(
                "SELECT c.id, c.agent, c.status, c.head, c.created_at, c.updated_at, "
                f"c.expires_at FROM {s}.sessions c LEFT JOIN {s}.sessions p ON p.sk = c.parent "
                "WHERE c.parent IS NOT NULL AND c.status IN ('running', 'waiting') "
                f"AND c.agent = ANY(%s) {past}AND CASE WHEN (p.sk IS NULL "
                "OR p.status NOT IN ('running', 'waiting') OR c.parent_turn IS NULL "
                "OR c.parent_turn IS DISTINCT FROM "
                f"{CURRENT_TURN.format(s=s, sk='p.sk')}) "
                # Still on its delegated turn (a later one is the child's own: see SQLite's).
                f"THEN {CURRENT_TURN.format(s=s, sk='c.sk')} IS NOT DISTINCT FROM "
                f"{FIRST_TURN.format(s=s, sk='c.sk')} END ORDER BY c.id LIMIT %s OFFSET %s",
                (list(agents), *(() if after is None else (after,)), limit, offset),
            )
            return [swept_summary(row) for row in await cur.fetchall()]

        return await self._read(body, "listing orphaned subagent sessions")

    async def database_bytes(self) -> int:
        """Bytes on disk of signoff's tables and indexes in this schema."""

        async def body(conn: Conn) -> int:
            cur = await conn.execute(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind = 'r'",
                (self.schema,),
            )
            row = await cur.fetchone()
            return 0 if row is None else int(row[0])

        return await self._read(body, "measuring the database")


def _session_filter(
    agent: str | None, status: str | None, initiated_by: InitiatorFilter | None
) -> tuple[str, list[Any]]:
    """The WHERE clause (and its parameters) of a session listing's filters; a NUL in one
    matches nothing (PostgreSQL text cannot hold it)."""
    check_listing(agent, status)
    if initiated_by is not None:
        checked_filter(initiated_by)
    if not storable(agent, status):
        return " WHERE false", []
    where: list[str] = []
    params: list[Any] = []
    for column, value in (("agent", agent), ("status", status)):
        if value is not None:
            where.append(f"{column}=%s")
            params.append(value)
    if initiated_by is not None:
        condition, more = initiated_by.where("%s", "sessions")
        where.append(condition)
        params += more
    return (" WHERE " + " AND ".join(where)) if where else "", params
