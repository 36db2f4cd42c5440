"""The PostgreSQL store's session deletion: a session and its subagents' sessions, every row
of them, and the audit entry recording it, in one transaction sent as one message."""

from __future__ import annotations

import math
from typing import Any

import psycopg

from ..._events import dumps
from ..._exceptions import StoreError
from .._audit import AuditRow, chain_parts
from .._deletions import (
    DELETIONS_STREAM,
    FINISHED,
    LIVE,
    RESOLVED_STORED,
    SESSION_DELETED,
    Doomed,
    StaleKey,
    deletion_row,
    erased_requests,
    refuse,
)
from ._connections import Conn, Connections, storable
from ._sql import (
    AUDIT_APPEND,
    AUDIT_LOCK,
    EARLIER_COLUMNS,
    EARLIER_JOIN,
    REQUEST_COLUMNS,
    REQUEST_JOIN,
)

__all__ = ["Deletions"]

_TREE = (
    "t(sk) AS (SELECT x.sk FROM {s}.sessions x WHERE x.id = %s "
    "UNION SELECT c.sk FROM {s}.sessions c JOIN t ON c.parent = t.sk WHERE c.parent > 0)"
)
"""The session named and its subagents' sessions, recursively, by row key (through
`sessions_by_parent`, whose condition `parent > 0` says)."""

_READ = (
    "WITH RECURSIVE " + _TREE + " SELECT x.sk, x.id, x.agent, x.head, x.audit_n, x.audit_hash, "
    "p.id, (SELECT l.sk IS NOT NULL FROM {s}.leases l WHERE l.sk = x.sk AND l.owner <> '' "
    "AND l.expires_at > %s), (SELECT array_agg(r.id ORDER BY r.id) FROM {s}.requests r "
    "WHERE r.sk = x.sk AND r.status = 'pending'), "
    "x.status IN ('running', 'waiting') AND (x.expires_at IS NULL OR x.expires_at > %s), "
    "x.updated_at "
    "FROM t JOIN {s}.sessions x ON x.sk = t.sk LEFT JOIN {s}.sessions p ON p.sk = x.parent "
    "ORDER BY x.sk"
)
"""Each session of the tree as its row keeps it, its parent's id, whether a drive holds its
lease, its open requests and whether its turn has work to do (its TTL not passed)."""

_REQUESTS = (
    f"SELECT s.id, {REQUEST_COLUMNS} FROM {{s}}.requests r {REQUEST_JOIN} WHERE r.sk = ANY(%s)"
)
"""The request rows of the sessions of the keys given (`erased_requests`)."""

_CLOSES = (
    f"SELECT a.id, e.data, {EARLIER_COLUMNS} FROM {{s}}.audit a JOIN {{s}}.events e "
    f"ON e.sk = a.sk AND e.seq = a.seq{EARLIER_JOIN} WHERE a.sk = ANY(%s) AND e.type = ANY(%s)"
)
"""The `input.resolved` entries of the sessions of the keys given, with their events."""

_GATE = (
    "ok AS (SELECT 1 WHERE (SELECT array_agg(x.sk || ':' || x.audit_n || ':' || x.head "
    "ORDER BY x.sk) FROM {s}.sessions x JOIN t ON t.sk = x.sk) = %s::text[] "
    "AND NOT EXISTS (SELECT 1 FROM {s}.sessions x JOIN {s}.sessions p ON p.sk = x.parent "
    "WHERE x.id = %s) "
    "AND NOT EXISTS (SELECT 1 FROM {s}.leases l JOIN t ON t.sk = l.sk "
    "WHERE l.owner <> '' AND l.expires_at > %s) "
    # The first %s: forced, unfinished too.
    "AND (%s OR NOT EXISTS (SELECT 1 FROM {s}.sessions x JOIN t ON t.sk = x.sk "
    "WHERE x.status IN ('running', 'waiting') AND (x.expires_at IS NULL OR x.expires_at > %s)) "
    "AND NOT EXISTS (SELECT 1 FROM {s}.requests r JOIN t ON t.sk = r.sk "
    "WHERE r.status = 'pending')) "
    "AND NOT EXISTS (SELECT 1 FROM {s}.sessions x JOIN t ON t.sk = x.sk "
    "WHERE x.updated_at >= %s)), "
    "d AS (SELECT sk FROM t WHERE EXISTS (SELECT 1 FROM ok)), "
    + "".join(
        f"d{table} AS (DELETE FROM {{s}}.{table} y USING d WHERE y.sk = d.sk), "
        for table in ("events", "snapshots", "requests", "leases", "audit", "sessions")
    )
    # Each id kept: its idempotency key starts nothing again (`SessionDeleted`).
    + "dx AS (INSERT INTO {s}.deleted_sessions (id, at) SELECT x.id, %s::float8 "
    "FROM {s}.sessions x JOIN d ON d.sk = x.sk ON CONFLICT (id) DO NOTHING), "
)
"""Deletes the tree's rows only if it is still the tree read (the same sessions, chains and
logs), none of it a subagent's under a parent, leased, running or waiting on people (unless
forced), and each session of it last active before the time given (`prune`'s; +infinity
for `delete_session`)."""

_NESTED = "SET LOCAL enable_hashjoin = off; SET LOCAL enable_mergejoin = off; "
"""Sent before the statements that join the tree: the planner guesses a recursive query's rows
in the hundreds, and so read whole tables (sessions, events) to hash or merge them with a tree
of a session or a few, at a cost that grew with the store. Nested loops over the indexes
instead, for this transaction only."""

_STALE = (
    "SELECT o.id, o.updated_at, o.sk, NOT EXISTS (WITH RECURSIVE t(sk) AS (SELECT c.sk "
    "FROM {s}.sessions c WHERE c.parent = o.sk AND c.parent > 0 UNION SELECT c.sk "
    "FROM {s}.sessions c JOIN t ON c.parent = t.sk WHERE c.parent > 0) SELECT 1 FROM t "
    "JOIN {s}.sessions x ON x.sk = t.sk WHERE x.updated_at >= %(before)s) "
    "FROM (SELECT id, updated_at, sk FROM {s}.sessions WHERE parent IS NULL "
    "AND updated_at < %(before)s "
    "AND (status = ANY(%(finished)s) OR (status = ANY(%(live)s) AND expires_at <= %(now)s)) "
    "AND (%(agent)s::text IS NULL OR agent = %(agent)s) "
    "AND (%(at)s::float8 IS NULL OR (updated_at, sk) > (%(at)s::float8, %(sk)s::bigint)) "
    "ORDER BY updated_at, sk LIMIT %(limit)s) o ORDER BY o.updated_at, o.sk"
)
"""The oldest top-level sessions `prune` may delete, past a place, each with whether no
subagent's session under it (recursively) was active at the cutoff or since: looked up for the
`limit` rows only, after the sort (see `stale_sessions`)."""

_LISTING = _NESTED + "SET LOCAL jit = off; "
"""Sent before `_STALE`: its lookup of each row's subagents' sessions is a few index probes,
which the planner guesses far dearer (a recursive query's rows in the hundreds, per row), and
compiled with JIT at a cost of 100 ms and more."""

_START = "WITH RECURSIVE v AS ("
_V_END = "behind, k)), "

_DELETE = AUDIT_APPEND.replace(_START, "WITH RECURSIVE " + _TREE + ", " + _GATE + "v AS (").replace(
    _V_END, "behind, k) WHERE EXISTS (SELECT 1 FROM ok)), "
)
"""The deletion and its audit entry (chained as `AUDIT_APPEND` chains), in one statement: the
entry is written only when the rows are deleted."""

if AUDIT_APPEND.count(_START) != 1 or AUDIT_APPEND.count(_V_END) != 1:  # pragma: no cover
    raise ImportError("AUDIT_APPEND changed its shape: _DELETE must be written anew")


class Deletions(Connections):
    """`PostgresStore.delete_session` and `stale_sessions`."""

    async def stale_sessions(
        self,
        *,
        before: float,
        now: float,
        limit: int,
        agent: str | None = None,
        after: StaleKey | None = None,
    ) -> list[tuple[str, StaleKey]]:
        """The top-level sessions `prune` deletes: finished (`FINISHED`), or live (`LIVE`) with
        their TTL passed at `now`, last active before `before`, their subagents' sessions too
        (of `agent`, if given), oldest first by their own last activity, at most `limit`, past
        the place `after` (a page before ended there); each with its place, where the next page
        starts.

        Plan: no index orders sessions by `updated_at` here, on purpose (migration 3 dropped it
        from `sessions_by_status`): every commit changes `updated_at`, and an index on it would
        make each one a non-HOT update writing every index of the row. So this reads the
        sessions (a sequential scan, or `sessions_by_status` for a filter that picks few) and
        keeps the oldest `limit` in a top-N heap sort: memory bounded by `limit`, time linear
        in the sessions (3 to 6 ms for 10,000, measured), outside any lock the deletions take.
        Only those `limit` have their subagents' sessions looked up (`sessions_by_parent`):
        were some active since, it reads on past them, a scan a time. Retention runs now and
        then; turns commit all the time. An agent named with a NUL names none (PostgreSQL text
        cannot hold it), as SQLite finds none."""
        if not storable(agent):
            return []
        sql = _LISTING + _STALE.format(s=self._s)
        params: dict[str, Any] = {
            "before": before,
            "finished": list(FINISHED),
            "live": list(LIVE),
            "now": now,
            "agent": agent,
            "limit": limit,
        }

        async def body(conn: Conn) -> list[tuple[str, StaleKey]]:
            found: list[tuple[str, StaleKey]] = []
            place = after
            while len(found) < limit:
                params["at"], params["sk"] = (None, None) if place is None else place
                cur = psycopg.AsyncClientCursor(conn)
                await cur.execute(sql, params)
                while cur.nextset():
                    pass
                rows = await cur.fetchall()
                found += [(str(r[0]), (float(r[1]), int(r[2]))) for r in rows if r[3]]
                if len(rows) < limit:
                    break  # the scan reached the end
                place = (float(rows[-1][1]), int(rows[-1][2]))
            return found[:limit]

        return await self._read(body, "listing the sessions to prune")

    async def delete_session(
        self,
        session_id: str,
        *,
        now: float,
        by: dict[str, Any] | None = None,
        reason: str | None = None,
        before: float | None = None,
        durable: bool = True,
        force: bool = False,
    ) -> list[str]:
        """Delete the session and its subagents' sessions with every row of theirs (events,
        snapshot, requests, lease, audit entries), and record it in `DELETIONS_STREAM`, in one
        transaction; refused, nothing changed, as `_deletions.refuse` says. Returns the ids;
        with `before`, none ([], nothing changed) if the session, or a subagent's session under
        it, was last active since then. Not `durable`: committed without waiting for the WAL's
        flush (a batch's deletions, made durable together by `flush`). `force`: unfinished too,
        under no lease held.

        The tree is read first, unlocked; the write locks its session and lease rows and the
        stream, then deletes only if what it finds is what was read (else it reads again), so
        the entry names the chain heads deleted. One that read the tree as another deletion
        erased it finds it gone when it reads again: `UnknownSession`, as on SQLite, not the
        ids of a deletion it did not make. One message, as every write here."""
        until = math.inf if before is None else before
        for _ in range(5):
            found = await self._doomed(session_id, now, until, force=force)
            if found is None:
                return []  # touched since `prune` listed it
            doomed, erased = found
            row = deletion_row(
                [d for _, d in doomed],
                at=now,
                by=by,
                reason=reason,
                force=force,
                requests=erased,
            )
            ids = [d.id for _, d in doomed]
            self._before(SESSION_DELETED)
            if await self._delete(session_id, doomed, row, now, until, durable, force):
                for sid in ids:
                    self._state.pop(sid, None)
                    self._granted.pop(sid, None)
                self._after(SESSION_DELETED)
                return ids
        raise StoreError(f"deleting session {session_id!r}: its sessions kept changing")

    async def check_deletion(self, session_id: str, *, now: float, force: bool = False) -> None:
        """Raise what `delete_session` would refuse the session with at `now` (`force`: as a
        forced one), as `_deletions.refuse` says, deleting nothing: a look before a person is
        asked whether to delete it. A change since is refused by the deletion itself."""
        await self._doomed(session_id, now, math.inf, force=force)

    async def _delete(
        self,
        session_id: str,
        doomed: list[tuple[int, Doomed]],
        row: AuditRow,
        now: float,
        until: float,
        durable: bool,
        force: bool = False,
    ) -> bool:
        """One attempt: whether the rows `doomed` (as read) were deleted by it, with the entry
        `row`; False when the write found the tree changed or gone (or a session of it last
        active at `until` or since) or refused, and wrote nothing. After a lost connection, the
        entry found in its stream says the deletion committed."""
        s = self._s
        keys = [sk for sk, _ in doomed]
        before, behind = chain_parts(
            stream=row.stream, type=row.type, at=row.at, seq=None, data=row.data
        )
        shape = [f"{sk}:{d.audit_n}:{d.head}" for sk, d in sorted(doomed, key=lambda d: d[0])]
        sync = self._sync_setting(durable)
        sql = (
            ("SELECT set_config('synchronous_commit', %s, true); " if sync else "")
            + _NESTED
            + f"{AUDIT_LOCK}; "
            + "SELECT 1 FROM {s}.sessions WHERE sk = ANY(%s) ORDER BY sk FOR UPDATE; "
            + "SELECT 1 FROM {s}.leases WHERE sk = ANY(%s) ORDER BY sk FOR UPDATE; "
            + _DELETE
            # Followers of the sessions wake now, to find them gone.
            + "; SELECT pg_notify(%s, x || ' 0') FROM unnest(%s::text[]) x "
            + "WHERE NOT EXISTS (SELECT 1 FROM {s}.sessions WHERE id = %s)"
        ).format(s=s)
        params: list[Any] = [sync] if sync else []
        params += [[DELETIONS_STREAM], keys, keys, session_id, shape, session_id, now, force]
        params += [now, until, now]
        params += [[row.stream], [None], [row.type], [row.at], [dumps(row.data)]]
        params += [[before], [behind]]
        params += [self.channel, [d.id for _, d in doomed], session_id]
        sent = False
        lost = False

        async def body(conn: Conn) -> bool:
            nonlocal sent
            sent = True
            cur = psycopg.AsyncClientCursor(conn)
            await cur.execute(sql, params)
            deleted = False
            while True:
                # Whether this statement deleted the tree, not whether it is gone: a deletion
                # that read it as another one committed finds it gone, and deleted nothing.
                if (cur.statusmessage or "").startswith("INSERT"):  # `_DELETE`: its entry
                    deleted = cur.rowcount > 0
                if not cur.nextset():
                    return deleted

        async def committed() -> bool:
            nonlocal lost
            lost = True
            return await self._recorded(row)

        deleted = await self._write(
            body, f"deleting session {session_id!r}", committed=committed, began=lambda: sent
        )
        if deleted is False and lost:
            # Sent again after its connection was lost, it found the tree changed or gone: the
            # first one, which the server went on with after the check, may have deleted it.
            return await self._recorded(row)
        return deleted is None or deleted

    async def _doomed(
        self, session_id: str, now: float, before: float, *, force: bool = False
    ) -> tuple[list[tuple[int, Doomed]], dict[str, list[dict[str, Any]]]] | None:
        """The session and its subagents' sessions, by key, checked deletable at `now` as read
        (the write checks again, locked), with the requests of theirs channels may show
        (`erased_requests`: the write's check that the chains are still the ones read keeps
        them true); None if it, or a subagent's session under it, was last active at `before`
        or since. `force`: unfinished too, under no lease held."""
        if not storable(session_id):
            refuse(session_id, found=False, parent=None, leased=None, waiting=())
        s = self._s

        async def body(conn: Conn) -> tuple[list[tuple[Any, ...]], dict[str, Any]]:
            cur = psycopg.AsyncClientCursor(conn)
            await cur.execute(_NESTED + _READ.format(s=s), (session_id, now, now))
            while cur.nextset():
                pass
            tree = list(await cur.fetchall())
            keys = [int(r[0]) for r in tree]
            if not keys:
                return tree, {}
            requests = await conn.execute(_REQUESTS.format(s=s), (keys,))
            closes = await conn.execute(_CLOSES.format(s=s), (keys, list(RESOLVED_STORED)))
            erased = erased_requests(await requests.fetchall(), await closes.fetchall())
            return tree, erased

        rows, erased = await self._read(body, f"reading session {session_id!r} to delete it")
        top = next((r for r in rows if r[1] == session_id), None)
        waiting = [(rid, str(r[1])) for r in rows for rid in (r[8] or ())]
        refuse(
            session_id,
            found=top is not None,
            parent=None if top is None else top[6],
            leased=next((str(r[1]) for r in rows if r[7]), None),
            waiting=() if force else sorted(waiting),
            running=() if force else [str(r[1]) for r in rows if r[9]],
        )
        if not all(r[10] < before for r in rows):  # a subagent's session too: the tree's age
            return None
        doomed = [
            (
                int(r[0]),
                Doomed(
                    id=str(r[1]),
                    agent=str(r[2]),
                    head=int(r[3]),
                    audit_n=int(r[4]),
                    audit_hash=None if r[5] is None else bytes(r[5]),
                ),
            )
            for r in rows
        ]
        doomed.sort(key=lambda d: d[1].id != session_id)  # the one asked for first
        return doomed, erased

    async def flush(self) -> None:
        """Wait until every commit made so far is flushed to disk: deletions committed not
        `durable` are then durable too. A transaction given an id commits synchronously, and
        its flush takes the write-ahead log up to its commit record, past all of theirs."""

        async def body(conn: Conn) -> None:
            await conn.execute(
                "SELECT set_config('synchronous_commit', 'on', true), txid_current()"
            )

        await self._write(body, "flushing the deletions to disk", transaction=False)

    async def _recorded(self, row: AuditRow) -> bool:
        """Whether the deletion's entry `row` is in its stream: written only with the deletion,
        so found, a deletion whose connection was lost committed. Not the session's row gone,
        which another deletion may have erased. (An entry the same in every part, the same
        sessions, moment, `by` and `reason`, is the same deletion asked twice at once.)"""
        data = dumps(row.data)

        async def body(conn: Conn) -> bool:
            cur = await conn.execute(
                f"SELECT EXISTS (SELECT 1 FROM {self._s}.audit WHERE stream = %s AND n > 0 "
                "AND type = %s AND at = %s AND data::text = %s)",
                (row.stream, row.type, row.at, data),
            )
            found = await cur.fetchone()
            return found is not None and bool(found[0])

        return await self._read(body, "checking whether the deletion was recorded")
