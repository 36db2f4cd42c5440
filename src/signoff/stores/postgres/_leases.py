"""The PostgreSQL store's leases: a worker claims sessions with work, or acquires, renews and
releases the lease on one; each is one autocommit statement or one short transaction."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg.rows import TupleRow

from ..._events import Event
from ..._exceptions import EventsRewritten, UnknownSession
from .._base import (
    LEASE_ACQUIRED,
    LEASE_CLAIMED,
    LEASE_RELEASED,
    LEASE_RENEWED,
    SessionSummary,
)
from .._codec import stored_type
from .._shown import check_shown
from .._swept_rows import DamagedSession, swept_summary
from ._connections import Conn, Connections, storable
from ._sql import LEASE_GRANT, named_turn, takeable
from ._sql import NOW as _NOW

__all__ = ["Leases"]

# A BIGINT's largest value: a lease token there has no next one to grant.
_LAST_TOKEN = 2**63 - 1


class Leases(Connections):
    """`PostgresStore`'s leases: who works on a session, and the token that proves it."""

    async def server_time(self) -> float:
        """The database server's clock (seconds since the epoch): the runtime times leases,
        deadlines and events by it, so processes on machines whose clocks differ agree on when
        a lease, a session or a request lapses. It is the clock as of the middle of this call,
        as the runtime takes it: the query reads it only once it has a connection, which a busy
        pool or a restarting server may take seconds to give, and the wait would otherwise put
        the reckoning ahead by half of it (leases others hold lapsing early)."""
        asked = time.monotonic()
        read_at: list[float] = []  # the middle of the query's own round trip

        async def body(conn: Conn) -> float:
            sent = time.monotonic()
            cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
            row = await cur.fetchone()
            assert row is not None
            read_at[:] = [(sent + time.monotonic()) / 2]
            return float(row[0])

        theirs = await self._read(body, "reading the database's clock")
        return theirs + (asked + time.monotonic()) / 2 - read_at[0]

    async def fit_pool(self, connections: int) -> tuple[int, int]:
        """Let the pool hold `connections` at once (a worker's turns, each making its store calls
        on one, and its claims and renewals beside them): its `pool_max` is raised to that,
        unless the URL or the store's argument set it. Returns it before and after."""
        before = self.max_size
        if connections > before and not self.max_given:
            pool = await self._get_pool()
            self.max_size = connections  # for this loop's pool, and any opened later
            await pool.resize(self.min_size, connections)
        return before, self.max_size

    def granted_head(
        self, session_id: str, token: int, *, shown: Event | None = None
    ) -> int | None:
        """The session's head when this store granted it lease `token` (by `claim` or
        `acquire_lease`), once; None if it granted no such lease, or if `shown` (the event a
        cached state ends at) is at that head and the grant found another event there. A token
        names one grant, so the drive holding it reads the head it began at, checked, without
        another round trip."""
        granted = self._granted.pop(session_id, None)
        if granted is None or granted[0] != token:
            return None
        _, head, row = granted
        if shown is not None and shown.seq == head:
            try:
                check_shown(session_id, shown, row)
            except EventsRewritten:
                return None
        return head

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
        """Lease up to `limit` sessions with work and no lease another owner may not take
        (`takeable`; a lapsed one of `owner`'s own is taken) (of `agents` only, if given; none
        of `skip`), skipping rows another worker is claiming right now (`FOR UPDATE SKIP
        LOCKED`): `(id, token)` each."""
        s = self._s
        if agents is not None and not agents:
            return []
        only = "" if agents is None else "AND s.agent = ANY(%s) "
        if skip:
            only += "AND s.id <> ALL(%s) "
        sync = self._sync_setting(True)  # a lease granted is flushed, as the commits it fences

        async def body(conn: Conn) -> psycopg.AsyncCursor[TupleRow]:
            # The session rows stay locked to the statement's end, and a row lock reads a row's
            # newest version: the heads answered are those the leases were granted at; a session
            # with a commit in flight is locked, so passed by (the commit's fence). (The
            # turn is read as of the statement's start: a guess, which the commit checks.)
            # A transaction of its own, sent with its Sync (`_write`): a worker frozen once it
            # is sent (SIGSTOP, a paused VM) holds no lock while the server commits it.
            return await conn.execute(
                f"WITH c AS (SELECT s.sk, s.id, s.head, s.audit_n, s.audit_hash, s.updated_at "
                f"FROM {s}.sessions s "
                f"LEFT JOIN {s}.leases l ON l.sk = s.sk "
                "WHERE s.status = 'running' "
                # A lapsed lease of the claimer's own it takes back at once, restart or not (as
                # acquire_lease does): no other process has its owner, and the sessions its own
                # still drives, a tool's outcome kept included, are `skip`.
                f"AND (l.sk IS NULL OR l.owner = '' OR {takeable('l', taker='%s')}) "
                # A token a hand edit left at the column's largest has no next: taken, it failed
                # the whole statement, every claim. Passed over, its session is left unclaimed.
                f"AND (l.sk IS NULL OR l.token < {_LAST_TOKEN}) "
                # a session whose TTL passed can never run again: no worker is to claim it
                "AND (s.expires_at IS NULL OR s.expires_at > %s) "
                f"{only}ORDER BY s.updated_at LIMIT %s FOR UPDATE OF s SKIP LOCKED), "
                f"i AS (INSERT INTO {s}.leases AS l "
                "(sk, owner, token, expires_at, ttl, granted_at) "
                f"SELECT sk, %s, 1, %s, {LEASE_GRANT} FROM c ON CONFLICT (sk) DO UPDATE "
                "SET owner=excluded.owner, token=l.token + 1, expires_at=excluded.expires_at, "
                "ttl=excluded.ttl, granted_at=excluded.granted_at "
                # re-checked on the latest row: an acquire_lease may have won meanwhile
                f"WHERE l.owner = '' OR {takeable('l', taker='excluded.owner')} "
                "RETURNING l.sk, l.token) "
                "SELECT c.id, i.token, c.head, c.audit_n, c.audit_hash, t.seq, t.turn, "
                "h.type, h.at, h.turn"
                + ("" if sync is None else ", set_config('synchronous_commit', %s, true)")
                + " FROM i JOIN c ON c.sk = i.sk "
                f"LEFT JOIN LATERAL ({named_turn(s, 'c.sk', 'c.head')}) t ON true "
                f"LEFT JOIN {s}.events h ON h.sk = c.sk AND h.seq = c.head "
                "ORDER BY c.updated_at",
                (now, owner, now, *([] if agents is None else [list(agents)]))
                + ((list(skip),) if skip else ())
                + (limit, owner, now + ttl, ttl, now)
                + (() if sync is None else (sync,)),
            )

        found: list[tuple[str, int]] = []
        unsure = self._unsure.setdefault(owner, [])
        await self._give_back_orphans(owner, unsure, now, skip)
        sent_again: list[str] | None = None

        async def committed() -> bool:
            # Its leases are the ones this owner holds until exactly the time it set: none
            # means it did not commit (or claimed nothing), so sending it again is safe.
            nonlocal sent_again
            if sent_again is None:
                # The server may still be running it (a connection cut by this process, or by
                # the network, while it waited on a lock), or this check may fail (the server
                # restarting), the claim's outcome unknown: what it commits is given back by
                # the next claim, but for the sessions a claim here returns (`sent_again`).
                sent_again = []
                unsure.append((now + ttl, sent_again))
            found[:] = await self._leased_until(owner, now + ttl)
            return bool(found)

        self._before(LEASE_CLAIMED)
        cur = await self._write(body, "claiming runnable sessions", committed=committed)
        self._after(LEASE_CLAIMED)
        if cur is None:  # committed, its acknowledgement lost: no heads (drives read them)
            _taken(unsure, now + ttl, [session_id for session_id, _ in found])
            return found
        claimed = [(str(row[0]), int(row[1]), row[2:]) for row in await cur.fetchall()]
        _taken(unsure, now + ttl, [session_id for session_id, _, _ in claimed])
        for session_id, token, row in claimed:
            self._granted[session_id] = (token, self._moved(session_id, row), _head_row(row))
        return [(session_id, token) for session_id, token, _ in claimed]

    async def _give_back_orphans(
        self,
        owner: str,
        unsure: list[tuple[float, list[str]]],
        now: float,
        driven: Sequence[str] = (),
    ) -> None:
        """Give back the leases a claim of `owner` that was sent again took after all: the lost
        first statement committed them once the resend had passed its rows by, so no drive
        holds them, and they would wait for their lease to lapse. Each claim of `owner` does so
        until that lease's expiry, the last time such a commit could matter. Not those of the
        sessions the claimer drives (`driven`, its `skip`): under a clock that stands still (a
        test's), their renewals set that very expiry."""
        unsure[:] = [(until, taken) for until, taken in unsure if until > now]
        if not unsure:
            return
        s = self._s

        async def body(conn: Conn) -> None:
            for until, taken in unsure:
                # Idempotent (the same rows whoever runs it again): a lost connection is retried.
                await conn.execute(
                    f"UPDATE {s}.leases l SET owner = '', expires_at = {_NOW} "
                    f"FROM {s}.sessions x WHERE x.sk = l.sk AND l.owner = %s "
                    "AND l.expires_at = %s AND x.id <> ALL(%s)",
                    (owner, until, [*taken, *driven]),
                )

        await self._write(body, "giving back the leases of a claim sent again", transaction=False)

    async def _leased_until(self, owner: str, expires_at: float) -> list[tuple[str, int]]:
        """The sessions `owner` holds a lease on expiring at `expires_at`, with their tokens:
        what a claim that set that time took, after its acknowledgement was lost."""
        s = self._s

        async def body(conn: Conn) -> list[tuple[str, int]]:
            cur = await conn.execute(
                f"SELECT x.id, l.token FROM {s}.leases l JOIN {s}.sessions x ON x.sk = l.sk "
                "WHERE l.owner = %s AND l.expires_at = %s",
                (owner, expires_at),
            )
            return [(str(i), int(t)) for i, t in await cur.fetchall()]

        return await self._read(body, "checking a claim")

    async def acquire_lease(
        self, session_id: str, owner: str, ttl: float, now: float
    ) -> int | None:
        s = self._s
        if not storable(session_id):
            raise UnknownSession(session_id)

        async def body(conn: Conn) -> tuple[int | None, tuple[Any, ...]]:
            # One statement: no row if the session is unknown, a NULL token if the lease is live.
            # The session row is locked first (as a commit and `claim` lock it, then the lease),
            # so the head read is the newest: a commit running meanwhile is waited for, not
            # missed by the statement's snapshot. That wait is the fence: the commit holds the
            # lease row only `FOR KEY SHARE`, which this statement's update would not wait for.
            cur = await conn.execute(
                f"WITH x AS (SELECT sk, head, audit_n, audit_hash FROM {s}.sessions "
                "WHERE id=%s FOR KEY SHARE), "
                f"i AS (INSERT INTO {s}.leases AS l "
                "(sk, owner, token, expires_at, ttl, granted_at) "
                f"SELECT sk, %s, 1, %s, {LEASE_GRANT} FROM x ON CONFLICT (sk) DO UPDATE "
                "SET owner=excluded.owner, token=l.token + 1, expires_at=excluded.expires_at, "
                "ttl=excluded.ttl, granted_at=excluded.granted_at "
                "WHERE l.owner = '' OR l.owner = excluded.owner OR "
                f"{takeable('l', '<=')} "
                "RETURNING token) "
                "SELECT (SELECT token FROM i), x.head, x.audit_n, x.audit_hash, t.seq, t.turn, "
                "h.type, h.at, h.turn FROM x LEFT JOIN LATERAL "
                f"({named_turn(s, 'x.sk', 'x.head')}) t ON true "
                f"LEFT JOIN {s}.events h ON h.sk = x.sk AND h.seq = x.head",
                (session_id, owner, now + ttl, ttl, now),
            )
            row = await cur.fetchone()
            if row is None:
                raise UnknownSession(session_id)
            return None if row[0] is None else int(row[0]), row[1:]

        self._before(LEASE_ACQUIRED)
        acquired = await self._write(
            body, f"acquiring the lease on session {session_id!r}", transaction=False
        )
        self._after(LEASE_ACQUIRED)
        assert acquired is not None  # only a transaction's write may answer None
        token, row = acquired
        head = self._moved(session_id, row)
        if token is not None:
            self._granted[session_id] = (token, head, _head_row(row))
        return token

    async def renew_lease(
        self, session_id: str, owner: str, token: int, ttl: float, now: float
    ) -> bool:
        s = self._s
        if not storable(session_id):
            return False

        async def body(conn: Conn) -> bool:
            # Never earlier than it is: a renewal a frozen server process applies after the call
            # timed out, and a newer one went through, must not shorten the lease. The session's
            # row key is found by its id here, not kept (`_session_key`).
            cur = await conn.execute(
                f"UPDATE {s}.leases SET expires_at=GREATEST(expires_at, %s) "
                f"WHERE sk=(SELECT sk FROM {s}.sessions WHERE id=%s) AND owner=%s AND token=%s",
                (now + ttl, session_id, owner, token),
            )
            return cur.rowcount == 1

        self._before(LEASE_RENEWED)
        renewed = await self._write(
            body, f"renewing the lease on session {session_id!r}", transaction=False, renewal=True
        )
        self._after(LEASE_RENEWED)
        return bool(renewed)

    async def lease_held(self, session_id: str, now: float) -> bool:
        """Whether a drive holds the session's lease at `now` (granted, not given back, not
        lapsed): what a listing shows by, read without a write (a role that may only SELECT)."""
        s = self._s
        if not storable(session_id):
            return False

        async def body(conn: Conn) -> bool:
            cur = await conn.execute(
                f"SELECT 1 FROM {s}.leases l JOIN {s}.sessions x ON x.sk = l.sk "
                "WHERE x.id = %s AND l.owner <> '' AND l.expires_at > %s",
                (session_id, now),
            )
            return await cur.fetchone() is not None

        return await self._read(body, f"reading the lease on session {session_id!r}")

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
        by `now`, whose lease no drive holds at `now`, and whose last event (of those of
        `among`'s types, if given) is of one of `last_types`, by id past `after`: one query,
        where reading each session's lease and last event took two."""
        s = self._s
        only = None if ids is None else sorted({i for i in ids if storable(i)})
        if not last_types or only == []:
            return []
        types = sorted({stored_type(t) for t in last_types} | set(last_types))
        past = "" if after is None else 'AND x.id COLLATE "C" > %s '
        if only is not None:  # a read's page: its rows, not every running one of the agent
            past += "AND x.id = ANY(%s) "
        # The type of the session's last event, or its last of `among`'s types, read back from
        # the head along the primary key (for a session stranded mid-turn, the events since it
        # last parked only); in a CASE, which the planner cannot take apart, so only where no
        # lease is held, not in the scan of every running session.
        last = f"(SELECT m.type FROM {s}.events m WHERE m.sk = x.sk AND "
        kinds: list[list[str]] = []
        if among is None:
            last += "m.seq = x.head)"
        else:
            last += "m.type = ANY(%s) ORDER BY m.seq DESC LIMIT 1)"
            kinds.append(sorted({stored_type(t) for t in among} | set(among)))
        sql = (
            "SELECT x.id, x.agent, x.status, x.head, x.created_at, x.updated_at, x.expires_at "
            f"FROM {s}.sessions x LEFT JOIN {s}.leases l ON l.sk = x.sk "
            "WHERE x.status = 'running' AND x.agent = %s "
            f"AND (x.expires_at IS NULL OR x.expires_at > %s) {past}"
            "AND CASE WHEN l.owner <> '' AND l.expires_at > %s THEN false "
            f"ELSE {last} = ANY(%s) END "
            'ORDER BY x.id COLLATE "C" LIMIT %s'
        )
        later: list[Any] = [] if after is None else [after]
        if only is not None:
            later.append(only)
        params = [agent, now, *later, now, *kinds, types, limit]

        async def body(conn: Conn) -> list[SessionSummary | DamagedSession]:
            cur = await conn.execute(sql, params)
            return [swept_summary(row) for row in await cur.fetchall()]

        return await self._read(body, f"listing the running sessions of {agent!r} none holds")

    async def release_lease(self, session_id: str, owner: str, token: int) -> None:
        s = self._s
        if not storable(session_id):
            return

        async def body(conn: Conn) -> None:
            # A session released with work left (a worker stopping) wakes the other workers.
            await conn.execute(
                f"WITH r AS (UPDATE {s}.leases SET owner='', expires_at=0 "
                f"WHERE sk=(SELECT sk FROM {s}.sessions WHERE id=%s) AND owner=%s AND token=%s "
                f"RETURNING sk) SELECT pg_notify(%s, %s) FROM r JOIN {s}.sessions s ON s.sk = r.sk "
                "WHERE s.status = 'running'",
                (session_id, owner, token, self.channel, f"{session_id} 0"),
            )

        self._before(LEASE_RELEASED)
        await self._write(body, f"releasing the lease on session {session_id!r}", transaction=False)
        self._after(LEASE_RELEASED)


def _head_row(row: Sequence[Any]) -> Sequence[Any] | None:
    """The stored type, time and turn of the head event, from a grant's row (`head, audit_n,
    audit_hash, turn seq, turn`, then those): None when the session has no such row."""
    return None if row[5] is None else row[5:8]


def _taken(unsure: list[tuple[float, list[str]]], until: float, sessions: list[str]) -> None:
    """Note that a claim leasing `sessions` until `until` returned them (they have drives): no
    earlier claim left unsure with that expiry (a clock that stood still) gives them back."""
    for expiry, taken in unsure:
        if expiry == until:
            taken.extend(sessions)
