"""Telling a PostgreSQL server that is down from a pool that is only busy, so that a call fails
fast with `StoreUnavailable` once an outage has lasted longer than a restart takes, and a call
made during a brief restart still goes through as soon as the server is back; a call made for an
HTTP request that finds the pool busy (the server up) fails soon with `StoreBusy`."""

from __future__ import annotations

import asyncio
import contextlib
from asyncio import FIRST_COMPLETED as FIRST
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg_pool import PoolTimeout

from ..._exceptions import StoreBusy, StoreError, StoreUnavailable, unwritten
from ._proxy import symptom
from ._shared import settle, shared

if TYPE_CHECKING:
    from psycopg.rows import TupleRow

    from ._borrowed import Pool

    Conn = psycopg.AsyncConnection[TupleRow]
else:
    Conn = Any

__all__ = ["ANSWERED_WITHIN", "GRACE", "PROBE_AFTER", "Outage", "is_down", "unreachable"]

GRACE = 10.0
"""Seconds an outage is ridden out (calls wait for the server) before calls fail at once:
longer than a `pg_ctl restart` or a crash recovery of a small database takes."""

PROBE_AFTER = 0.5
"""Seconds a call waits for a pooled connection before the server is probed: a busy pool
hands one over sooner than that."""

ANSWERED_WITHIN = 5.0
"""Seconds a call past the grace waits for a check when the server's host answered the last one
at once (refused, or still starting): a server just back on a loaded machine may take longer
than `PROBE_AFTER` to hand over a connection. After a check that went unanswered for
`PROBE_AFTER` (a silent network) a call waits `PROBE_AFTER` only."""

_STARTING = ("the database system is",)
"""What PostgreSQL says when it refuses connections while starting, stopping or recovering
(SQLSTATE 57P03, which a failed connection does not carry in psycopg)."""


_ENDED = ("57P01", "57P02", "57P03")
"""SQLSTATEs of a session the server ended: admin_shutdown (a fast restart,
`pg_terminate_backend`), crash_shutdown, cannot_connect_now. A call on a pooled connection rides
them out; an open that met one waits as for a server down (`signoff worker` and `serve`)."""


_SETUP = (
    "SSL was required",
    "certificate",
    "private key",
)
"""What libpq says when the connection's encryption cannot be set up as the URL asks: a server
without SSL for `sslmode=require`, a server certificate that does not verify or match the host,
a root certificate, client certificate or key file missing. The server is up, or the fault is
on this side: waiting does not mend it. (GSSAPI's is not here: a Kerberos ticket expired may
be renewed meanwhile.)"""


def is_down(exc: psycopg.Error) -> bool:
    """Whether a failed connection means the server is not there: no answer from it at all
    (refused, unresolvable, timed out), or it is starting or stopping. A server that answered
    with another refusal (a bad password, too many clients) is up, and not an outage; nor is
    one whose connection's SSL encryption cannot be set up as the URL asks (`_SETUP`),
    which `signoff worker` and `serve` waited out for ever, as if the database were down."""
    text = str(exc)
    if any(s in text for s in _SETUP):
        return False
    return "FATAL:" not in text or any(s in text for s in _STARTING)


def unreachable(exc: psycopg.Error) -> bool:
    """Whether a statement failed because the server is not there (a connection that was just
    made): the connection was lost, or a proxy in front of it (pgbouncer) accepted the login but
    answered that it cannot reach the server ("pgbouncer cannot connect to server", "server
    login has been failing", SQLSTATE 08P01, of class 08: connection exceptions), or the
    server ended the session as it shuts down, restarts or recovers (`_ENDED`: a fast restart
    or `pg_terminate_backend`). Not a Bind that does not fit its prepared statement (08P01
    too): a proxy sharing the connection (`_proxy.symptom`)."""
    if not isinstance(exc, psycopg.OperationalError) or symptom(exc):
        return False
    return exc.sqlstate is None or exc.sqlstate.startswith("08") or exc.sqlstate in _ENDED


class Outage:
    """What one store knows of its server being down: since when, and why. `probe()` connects
    once for every caller asking at the same time, and records or clears the outage."""

    def __init__(
        self,
        connect: Callable[[], Awaitable[Conn]],
        where: str,
        grace: float = GRACE,
    ) -> None:
        self._connect = connect
        self._where = where
        self.grace = grace
        self.since: float | None = None
        self.error = ""
        # What the server answered the last check with when it refused a connection (a password
        # rotated, a database not accepting connections, too many clients): up, but the pool
        # cannot grow.
        self.refused: str | None = None
        self._probing: asyncio.Future[None] | None = None
        self._asked = 0.0  # when the check under way started
        # Whether the last check of this outage that found it down waited PROBE_AFTER or more
        # (True while none has: no earlier outage's check tells how this one answers).
        self._silent = True
        self._spare: list[Conn] = []  # at most one: the connection a check found the server back on

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def down_since(self) -> float | None:
        """Since when the server is taken to be down: found so, or not answering the check under
        way (a silent network holds a connection for libpq's whole `connect_timeout`)."""
        if self.since is not None:
            return self.since
        probing = self._probing
        return self._asked if probing is not None and not probing.done() else None

    def over_grace(self) -> bool:
        """Whether the server has been down for longer than the grace period."""
        since = self.down_since()
        return since is not None and self._now() - since >= self.grace

    def grace_left(self) -> float:
        """Seconds until the outage outlasts its grace (0 if it has, the grace if none)."""
        since = self.down_since()
        if since is None:
            return self.grace
        return max(0.0, since + self.grace - self._now())

    def unavailable(self) -> StoreUnavailable:
        since = self.down_since()
        down = 0.0 if since is None else self._now() - since
        why = self.error if self.since is not None else "a new connection was not answered"
        return StoreUnavailable(f"PostgreSQL unavailable at {self._where} for {down:.1f}s: {why}")

    def busy(self, pool: Pool, busy_after: float | None, refused: str | None = None) -> StoreError:
        """No connection came in time, the server up: `StoreBusy` for a call that was to wait
        only briefly (so a 503 `store_busy` always means the request wrote nothing), otherwise a
        `StoreError` after the pool's whole timeout, as before; either wrote nothing
        (`unwritten`). If the server `refused` a new connection (a check the call waited on),
        that is why, however long the call was to wait: a `StoreError` saying so."""
        waited = pool.timeout if busy_after is None else min(busy_after, pool.timeout)
        message = f"no free PostgreSQL connection at {self._where} within {waited:g}s: "
        if refused is not None:
            message += (
                f"{pool.lent} of the pool's {pool.max_size} (`pool_max`) in use, and a new one "
                f"refused: {refused}"
            )
            return unwritten(StoreError(message))
        message += f"all {pool.max_size} of the pool's (`pool_max`) are in use"
        return unwritten(StoreError(message) if busy_after is None else StoreBusy(message))

    def refusing(self, pool: Pool) -> StoreError:
        """The server refused `pool` a new connection and it has none to lend: the pool is
        named, as a store has two (the lease renewals' beside the main one)."""
        return StoreError(
            f"PostgreSQL at {self._where} refuses new connections, and none of pool "
            f"{pool.name!r}'s is open to use: {self.refused}"
        )

    async def borrow(self, pool: Pool, busy_after: float | None) -> tuple[Conn, bool]:
        """A connection for one call, and whether it is the pool's. While the server is down
        this fails with `StoreUnavailable` once the outage outlasts its grace, instead of
        waiting the pool's whole timeout; a call waiting when the server comes back may get
        the probe's connection (not the pool's) rather than wait for the pool to reconnect.
        The server up, a call waits `busy_after` seconds if given (else the pool's timeout),
        then fails (`busy`); at once if the server refuses new connections and the pool has
        none lent that could come back (`refusing`)."""
        spare = self._take_spare()
        if spare is not None:
            return spare, False
        if self.since is None and pool.get_stats().get("pool_available", 0):
            try:  # the usual case: an idle connection
                return await pool.getconn(busy_after), True
            except PoolTimeout as exc:  # another call took it first, and no other came
                raise self.busy(pool, busy_after) from exc
        if self.over_grace():
            # Past the grace a call fails at once: it waits for a probe only as long as a
            # server that is back takes to answer one, not a silent network's `connect_timeout`.
            conn = await self.probe(PROBE_AFTER if self._silent else ANSWERED_WITHIN)
            if conn is not None:
                return conn, False
            if self.over_grace():
                raise self.unavailable()
        started = self._now()
        waiting = asyncio.ensure_future(pool.getconn())
        handed = False
        try:
            wait = PROBE_AFTER if self.since is None else 0.0
            while True:
                if busy_after is not None and self.since is None:
                    wait = min(wait, max(0.0, started + busy_after - self._now()))
                await asyncio.wait({waiting}, timeout=wait)
                if not waiting.done():
                    # The pool's connection may still come while the probe waits for an answer;
                    # the wait ends with the grace, however long the probe's connection takes.
                    probing = self._start_probe()
                    limit = self.grace_left()
                    either: set[asyncio.Future[Any]] = {waiting, probing}
                    await asyncio.wait(either, timeout=limit, return_when=FIRST)
                    _raise(probing)
                    if probing.done() and not waiting.done() and self.refused and not pool.lent:
                        raise self.refusing(pool)  # no connection to come back, none to open
                if waiting.done():
                    try:
                        conn = waiting.result()
                    except PoolTimeout as exc:
                        if self.since is not None:
                            raise self.unavailable() from exc
                        raise self.busy(pool, busy_after, self.refused) from exc
                    handed = True
                    return conn, True
                spare = self._take_spare()
                if spare is not None:
                    return spare, False
                if self.over_grace():
                    raise self.unavailable()
                if (
                    busy_after is not None
                    and self.since is None
                    and self._now() - started >= busy_after
                ):
                    # up, and no connection came: busy (or refusing new ones)
                    raise self.busy(pool, busy_after, self.refused)
                wait = PROBE_AFTER if self.since is None else min(PROBE_AFTER, self.grace_left())
        finally:
            if not handed:
                waiting.cancel()
                try:
                    conn = await waiting
                except BaseException:  # cancelled, or it had failed: nothing borrowed
                    pass
                else:
                    await pool.putconn(conn)

    def found_down(self, started: float, exc: psycopg.Error) -> None:
        """Record that a connection asked for at `started` (this loop's time) found the server
        down (`is_down(exc)`): the outage began then, if it was not known already."""
        self.refused = None
        self._silent = self._now() - started >= PROBE_AFTER
        if self.since is None:
            # Down since it was first asked: a connection that timed out took
            # `connect_timeout` to tell, and that counts toward the grace.
            self.since = started
        self.error = " ".join(str(exc).split()) or type(exc).__name__

    async def back(self) -> Conn | None:
        """Wait for the server found down to answer again, as a call waiting for a connection
        does (`borrow`), for a pool that is opening (a new event loop's): the connection a check
        found it back on, or None once it answers without one for this caller (another call took
        it, or the server refused the check: connect anew to learn why). `StoreUnavailable` once
        the outage outlasts its grace: past it, after one short check, as a call fails."""
        while True:
            spare = self._take_spare()
            if spare is not None:
                return spare
            past = self.over_grace()
            within = (PROBE_AFTER if self._silent else ANSWERED_WITHIN) if past else None
            conn = await self.probe(self.grace_left() if within is None else within)
            if conn is not None:
                return conn
            if self.over_grace():
                raise self.unavailable()
            if self.down_since() is None:
                return None
            await asyncio.sleep(min(PROBE_AFTER, self.grace_left()))

    async def probe(self, within: float | None = None) -> Conn | None:
        """Check the server, waiting `within` seconds at most (the check goes on without the
        caller). Returns a live connection only when the check found the server back after a
        known outage (the caller uses it, then closes it); otherwise None, with `since` telling
        whether it is down. Calls at the same time share one connection attempt; a finding is
        not reused after it, so a call right after the server is back finds it. A call that
        joined an attempt begun before it asked, which found the server down, tries once more,
        again waiting `within` at most: the server may have come back in between, and the time
        spent on an attempt made before it was back says nothing of how soon it answers now
        (`PROBE_AFTER` at most after an attempt it left unanswered that long: a silent network)."""
        asked = self._now()
        probing = self._start_probe()
        await asyncio.wait({probing}, timeout=within)
        _raise(probing)
        if probing.done() and self.since is not None and self._asked < asked and not self._spare:
            if within is not None and self._silent:
                within = min(within, PROBE_AFTER)  # that attempt went unanswered: so may this
            probing = self._start_probe()
            await asyncio.wait({probing}, timeout=within)
            _raise(probing)
        return self._take_spare()

    async def fresh(self) -> Conn:
        """A new connection set up as the pool's, for a call that must not get another of the
        pool's (a write a read-only server refused: they may all be on that server)."""
        return await self._connect()

    def _take_spare(self) -> Conn | None:
        """The connection a check found the server back on, if no call took it first (the
        calls of another event loop's thread may be after it too)."""
        try:
            return self._spare.pop()
        except IndexError:
            return None

    def _start_probe(self) -> asyncio.Future[None]:
        """The check of the server under way on this event loop, started now if there is none."""
        probing = self._probing = shared(self._probing, self._probe)
        return probing

    async def _probe(self) -> None:
        """Connect once: record the outage or clear it, and keep a connection found back."""
        started = self._asked = self._now()
        try:
            conn = await self._connect()
        except psycopg.Error as exc:
            if is_down(exc):
                self.found_down(started, exc)
            else:
                self.since = None  # it answered: up, for whatever reason it refused us
                self._silent = True  # a later outage is told by its own checks, as the first
                self.refused = " ".join(str(exc).split()) or type(exc).__name__
            return
        self.refused = None
        self._silent = True  # the outage is over: a later one is told by its own checks
        was_down, self.since = self.since is not None, None
        if was_down and not self._spare:
            self._spare.append(conn)  # for the first call to borrow one
            return
        with contextlib.suppress(psycopg.Error):
            await conn.close()

    async def close(self) -> None:
        """Stop a check under way and close the connection a check left for a call: the store
        is closing."""
        probing, self._probing = self._probing, None
        if probing is not None and not probing.done():
            await settle(probing)
        while (spare := self._take_spare()) is not None:
            with contextlib.suppress(psycopg.Error):
                await spare.close()

    def forget(self) -> None:
        """Drop the check of an event loop that is no longer this store's (a connection it
        left for a call is kept: a connection is not bound to a loop)."""
        self._probing = None


def _raise(probing: asyncio.Future[None]) -> None:
    """Raise what failed a check of the server that ended, other than a connection refused."""
    if probing.done() and not probing.cancelled():
        error = probing.exception()
        if error is not None:
            raise error
