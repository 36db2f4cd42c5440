"""The PostgreSQL store's channel claims: the claim a channel hub holds on delivering to a
channel, and the memos kept beside it, as rows of `channel_claims`, timed by the database's
clock."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psycopg

from .._base import CHANNEL_CLAIMED, CHANNEL_MEMOS, CHANNEL_RELEASED
from .._memos import checked_memo_names, checked_memos
from ._connections import Conn, Connections
from ._sql import NOW as _NOW

__all__ = ["ChannelClaims"]

# How many times a take reads the claim again after another write changed it between its
# read and its own: each such change is another hub's take or give-back, or this hub's own.
_RACES = 5


class ChannelClaims(Connections):
    """`PostgresStore`'s channel claims: which hub delivers to a channel, and from where."""

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
        """Take or keep the claim `name` (a hub's on a channel) for `owner` until `ttl` seconds
        from now: it is free, lapsed or `owner`'s already. `(True, the position saved in it,
        when it lapsed or was given back or lapses)`, saving `after_id` first if given (`None`
        for a claim never taken before); `(False, None, None)` while another owner holds it. An
        owner whose name starts with `succeeds` is taken over at once, lapsed or not (the caller
        knows it is gone). `renewing`: kept only while it still names `owner`, lapsed or not
        (not taken back once another took it, even given back since). `memos` (as
        `keep_channel_memos` takes them) are kept in the same statement, if it is held. Now is
        the database's clock at the statement, not `now`: a process's reckoning of it is
        measured when it opens and goes stale (the server's clock stepped, say by a
        failover), and two hubs would then both deliver."""
        given = memos or {}
        names = checked_memos(given)
        keep, kept_args = self._memos_kept(names, given)
        if renewing:
            return await self._renew_channel(name, owner, ttl, after_id, keep, kept_args)
        s = self._s
        read = (
            f"SELECT owner, expires_at, expires_at <= {_NOW} FROM {s}.channel_claims "
            "WHERE name = %s"
        )
        # Written only while the row is as read (no row: none there yet): what the take says of
        # the claim before it is then what it replaced.
        write = (
            f"WITH k AS (INSERT INTO {s}.channel_claims AS c (name, owner, expires_at, after_id) "
            f"VALUES (%s, %s, {_NOW} + %s::float8, %s::bigint) ON CONFLICT (name) DO UPDATE "
            "SET owner=excluded.owner, expires_at=excluded.expires_at, "
            "after_id=COALESCE(excluded.after_id, c.after_id) "
            "WHERE c.owner = %s::text AND c.expires_at = %s::float8 RETURNING after_id)"
            f"{keep} SELECT after_id FROM k"
        )
        # The claim as this call found it before it sent a write, kept while it names `owner`
        # from then on: an attempt sent again after its acknowledgement was lost finds the
        # claim its own, at the expiry it set, and says when the one before lapsed all the same,
        # whoever held it (this hub's own, lapsed as its give-back failed, too): a claim lapsed
        # long ago passes no position on (`Claims.take`).
        found: list[tuple[str, float] | None] = []
        sent = False

        async def body(conn: Conn) -> tuple[bool, int | None, float | None]:
            nonlocal sent
            for _ in range(_RACES):
                cur = await conn.execute(read, (name,))
                row = await cur.fetchone()
                if not (sent and found and row is not None and row[0] == owner):
                    found[:] = [None if row is None else (str(row[0]), float(row[1]))]
                if row is not None and row[0] not in ("", owner) and not row[2]:
                    if succeeds is None or not str(row[0]).startswith(succeeds):
                        return False, None, None  # another's, live: nothing written
                held = (None, None) if row is None else (row[0], row[1])
                sent = True  # it may commit with its acknowledgement lost
                cur = await conn.execute(write, [name, owner, ttl, after_id, *held, *kept_args])
                took = await cur.fetchone()
                if took is not None:
                    before = found[0]
                    return True, took[0], None if before is None else before[1]
            return False, None, None  # changed under each try: others' takes and give-backs

        # Sent again whenever the connection is lost: its read finds what an attempt committed.
        self._before(CHANNEL_CLAIMED)
        got = await self._write(body, f"claiming channel {name!r}", transaction=False)
        self._after(CHANNEL_CLAIMED)
        return (False, None, None) if got is None else got

    async def _renew_channel(
        self,
        name: str,
        owner: str,
        ttl: float,
        after_id: int | None,
        keep: str,
        kept_args: list[Any],
    ) -> tuple[bool, int | None, float | None]:
        """`claim_channel` renewing: the claim kept, `after_id` saved and the memos (`keep`)
        kept only while it names `owner`; when it was to lapse, read as the row stood before."""
        s = self._s
        sql = (
            f"WITH was AS (SELECT expires_at FROM {s}.channel_claims WHERE name = %s), "
            f"k AS (UPDATE {s}.channel_claims AS c SET expires_at={_NOW} + %s::float8, "
            "after_id=COALESCE(%s::bigint, c.after_id) WHERE name = %s AND owner = %s "
            f"RETURNING after_id, (SELECT expires_at FROM was) AS was_at){keep} "
            "SELECT after_id, was_at FROM k"
        )
        args = [name, ttl, after_id, name, owner, *kept_args]

        async def body(conn: Conn) -> tuple[bool, int | None, float | None]:
            cur = await conn.execute(sql, args)
            row = await cur.fetchone()
            return (False, None, None) if row is None else (True, row[0], row[1])

        # One statement, the same whoever runs it again: a lost connection is retried.
        self._before(CHANNEL_CLAIMED)
        found = await self._write(body, f"claiming channel {name!r}", transaction=False)
        self._after(CHANNEL_CLAIMED)
        return (False, None, None) if found is None else found

    def _memos_kept(
        self, names: list[str], memos: Mapping[str, str | None]
    ) -> tuple[str, list[Any]]:
        """The common table expressions that keep `memos` (`names`, checked) beside a claim
        only where its `k` kept it (the memos' rows have names with a `:`), and their
        parameters; none for no memos."""
        if not names:
            return "", []
        s = self._s
        kept = [n for n in names if memos[n] is not None]
        sql = (
            f", d AS (DELETE FROM {s}.channel_claims "
            "WHERE name = ANY(%s::text[]) AND EXISTS (SELECT 1 FROM k)), "
            f"m AS (INSERT INTO {s}.channel_claims AS c (name, owner, expires_at) "
            f"SELECT n, v, {_NOW} FROM unnest(%s::text[], %s::text[]) AS t(n, v) "
            "WHERE EXISTS (SELECT 1 FROM k) ON CONFLICT (name) DO UPDATE "
            "SET owner=excluded.owner, expires_at=excluded.expires_at)"
        )
        return sql, [[n for n in names if memos[n] is None], kept, [memos[n] for n in kept]]

    async def release_channel(self, name: str, owner: str, now: float) -> None:
        """Give back the claim `name` if `owner` holds it, as of now by the database's clock
        (not `now`: see `claim_channel`); its position stays."""
        s = self._s

        async def body(conn: Conn) -> None:
            await conn.execute(
                f"UPDATE {s}.channel_claims SET owner='', expires_at={_NOW} "
                "WHERE name=%s AND owner=%s",
                (name, owner),
            )

        self._before(CHANNEL_RELEASED)
        await self._write(body, f"releasing channel {name!r}", transaction=False)
        self._after(CHANNEL_RELEASED)

    async def keep_channel_memos(
        self, memos: Mapping[str, str | None], now: float, *, durable: bool = False
    ) -> None:
        """Keep each value (JSON text) under its name (`<hub>.<channel>:<key>`), or drop the
        memo where it is None, in one statement: rows of `channel_claims` beside the claims
        (whose names have no `:`), the value in `owner`, when kept (the database's clock, not
        `now`) in `expires_at`. `durable`: flushed before it returns, as an answer is, also on
        a server whose `synchronous_commit` is off."""
        names = checked_memos(memos)
        s = self._s
        gone = [n for n in names if memos[n] is None]
        kept = [n for n in names if memos[n] is not None]
        values = [memos[n] for n in kept]
        sync = self._sync_setting(True) if durable else None
        sql = (
            f"WITH d AS (DELETE FROM {s}.channel_claims WHERE name = ANY(%s::text[])) "
            f"INSERT INTO {s}.channel_claims AS c (name, owner, expires_at) "
            f"SELECT n, v, {_NOW} FROM unnest(%s::text[], %s::text[]) AS t(n, v) "
            "ON CONFLICT (name) DO UPDATE SET owner=excluded.owner, "
            "expires_at=excluded.expires_at"
        )
        params: list[Any] = [gone, kept, values]
        if sync is not None:  # sent together (one transaction) by the simple protocol
            sql = f"SELECT set_config('synchronous_commit', %s, true); {sql}"
            params.insert(0, sync)

        async def body(conn: Conn) -> None:
            # Idempotent (the same rows whoever runs it again): a lost connection is retried.
            if sync is None:
                await conn.execute(sql, params)
            else:
                await psycopg.AsyncClientCursor(conn).execute(sql, params)

        self._before(CHANNEL_MEMOS)
        await self._write(body, "keeping a channel's memos", transaction=False)
        self._after(CHANNEL_MEMOS)

    async def channel_memo(self, name: str) -> str | None:
        """The value kept under `name` by `keep_channel_memos`, or None."""
        (name,) = checked_memo_names([name])
        s = self._s

        async def body(conn: Conn) -> str | None:
            cur = await conn.execute(
                f"SELECT owner FROM {s}.channel_claims WHERE name = %s", (name,)
            )
            row = await cur.fetchone()
            return None if row is None else str(row[0])

        return await self._read(body, f"reading the channel memo {name!r}")

    async def channel_memos(self, prefix: str) -> list[tuple[str, str, float]]:
        """The memos kept by `keep_channel_memos` whose name starts with `prefix` (which names
        memos, `<hub>.<channel>:...`): each name, value and when it was kept (the database's
        clock), oldest first."""
        (prefix,) = checked_memo_names([prefix])
        s = self._s

        async def body(conn: Conn) -> list[tuple[str, str, float]]:
            cur = await conn.execute(
                f"SELECT name, owner, expires_at FROM {s}.channel_claims "
                "WHERE starts_with(name, %s) ORDER BY expires_at, name",
                (prefix,),
            )
            return [(str(n), str(v), float(at)) for n, v, at in await cur.fetchall()]

        return await self._read(body, f"reading the channel memos {prefix!r}")
