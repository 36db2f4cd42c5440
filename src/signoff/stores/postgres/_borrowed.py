"""A connection lent to one store call, and the deadline the call is held to on it. A server
that stops answering while its kernel still acknowledges (a stopped process, a hung machine or
disk) trips no TCP setting and cannot enforce its own `statement_timeout`, so past
`operation_timeout` the connection's socket is shut down under the waiting call, which then
fails as over a lost connection, and the connection is never pooled again. The pool's test of
its idle connections (`Pool`) is held to the same deadline."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..._exceptions import StoreError

if TYPE_CHECKING:
    from psycopg.rows import TupleRow

    from ._outage import Outage

    Conn = psycopg.AsyncConnection[TupleRow]
else:
    Conn = Any

__all__ = ["LEASE_CONNECTIONS", "OPERATION_TIMEOUT", "Borrowed", "Pool", "sever"]

OPERATION_TIMEOUT = 30.0
"""Seconds a store call may spend on its connection (each attempt of it) unless the URL
(`?operation_timeout=`) or the store's argument says otherwise: as long as the pool's wait for
a connection, and far longer than any statement signoff sends takes on a live server."""


def sever(conn: Conn) -> None:
    """Cut `conn` under whatever waits on it: its socket is shut down (not closed, so its file
    descriptor is not reused while the event loop still watches it), so libpq reads an end of
    file, fails the call and marks the connection broken, as if the server had dropped it. It
    takes no file descriptor of its own, which a process that ran out of them has none of."""
    try:
        fd = conn.pgconn.socket
    except psycopg.Error:  # closed already
        return
    with contextlib.suppress(OSError):
        sock = socket.socket(fileno=fd)
        try:
            sock.shutdown(socket.SHUT_RDWR)
        finally:
            sock.detach()  # the descriptor stays libpq's, open


LEASE_CONNECTIONS = 2
"""Connections of a store's lease pool (`Pool.leases`): lease renewals only, each one short
statement, so a few serve every drive of the process. One is kept open from the pool's opening
on, so renewals still get through once the server is full (`max_connections`)."""

IDLE_WAIT = 0.1
"""Seconds a renewal the server refuses a lease connection waits for an idle one of the main
pool (another call may take it first): never long, so it does not queue behind busy calls."""


class Pool(AsyncConnectionPool[Conn]):
    """The store's pool: `check()` (run after a connection was lost) tests each idle connection
    within `operation_timeout`, as a call is held on one: a server process that stopped
    answering would otherwise hold the test, and whatever waits for it, for ever. It counts the
    connections it has lent (`lent`). Its `leases` pool, closed with it, holds the connections
    lease renewals use, so they never queue behind the process's other calls."""

    def __init__(self, *args: Any, operation_timeout: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.operation_timeout = operation_timeout
        # Connections handed out and not put back yet: those a call waiting may still get, when
        # the server refuses new ones (`Outage.borrow`).
        self.lent = 0
        self.leases: Pool | None = None
        # Why its last new connection failed: psycopg_pool only logs it, and says of a pool that
        # could not open its `min_size` connections in time "pool initialization incomplete".
        self.refused: psycopg.Error | None = None
        self.opened = 0  # new connections made
        self.tried = asyncio.Event()  # set once its first new connection is made or refused
        # Calls waiting in `getconn` now: psycopg_pool's own `requests_waiting` still counts a
        # wait that was cancelled (a renewal that went to the main pool), until a connection
        # comes, and a reconnect started again for it kept a full server refusing logins.
        self.waiting = 0

    async def close(self, timeout: float = 5.0) -> None:
        leases, self.leases = self.leases, None
        try:
            if leases is not None:
                await leases.close(timeout)
        finally:
            await super().close(timeout)

    async def _connect(self, timeout: float | None = None) -> Conn:
        try:
            conn = await super()._connect(timeout)
        except psycopg.Error as exc:
            self.refused = exc
            self.tried.set()
            raise
        self.opened += 1
        self.tried.set()
        return conn

    async def getconn(self, timeout: float | None = None) -> Conn:
        self.waiting += 1
        try:
            conn = await super().getconn(timeout)
        finally:
            self.waiting -= 1
        self.lent += 1
        return conn

    async def putconn(self, conn: Conn) -> None:
        self.lent -= 1
        await super().putconn(conn)

    async def check_connection(self, conn: Conn) -> None:  # type: ignore[override]
        timer = asyncio.get_running_loop().call_later(self.operation_timeout, sever, conn)
        try:
            await AsyncConnectionPool.check_connection(conn)
        finally:
            timer.cancel()


class Borrowed:
    """A connection for one attempt of a store call (`Outage.borrow`, waiting `busy_after`
    seconds at most if given: for an HTTP request; a new one if `fresh`), held to `timeout`
    seconds (`expired` once it was cut for passing them), then back to the pool, or closed if it
    was the outage probe's, a new one, or was cut. Lighter than the pool's `connection()`,
    whose `async with conn` commits or rolls back an autocommit connection (nothing to do:
    `_write` rolls back the transactions it opens, and the pool would roll back any other it is
    handed). The deadline is one timer on the event loop, cancelled when the call is done."""

    __slots__ = (
        "beside",
        "busy_after",
        "conn",
        "expired",
        "fresh",
        "outage",
        "pool",
        "pooled",
        "timeout",
        "timer",
    )

    def __init__(
        self,
        pool: Pool,
        outage: Outage,
        busy_after: float | None,
        timeout: float,
        fresh: bool = False,
        beside: Pool | None = None,
    ) -> None:
        self.pool = pool
        self.beside = beside
        self.outage = outage
        self.busy_after = busy_after
        self.timeout = timeout
        self.fresh = fresh
        self.expired = False

    async def __aenter__(self) -> Conn:
        if self.fresh:  # not the pool's: they may all be on the server that refused the call
            self.conn, self.pooled = await self.outage.fresh(), False
        elif self.beside is not None:
            self.conn, self.pooled = await self._renewing(self.beside)
        else:
            self.conn, self.pooled = await self.outage.borrow(self.pool, self.busy_after)
        self.timer = asyncio.get_running_loop().call_later(self.timeout, self._expire)
        return self.conn

    async def _renewing(self, main: Pool) -> tuple[Conn, bool]:
        """A connection for a lease renewal: the lease pool's, or, when the server refuses that
        pool a new one (too many clients) and it has none open, an idle one of the main pool,
        at once if the refusal is known already. Only an idle one: one in use may be held by a
        long call, which a renewal must not wait behind."""
        outage = self.outage
        if _refusing(outage) and not _idle(self.pool):
            conn = await _take_idle(main)
            if conn is not None:
                self.pool = main
                return conn, True
        try:
            return await outage.borrow(self.pool, self.busy_after)
        except StoreError:
            conn = await _take_idle(main) if _refusing(outage) else None
            if conn is None:
                raise
            self.pool = main
            return conn, True

    def _expire(self) -> None:
        self.expired = True
        sever(self.conn)

    async def __aexit__(self, *exc: object) -> None:
        self.timer.cancel()
        if self.expired and not self.conn.closed:  # cut just as the call was done
            with contextlib.suppress(psycopg.Error):
                await self.conn.close()
        if self.pooled:
            await self.pool.putconn(self.conn)  # the pool replaces one that is closed
        elif not self.conn.closed:
            with contextlib.suppress(psycopg.Error):
                await self.conn.close()


def _refusing(outage: Outage) -> bool:
    """Whether the server is up and refused the last new connection asked of it."""
    return outage.since is None and outage.refused is not None


def _idle(pool: Pool) -> bool:
    return bool(pool.get_stats().get("pool_available", 0))


async def _take_idle(pool: Pool) -> Conn | None:
    """One of `pool`'s idle connections, or None if it has none (or another call took it)."""
    if not _idle(pool):
        return None
    try:
        return await pool.getconn(IDLE_WAIT)
    except PoolTimeout:
        return None
