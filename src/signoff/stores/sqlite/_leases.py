"""The SQLite store's leases: a worker claims sessions with work, or acquires, renews and
releases the lease on one, each in one `BEGIN IMMEDIATE` transaction; a lease given back after
a park folds the WAL into the database file when the store is quiet."""

from __future__ import annotations

import logging
import math
import os
import sqlite3
from collections.abc import Mapping, Sequence

from ..._exceptions import StoreDamaged, UnknownSession
from .._base import (
    CHANNEL_CLAIMED,
    CHANNEL_MEMOS,
    CHANNEL_RELEASED,
    LEASE_ACQUIRED,
    LEASE_CLAIMED,
    LEASE_RELEASED,
    LEASE_RENEWED,
    SessionSummary,
)
from .._codec import stored_type
from .._memos import checked_memo_names, checked_memos
from .._swept_rows import DamagedSession, swept_summary
from ._connection import Connection, kept
from ._transactions import immediate, reading, serialised

__all__ = ["Leases"]

log = logging.getLogger("signoff.store")

# SQLite's largest integer: a token there has no next one to grant.
_LAST_TOKEN = 2**63 - 1


def _lease_damage(token: object, expires: object) -> str | None:
    """What is wrong with a lease row's token and expiry (a hand edit, a half-restored backup),
    as claims read them; None for a lease they can take over with the next token."""
    if not isinstance(token, int):
        return f"token is {token!r:.40}"
    if token >= _LAST_TOKEN:
        return f"token is {token}, past which no token can be granted"
    if not isinstance(expires, int | float):
        return f"expiry is {expires!r:.40}"
    return None


class Leases(Connection):
    """`SQLiteStore`'s leases: who works on a session, and the token that proves it."""

    @serialised
    async def acquire_lease(
        self, session_id: str, owner: str, ttl: float, now: float
    ) -> int | None:
        conn = self.conn
        self._before(LEASE_ACQUIRED)
        with immediate(conn, self._writable, self.path):
            sk = self._session_key(session_id, fresh=True)
            if sk is None:
                raise UnknownSession(session_id)
            row = conn.execute("SELECT owner, token, expires_at FROM leases WHERE sk=?", (sk,))
            lease = row.fetchone()
            if lease is None:
                conn.execute(
                    "INSERT INTO leases (sk, owner, token, expires_at) VALUES (?,?,1,?)",
                    (sk, owner, now + ttl),
                )
                token = 1
            else:
                held_by = kept(lease[0], str, session_id, "lease owner")
                damage = _lease_damage(lease[1], lease[2])
                if damage is not None:
                    raise StoreDamaged(f"session {session_id!r} is damaged: its lease {damage}")
                token, expires_at = lease[1], lease[2]
                if held_by != "" and held_by != owner and expires_at > now:
                    return None
                token += 1
                conn.execute(
                    "UPDATE leases SET owner=?, token=?, expires_at=? WHERE sk=?",
                    (owner, token, now + ttl, sk),
                )
        self._after(LEASE_ACQUIRED)
        self._granted(session_id, token, now, ttl)
        return token

    @staticmethod
    def _grant(conn: sqlite3.Connection, sk: int, owner: str, ttl: float, now: float) -> int | None:
        """A commit's grant of the session's lease to `owner` (`Commit.grant`), in its
        transaction: as `acquire_lease` grants it, but nothing (None) for a lease another owner
        holds live, or one whose row is damaged (the commit is not refused for it)."""
        lease = conn.execute(
            "SELECT owner, token, expires_at FROM leases WHERE sk=?", (sk,)
        ).fetchone()
        if lease is None:
            conn.execute(
                "INSERT INTO leases (sk, owner, token, expires_at) VALUES (?,?,1,?)",
                (sk, owner, now + ttl),
            )
            return 1
        if not isinstance(lease[0], str) or _lease_damage(lease[1], lease[2]) is not None:
            return None
        if lease[0] not in ("", owner) and lease[2] > now:
            return None
        token = int(lease[1]) + 1
        conn.execute(
            "UPDATE leases SET owner=?, token=?, expires_at=? WHERE sk=?",
            (owner, token, now + ttl, sk),
        )
        return token

    @serialised
    async def renew_lease(
        self, session_id: str, owner: str, token: int, ttl: float, now: float
    ) -> bool:
        conn = self.conn
        self._before(LEASE_RENEWED)
        with immediate(conn, self._writable, self.path):
            sk = self._session_key(session_id)
            cur = conn.execute(
                # never earlier than it is: a renewal applied late must not shorten the lease
                "UPDATE leases SET expires_at=MAX(expires_at, ?) "
                "WHERE sk=? AND owner=? AND token=?",
                (now + ttl, sk, owner, token),
            )
        self._after(LEASE_RENEWED)
        if cur.rowcount != 1:
            return False
        self._granted(session_id, token, now, ttl)
        return True

    @serialised
    async def claim(
        self,
        owner: str,
        ttl: float,
        now: float,
        limit: int,
        agents: Sequence[str] | None = None,
        *,
        skip: Sequence[str] = (),
    ) -> list[tuple[str, int]]:
        """Lease up to `limit` sessions that have work and no live lease (of `agents` only, if
        given; none of `skip`): `(id, token)` each."""
        if agents is not None and not agents:
            return []
        conn = self.conn
        claimed: list[tuple[str, int]] = []
        only = "" if agents is None else f" AND s.agent IN ({','.join('?' * len(agents))})"
        if skip:
            only += f" AND s.id NOT IN ({','.join('?' * len(skip))})"
        self._before(LEASE_CLAIMED)
        with immediate(conn, self._writable, self.path):
            rows = conn.execute(
                "SELECT s.sk, s.id, l.sk, l.token, l.expires_at "
                "FROM sessions s LEFT JOIN leases l ON l.sk = s.sk "
                "WHERE s.status = 'running' AND (l.sk IS NULL OR l.owner = '' OR l.expires_at < ?"
                # SQLite orders text after every number: such an expiry is listed to be named
                " OR typeof(l.expires_at) NOT IN ('integer', 'real'))"
                # a session whose TTL passed can never run again: no worker is to claim it
                " AND (s.expires_at IS NULL OR s.expires_at > ?)"
                f"{only} ORDER BY s.updated_at",
                (now, now, *(agents or ()), *skip),
            )
            # Read a row at a time up to `limit` claimable ones (the index keeps the order): a
            # damaged lease row is passed over, not counted, so it neither fails every claim
            # nor takes a place that another session's would fill.
            taken: list[tuple[int, str, int]] = []
            for sk, session_id, leased, token, expires in rows:
                if len(taken) >= limit:
                    break
                damage = None if leased is None else _lease_damage(token, expires)
                if damage is not None:
                    self._pass_over(str(session_id), damage)
                    continue
                taken.append((sk, str(session_id), 1 if leased is None else token + 1))
            rows.close()
            for sk, session_id, new in taken:
                conn.execute(
                    "INSERT INTO leases (sk, owner, token, expires_at) VALUES (?,?,?,?) "
                    "ON CONFLICT (sk) DO UPDATE SET owner=excluded.owner, token=excluded.token, "
                    "expires_at=excluded.expires_at",
                    (sk, owner, new, now + ttl),
                )
                claimed.append((session_id, new))
        self._after(LEASE_CLAIMED)
        for session_id, token in claimed:
            self._granted(session_id, token, now, ttl)
        return claimed

    @reading
    async def lease_held(self, session_id: str, now: float) -> bool:
        """Whether a drive holds the session's lease at `now` (granted, not given back, not
        lapsed): what a listing shows by, read without a write."""
        row = self.conn.execute(
            "SELECT l.owner, l.expires_at FROM leases l JOIN sessions s ON s.sk = l.sk "
            "WHERE s.id=?",
            (session_id,),
        ).fetchone()
        if row is None:
            return False
        # Checked, as taking it checks them: SQLite orders text after every number, so an
        # expiry a hand edit left as text would read as a lease held forever.
        owner = kept(row[0], str, session_id, "lease owner")
        expires: float = kept(row[1], int | float, session_id, "lease expiry")
        return owner != "" and expires > now

    @reading
    async def running_unheld(
        self,
        agent: str,
        now: float,
        *,
        last_types: Sequence[str],
        among: Sequence[str] | None = None,
        ids: Sequence[str] | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> list[SessionSummary | DamagedSession]:
        """The running sessions of `agent` (of `ids` only, if given) whose TTL has not passed
        by `now`, whose lease no drive may hold at `now`, and whose last event (of those of
        `among`'s types, if given) is of one of `last_types`, by id past `after`: one query,
        where reading each session's lease and last event took two."""
        if not last_types or (ids is not None and not ids):
            return []
        types = sorted({stored_type(t) for t in last_types} | set(last_types))
        marks = ",".join("?" * len(types))
        past = "" if after is None else " AND s.id > ?"
        only = [] if ids is None else sorted(set(ids))
        if ids is not None:  # a read's page: its rows, not every running one of the agent
            past += f" AND s.id IN ({','.join('?' * len(only))})"
        # The type of the session's last event, or its last of `among`'s types, read back from
        # the head along the primary key (for a session stranded mid-turn, the events since it
        # last parked only); in a CASE, so only where no lease is held.
        last = "(SELECT m.type FROM events m WHERE m.sk = s.sk AND "
        kinds: list[str] = []
        if among is None:
            last += "m.seq = s.head)"
        else:
            kinds = sorted({stored_type(t) for t in among} | set(among))
            last += f"m.type IN ({','.join('?' * len(kinds))}) ORDER BY m.seq DESC LIMIT 1)"
        # A lease is taken as held only when its row says so plainly: one a hand edit left
        # odd is listed, so that reading it then (`lease_held`) says what is wrong with it.
        sql = (
            "SELECT s.id, s.agent, s.status, s.head, s.created_at, s.updated_at, s.expires_at "
            "FROM sessions s LEFT JOIN leases l ON l.sk = s.sk "
            "WHERE s.status = 'running' AND s.agent = ? "
            f"AND (s.expires_at IS NULL OR s.expires_at > ?){past} "
            "AND CASE WHEN l.owner IS NOT NULL AND l.owner <> '' "
            "AND typeof(l.expires_at) IN ('integer', 'real') AND l.expires_at > ? THEN 0 "
            f"ELSE {last} IN ({marks}) END ORDER BY s.id LIMIT ?"
        )
        later = [] if after is None else [after]
        params = [agent, now, *later, *only, now, *kinds, *types, limit]
        return [swept_summary(row) for row in self.conn.execute(sql, params)]

    @serialised
    async def release_lease(self, session_id: str, owner: str, token: int) -> None:
        conn = self.conn
        self._before(LEASE_RELEASED)
        with immediate(conn, self._writable, self.path):
            sk = self._session_key(session_id)
            conn.execute(
                "UPDATE leases SET owner='', expires_at=0 WHERE sk=? AND owner=? AND token=?",
                (sk, owner, token),
            )
        self._after(LEASE_RELEASED)
        self._given_back(session_id, token)

    @serialised
    async def claim_channel(
        self,
        name: str,
        owner: str,
        ttl: float,
        now: float,
        *,
        after_id: int | None = None,
        succeeds: str | None = None,
        renewing: bool = False,
        memos: Mapping[str, str | None] | None = None,
    ) -> tuple[bool, int | None, float | None]:
        """Take or keep the claim `name` (a hub's on a channel) for `owner` until `now + ttl`:
        it is free, lapsed or `owner`'s already. `(True, the position saved in it, when it
        lapsed or was given back or lapses)`, saving `after_id` first if given (`None` for a
        claim never taken before); `(False, None, None)` while another owner holds it. An owner
        whose name starts with `succeeds` is taken over at once, lapsed or not (the caller
        knows it is gone). `renewing`: kept only while it still names `owner`, lapsed or not
        (not taken back once another took it, even given back since). `memos` (as
        `keep_channel_memos` takes them) are kept in the same transaction, if it is held."""
        names = checked_memos(memos or {})
        conn = self.conn
        self._before(CHANNEL_CLAIMED)
        with immediate(conn, self._writable, self.path):
            row = conn.execute(
                "SELECT owner, expires_at, after_id FROM channel_claims WHERE name=?", (name,)
            ).fetchone()
            if row is not None:
                held_by, until, saved = row
                if not isinstance(until, int | float) or not (
                    saved is None or isinstance(saved, int)
                ):
                    raise StoreDamaged(f"channel claim {name!r} is damaged: {row!r:.60}")
                heir = succeeds is not None and str(held_by).startswith(succeeds)
                if held_by not in ("", owner) and until > now and not heir:
                    return False, None, None
            if renewing and (row is None or row[0] != owner):
                return False, None, None
            conn.execute(
                "INSERT INTO channel_claims (name, owner, expires_at, after_id) "
                "VALUES (?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET owner=excluded.owner, "
                "expires_at=excluded.expires_at, "
                "after_id=COALESCE(excluded.after_id, channel_claims.after_id)",
                (name, owner, now + ttl, after_id),
            )
            _keep_memos(conn, names, memos or {}, now)
        self._after(CHANNEL_CLAIMED)
        if row is None:
            return True, after_id, None
        return True, saved if after_id is None else after_id, float(until)

    @serialised
    async def release_channel(self, name: str, owner: str, now: float) -> None:
        """Give back the claim `name` if `owner` holds it, as of `now` (its position stays)."""
        conn = self.conn
        self._before(CHANNEL_RELEASED)
        with immediate(conn, self._writable, self.path):
            conn.execute(
                "UPDATE channel_claims SET owner='', expires_at=? WHERE name=? AND owner=?",
                (now, name, owner),
            )
        self._after(CHANNEL_RELEASED)

    @serialised
    async def keep_channel_memos(
        self, memos: Mapping[str, str | None], now: float, *, durable: bool = False
    ) -> None:
        """Keep each value (JSON text) under its name (`<hub>.<channel>:<key>`), or drop the
        memo where it is None, in one transaction: rows of `channel_claims` beside the claims
        (whose names have no `:`), the value in `owner`, `now` (when kept) in `expires_at`.
        `durable`: synced to disk before it returns (`synchronous=FULL`), as an answer is."""
        names = checked_memos(memos)
        conn = self.conn
        self._before(CHANNEL_MEMOS)
        if durable:
            conn.execute("PRAGMA synchronous=FULL")
        try:
            with immediate(conn, self._writable, self.path):
                _keep_memos(conn, names, memos, now)
        finally:
            if durable:
                conn.execute("PRAGMA synchronous=NORMAL")
        self._after(CHANNEL_MEMOS)

    @reading
    async def channel_memo(self, name: str) -> str | None:
        """The value kept under `name` by `keep_channel_memos`, or None."""
        (name,) = checked_memo_names([name])
        row = self.conn.execute("SELECT owner FROM channel_claims WHERE name=?", (name,)).fetchone()
        return None if row is None else str(row[0])

    @reading
    async def channel_memos(self, prefix: str) -> list[tuple[str, str, float]]:
        """The memos kept by `keep_channel_memos` whose name starts with `prefix` (which names
        memos, `<hub>.<channel>:...`): each name, value and when it was kept, oldest first.
        One whose time is no finite number (text a hand edit left, which SQLite keeps) is
        logged and passed: it reads the same every time, and `float()` of it failed the read of
        every other memo of its channel (its hub's restart, at every tick)."""
        (prefix,) = checked_memo_names([prefix])
        rows = self.conn.execute(
            "SELECT name, owner, expires_at FROM channel_claims "
            "WHERE substr(name, 1, length(?)) = ? ORDER BY expires_at, name",
            (prefix, prefix),
        ).fetchall()
        memos: list[tuple[str, str, float]] = []
        for n, v, at in rows:
            if type(at) not in (int, float) or not math.isfinite(at):
                if self._new_damage(f"memo {n}", repr(at)):
                    log.warning(
                        "channel memo %r is damaged: its time is %.40r (%s); passed over "
                        "until it is mended",
                        n,
                        at,
                        self.path,
                    )
                continue
            memos.append((str(n), str(v), float(at)))
        return memos

    def _pass_over(self, session_id: str, damage: str) -> None:
        """Log, once, that claims pass over a session for its damaged lease row: the worker
        that meets it goes on with the others, and the row is the operator's to mend."""
        if not self._new_damage(session_id, damage):
            return
        log.warning(
            "session %s is damaged: its lease %s (%s); claims pass it over until it is mended",
            session_id,
            damage,
            self.path,
        )

    def _new_damage(self, key: str, damage: str) -> bool:
        """Whether `damage` of the row `key` is news, to log once (the newest 10,000 kept)."""
        if self._passed_over.get(key) == damage:
            return False
        self._passed_over.pop(key, None)
        self._passed_over[key] = damage  # the newest last: the oldest forgotten first
        if len(self._passed_over) > 10_000:
            del self._passed_over[next(iter(self._passed_over))]
        return True

    def _given_back(self, session_id: str, token: int, *, rest: bool = False) -> None:
        """Forget a lease this store granted. When that leaves a session at rest for a person's
        pace (its turn parked on one, or ended after waiting for one) and no lease is left, fold
        the WAL into the database file: such a session is in one file of live pages. A fold
        costs a checkpoint (its fsyncs) and SQLite's page cache, which a person's turn can
        afford and back-to-back turns without one should not pay: for those,
        `wal_autocheckpoint` and `journal_size_limit` bound the WAL."""
        if self._leased.get(session_id, (None,))[0] == token:
            del self._leased[session_id]
        if rest:
            # One that lapsed unreleased (a failed drive keeps its lease; a stalled one loses
            # it) is forgotten: it must not keep the WAL for ever.
            now = self._lease_now
            self._leased = {sid: held for sid, held in self._leased.items() if held[1] > now}
            if not self._leased:
                self._checkpoint_if_quiet()

    def _granted(self, session_id: str, token: int, now: float, ttl: float) -> None:
        """Note a lease granted or renewed: the session's newest token replaces any older one."""
        self._leased[session_id] = (token, now + ttl)
        self._lease_now = max(self._lease_now, now)

    def _checkpoint_if_quiet(self) -> None:
        """Copy the WAL into the database file and truncate it, unless it is empty or another
        connection is reading or writing: the attempt never waits, so a busy file just keeps its
        WAL until the next quiet moment."""
        if self.path == ":memory:" or self._conn is None:
            return
        try:
            if os.path.getsize(self._wal_file()) == 0:
                return
        except OSError:
            return
        conn = self._conn
        self._before("wal.fold")
        conn.execute("PRAGMA busy_timeout=0")
        try:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        except sqlite3.Error:
            pass  # busy or locked: another connection is at work, and will quiet down later
        finally:
            conn.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        self._after("wal.fold")


def _keep_memos(
    conn: sqlite3.Connection, names: list[str], memos: Mapping[str, str | None], now: float
) -> None:
    """Keep each of the memos `names` (checked) in the transaction under way, or drop it."""
    for name in names:
        value = memos[name]
        if value is None:
            conn.execute("DELETE FROM channel_claims WHERE name=?", (name,))
            continue
        conn.execute(
            "INSERT INTO channel_claims (name, owner, expires_at, after_id) "
            "VALUES (?, ?, ?, NULL) ON CONFLICT (name) DO UPDATE SET "
            "owner=excluded.owner, expires_at=excluded.expires_at",
            (name, value, now),
        )
