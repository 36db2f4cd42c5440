"""The embedded default store: one SQLite file in WAL mode, safe for several processes at once.

Every write is one `BEGIN IMMEDIATE` transaction, so writers queue on SQLite's lock rather than
fail half-way; the per-session head check and the request compare-and-set live in that same
transaction. Commits that acknowledge an answer run with `synchronous=FULL`.

This module holds the writes and `wait_for_change`; the connection and its transactions
(`_connection`), the schema (`_schema`), the reads (`_reads`) and the leases (`_leases`) have their
own.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence

from ..._events import Event
from ..._exceptions import (
    AppendConflict,
    EventsRewritten,
    LeaseLost,
    RequestClosed,
    SessionDeleted,
    StoreDamaged,
    StoreError,
    UnknownSession,
)
from .._audit import AUDIT_TYPES, AuditRow, chain_session
from .._base import AUDIT_RECORDED, Commit, parent_of
from .._codec import (
    CHAIN_MAX,
    Tail,
    event_text,
    needs_previous,
    pack,
    pack_event,
    stored_type,
    tail_of,
    type_name,
)
from .._initiators import initiator_columns
from .._request_rows import request_rows
from .._shown import check_shown, rewritten
from ._connection import kept
from ._deletions import DELETED, LAST_KEY, Deletions
from ._leases import Leases
from ._own_streams import append_entry
from ._reads import Reads
from ._schema import CURRENT_TURN
from ._transactions import failed, immediate, serialised

__all__ = ["SQLiteStore", "TURN_NAMED_EVERY"]

TURN_NAMED_EVERY = 64
"""An event row names its turn when the turn changes, and at least every 64 rows, so finding
an event's turn never scans back further than that."""


_NEXT_KEY = (
    "MAX(COALESCE((SELECT MAX(sk) FROM sessions), 0), COALESCE((SELECT CAST(value AS INTEGER) "
    f"FROM meta WHERE key = '{LAST_KEY}'), 0)) + 1"
)
"""A new session's row key: past the highest of any session stored or deleted."""


class Follows:
    """The waits for sessions on one event loop, by the session, head and `poll_interval` they
    wait on, and the task polling for them all while there are any."""

    def __init__(self) -> None:
        self.waits: dict[asyncio.Future[bool], tuple[str, int, float]] = {}
        self.task: asyncio.Task[None] | None = None
        # What `_changed` saw last: the connection and its counts.
        self.seen: tuple[object, int, int] | None = None


class SQLiteStore(Reads, Leases, Deletions):
    """`Store` on one SQLite file (`sqlite:///path`); `sqlite:///:memory:` for throwaway use.

    With `migrate=False`, opening refuses a file of an older schema (or none) instead of
    upgrading it, and writes nothing to it (run `signoff db upgrade`), as `PostgresStore` does.
    """

    def _unopened_copy(self, *, migrate: bool) -> SQLiteStore:
        """A new store, not yet opened, of this one's file and `busy_timeout` but `migrate`:
        what a command opens for a runtime's store (`signoff pending app:runtime`) waits on a
        lock as long as the runtime's own would, where one made from its URL took the default."""
        return SQLiteStore(self.url, busy_timeout=self.busy_timeout, migrate=migrate)

    # -- writes -------------------------------------------------------------------------------

    @serialised
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
        """Write a new session with its first events (and `status`, and `lease`) in one
        transaction; a `session_id` already stored is a `StoreError` and one deleted (or a
        subagent's whose parent was) `SessionDeleted`, each writing nothing."""
        conn = self.conn
        at = events[0].at
        # A subagent's: its row names the parent and the parent's turn that delegated to it.
        parent, turn = parent_of(events)
        initiator, tenant = initiator_columns(events)  # who may see it, for listings
        self._before("session.created")
        try:
            with immediate(conn, self._writable, self.path):
                deleted = "SELECT 1 FROM meta WHERE key=?"
                for sid in (session_id,) if parent is None else (session_id, parent):
                    if conn.execute(deleted, (DELETED + sid,)).fetchone() is not None:
                        raise SessionDeleted(sid)  # or under its parent, with no parent
                cur = conn.execute(
                    # The key past every session's, deleted ones' too (`LAST_KEY`).
                    "INSERT INTO sessions (sk, id, agent, head, status, created_at, updated_at, "
                    "expires_at, initiator, tenant, parent, parent_turn) SELECT "
                    f"{_NEXT_KEY}, ?,?,?,?,?,?,?,?,?, "
                    "p.sk, CASE WHEN p.sk IS NOT NULL THEN COALESCE(?, "
                    + CURRENT_TURN.format(sk="p.sk")
                    + ") END FROM (SELECT 1) LEFT JOIN sessions p ON p.id = ?",
                    [session_id, agent, events[-1].seq, status, at, at, expires_at]
                    + [initiator, tenant, turn, parent],
                )
                sk = int(cur.lastrowid or 0)
                tail, named = self._insert_events(conn, sk, events, None, None)
                version = self._version(conn)
                if lease is not None:
                    owner, ttl, now = lease
                    conn.execute(
                        "INSERT INTO leases (sk, owner, token, expires_at) VALUES (?,?,1,?)",
                        (sk, owner, now + ttl),
                    )
        except sqlite3.IntegrityError as exc:
            raise StoreError(f"session {session_id!r} already exists") from exc
        self._sk[session_id] = sk
        self._tails.put(sk, events[-1].seq, tail)
        self._named.put(sk, events[-1].seq, (*named, version))
        self._after("session.created")
        if lease is None:
            return None
        self._granted(session_id, 1, lease[2], lease[1])
        return 1

    @serialised
    async def commit(self, commit: Commit) -> None:
        """Apply `commit` in one transaction, or nothing of it (see `Store.commit`); synced to
        disk before it returns when `commit.durable`, which the engine sets on a commit a person
        may be told about: one that opens a request or parks a turn on a person, or an answer."""
        conn = self.conn
        label = commit.events[0].type if commit.events else "commit"
        self._before(label)
        if commit.durable:
            conn.execute("PRAGMA synchronous=FULL")
        sk, tail, named, version = -1, None, ("", 0), 0
        try:
            with immediate(conn, self._writable, self.path):
                # A released lease (no owner) keeps its token for the next grant, but fences it.
                # With the row of the head event, which `expected_event` must still be.
                row = conn.execute(
                    "SELECT s.sk, s.head, CASE WHEN l.owner <> '' THEN l.token END, s.audit_n, "
                    "s.audit_hash, l.owner, e.type, e.at, e.turn FROM sessions s "
                    "LEFT JOIN leases l ON l.sk = s.sk "
                    "LEFT JOIN events e ON e.sk = s.sk AND e.seq = s.head WHERE s.id=?",
                    (commit.session_id,),
                ).fetchone()
                if row is None:
                    raise UnknownSession(commit.session_id)
                sid = commit.session_id
                sk, head = int(row[0]), kept(row[1], int, sid, "head")
                if head != commit.expected_seq:
                    raise AppendConflict(
                        f"session {commit.session_id!r} is at seq {head}, not {commit.expected_seq}"
                    )
                if commit.expected_event is not None:
                    try:
                        check_shown(sid, commit.expected_event, None if row[6] is None else row[6:])
                    except EventsRewritten:
                        raise AppendConflict(rewritten(sid, head)) from None
                if commit.lease_token is not None and (
                    row[2] is None
                    or kept(row[2], int, sid, "lease token") != commit.lease_token
                    or commit.lease_owner not in (None, row[5])
                ):
                    raise LeaseLost(
                        f"lease {commit.lease_token} on session {commit.session_id!r} "
                        "was taken over"
                    )
                for r in commit.resolve:
                    cur = conn.execute(
                        "UPDATE requests SET status=?, outcome=?, resolution=? "
                        "WHERE id=? AND sk=? AND status='pending'",
                        (r.status, r.outcome, pack(r.resolution), r.request_id, sk),
                    )
                    if cur.rowcount != 1:
                        raise RequestClosed(
                            f"request {r.request_id} is no longer pending", [r.request_id]
                        )
                if commit.new_requests:
                    conn.executemany(
                        "INSERT INTO requests (id, sk, seq, idx, agent, kind, tool, status, "
                        "created_at, data, expires_at) VALUES (?,?,?,?,?,?,?,'pending',?,?,?)",
                        [
                            (
                                req.id,
                                sk,
                                *where,
                                req.agent,
                                req.kind,
                                req.tool_name,
                                req.created_at,
                                copy,
                                req.expires_at,
                            )
                            for req, where, copy in request_rows(commit, pack)
                        ],
                    )
                for req in commit.updated_requests:
                    conn.execute(
                        "UPDATE requests SET data=?, expires_at=? WHERE id=? AND sk=?",
                        (
                            pack(req.model_dump(mode="json", exclude_defaults=True)),
                            req.expires_at,
                            req.id,
                            sk,
                        ),
                    )
                if commit.events:
                    # A head below what this store wrote: the file lost that (a backup restored).
                    self._tails.forget(sk, past=head)
                    self._named.forget(sk, past=head)
                    cached = self._tails.knows(sk, head)
                    version = self._version(conn)
                    tail, named = self._insert_events(
                        conn,
                        sk,
                        commit.events,
                        self._named_at(sk, head, version) or self._turn_at(sk, head),
                        self._tails.get(sk, head) if cached else self._previous(conn, sk, head),
                        head if cached else None,
                    )
                    n = kept(row[3], int, sid, "audit_n")
                    digest = kept(row[4], bytes, sid, "audit_hash")
                    n, digest = self._insert_session_audit(conn, sk, n, digest, commit.events)
                    last = commit.events[-1]
                    conn.execute(
                        "UPDATE sessions SET head=?, updated_at=COALESCE(?, updated_at), "
                        "status=COALESCE(?, status), expires_at=?, audit_n=?, audit_hash=? "
                        "WHERE sk=?",
                        (
                            last.seq,
                            last.at if commit.activity else None,
                            commit.status,
                            commit.expires_at,
                            n,
                            digest,
                            sk,
                        ),
                    )
                if commit.snapshot is not None:
                    conn.execute(
                        "INSERT INTO snapshots (sk, seq, data) VALUES (?,?,?) "
                        "ON CONFLICT (sk) DO UPDATE SET seq=excluded.seq, data=excluded.data",
                        (sk, commit.snapshot["seq"], pack(commit.snapshot)),
                    )
                if commit.release_lease and commit.lease_token is not None:
                    conn.execute(
                        "UPDATE leases SET owner='', expires_at=0 WHERE sk=? AND token=?",
                        (sk, commit.lease_token),
                    )
                granted = None
                if commit.grant is not None and commit.lease_token is None:
                    granted = self._grant(conn, sk, *commit.grant)
        except sqlite3.IntegrityError as exc:
            raise AppendConflict(f"session {commit.session_id!r}: {exc}") from exc
        except sqlite3.Error as exc:
            raise StoreError(failed("commit to", self.path, exc)) from exc
        finally:
            if commit.durable:
                conn.execute("PRAGMA synchronous=NORMAL")
        if commit.events:
            self._tails.put(sk, commit.events[-1].seq, tail)
            self._named.put(sk, commit.events[-1].seq, (*named, version))
        self._after(label)
        if granted is not None and commit.grant is not None:
            commit.granted = granted
            self._granted(commit.session_id, granted, commit.grant[2], commit.grant[1])
        if commit.release_lease and commit.lease_token is not None:
            parked = any(e.type == "turn.waiting" for e in commit.events)
            self._given_back(commit.session_id, commit.lease_token, rest=parked or commit.waited)

    @staticmethod
    def _insert_session_audit(
        conn: sqlite3.Connection, sk: int, n: int, digest: bytes | None, events: Sequence[Event]
    ) -> tuple[int, bytes | None]:
        """Chain the audited events of a commit onto the session's stream, whose head the
        session row keeps; the entries hold no copy of the events, only their place and hash."""
        entries = chain_session(n, digest, events)
        if entries:
            conn.executemany(
                "INSERT INTO audit (sk, n, seq, hash) VALUES (?,?,?,?)",
                [(sk, *entry) for entry in entries],
            )
            n, _, digest = entries[-1]
        return n, digest

    @serialised
    async def record_audit(self, rows: Sequence[AuditRow]) -> None:
        """Append entries that no event carries (tool setting changes), and keep each stream's
        chain head in its head row (`n = 0`), so entries removed from its end are noticed."""
        conn = self.conn
        self._before(AUDIT_RECORDED)
        with immediate(conn, self._writable, self.path):
            last: dict[str, tuple[int, str | None]] = {}
            for row in rows:
                append_entry(conn, last, row)
        self._after(AUDIT_RECORDED)

    @staticmethod
    def _version(conn: sqlite3.Connection) -> int:
        """SQLite's count of the commits other connections made to the file, as this write
        transaction sees it (this connection's own leave it as it is): the same at two commits,
        no one else wrote between. A statement of its own, 0.9 us: a column of the session's
        read (`pragma_data_version()`) cost 1.2 us more."""
        (version,) = conn.execute("PRAGMA data_version").fetchone()
        return int(version)

    def _named_at(self, sk: int, head: int, version: int) -> tuple[str, int] | None:
        """The turn at the head as this store's last commit to the session left it, if that
        commit is still the head and no other connection committed to the file since (`version`
        as then): else None, and `_turn_at` reads it. Another process may have written that
        seq again after the file lost it (a backup restored in place), in another turn."""
        known = self._named.get(sk, head)
        if known is None or known[2] != version:
            return None
        return known[0], known[1]

    def _turn_at(self, sk: int, head: int) -> tuple[str, int] | None:
        """The turn of the session's event `head` and how many events back a row names it."""
        row = self.conn.execute(
            "SELECT seq, turn FROM events WHERE sk=? AND seq<=? AND turn IS NOT NULL "
            "ORDER BY seq DESC LIMIT 1",
            (sk, head),
        ).fetchone()
        return None if row is None else (str(row[1]), head - int(row[0]))

    @classmethod
    def _insert_events(
        cls,
        conn: sqlite3.Connection,
        sk: int,
        events: Sequence[Event],
        turn_before: tuple[str, int] | None,
        previous: Tail | None,
        head: int | None = None,
    ) -> tuple[Tail | None, tuple[str, int]]:
        """Insert a commit's events; returns what the next event may be stored on, and the
        turn of the last one with how many rows back a row names it (`_turn_at` of it). An
        audited event is never stored on, so altering one in the log is reported at its entry
        alone. Given `head`, `previous` is this store's copy of that event, checked if used."""
        # `turn` is NULL when the event belongs to the turn of the event before it: only a
        # turn's first event names it ('' for none), and one in every TURN_NAMED_EVERY again.
        rows = []
        turn, since = turn_before or (None, 0)
        on = None if previous is None else previous[0]
        for e in events:
            named = e.turn_id or ""
            same = named == turn and since + 1 < TURN_NAMED_EVERY
            since = since + 1 if same else 0
            data, on = pack_event(e.data, on)
            if e.type in AUDIT_TYPES:
                on = None
            rows.append((sk, e.seq, stored_type(e.type), None if same else named, e.at, e.v, data))
            turn = named
        if head is not None and previous is not None and needs_previous(rows[0][6]):
            found = conn.execute(
                "SELECT data FROM events WHERE sk=? AND seq BETWEEN ? AND ? ORDER BY seq DESC",
                (sk, head + 1 - len(previous[1]), head),
            )
            if tuple(data for (data,) in found) != previous[1]:
                # Not the rows this store wrote there (a backup restored under it, and the seq
                # written again): the first event stands alone.
                return cls._insert_events(conn, sk, events, turn_before, None)
        conn.executemany(
            "INSERT INTO events (sk, seq, type, turn, at, v, data) VALUES (?,?,?,?,?,?,?)", rows
        )
        return tail_of(on, [row[6] for row in rows], previous), (turn or "", since)

    def _previous(self, conn: sqlite3.Connection, sk: int, head: int) -> Tail | None:
        """The text of the session's event `head` and how many events reading it needs, with
        their rows' data, for the next event to be stored on; None if it cannot be read (that
        event then stands alone)."""
        rows: dict[int, str | bytes] = {}
        try:
            for seq, code, data in conn.execute(
                "SELECT seq, type, data FROM events WHERE sk=? AND seq BETWEEN ? AND ?",
                (sk, head - CHAIN_MAX, head),
            ):
                if seq == head and type_name(code) in AUDIT_TYPES:
                    return None
                rows[seq] = data
            if head not in rows:
                return None
            text = event_text(rows[head], [rows.get(head - i) for i in range(1, CHAIN_MAX + 1)])
        except StoreDamaged:
            return None
        needs = 0
        while needs < CHAIN_MAX and needs_previous(rows.get(head - needs)):
            needs += 1
        if needs >= CHAIN_MAX:
            return None  # no event may be stored on it
        return (text, needs), tuple(rows[head - i] for i in range(needs + 1))

    # -- change notifications (polling: SQLite has no NOTIFY) ---------------------------------

    async def wait_for_change(
        self,
        session_id: str | None,
        timeout: float,
        *,
        after: int | None = None,
        poll_interval: float = 0.05,
        since: tuple[int, ...] | None = None,
    ) -> bool:
        """Poll until a commit to `session_id` (any session if None) shows up; False on timeout.

        Given `after`, it returns at once if the session's head is already past it; given
        `since` (a `change_mark` read before the caller last looked), if any commit was made to
        the file since then, so none made while the caller was busy is missed. The waits
        for sessions share one poll per event loop, every `poll_interval`: it reads the heads of
        all their sessions in one query, and only when the file changed since its last look, so
        a thousand idle followers cost what one does. Each poll takes the store's lock; the
        waits between them do not.
        """

        def mark() -> tuple[int, ...]:
            with self._lock:
                try:
                    return self._mark(session_id)
                except sqlite3.Error as exc:
                    raise StoreError(failed("read", self.path, exc)) from exc

        if since is not None and self.change_mark() != since:
            return True
        start = mark()
        if after is not None and session_id is not None and start[1] > after:
            return True
        deadline = time.monotonic() + timeout
        if session_id is not None:
            return await self._follow(session_id, start[1], deadline, poll_interval, mark)
        while (remaining := deadline - time.monotonic()) > 0:
            await asyncio.sleep(min(poll_interval, remaining))
            if mark() != start:
                return True
        return False

    def change_mark(self) -> tuple[int, ...]:
        """A mark of the commits made to the file, for a later `wait_for_change(since=...)`."""
        with self._lock:
            try:
                return self._mark(None)
            except sqlite3.Error as exc:
                raise StoreError(failed("read", self.path, exc)) from exc

    async def _follow(
        self,
        session_id: str,
        head: int,
        deadline: float,
        every: float,
        mark: Callable[[], tuple[int, ...]],
    ) -> bool:
        """Wait, through the loop's shared poll, for `session_id`'s head to move past `head`;
        when the poll cannot vouch for the session (not found, a failed read), read its head
        here, which raises what it always did (`UnknownSession`, a `StoreError`)."""
        loop = asyncio.get_running_loop()
        while True:
            follows = self._follows.get(loop)
            if follows is None:
                follows = self._follows[loop] = Follows()
            fut: asyncio.Future[bool] = loop.create_future()
            follows.waits[fut] = (session_id, head, every)
            if follows.task is None or follows.task.done():
                follows.task = loop.create_task(self._polling(follows), name="signoff-follows")
            try:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                async with asyncio.timeout(remaining):
                    if await asyncio.shield(fut):
                        return True
            except TimeoutError:
                return False
            finally:
                follows.waits.pop(fut, None)
            if mark()[1] != head:
                return True

    async def _polling(self, follows: Follows) -> None:
        """The poll the waits for sessions on one event loop share: every `poll_interval` (the
        least of theirs), if the file changed since the last look (`_changed`), one query reads
        their sessions' heads and wakes the waits whose head moved; a session not found, or a
        failed read, has its waits read their own head."""
        try:
            while follows.waits:
                await asyncio.sleep(min(every for _, _, every in follows.waits.values()))
                waits = [(f, w) for f, w in follows.waits.items() if not f.done()]
                if not waits:
                    continue
                try:
                    with self._lock:
                        if not self._changed(follows):
                            continue
                        found = self._heads(sorted({sid for _, (sid, _, _) in waits}))
                except (sqlite3.Error, StoreError):
                    follows.seen = None
                    found = {}
                for fut, (sid, head, _) in waits:
                    seq = found.get(sid)
                    if not fut.done() and (seq is None or seq != head):
                        fut.set_result(seq is not None)
        finally:
            for fut in follows.waits:  # none may be left counting on a poll that stopped
                if not fut.done():
                    fut.set_result(False)
            loop = asyncio.get_running_loop()
            if self._follows.get(loop) is follows:  # no loop is kept once its waits are over
                del self._follows[loop]

    def _changed(self, follows: Follows) -> bool:
        """Whether the file may have changed since the poll last looked: SQLite's counts of the
        commits of other connections (`data_version`) and of this one's changes, on the same
        connection; a read-only store, whose connection is swapped as writers come and go,
        always reads the heads."""
        self._readable(every=0)  # a file deleted or replaced under us never changes again
        conn = self.conn
        if self._access != "rw":
            follows.seen = None
            return True
        (version,) = conn.execute("PRAGMA data_version").fetchone()
        seen = (conn, int(version), conn.total_changes)
        if follows.seen is not None and follows.seen == seen:
            return False
        follows.seen = seen
        return True

    def _heads(self, session_ids: Sequence[str]) -> dict[str, int]:
        """The heads of those of `session_ids` that are stored (and well-formed), a few hundred
        a query."""
        found: dict[str, int] = {}
        for i in range(0, len(session_ids), 500):
            ids = session_ids[i : i + 500]
            marks = ",".join("?" * len(ids))
            sql = f"SELECT id, head FROM sessions WHERE id IN ({marks})"
            for sid, head in self.conn.execute(sql, ids):
                if type(head) is int:
                    found[str(sid)] = head
        return found

    def _mark(self, session_id: str | None) -> tuple[int, ...]:
        """What `wait_for_change` compares: the session's head; for any session, what SQLite
        counts of the commits of other connections to the file (`data_version`) and of the rows
        this one changed, which cost the same however many sessions there are (a read-only
        store, whose connection is swapped as writers come and go, counts and sums the heads)."""
        self._readable(every=0)  # a file deleted or replaced under us never changes again
        if session_id is None:
            conn = self.conn
            if self._access == "rw":
                (version,) = conn.execute("PRAGMA data_version").fetchone()
                return id(conn), int(version), conn.total_changes
            row = conn.execute("SELECT COUNT(*), COALESCE(SUM(head), 0) FROM sessions")
            count, total = row.fetchone()
            return int(count), int(total)
        head = self.conn.execute("SELECT head FROM sessions WHERE id=?", (session_id,))
        found = head.fetchone()
        if found is None:
            raise UnknownSession(session_id)
        return 0, int(kept(found[0], int, session_id, "head"))
