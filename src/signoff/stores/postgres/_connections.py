"""The PostgreSQL store's connections: the pool, the schema migrated when it first opens
(`_migrations`), and how each connection is set up. `Connections` is the base class of
`PostgresStore`; its reads, leases and writes are built on `_read` and `_write`
(`_transactions`)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import psycopg
from psycopg import conninfo as _conninfo
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from ..._any_loop import blocked
from ..._exceptions import (
    StoreError,
    StoreUnavailable,
    UsageError,
)
from ..._settings import flag, seconds, whole
from .. import _without_password
from .._base import FaultHook, older_schema
from .._codec import PerSession, Tail, Tails
from .._prompt import REQUEST_WAIT
from . import _schema
from ._borrowed import LEASE_CONNECTIONS, OPERATION_TIMEOUT, Pool
from ._changes import Listener
from ._migrations import Migrations
from ._outage import GRACE, PROBE_AFTER, Outage, is_down
from ._proxy import BACKEND, beside, discard, refused, shares_backend
from ._shared import settle
from ._transactions import Conn
from ._url import (
    check_parameters,
    describe,
    number,
    schema_name,
    split_options,
    unparsable,
    with_libpq_defaults,
    with_schema,
)

__all__ = ["Conn", "Connections", "Seen", "storable"]


def storable(*texts: str | None) -> bool:
    """Whether PostgreSQL can hold these texts: it refuses a NUL in text, so an id or a filter
    with one names nothing stored (SQLite just finds no match), rather than being an error."""
    return not any(t is not None and "\x00" in t for t in texts)


class Seen(NamedTuple):
    """A session's state as this store last saw it, which its next commit guesses from."""

    head: int
    audit_n: int
    audit_hash: bytes | None
    turn_seq: int | None
    """The row naming the turn of the event at `head`: the last at or before it naming one."""
    turn: str | None


class Connections(Migrations):
    """What every part of `PostgresStore` stands on: its settings, its pool (opened, and the
    schema migrated, on first use), `_read` and `_write`, and what it remembers of sessions."""

    def __init__(
        self,
        url: str,
        *,
        schema: str | None = None,
        min_size: int | None = None,
        max_size: int | None = None,
        connect_timeout: float | None = None,
        timeout: float | None = None,
        poll_interval: float = 1.0,
        migrate: bool = True,
        grace: float | None = None,
        request_timeout: float | None = None,
        operation_timeout: float | None = None,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("postgresql://", "postgres://")):
            shown = _without_password(url) if isinstance(url, str) else url
            raise StoreError(f"not a PostgreSQL URL: {shown!r} (expected postgresql://…)")
        # As given, for a copy of this store (`PostgresStore._unopened_copy`): a setting taken
        # from the URL (or its default) stays the URL's there, as here.
        self._given: dict[str, Any] = {
            "min_size": min_size,
            "max_size": max_size,
            "connect_timeout": connect_timeout,
            "timeout": timeout,
            "poll_interval": poll_interval,
            "grace": grace,
            "request_timeout": request_timeout,
            "operation_timeout": operation_timeout,
        }
        dsn, options = split_options(url)
        check_parameters(dsn)
        schema = schema_name(schema, options)
        # Naming the schema given as an argument: what opens the store again from its URL alone
        # (the `--store` a command suggests, a process handed it) must open this schema.
        self.url = with_schema(url, schema)
        self.schema = schema
        self.channel = f"{schema}_changes"
        # Given here, these win over the URL's: each is checked, as 0 no longer means "unset"
        # (`connect_timeout` is, by `with_libpq_defaults`).
        for name, size in (("min_size", min_size), ("max_size", max_size)):
            if size is not None:
                whole(name, size, least=1)
        for name, value in (
            ("timeout", timeout),
            ("grace", grace),
            ("request_timeout", request_timeout),
            ("operation_timeout", operation_timeout),
        ):
            if value is not None:
                seconds(name, value)
        seconds("poll_interval", poll_interval)
        self.min_size = min_size if min_size is not None else number(options, "pool_min", int, 1)
        self.max_size = max_size if max_size is not None else number(options, "pool_max", int, 10)
        self.max_given = max_size is not None or "pool_max" in options  # `Leases.fit_pool`
        if not 1 <= self.min_size <= self.max_size:
            error = StoreError if min_size is None and max_size is None else UsageError
            raise error(f"pool sizes need 1 <= min <= max: {self.min_size}, {self.max_size}")
        # Every connection gets these, the pool's, the LISTEN one and the outage probe's alike.
        dsn, self.connect_timeout = with_libpq_defaults(dsn, connect_timeout)
        self.timeout = (
            timeout if timeout is not None else number(options, "pool_timeout", float, 30.0)
        )
        # How long a call made for an HTTP request (`promptly()`) waits for a busy pool.
        self.request_timeout = (
            request_timeout
            if request_timeout is not None
            else number(options, "request_pool_timeout", float, REQUEST_WAIT)
        )
        # How long a call may wait on its connection before it is cut (`Borrowed`).
        self.operation_timeout = (
            operation_timeout
            if operation_timeout is not None
            else number(options, "operation_timeout", float, OPERATION_TIMEOUT)
        )
        self.poll_interval = poll_interval
        grace = grace if grace is not None else number(options, "outage_grace", float, GRACE)
        self.auto_migrate = flag("migrate", migrate)  # "no" upgraded the store it was to spare
        self._dsn = dsn
        # Where errors and logs say the store is: a schema other than the default is another
        # store at the same server, so it is shown too (`_server` where the schema is named).
        self._server = describe(dsn)
        self._where = self._server + ("" if schema == "signoff" else f"?schema={schema}")
        self._pool: Pool | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Whether a pool was opened since the store was made or closed: a new loop's opening
        # then waits out an outage as the calls do (`_open_pool`).
        self._opened = False
        self._closes = 0  # how many times it was closed: an opening it overtook is dropped
        # The pools of other event loops still running (a runtime's async calls and its sync
        # twins on its bridge loop), each taken back when its loop calls again.
        self._parked: dict[asyncio.AbstractEventLoop, Pool] = {}
        # Those loops run in other threads: who holds the pool changes under this lock, and
        # each loop opens its pool under an asyncio lock of its own (one loop's lock released
        # from another thread would not wake the loop waiting on it).
        self._swap = threading.Lock()
        self._open_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = (
            weakref.WeakKeyDictionary()
        )
        self._server_async = False
        self._checking: asyncio.Future[None] | None = None  # the pool's test (`_after_loss`)
        self._fault: FaultHook | None = None
        # A commit guesses the session's state from what this store last saw of it, so it needs
        # no round trip to read it first; the guess is checked in the statement that writes,
        # under the session's row lock.
        self._state: PerSession[Seen] = PerSession()
        self._tails: Tails[Tail | None] = Tails()
        # The head each session had when this store granted a lease on it, by token, with that
        # event's stored type, time and turn (`granted_head`): the drive under that lease needs
        # no round trip to read it, nor to check it is the event its cached state ends at.
        self._granted: PerSession[tuple[int, int, Sequence[Any] | None]] = PerSession()
        # Claims whose connection was lost and that were sent again (`Leases.claim`): by owner,
        # each one's lease expiry and the sessions the resend took.
        self._unsure: dict[str, list[tuple[float, list[str]]]] = {}
        # Each event loop that waits for changes has its own LISTEN connection and waiters, kept
        # while that loop runs: a waiter must be woken from its own loop's thread.
        self._listeners: dict[asyncio.AbstractEventLoop, Listener] = {}
        self._outage = Outage(self._probe_connect, self._where, grace)
        self._s = f'"{schema}"'

    # -- lifecycle ----------------------------------------------------------------------------

    async def open(self) -> None:
        await self._get_pool()

    async def _get_pool(self) -> Pool:
        loop = asyncio.get_running_loop()
        pool = self._pool
        if pool is not None and self._loop is loop:
            return pool
        with self._swap:
            lock = self._open_locks.get(loop)
            if lock is None:
                lock = self._open_locks[loop] = asyncio.Lock()
        async with lock:
            with self._swap:
                if self._pool is not None and self._loop is loop:
                    return self._pool
                if self._pool is not None:
                    self._abandon()  # another loop's (or a loop gone: a second asyncio.run())
                parked = self._parked.pop(loop, None)
                if parked is not None and not parked.closed:
                    self._pool, self._loop = parked, loop
                    return parked
            closes = self._closes
            pool = await self._open_pool(closes)
            with self._swap:
                overtaken = self._closes != closes
                if not overtaken:
                    if self._pool is not None:
                        self._abandon()  # another loop's, taken while this one was opening
                    self._pool, self._loop = pool, loop
                    self._opened = True
            if overtaken:
                await pool.close()
                raise self._closed_meanwhile()
            return pool

    def _closed_meanwhile(self) -> StoreError:
        """The store was closed while a call of another event loop opened that loop's pool
        (waiting out an outage, say): the pool is not kept on a closed store."""
        return StoreError(
            f"PostgreSQL store {self._where} was closed while this call opened its connections"
        )

    async def _open_pool(self, closes: int) -> Pool:
        """A new pool of this event loop, once the schema is checked (and migrated if allowed).
        For a store open already (a pool of another loop, or this loop's earlier one), a server
        found down is waited for as a call waits for a connection (`Outage.back`), up to the
        outage grace, unless the store is closed meanwhile (`closes`: its count of closes when
        the opening began); opening a store fails at once (`StoreUnavailable`)."""
        riding = self._opened
        outage = self._outage
        conn = await outage.back() if riding and outage.down_since() is not None else None
        while True:
            if self._closes != closes:
                if conn is not None:
                    await conn.close()
                raise self._closed_meanwhile()
            started = asyncio.get_running_loop().time()
            try:
                checking, conn = conn or await self._connect(), None
                await self._check(checking, proxy=not riding)  # once the store was opened
                return await self._filled(riding)
            except StoreUnavailable as exc:
                down = exc.__cause__
                if not riding or not isinstance(down, psycopg.Error):
                    raise
                outage.found_down(started, down)
                conn = await outage.back()

    async def _check(self, conn: Conn, *, proxy: bool) -> None:
        """On a connection just made, refuse a proxy sharing server connections (if `proxy`:
        with a second connection to the same host, made meanwhile: once this one is, so that a
        server with room for one more connection still takes this one), read the server's
        settings and the schema's version (migrating it if need be), then close both."""
        second: asyncio.Future[Conn] | None = None
        try:
            if proxy:
                second = asyncio.ensure_future(self._connect_raw(**beside(conn)))
            cur = await conn.execute(f"{BACKEND}, current_setting('synchronous_commit')")
            row = await cur.fetchone()
            assert row is not None  # a SELECT without FROM returns its row
            if second is not None:
                await self._refuse_shared(row[:2], second)
            self._server_async = row[2] == "off"
            version = await self._read_version(conn)
            self._refuse_newer(version)
            if version < _schema.STORE_SCHEMA:
                if not self.auto_migrate:
                    where = f"PostgreSQL store {self._server} (schema {self.schema!r})"
                    raise older_schema(where, version, _schema.STORE_SCHEMA)
                await self._migrate(conn)
        except psycopg.Error as exc:
            raise self._opening_failed("cannot read settings", exc) from exc
        finally:
            await conn.close()
            if second is not None:
                await discard(second)

    async def _refuse_shared(self, mine: Sequence[Any], second: asyncio.Future[Conn]) -> None:
        """Refuse a proxy that shares one server connection between its clients (`_proxy`),
        before anything is written: the first connection's process (`mine`) runs the second's
        statement too, though both are open."""
        if await shares_backend(mine, second):
            raise refused(self._where, mine[0])

    async def _filled(self, riding: bool) -> Pool:
        """A new pool, open with its `min_size` connections. If `riding` (the store is open
        already), a server found down meanwhile is `StoreUnavailable` at once, for the caller to
        wait for as an outage, rather than a `StoreError` after the pool's whole timeout."""
        pool = self._new_pool(self.min_size, self.max_size, "")
        # Lease renewals have connections of their own: behind the process's other calls in a
        # busy pool (drives just claimed, the pool still growing one connection at a time),
        # they waited past their deadline and the lease lapsed under a live drive, whose call
        # another worker then ran again. One is kept from now on (opened in the background):
        # opened only when a drive first renewed, it was refused by a server full by then
        # (max_connections), and every renewal failed while the main pool sat idle.
        pool.leases = self._new_pool(1, LEASE_CONNECTIONS, "-leases")
        try:
            opening = asyncio.ensure_future(pool.open(wait=True, timeout=self.timeout))
            try:
                while not opening.done():
                    await asyncio.wait({opening}, timeout=PROBE_AFTER)
                    refused = pool.refused
                    if riding and not opening.done() and refused is not None and is_down(refused):
                        detail = " ".join(str(refused).split()) or type(refused).__name__
                        raise StoreUnavailable(
                            f"cannot connect to PostgreSQL at {self._where}: {detail}"
                        ) from refused
                opening.result()
            finally:
                await settle(opening)
            await pool.leases.open()
            # Its first connection made (or refused: a server with room for `pool_min` alone
            # still opens) before the store is used, not set up under its first calls.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(pool.leases.tried.wait(), self.timeout)
        except PoolTimeout as exc:
            await pool.close()
            raise self._unfilled(pool, exc) from exc
        except BaseException:
            await pool.close()
            raise
        return pool

    def _unfilled(self, pool: Pool, exc: PoolTimeout) -> StoreError:
        """Why the pool could not open its `min_size` connections within `timeout`: psycopg_pool
        says only "pool initialization incomplete", its connections' failures going to a log
        the CLI does not show ("too many clients already": `pool_min` past what the server, the
        role or the database takes)."""
        refused = pool.refused
        if refused is None:  # slow, not refused
            why = f"{exc}. Lower pool_min, or raise pool_timeout"
        else:
            why = (
                f"{' '.join(str(refused).split())}. Lower pool_min, or let the server take more "
                "connections (max_connections, or the role's or database's CONNECTION LIMIT)"
            )
        return StoreError(
            f"cannot connect to PostgreSQL at {self._where}: the pool opened {pool.opened} of "
            f"the {self.min_size} connections it keeps (pool_min) within {self.timeout:g}s "
            f"(pool_timeout): {why}"
        )

    def _new_pool(self, min_size: int, max_size: int, suffix: str) -> Pool:
        """A pool of this store's connections, not opened yet."""
        return Pool(
            self._dsn,
            min_size=min_size,
            max_size=max_size,
            timeout=self.timeout,
            kwargs={
                "autocommit": True,
                "client_encoding": "utf8",  # whatever the role's or database's default
            },
            open=False,
            name=f"signoff-{self.schema}{suffix}",
            reconnect_timeout=RECONNECT_WITHIN,
            reconnect_failed=_reconnect_again,
            configure=partial(_configure, operation_timeout=self.operation_timeout),
            operation_timeout=self.operation_timeout,
        )

    @property
    def _changes(self) -> Listener:
        """The running event loop's listener, started by its first wait."""
        loop = asyncio.get_running_loop()
        with self._swap:
            listener = self._listeners.get(loop)
            if listener is None:
                self._listeners = {
                    there: kept for there, kept in self._listeners.items() if not there.is_closed()
                }
                name = f"signoff-listen-{self.schema}"
                listener = self._listeners[loop] = Listener(self.channel, self._connect, name)
        return listener

    def _abandon(self) -> None:
        """Put away the pool of another event loop (under `_swap`): kept for its loop's next call
        while that loop runs, forgotten once it is closed (its connections close when collected)."""
        if self._pool is not None and self._loop is not None:
            self._parked[self._loop] = self._pool
        self._parked = {loop: pool for loop, pool in self._parked.items() if not loop.is_closed()}
        self._pool = None
        self._loop = None
        self._checking = None
        self._outage.forget()

    async def _connect(self) -> Conn:
        """A fresh autocommit connection, or a `StoreError` saying why there is none."""
        try:
            _conninfo.conninfo_to_dict(self._dsn)
        except psycopg.Error as exc:
            raise StoreError(unparsable(exc)) from exc
        try:
            return await self._connect_raw()
        except psycopg.Error as exc:
            detail = str(exc).strip() or type(exc).__name__
            error = StoreUnavailable if is_down(exc) else StoreError
            raise error(f"cannot connect to PostgreSQL at {self._where}: {detail}") from exc

    async def _connect_raw(self, **where: Any) -> Conn:
        return await psycopg.AsyncConnection.connect(
            self._dsn,
            autocommit=True,
            # A role's or database's LATIN1, say, would make any text outside it a raw
            # UnicodeEncodeError.
            client_encoding="utf8",
            **where,
        )

    async def _probe_connect(self) -> Conn:
        """A connection set up as the pool's are, for the outage probe to hand to a call."""
        conn = await self._connect_raw()
        try:
            await _configure(conn, self.operation_timeout)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def close(self) -> None:
        here = asyncio.get_running_loop()
        with self._swap:
            self._opened = False
            self._closes += 1
            foreign = self._pool is not None and self._loop is not here
            if foreign:
                self._abandon()
            parked, self._parked = self._parked, {}
            listeners, self._listeners = self._listeners, {}
        there: list[Awaitable[None]] = []  # other loops' closes, waited for all at once
        for loop, listener in listeners.items():
            if loop is here:
                await listener.stop()
            else:
                there.append(_on_its_loop(loop, listener.stop))
        for loop, spare in parked.items():
            if loop is here:
                await spare.close()
            else:
                there.append(_on_its_loop(loop, spare.close))
        await asyncio.gather(*there)
        if foreign:  # what probes belonged to the other loop, and went with it
            return
        with self._swap:
            pool, self._pool = self._pool, None
            self._loop = None
        if pool is not None:
            await pool.close()
        checking, self._checking = self._checking, None
        if checking is not None and checking.get_loop() is here:
            await asyncio.wait({checking})  # each connection it holds is cut at its deadline
        elif checking is not None:  # another loop's, started after its pool was put away
            await settle(checking)
        await self._outage.close()

    def set_fault_hook(self, hook: FaultHook | None) -> None:
        self._fault = hook

    def _forget(self) -> None:
        """Forget what this store knew of its sessions: their schema was dropped (`_gone`)."""
        self._state = PerSession()
        self._tails = Tails()
        self._granted = PerSession()

    def _remember(self, session_id: str, state: Seen) -> None:
        self._state[session_id] = state
        self._tails.forget(session_id, past=state.head)

    def _moved(self, session_id: str, row: Sequence[Any]) -> int:
        """The head of a session row read as `head, audit_n, audit_hash, turn seq, turn`: the
        guess a commit makes of a session this store works on is kept up with it, so a commit
        after another process's needs no round trip to read its state first."""
        head = int(row[0])
        self._tails.forget(session_id, past=head)
        guess = self._state.get(session_id)
        if guess is not None and guess.head != head:
            digest = None if row[2] is None else bytes(row[2])
            turn_seq = None if row[3] is None else int(row[3])
            self._remember(session_id, Seen(head, int(row[1]), digest, turn_seq, row[4]))
        return head

    async def _session_key(self, conn: Conn, session_id: str) -> int | None:
        """The session's row key, read anew: none is kept between calls, since the schema may
        be dropped and made anew (a restore) between them, its keys reused by other sessions."""
        if not storable(session_id):
            return None
        cur = await conn.execute(f"SELECT sk FROM {self._s}.sessions WHERE id=%s", (session_id,))
        row = await cur.fetchone()
        return None if row is None else int(row[0])

    def _before(self, label: str) -> None:
        if self._fault is not None:
            self._fault("before", label)

    def _after(self, label: str) -> None:
        if self._fault is not None:
            self._fault("after", label)


async def _configure(conn: Conn, operation_timeout: float) -> None:
    """Settings each pooled connection needs whatever a DBA set for the role or database: READ
    COMMITTED, so a commit or claim that waited for a row lock goes on with the row's newest
    version (a stricter default made it fail with "could not serialize access"); doubles sent in
    full, not rounded to 15 digits (`extra_float_digits = 0`: times read back differed). Each
    statement is prepared the first time it runs, not the 6th as psycopg's default has it: a
    turn runs the same few statements, and every connection of the pool paid the warm-up.

    A transaction left idle for half `operation_timeout` is ended by the server: its process
    froze between two of its statements (SIGSTOP, a paused virtual machine), and its row locks
    would block every other writer of the session for as long (its kernel still answers, so no
    TCP setting notices). A pipelined one waiting for its client is not idle to the server and
    is not ended (nor is it on PostgreSQL 15 by any other setting), so no write leaves a lock
    waiting for its client: `commit`, `claim` and `create_session` are one statement sent with
    its Sync, and `record_audit` its two in one message, each committed by the server alone."""
    idle = min(max(int(operation_timeout * 500), 1), 2**31 - 1)  # milliseconds, a C int
    # standard_conforming_strings on: psycopg quotes a bytea array bound on the client (the
    # simple protocol of `record_audit`) as if it were, whatever the server says, so with a
    # DBA's "off" the audit hashes were stored as the text of their hex digits, and every
    # tool-setting entry failed verification ("content does not match"). array_nulls on: it
    # writes a None in such an array as NULL, which "off" reads as the text 'NULL' (every
    # `record_audit` failed: "invalid input syntax for type bigint").
    await conn.execute(
        "SET default_transaction_isolation = 'read committed'; SET extra_float_digits = 3; "
        f"SET idle_in_transaction_session_timeout = {idle}; SET standard_conforming_strings = on; "
        "SET array_nulls = on"
    )
    conn.prepare_threshold = 0  # after the SETs: a prepared statement holds one command only


RECONNECT_WITHIN = 5.0
"""Seconds the pool retries a lost connection, each wait longer, before starting over at once:
psycopg_pool's own 5 minutes let the waits grow so long that a database back after an outage
went unused, every call failing, for up to as long again as it had been down."""


async def _reconnect_again(pool: AsyncConnectionPool[Conn]) -> None:
    """The pool gave up reconnecting: with calls waiting for a connection (`Pool.waiting`, not
    psycopg_pool's count, which keeps a cancelled wait), start again now (`check()` grows an
    empty pool); without, the next call starts it."""
    waiting = (
        pool.waiting if isinstance(pool, Pool) else pool.get_stats().get("requests_waiting", 0)
    )
    if not pool.closed and waiting:
        with contextlib.suppress(psycopg.Error):
            await pool.check()


CLOSE_THERE_WAIT = 2.0
"""Seconds `close` waits for another loop to close that loop's pool (or listener) before it goes
on."""


async def _on_its_loop(
    loop: asyncio.AbstractEventLoop, close: Callable[[], Awaitable[None]]
) -> None:
    """Close a pool or listener on its own event loop, which still runs, and wait for it there
    (a while): a store closed from another loop must not leave that loop's connections open,
    and that loop may be stopped right after (a runtime's sync bridge), which would cancel a
    close still under way and leave the pool's workers pending. Not waited for on a loop a
    `*_sync` call blocks (`_any_loop.blocked`): it runs the close once that call returns."""
    if loop.is_closed() or not loop.is_running():
        return  # its connections went, or go, with it

    async def closing() -> None:
        await close()

    try:
        done = asyncio.run_coroutine_threadsafe(closing(), loop)
    except RuntimeError:  # that loop closed meanwhile
        return
    if blocked(loop):  # on the `*_sync` call closing this store: it runs the close once back
        return
    # Polled, not awaited through a wrapping future: giving up on that would cancel the close
    # over there, and its result could arrive after this loop has closed.
    until = time.monotonic() + CLOSE_THERE_WAIT
    while not done.done() and time.monotonic() < until:
        await asyncio.sleep(0.005)
    if done.done() and not done.cancelled():
        with contextlib.suppress(Exception):  # closing is best effort, as for our own pool
            done.result()
