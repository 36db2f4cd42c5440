"""A proxy in front of PostgreSQL that shares one server connection between its clients
(pgbouncer's `pool_mode = transaction` or `statement`): signoff keeps prepared statements,
session settings and LISTEN on its connections, which such a proxy hands to other clients
between transactions. The store refuses one as it opens (`shares_backend`), and names it as
the likely cause of the errors it makes all the same (`symptom`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import psycopg

from ..._exceptions import StoreError
from ._borrowed import sever

if TYPE_CHECKING:
    from psycopg.rows import TupleRow

    Conn = psycopg.AsyncConnection[TupleRow]
else:
    Conn = Any

__all__ = ["BACKEND", "SHARED", "beside", "discard", "refused", "shares_backend", "symptom"]

BACKEND = "SELECT pg_backend_pid(), pg_postmaster_start_time()"
"""The server process a connection's statement ran on, and its server's start: two servers
(the hosts of a URL naming several) may each have a process of that number."""

SHARED = (
    "a proxy in front of PostgreSQL (pgbouncer, say) that shares one server connection between "
    "its clients (pool_mode = transaction or statement), which signoff's prepared statements, "
    "session settings and LISTEN do not survive; signoff needs session pooling "
    "(pool_mode = session) or a direct connection"
)

ANSWER_WITHIN = 2.0
"""Seconds the check's second connection has to answer: a proxy sharing the first one's server
connection answers at once (that one is idle); one pooling by session with no server connection
to spare holds the client until one is free, and the check gives up rather than hold the store's
opening for as long."""

_PREPARED = ("42P05", "26000")
"""SQLSTATEs duplicate_prepared_statement and invalid_sql_statement_name."""


def beside(conn: Conn) -> dict[str, str]:
    """Where the check's second connection goes: to the host `conn` reached, not the first of
    a URL's hosts again, which down would cost the check a whole `connect_timeout` more."""
    info = conn.info
    where = {"host": info.host, "port": str(info.port)}
    with contextlib.suppress(psycopg.NotSupportedError):  # libpq before 12: the host alone
        if info.hostaddr:
            where["hostaddr"] = info.hostaddr
    return where


async def shares_backend(mine: Sequence[Any], connecting: asyncio.Future[Conn]) -> bool:
    """Whether a second connection, made while the first (whose `BACKEND` row is `mine`) is
    still open, runs its statement on the same server process: directly, or through a proxy
    pooling by session, two clients connected at once never do. False when it cannot tell (the
    second connection refused, as by a server at its limit of clients, or not answering within
    `ANSWER_WITHIN`), and it may miss a busy proxy, which can hand it another idle one."""
    try:  # its making too: a server slow to take one more must not hold the opening
        conn = await asyncio.wait_for(asyncio.shield(connecting), ANSWER_WITHIN)
    except (StoreError, psycopg.Error, TimeoutError):
        return False
    # Cut, not cancelled: psycopg would wait up to 5 s more for the server to end the query.
    timer = asyncio.get_running_loop().call_later(ANSWER_WITHIN, sever, conn)
    try:
        cur = await conn.execute(BACKEND)
        theirs = await cur.fetchone()
    except psycopg.Error:
        return False
    finally:
        timer.cancel()
        await conn.close()
    return theirs is not None and tuple(theirs) == tuple(mine)


async def discard(connecting: asyncio.Future[Conn]) -> None:
    """Close the check's second connection, or stop its making, whatever became of it."""
    if not connecting.done():
        connecting.cancel()
    await asyncio.wait({connecting})
    if not connecting.cancelled() and connecting.exception() is None:
        with contextlib.suppress(psycopg.Error):
            await connecting.result().close()


def refused(where: str, pid: object) -> StoreError:
    """Why the store at `where` does not open: its two connections reached one process."""
    return StoreError(
        f"cannot open PostgreSQL store {where}: two connections to it, open at once, ran on one "
        f"server process (pg_backend_pid() {pid}), so they pass through {SHARED}. Nothing was "
        "written"
    )


def symptom(exc: psycopg.Error) -> bool:
    """Whether a statement failed as one does on a server connection another client uses too:
    psycopg's prepared statement found taken (42P05) or gone (26000), or another one found
    under its name, its parameters not fitting (08P01 "bind message supplies 2 parameters, but
    prepared statement ... requires 1")."""
    return exc.sqlstate in _PREPARED or (exc.sqlstate == "08P01" and "bind message" in str(exc))
