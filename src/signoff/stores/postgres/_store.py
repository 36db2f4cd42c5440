"""The PostgreSQL store (`postgresql://…`): psycopg 3, async, over a `psycopg_pool` pool.

Every write is one transaction. A commit is one statement: it locks its session's row (`FOR
UPDATE`), checks the head, the audit chain head and the lease (a takeover locks the session row
first, so it waits for the commit; a renewal does not), compare-and-sets the requests it
resolves, then writes events, audit entries, requests, snapshot and head together and announces
itself with `NOTIFY`: a transaction of its own, sent with its Sync in one message and one round
trip, so a process frozen once it is sent (SIGSTOP, a paused VM) holds no lock while the server
commits it. Durable commits (an answer, a park or an opened request, which a person may be told
about) are synchronous; the others may skip the WAL flush (`synchronous_commit=off`), like
SQLite's `synchronous=NORMAL`. The schema lives in its own PostgreSQL schema (`signoff` by
default) and is migrated by signoff under an advisory lock. This module holds the writes; the
pool (`_connections`), the transactions (`_transactions`), the reads (`_reads`, `_audit_reads`),
the leases (`_leases`) and the LISTEN connection (`_changes`) have their own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from ..._events import Event, dumps
from ..._exceptions import AppendConflict, LeaseLost, SessionDeleted, StoreError, UnknownSession
from .._audit import AuditRow, chain_parts, chain_session
from .._base import AUDIT_RECORDED, Commit, parent_of
from .._codec import EventTexts, Tail, pack_bytes, stored_type, type_name
from .._initiators import initiator_columns
from .._request_rows import request_rows
from .._shown import rewritten
from ._channel_claims import ChannelClaims
from ._connections import Conn, Seen, storable
from ._deletions import Deletions
from ._leases import Leases
from ._reads import Reads
from ._sql import (
    AUDIT_APPEND,
    AUDIT_LOCK,
    AUDIT_RESEND,
    EARLIER_COLUMNS,
    EARLIER_JOIN,
    TURN,
    commit_sql,
    create_sql,
    event_rows,
    named_turn,
    rows_params,
)

__all__ = ["PostgresStore"]


class PostgresStore(Reads, Leases, ChannelClaims, Deletions):
    """`Store` on PostgreSQL (`postgresql://user@host:port/db`); many processes may share it.

    `schema` names the PostgreSQL schema holding signoff's tables. With `migrate=False`, `open()`
    refuses an older schema instead of upgrading it (run `signoff db upgrade`). The URL may carry
    `schema`, `pool_min`, `pool_max`, `pool_timeout`, `request_pool_timeout`, `outage_grace` and
    `operation_timeout` beside libpq's own parameters; signoff adds libpq's `connect_timeout` and
    TCP keepalive settings where nothing sets them, not the URL, its service (pg_service.conf) or
    `PGCONNECT_TIMEOUT` (`_url.TCP_DEFAULTS`), so a connection gone silent fails soon, and cuts a
    connection a call waited on for `operation_timeout` seconds (30 by default), so a server
    that stopped answering fails the call with `StoreUnavailable`.
    """

    def __repr__(self) -> str:
        return f"PostgresStore({self._where!r}, schema={self.schema!r})"

    def _unopened_copy(self, *, migrate: bool) -> PostgresStore:
        """A new store, not yet opened, of this one's URL, schema and settings but `migrate`:
        what a command opens for a runtime's store (`signoff pending app:runtime`) waits as
        long as the runtime's own would, where one made from its URL took the defaults. Its
        pool keeps one connection open, not the runtime's least: a command needs a connection
        or two, and one opening a server's pool (`min_size=20`, or `?pool_min=20`) waited for
        all of them, or failed at a role's connection limit."""
        given = {**self._given, "min_size": 1}  # at most any maximum: the copy is always valid
        return PostgresStore(self.url, schema=self.schema, migrate=migrate, **given)

    # -- writes -------------------------------------------------------------------------------

    async def create_session(
        self,
        session_id: str,
        agent: str,
        events: Sequence[Event],
        expires_at: float | None,
        *,
        status: str = "idle",
        lease: tuple[str, float, float] | None = None,
    ) -> int | None:
        s = self._s
        at = events[0].at
        last = events[-1].seq
        sync = self._sync_setting(True)
        rows, named, tail, _ = event_rows(events, (None, None), None)
        # A subagent's row names its parent and the parent's turn that delegated to it (or its
        # current one if the event names none), for `orphaned_children`.
        parent, turn = parent_of(events)
        # The session (its id derived from a key) or its parent (a subagent's) may be deleted
        # by a transaction this statement's snapshot predates: guarded (`create_sql`).
        guard = parent is not None or "idem" in events[0].data
        # One statement: the session row, its first events, its lease and the announcement.
        sql = create_sql(s, len(rows), lease is not None, sync is not None, guard)
        initiator, tenant = initiator_columns(events)  # who may see it, for listings
        params: list[Any] = [session_id, parent, session_id, parent] if guard else []
        params += [session_id, agent, last, status, at, at, expires_at, initiator]
        params.append(tenant)
        params += [turn, expires_at, parent]  # the deadline again: a child's copy
        params.append([session_id, *([] if parent is None else [parent])] if guard else session_id)
        params += rows_params(rows)
        if lease is not None:
            owner, ttl, now = lease
            params += [owner, now + ttl, ttl]
        params += [self.channel, f"{session_id} {last}"]
        if sync is not None:
            params.append(sync)

        async def body(conn: Conn) -> bool:
            cur = await conn.execute(sql, params)
            return await cur.fetchone() is not None

        async def committed() -> bool:
            return await self._has_events(session_id, events)

        self._before("session.created")
        try:
            made = await self._write(
                body,
                f"creating session {session_id!r}",
                committed=committed,
            )
        except AppendConflict as exc:
            cause = exc.__cause__
            if not isinstance(cause, psycopg.errors.UniqueViolation) or (
                cause.diag.constraint_name != "sessions_id_key"
            ):
                raise
            # Sent again after its connection was lost, the statement may meet the session the
            # first one made, committed meanwhile (the server went on with it): this call's.
            if not await self._created(session_id, events, None if lease is None else lease[0]):
                raise StoreError(f"session {session_id!r} already exists") from None
            made = True
        if made is False:  # the session's id was deleted, or its parent
            gone = parent if parent is not None and await self._was_deleted(parent) else None
            raise SessionDeleted(gone or session_id)
        self._remember(session_id, Seen(last, 0, None, *named))
        self._tails.put(session_id, last, tail)
        self._after("session.created")
        if lease is None:
            return None
        # The head its drive begins at (`granted_head`), as this statement wrote it.
        self._granted[session_id] = (1, last, (events[-1].type, events[-1].at, None))
        return 1

    async def commit(self, commit: Commit) -> None:
        """One statement writes the whole commit, gated on the session's state: its head, its
        audit chain head and the row naming the turn at the head (the audit chain and the event
        rows are computed here from a guess of them, `_state`), the lease, and the stored data of
        the rows its first event is deflated on (their text is this store's copy, `_tails`),
        read under the session's row lock in that same statement. A wrong guess writes nothing
        and answers the state found, so the commit is sent again from it (without that copy); a
        commit with no guess reads the state first (locked), as the statement's transaction's
        first round trip."""
        s = self._s
        sid = commit.session_id
        label = commit.events[0].type if commit.events else "commit"
        token, owner = commit.lease_token, commit.lease_owner
        grant = commit.grant if token is None else None
        events = commit.events
        updated = {
            req.id: (pack_bytes(req.model_dump(mode="json", exclude_defaults=True)), req.expires_at)
            for req in commit.updated_requests
        }  # a request updated twice keeps the last
        new_rows: list[tuple[Any, ...]] = []
        for req, (seq, idx), copy in (
            request_rows(commit, pack_bytes) if commit.new_requests else ()
        ):
            # A new request updated in the same commit is stored with its update.
            data, deadline = updated.pop(req.id) if req.id in updated else (copy, req.expires_at)
            new_rows.append(
                (
                    req.id,
                    seq,
                    idx,
                    req.agent,
                    req.kind,
                    req.tool_name,
                    req.created_at,
                    data,
                    deadline,
                )
            )
        resolve_rows: list[tuple[Any, ...]] = []
        seen: set[str] = set()
        for i, r in enumerate(commit.resolve):
            # A request resolved twice is closed the second time; one resolved and updated
            # gets both.
            dup = r.request_id in seen
            seen.add(r.request_id)
            data = None if dup else updated.pop(r.request_id, (None, None))[0]
            resolution = pack_bytes(r.resolution)
            resolve_rows.append((r.request_id, r.status, r.outcome, resolution, data, i, dup))
        updated_rows = [(rid, data, deadline) for rid, (data, deadline) in updated.items()]
        # A grant is flushed, as `acquire_lease`'s: a crash must not lose the turn it leases.
        sync = self._sync_setting(commit.durable or grant is not None)
        shown = commit.expected_event
        if shown is not None and shown.seq != commit.expected_seq:
            shown = None  # not the head it expects: nothing to compare it with
        ambiguous = False
        sent = False  # whether the body's last run sent its statement
        guess = self._state.get(sid)

        async def body(conn: Conn) -> psycopg.AsyncCursor[TupleRow] | None:
            nonlocal sent
            sent = False
            if not storable(sid):
                raise UnknownSession(sid)
            state = guess
            if state is None or state.head != commit.expected_seq:
                # Read unlocked, in one statement (so the turn named is the one at the head it
                # read): this waits for the answer, and a process frozen meanwhile must hold no
                # lock (the server sees it active, not idle in a transaction, and no timeout of
                # its ends it). The statement below checks all of it, locked.
                cur = await conn.execute(
                    f"SELECT x.sk, x.head, x.audit_n, x.audit_hash, t.seq, t.turn "
                    f"FROM {s}.sessions x LEFT JOIN LATERAL "
                    f"({named_turn(s, 'x.sk', 'x.head')}) t ON true WHERE x.id=%s",
                    (sid,),
                )
                found = await cur.fetchone()
                if found is None:
                    raise UnknownSession(sid)
                sk, head = int(found[0]), int(found[1])
                if head != commit.expected_seq:
                    if ambiguous and await self._events_match(conn, sk, events):
                        return None  # our first attempt did commit after all
                    raise AppendConflict(
                        f"session {sid!r} is at seq {head}, not {commit.expected_seq}"
                    )
                state = Seen(
                    head,
                    int(found[2]),
                    None if found[3] is None else bytes(found[3]),
                    None if found[4] is None else int(found[4]),
                    found[5],
                )
            n, digest = state.audit_n, state.audit_hash
            rows: list[tuple[Any, ...]] = []
            named = state.turn_seq, state.turn
            checked: tuple[str | bytes, ...] = ()  # the rows its first event is deflated on
            if events:
                cached = self._tails.get(sid, state.head)
                rows, named, tail, checked = event_rows(events, named, cached)
                tails[:] = [tail]
            audit = chain_session(n, digest, events) if events else []
            if audit:
                n, digest = audit[-1][0], audit[-1][2]
            sql = commit_sql(
                s,
                len(rows),
                len(audit),
                len(new_rows),
                len(resolve_rows),
                len(updated_rows),
                commit.snapshot is not None,
                token is not None,
                commit.release_lease and token is not None,
                sync is not None,
                token is not None and owner is not None,
                len(checked),
                shown is not None,
                grant is not None,
            )
            # In the order of their placeholders in `commit_sql`.
            params: list[Any] = [sid]
            if shown is not None:
                params += [shown.at, stored_type(shown.type), shown.type]
            params += [commit.expected_seq, state.audit_n, state.audit_hash]
            if events:
                params += [state.turn_seq, state.turn]
            if token is not None:
                params.append(token)
                if owner is not None:
                    params.append(owner)
            params += checked
            if grant is not None:
                params += [grant[0], grant[2] + grant[1], grant[1], grant[2]]
            if resolve_rows:
                params += rows_params(resolve_rows)
            if new_rows:
                params += rows_params(new_rows)
            if updated_rows:
                params += rows_params(updated_rows)
            if events:
                last = events[-1]
                params += rows_params(rows)
                if audit:
                    params += rows_params(audit)
                at = last.at if commit.activity else None  # None: the row keeps its updated_at
                params += [last.seq, at, commit.status, commit.expires_at]
                params += [commit.expires_at, n, digest]  # a child's copy of the deadline first
                params += [self.channel, f"{sid} {last.seq}"]
            if commit.snapshot is not None:
                params += [commit.snapshot["seq"], pack_bytes(commit.snapshot)]
            if commit.release_lease and token is not None:
                params.append(token)
            if sync is not None:
                params.append(sync)
            written.clear()
            written.append(Seen(events[-1].seq if events else state.head, n, digest, *named))
            sent = True
            return await conn.execute(sql, params)

        async def committed() -> bool:
            nonlocal ambiguous
            ambiguous = True
            if not events:
                raise StoreError("cannot tell")
            return await self._has_events(sid, events)

        written: list[Seen] = []  # the state after it, if it applies
        tails: list[Tail | None] = []  # what its last event gives the next, if it applies
        self._before(label)
        for _ in range(2):
            cur = await self._write(
                body,
                f"commit to session {sid!r}",
                committed=committed,
                began=lambda: sent,
            )
            if cur is None:  # found committed after a lost connection: state unknown here
                written.clear()
                self._state.pop(sid, None)
                if grant is not None:  # granted or not: its owner is granted it again, or not
                    with contextlib.suppress(StoreError):
                        commit.granted = await self.acquire_lease(sid, *grant)
                break
            # The statement's answer, the state it found: it came back with its commit, so
            # reading it needs the connection no more.
            row = await cur.fetchone()
            if row is None:
                self._state.pop(sid, None)
                raise UnknownSession(sid)
            if row[4]:
                if grant is not None:
                    got = row[-2] if shown is not None else row[-1]
                    commit.granted = None if got is None else int(got)
                    if got is not None and events:
                        # The head its drive begins at (`granted_head`), as this statement
                        # wrote it: the drive reads none, as with `acquire_lease`'s.
                        last = events[-1]
                        self._granted[sid] = (int(got), last.seq, (last.type, last.at, None))
                break
            head, n, digest = int(row[0]), int(row[2]), None if row[3] is None else bytes(row[3])
            self._remember(
                sid, Seen(head, n, digest, None if row[5] is None else int(row[5]), row[6])
            )
            if head != commit.expected_seq:
                if ambiguous and await self._has_events(sid, events):
                    written.clear()  # our first attempt did commit after all
                    break
                raise AppendConflict(f"session {sid!r} is at seq {head}, not {commit.expected_seq}")
            if token is not None and (
                row[1] is None or int(row[1]) != token or owner not in (None, row[7])
            ):
                raise LeaseLost(f"lease {token} on session {sid!r} was taken over")
            if shown is not None and not row[-1]:
                raise AppendConflict(rewritten(sid, head))
            guess = None  # a stale guess of the chain head or the turn: read it again
            # Or the head event is not the one this store wrote at that seq (a crash lost it and
            # another process wrote the seq again): its text is no dictionary for the next.
            self._tails.forget(sid)
        else:
            raise StoreError(f"commit to session {sid!r}: its state kept changing")
        if written:
            self._remember(sid, written[-1])
            if events:
                self._tails.put(sid, events[-1].seq, tails[-1])
        self._after(label)

    async def record_audit(self, rows: Sequence[AuditRow]) -> None:
        """Append entries that no event carries (tool setting changes), and keep each stream's
        chain head in its head row (`n = 0`), so entries removed from its end are noticed.

        The statement chains them from the heads it reads once it holds each stream's lock (so
        a statement of its own, with a snapshot taken after the lock's). The lock's statement
        and this one go out in one message, a transaction of its own (the simple protocol, the
        values bound here): a process frozen once it is sent holds no lock while the server
        commits it, as it would between two flushes of a pipeline."""
        if not rows:
            return
        columns: list[list[Any]] = [[] for _ in range(7)]
        for row in rows:
            before, behind = chain_parts(
                stream=row.stream, type=row.type, at=row.at, seq=None, data=row.data
            )
            values = (row.stream, row.after, row.type, row.at, dumps(row.data), before, behind)
            for column, value in zip(columns, values, strict=True):
                column.append(value)
        streams = sorted(set(columns[0]))
        sync = self._sync_setting(True)
        # Sent again after a lost connection, it skips what the first statement may have
        # written since the check found nothing (the server went on with it).
        sql, again = (f"{AUDIT_LOCK}; {a.format(s=self._s)}" for a in (AUDIT_APPEND, AUDIT_RESEND))
        params: list[Any] = [streams, *columns]
        if sync is not None:
            sql, again = (
                f"SELECT set_config('synchronous_commit', %s, true); {q}" for q in (sql, again)
            )
            params.insert(0, sync)
        sent = False
        resend = False

        async def body(conn: Conn) -> None:
            nonlocal sent
            sent = True
            await psycopg.AsyncClientCursor(conn).execute(again if resend else sql, params)

        async def committed() -> bool:
            nonlocal resend
            resend = True
            # Written whole or not at all: any of its entries found means it committed (and
            # one that wrote none, every `after` stale, writes none if sent again).
            return await self._has_audit(columns)

        self._before(AUDIT_RECORDED)
        await self._write(
            body,
            "recording audit entries",
            committed=committed,
            began=lambda: sent,
        )
        self._after(AUDIT_RECORDED)

    async def _has_audit(self, columns: list[list[Any]]) -> bool:
        """Whether any of these entries (`record_audit`'s columns) is stored in its stream."""
        stream, _, type_, at, data, *_ = columns

        async def body(conn: Conn) -> bool:
            cur = await conn.execute(
                f"SELECT EXISTS (SELECT 1 FROM {self._s}.audit a JOIN unnest(%s::text[], "
                "%s::text[], %s::float8[], %s::text[]) v (stream, type, at, data) "
                "ON a.stream = v.stream AND a.n > 0 AND a.type = v.type AND a.at = v.at "
                "AND a.data::text = v.data)",
                (stream, type_, at, data),
            )
            row = await cur.fetchone()
            return row is not None and bool(row[0])

        return await self._read(body, "checking audit entries")

    async def _created(self, session_id: str, events: Sequence[Event], owner: str | None) -> bool:
        """Whether the session stands as a creation of it with these events (and a lease for
        `owner`, if given) left it: its head their last, those events, the lease as granted."""
        s = self._s

        async def body(conn: Conn) -> bool:
            cur = await conn.execute(
                f"SELECT x.sk, x.head, l.owner, l.token FROM {s}.sessions x "
                f"LEFT JOIN {s}.leases l ON l.sk = x.sk WHERE x.id = %s",
                (session_id,),
            )
            row = await cur.fetchone()
            if row is None or int(row[1]) != events[-1].seq:
                return False
            if owner is not None and (row[2] != owner or row[3] != 1):
                return False
            return await self._events_match(conn, int(row[0]), events)

        return await self._read(body, f"checking session {session_id!r}")

    async def _was_deleted(self, session_id: str) -> bool:
        """Whether `delete_session` erased this id (its row in `deleted_sessions`)."""

        async def body(conn: Conn) -> bool:
            cur = await conn.execute(
                f"SELECT 1 FROM {self._s}.deleted_sessions WHERE id = %s", (session_id,)
            )
            return await cur.fetchone() is not None

        return await self._read(body, f"checking session {session_id!r}")

    async def _has_events(self, session_id: str, events: Sequence[Event]) -> bool:
        """Whether exactly these events are stored (after a COMMIT whose outcome is unknown)."""

        async def body(conn: Conn) -> bool:
            sk = await self._session_key(conn, session_id)
            return sk is not None and await self._events_match(conn, sk, events)

        return await self._read(body, f"checking session {session_id!r}")

    async def _events_match(self, conn: Conn, sk: int, events: Sequence[Event]) -> bool:
        if not events:
            return False
        s = self._s
        cur = await conn.execute(
            f"SELECT e.seq, e.type, {TURN.format(s=s)}, e.at, e.v, e.data, {EARLIER_COLUMNS} "
            f"FROM {s}.events e{EARLIER_JOIN.format(s=s)} "
            "WHERE e.sk=%s AND e.seq BETWEEN %s AND %s ORDER BY e.seq",
            (sk, events[0].seq, events[-1].seq),
        )
        rows = await cur.fetchall()
        if len(rows) != len(events):
            return False
        earlier = {int(row[0]): row[6:] for row in rows}
        texts = EventTexts(lambda seq: earlier[seq])
        return all(
            (int(seq), type_name(type_), turn or None, float(at), int(v), texts.value(seq, data))
            == (e.seq, e.type, e.turn_id, e.at, e.v, e.data)
            for (seq, type_, turn, at, v, data, *_), e in zip(rows, events, strict=True)
        )

    # -- change notifications -----------------------------------------------------------------

    @property
    def changes_seen(self) -> int:
        """How many changes this store has heard announced on this event loop (a mark for
        `wait_for_change` on the same loop); 0 outside one."""
        try:
            return self._changes.seen
        except RuntimeError:  # no running event loop
            return 0

    def change_mark(self) -> int:
        """`changes_seen` now, for a later `wait_for_change(since=...)` (the worker's)."""
        return self.changes_seen

    async def wait_for_change(
        self,
        session_id: str | None,
        timeout: float,
        *,
        after: int | None = None,
        since: int | None = None,
    ) -> bool:
        """Wait until a commit to `session_id` (any session if None) is announced, or a lease
        on a session with work left is released.

        Returns True on a change (or a possibly missed one: the listener reconnected), False on
        timeout. Given `after`, it returns at once if the session's head is already past it (or
        behind it: a crash lost events the caller read, which its next read finds); one
        read of the heads of every session waited on this way, every `poll_interval`, re-checks
        them all, so a lost notification only delays a wake-up (by `poll_interval` at most, plus
        that read) and a thousand followers cost that one read, not a thousand.
        Given `since` (`changes_seen` read before the caller last looked), it returns at once if
        a change was announced in between.
        """
        await self._get_pool()
        return await self._changes.wait(
            session_id,
            timeout,
            after=after,
            head=self.head,
            heads=self._session_heads,
            subscribe_within=min(timeout, self.timeout),
            poll_interval=self.poll_interval,
            since=since,
        )
