"""Running a read or a write on the PostgreSQL store's pool, with the retries a lost
connection allows: a read is tried again (`ATTEMPTS` in all), a write again when it was
lost before it was sent or is found not committed. `Transactions` is the part of `Connections`
that does it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

import psycopg
from psycopg import pq
from psycopg.rows import TupleRow

from ..._exceptions import (
    AppendConflict,
    RequestClosed,
    StoreError,
    StoreGone,
    StoreUnavailable,
)
from .._prompt import is_prompt, wrote
from ._borrowed import Borrowed, Pool
from ._outage import Outage
from ._proxy import SHARED, symptom
from ._schema import STORE_SCHEMA
from ._shared import shared

__all__ = ["Conn", "Transactions", "failed"]

T = TypeVar("T")
Conn = psycopg.AsyncConnection[TupleRow]


class Transactions:
    """`_read` and `_write`, and what they use of `Connections`: the attributes its `__init__`
    sets, and its `_get_pool`, `_forget` and `_lacking` for type checkers."""

    request_timeout: float
    operation_timeout: float
    schema: str
    _where: str
    _server_async: bool
    _checking: asyncio.Future[None] | None  # the pool's test (`_after_loss`)
    _outage: Outage

    if TYPE_CHECKING:  # `Connections._get_pool`

        async def _get_pool(self) -> Pool: ...

        def _forget(self) -> None: ...

        async def _lacking(self) -> list[str]: ...  # `Migrations._lacking`

    async def _read(self, body: Callable[[Conn], Awaitable[T]], what: str) -> T:
        """Run a read-only `body`; a lost connection is retried on a fresh one (`ATTEMPTS` in
        all, as a write); one cut for passing `operation_timeout` is not (the server is not
        answering)."""
        pool = await self._get_pool()
        for attempt in range(ATTEMPTS):
            broken = False
            borrowed = self._borrow(pool, attempt)
            try:
                async with borrowed as conn:
                    try:
                        return await body(conn)
                    except psycopg.OperationalError as exc:
                        # libpq may fail to leave pipeline mode on a connection that died
                        # mid-batch before psycopg marks it broken: that is a lost connection.
                        broken = conn.broken or "exit pipeline mode" in str(exc)
                        if broken and not conn.closed:
                            await conn.close()
                        raise
            except psycopg.Error as exc:
                if borrowed.expired:
                    raise self._timed_out(what) from exc
                if isinstance(exc, psycopg.OperationalError) and broken and attempt < ATTEMPTS - 1:
                    await self._after_loss(pool)
                    continue
                if isinstance(exc, _MISSING):
                    raise await self._gone(what, exc) from exc
                raise failed(f"{what} failed at {self._where}", exc) from exc
        raise AssertionError("unreachable")  # pragma: no cover

    def _borrow(
        self, pool: Pool, attempt: int, fresh: bool = False, beside: Pool | None = None
    ) -> Borrowed:
        """A connection for an attempt of a call (a new one, not the pool's, if `fresh`; for a
        lease renewal, `pool` is the lease pool and `beside` the main one): only a first attempt
        may fail soon for want of one (`promptly()`), as a retry's statement may have run
        already."""
        busy_after = self.request_timeout if attempt == 0 and is_prompt() else None
        return Borrowed(pool, self._outage, busy_after, self.operation_timeout, fresh, beside)

    async def _gone(self, what: str, exc: psycopg.Error) -> StoreError:
        """The store's schema, or a table of it, was dropped under this process: what it knew of
        its sessions is forgotten (a schema made anew reuses their row keys for others). A
        schema gone or older is `StoreGone`: opening the store anew migrates it. One still at
        this signoff's version that lacks a table is damaged: a restart makes nothing again, so
        the `StoreError` says to restore it, naming what it lacks."""
        self._forget()
        detail = " ".join(str(exc).split())
        lacking = await self._lacking()
        if lacking:
            names = (
                lacking[0] if len(lacking) == 1 else f"{', '.join(lacking[:-1])} and {lacking[-1]}"
            )
            return StoreError(
                f"{what}: the store's schema {self.schema!r} at {self._where} has schema version "
                f"{STORE_SCHEMA} but lacks {names}, dropped outside signoff: the store is damaged "
                f"({detail}). Nothing was written. Restore it from a backup; neither a restart "
                "nor `signoff db upgrade` makes them again"
            )
        return StoreGone(
            f"{what}: the store's schema {self.schema!r} at {self._where} is gone or incomplete "
            f"({detail}): dropped after this process opened it? Nothing was written. Restart the "
            "process (or close the store) to open the schema there anew, migrated on first use."
        )

    def _timed_out(self, what: str) -> StoreUnavailable:
        return StoreUnavailable(
            f"{what}: PostgreSQL at {self._where} did not answer within "
            f"{self.operation_timeout:g}s (`operation_timeout`); the connection was dropped"
        )

    async def _write(
        self,
        body: Callable[[Conn], Awaitable[T]],
        what: str,
        *,
        committed: Callable[[], Awaitable[bool]] | None = None,
        transaction: bool = True,
        began: Callable[[], bool] | None = None,
        renewal: bool = False,
    ) -> T | None:
        """Run `body`, whose write is one message that is a transaction of its own: one
        statement (sent with its Sync), or statements sent together by the simple protocol.
        The server commits it without waiting for this process, which may freeze (SIGSTOP, a
        paused VM) once it is sent: a pipelined transaction, flushed statement by statement,
        would hold its locks until this process sent its COMMIT, and no server setting ends
        one waiting so. Its statement sets `synchronous_commit` itself (`_sync_setting`).

        The body may read first (unlocked); `began` then says whether it sent its write. A
        connection lost before that is retried; from then (without `began`, as soon as the body
        runs) the outcome is unknown: `committed` (read on a fresh connection) decides; without
        it, or if it cannot tell, the caller gets a `StoreError`. Returns None when the write is
        found committed that way. With `transaction=False`, the body is one idempotent
        statement, retried whenever the connection is lost. A lease `renewal` runs on the
        pool's lease connections (`Pool.leases`), never waiting behind the other calls; on an
        idle one of the main pool if the server refuses the lease pool one (`Borrowed`).
        """
        pool = await self._get_pool()
        beside = None
        if renewal and pool.leases is not None:
            pool, beside = pool.leases, pool
        fresh = False  # a connection opened for the call, not another of the pool's
        for attempt in range(ATTEMPTS):
            phase = "connect"
            broken = False
            borrowed = self._borrow(pool, attempt, fresh, beside)
            try:
                async with borrowed as conn:
                    try:
                        phase = "body" if began is not None or not transaction else "commit"
                        result = await body(conn)
                        phase = "done"
                        wrote()
                        return result
                    except Exception as exc:
                        if phase == "body" and began is not None and began():
                            phase = "commit"  # its write was sent: the server may have run it
                        if isinstance(exc, psycopg.OperationalError):
                            broken = conn.broken
                            if broken and not conn.closed:
                                await conn.close()
                        elif isinstance(exc, _READ_ONLY) and not conn.closed:
                            await conn.close()  # not pooled again: its server takes no writes
                        if not conn.closed and conn.info.transaction_status in _OPEN:
                            with contextlib.suppress(psycopg.Error):
                                await conn.rollback()
                        raise
            except psycopg.OperationalError as exc:
                expired = borrowed.expired
                if not broken and not expired:  # the server answered: it rolled back
                    raise failed(f"{what} failed at {self._where}", exc) from exc
                if not expired:  # a server not answering would hold the check as long
                    await self._after_loss(borrowed.pool)  # the main pool's, for a renewal on it
                if transaction and phase in ("commit", "done"):
                    # The server may or may not have committed before the connection dropped.
                    if committed is not None:
                        try:
                            if await committed():
                                wrote()
                                return None
                        except StoreError:
                            pass
                        else:
                            if attempt < ATTEMPTS - 1:
                                continue  # not committed: safe to try again
                    lost = (
                        f"no answer from {self._where} within {self.operation_timeout:g}s "
                        "(`operation_timeout`)"
                        if expired
                        else f"connection to {self._where} lost"
                    )
                    raise StoreError(
                        f"{what}: {lost} during COMMIT; the outcome is unknown: {exc}"
                    ) from exc
                if expired:  # not sent again: the server is not answering
                    raise self._timed_out(what) from exc
                if attempt < ATTEMPTS - 1:
                    continue  # lost before COMMIT (the server rolled back) or idempotent
                raise failed(f"{what} failed at {self._where}", exc) from exc
            except psycopg.IntegrityError as exc:
                raise AppendConflict(f"{what}: {exc}") from exc
            except _READ_ONLY as exc:
                # A read-only server answered, so nothing was written: a standby that a URL of
                # several hosts led the connection to while the primary restarted, say. A new
                # connection may reach one that takes writes (the pool's others may all be
                # on the standby still: each is replaced as a write meets it).
                if not fresh:
                    fresh = True
                    continue
                detail = " ".join(str(exc).split())
                raise StoreError(
                    f"{what}: PostgreSQL at {self._where} is read-only (a hot standby, or "
                    f"default_transaction_read_only set): nothing was written ({detail})"
                ) from exc
            except psycopg.Error as exc:
                if borrowed.expired:
                    raise self._timed_out(what) from exc
                if exc.sqlstate == _CLOSED:
                    request_id = exc.diag.message_detail or ""
                    raise RequestClosed(
                        f"request {request_id} is no longer pending", [request_id]
                    ) from None
                if isinstance(exc, _MISSING):
                    raise await self._gone(what, exc) from exc
                raise failed(f"{what} failed at {self._where}", exc) from exc
        raise StoreError(f"{what}: connection to {self._where} kept failing")

    async def _after_loss(self, pool: Pool) -> None:
        """A connection was lost, so the others idle in the pool may be too (the server restarted):
        test them now, so that the check and the retry that follow get a live one. Calls losing
        theirs at once share one test and wait for it `CHECK_WAIT` at most (it goes on without
        them: the connections it still holds do not answer, and are out of the pool meanwhile);
        the test runs as a task of its own, as `pool.check()` takes a cancellation for a broken
        connection: the caller's must reach the caller."""
        checking = self._checking = shared(self._checking, pool.check)
        await asyncio.wait({checking}, timeout=min(CHECK_WAIT, self.operation_timeout))

    def _sync_setting(self, synchronous: bool) -> str | None:
        """The `synchronous_commit` a write's transaction needs, None for the server's."""
        if not synchronous:
            return "off"
        return "on" if self._server_async else None  # the server skips flushes: not for us


ATTEMPTS = 3
"""How many times a read, or a write lost before it was sent (or found not committed), is tried
on a lost connection: a server crashing kills the connection a call had and the one its retry
made as the server went down."""

CHECK_WAIT = 1.0
"""Seconds a call that lost its connection waits for the pool's test (`_after_loss`): dead
connections fail it at once; a slower one is a silent server, met as an outage (its grace)."""


def failed(head: str, exc: psycopg.Error) -> StoreError:
    """The `StoreError` of a statement the server refused (`head`: what failed, and where), with
    what to do when a setting of the role or database ended it: the server's message names the
    setting, not the fix; and the likely cause of a prepared statement found taken, gone or
    another's (a proxy sharing the connection, `_proxy`), which the message does not name."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    message = f"{head}: {detail}"
    if symptom(exc):
        return StoreError(f"{message}. The likely cause: {SHARED}")
    setting = next((name for name in _TIMEOUTS if name.replace("_", " ") in detail), None)
    if isinstance(exc, psycopg.errors.QueryCanceled | psycopg.errors.LockNotAvailable) and setting:
        message += (
            f". A {setting} set for this role or database (or by PGOPTIONS) ended signoff's "
            "statement: signoff bounds its own calls (the URL's `operation_timeout`), so "
            f"exempt its role (ALTER ROLE ... SET {setting} = 0) or raise the setting"
        )
    return StoreError(message)


_TIMEOUTS = ("statement_timeout", "lock_timeout")
"""The server settings whose end of a statement `failed` explains; PostgreSQL's message names
each with spaces ("canceling statement due to statement timeout")."""

_OPEN = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)
"""A connection's transaction states that need a ROLLBACK before it goes back to the pool."""

_READ_ONLY = psycopg.errors.ReadOnlySqlTransaction
"""What a write fails with on a server that takes none (SQLSTATE 25006)."""

_MISSING = (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName)
"""What a statement fails with when the store's schema, or a table of it, no longer exists."""

_CLOSED = "SO409"
"""SQLSTATE of `request_closed()`: a resolved request was no longer pending."""
