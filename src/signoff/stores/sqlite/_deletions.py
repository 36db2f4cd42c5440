"""The SQLite store's session deletion: a session and its subagents' sessions, every row of
them, and the audit entry recording it, in one `BEGIN IMMEDIATE` transaction."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from ..._exceptions import StoreDamaged, StoreError
from .._codec import CHAIN_MAX
from .._deletions import (
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
from ._connection import Connection, kept
from ._own_streams import append_entry
from ._schema import EARLIER_JOIN, REQUEST_COLUMNS, REQUEST_JOIN
from ._transactions import failed, immediate, reading, serialised

__all__ = ["DELETED", "Deletions", "LAST_KEY"]

LAST_KEY = "last_sk"
"""The `meta` row keeping the highest row key a deleted session had: SQLite gives a new row
the highest key + 1, so deleting the newest session would let the next one take its key, which
another process may still hold for the deleted one (`_session_key`) and read as its own."""

DELETED = "deleted:"
"""The `meta` rows naming each deleted session (`deleted:<id>`, the time): a call repeating
the idempotency key its id derives from is refused (`SessionDeleted`), not given a new session
of the erased id, which the deletion's entry names and another process may hold the key of."""

_TREE = (
    "WITH RECURSIVE t(sk) AS (SELECT ? UNION SELECT c.sk FROM sessions c JOIN t ON c.parent = "
    "t.sk WHERE c.parent > 0) SELECT s.sk, s.id, s.agent, s.head, s.audit_n, s.audit_hash "
    "FROM sessions s JOIN t ON t.sk = s.sk ORDER BY s.sk"
)
"""The session whose key is `?` and its subagents' sessions, recursively, oldest first (through
`sessions_by_parent`, whose condition `parent > 0` says)."""


_QUIET = (
    " AND NOT EXISTS (SELECT 1 FROM sessions c WHERE c.parent = o.sk AND c.parent > 0"
    " AND (NOT c.updated_at < :before OR EXISTS (WITH RECURSIVE t(sk) AS (SELECT g.sk"
    " FROM sessions g WHERE g.parent = c.sk AND g.parent > 0 UNION SELECT g.sk FROM sessions g"
    " JOIN t ON g.parent = t.sk WHERE g.parent > 0) SELECT 1 FROM t JOIN sessions x"
    " ON x.sk = t.sk WHERE NOT x.updated_at < :before)))"
)
"""No subagent's session under the session `o` (recursively, through `sessions_by_parent`) was
active at `:before` or since: a session's tree is as old as its newest activity. Its children
are read plainly, and only theirs recursively: a recursive query per row cost 4 times the
listing (20 us a row, measured), this one a fifth more."""


def _oldest(statuses: str, *, agent: bool, ttl: bool, after: bool) -> str:
    """The oldest top-level sessions of `statuses` (of the agent `:agent`, if `agent`; their TTL
    passed at `:now`, if `ttl`; past the place `(:at, :sk)`, if `after`) last active before
    `:before`, their subagents' sessions too, at most `:limit` of them."""
    return (
        "SELECT * FROM (SELECT id, updated_at, sk FROM sessions o "
        f"WHERE status IN ({statuses}) AND updated_at < :before AND parent IS NULL"
        + (" AND agent = :agent" if agent else "")
        + (" AND typeof(expires_at) IN ('integer', 'real') AND expires_at <= :now" if ttl else "")
        # The range starts at `:at` in the index; the rows of that time up to `:sk` are skipped.
        + (" AND updated_at >= :at AND (updated_at > :at OR sk > :sk)" if after else "")
        + _QUIET
        + " ORDER BY updated_at, sk LIMIT :limit)"
    )


_TABLES = ("events", "snapshots", "requests", "leases", "audit")
"""The tables holding rows of a session by its key, besides `sessions`."""

_REQUESTS = f"SELECT s.id, {REQUEST_COLUMNS} FROM requests r {REQUEST_JOIN} WHERE r.sk IN ({{}})"
"""The request rows of the sessions whose keys fill `{}` (`erased_requests`)."""

_CLOSES = (
    "SELECT a.id, e.data, "
    + ", ".join(f"p{i}.data" for i in range(1, CHAIN_MAX + 1))
    + " FROM audit a JOIN events e ON e.sk = a.sk AND e.seq = a.seq"
    + EARLIER_JOIN
    + " WHERE a.sk IN ({}) AND e.type IN (?, ?)"
)
"""The `input.resolved` entries of the sessions whose keys fill `{}`, with their events."""


def _doomed_row(
    sid: str, agent: str, head: object, n: object, digest: object, *, force: bool
) -> Doomed:
    """A session of the tree as its row keeps it. A chain head or last event a hand edit left
    unreadable is `StoreDamaged`, unless `force`: then it is None, named in `damaged` (the
    deletion's entry says what the row held, and a damaged row is no longer every prune's to
    fail on)."""
    read: dict[str, Any] = {}
    damaged: list[tuple[str, str]] = []
    for name, column, value, kind in (
        ("events", "head", head, int),
        ("audit_n", "audit_n", n, int),
        ("audit_hash", "audit_hash", digest, bytes),
    ):
        try:
            read[name] = kept(value, kind, sid, column)
        except StoreDamaged:
            if not force:
                raise
            read[name] = None
            damaged.append((name, f"{value!r:.40}"))
    return Doomed(
        id=sid,
        agent=agent,
        head=read["events"],
        audit_n=read["audit_n"],
        audit_hash=read["audit_hash"],
        damaged=tuple(damaged),
    )


class Deletions(Connection):
    """`SQLiteStore.delete_session`."""

    @reading
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

        Plan: one branch per status, each an ordered range of the index `sessions_by_status
        (status, updated_at)` (its rows end with their key) that stops after `limit` rows
        (subagents' rows it meets are skipped; each row's subagents' sessions are looked up in
        `sessions_by_parent`, none for most), merged by a sort of at most 4 x `limit` rows: a
        page costs its size, not the store's. The live branch (running, waiting; their TTL in
        no index) reads the live sessions older than `before`, few. No new index: the ones
        there are in order."""
        sql = (
            "SELECT id, updated_at, sk FROM ("
            + " UNION ALL ".join(
                _oldest(st, agent=agent is not None, ttl=ttl, after=after is not None)
                for st, ttl in [
                    *((f"'{st}'", False) for st in FINISHED),
                    (", ".join(f"'{st}'" for st in LIVE), True),
                ]
            )
            + ") ORDER BY updated_at, sk LIMIT :limit"
        )
        at, sk = (None, None) if after is None else after
        params = {"before": before, "now": now, "limit": limit, "agent": agent, "at": at, "sk": sk}
        return [
            (str(sid), (float(updated), int(key)))
            for sid, updated, key in self.conn.execute(sql, params)
        ]

    @serialised
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
        it, was last active since then. `durable`: synced to disk before it returns
        (`synchronous=FULL`), as an answer is; a batch's deletions are synced together by
        `flush`. `force`: unfinished too; refused only for a lease its row plainly shows held
        (one a hand edit left odd is not)."""
        conn = self.conn
        self._before(SESSION_DELETED)
        if durable:
            conn.execute("PRAGMA synchronous=FULL")
        try:
            with immediate(conn, self._writable, self.path):
                doomed = self._doomed(conn, session_id, now, force=force)
                keys = [sk for sk, _ in doomed]
                if before is not None and not self._untouched(conn, keys, before):
                    return []
                marks = ",".join("?" * len(keys))
                # Read before they go: the requests channels may show, for the hubs (see
                # `erased_requests`).
                erased = erased_requests(
                    conn.execute(_REQUESTS.format(marks), keys).fetchall(),
                    conn.execute(_CLOSES.format(marks), [*keys, *RESOLVED_STORED]).fetchall(),
                )
                # SQLite numbers a row one past the highest kept: the entry goes past every id
                # given so far, so no id a hub has read past is given again (it would never
                # read this entry, nor the next ones, which took the erased entries' ids).
                top = conn.execute("SELECT max(id) FROM audit").fetchone()[0]
                for table in _TABLES:
                    conn.execute(f"DELETE FROM {table} WHERE sk IN ({marks})", keys)
                conn.execute(f"DELETE FROM sessions WHERE sk IN ({marks})", keys)
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                    "SET value = MAX(CAST(value AS INTEGER), excluded.value)",
                    (LAST_KEY, max(keys)),
                )
                conn.executemany(  # its idempotency key starts nothing again (`SessionDeleted`)
                    "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                    [(DELETED + d.id, repr(now)) for _, d in doomed],
                )
                row = deletion_row(
                    [d for _, d in doomed],
                    at=now,
                    by=by,
                    reason=reason,
                    force=force,
                    requests=erased,
                )
                append_entry(conn, {}, row, entry_id=max(0, int(top or 0)) + 1)
        except sqlite3.IntegrityError as exc:
            raise StoreError(failed("delete from", self.path, exc)) from exc
        finally:
            if durable:
                conn.execute("PRAGMA synchronous=NORMAL")
        ids = [d.id for _, d in doomed]
        for sid in ids:
            self._sk.pop(sid, None)
            self._leased.pop(sid, None)
        self._after(SESSION_DELETED)
        return ids

    @reading
    async def check_deletion(self, session_id: str, *, now: float, force: bool = False) -> None:
        """Raise what `delete_session` would refuse the session with at `now` (`force`: as a
        forced one), as `_deletions.refuse` says, deleting nothing: a look before a person is
        asked whether to delete it. A change since is refused by the deletion itself."""
        self._doomed(self.conn, session_id, now, force=force)

    @serialised
    async def flush(self) -> None:
        """Sync the write-ahead log to disk, as a `synchronous=FULL` commit does: deletions
        committed not `durable` are then durable too (a checkpoint synced what it moved)."""
        if self.path == ":memory:":
            return
        wal = self._wal_file()
        try:
            fd = os.open(wal, os.O_RDONLY)
        except FileNotFoundError:
            return  # none: everything is in the database file, synced by its checkpoint
        try:
            os.fsync(fd)
        except OSError as exc:
            raise StoreError(f"syncing {wal} to disk failed: {exc}") from exc
        finally:
            os.close(fd)

    @staticmethod
    def _untouched(conn: sqlite3.Connection, keys: list[int], before: float) -> bool:
        """Whether the last activity of the sessions of `keys` (a session and its subagents')
        is before `before`, each one's (`prune` listed the tree so): a subagent's session a
        person talked to since keeps its parent's."""
        row = conn.execute(
            f"SELECT 1 FROM sessions WHERE sk IN ({','.join('?' * len(keys))}) "
            "AND NOT updated_at < ? LIMIT 1",
            (*keys, before),
        ).fetchone()
        return row is None

    def _doomed(
        self, conn: sqlite3.Connection, session_id: str, now: float, *, force: bool = False
    ) -> list[tuple[int, Doomed]]:
        """The session and its subagents' sessions, by key, checked deletable at `now` (`force`:
        unfinished too, under no lease plainly held, and with a row a hand edit damaged)."""
        top = conn.execute(
            "SELECT s.sk, p.id FROM sessions s LEFT JOIN sessions p ON p.sk = s.parent "
            "WHERE s.id=?",
            (session_id,),
        ).fetchone()
        if top is None:
            refuse(session_id, found=False, parent=None, leased=None, waiting=())
        doomed = [
            (int(sk), _doomed_row(str(sid), str(agent), head, n, digest, force=force))
            for sk, sid, agent, head, n, digest in conn.execute(_TREE, (int(top[0]),))
        ]
        doomed.sort(key=lambda d: d[1].id != session_id)  # the one asked for first
        keys = [sk for sk, _ in doomed]
        marks = ",".join("?" * len(keys))
        # An expiry that is not a number (a hand edit) reads as held, unless forced: SQLite
        # orders text after every number, so it would otherwise read as held for ever.
        held = (
            "typeof(l.expires_at) IN ('integer', 'real') AND l.expires_at > ?"
            if force
            else "NOT (typeof(l.expires_at) IN ('integer', 'real') AND l.expires_at <= ?)"
        )
        leased = conn.execute(
            f"SELECT s.id FROM leases l JOIN sessions s ON s.sk = l.sk WHERE l.sk IN ({marks}) "
            f"AND l.owner <> '' AND {held} ORDER BY l.sk LIMIT 1",
            (*keys, now),
        ).fetchone()
        if force:
            refuse(
                session_id,
                found=True,
                parent=None if top[1] is None else str(top[1]),
                leased=None if leased is None else str(leased[0]),
                waiting=(),
            )
            return doomed
        waiting = conn.execute(
            f"SELECT r.id, s.id FROM requests r JOIN sessions s ON s.sk = r.sk "
            f"WHERE r.sk IN ({marks}) AND r.status = 'pending' ORDER BY r.id",
            keys,
        ).fetchall()
        running = conn.execute(
            f"SELECT id FROM sessions WHERE sk IN ({marks}) AND status IN ('running', 'waiting') "
            "AND NOT (typeof(expires_at) IN ('integer', 'real') AND expires_at <= ?) "
            "ORDER BY sk",
            (*keys, now),
        ).fetchall()
        refuse(
            session_id,
            found=True,
            parent=None if top[1] is None else str(top[1]),
            leased=None if leased is None else str(leased[0]),
            waiting=[(str(r[0]), str(r[1])) for r in waiting],
            running=[str(r[0]) for r in running],
        )
        return doomed
