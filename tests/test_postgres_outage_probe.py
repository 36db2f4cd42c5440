"""The outage probe of the PostgreSQL store (`stores/postgres/_outage.py`), with a fake connect:
what a call learns when it joins a check of the server already under way."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg

from signoff.stores.postgres._outage import Outage

from ._loops import other_loop

STARTING = "connection failed: FATAL:  the database system is starting up"


class Server:
    """A connect function whose attempts are let through one at a time by the test."""

    def __init__(self) -> None:
        self.attempts: list[asyncio.Future[Any]] = []
        self.began = asyncio.Event()

    async def connect(self) -> Any:
        attempt: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.attempts.append(attempt)
        self.began.set()
        return await attempt


class Conn:
    async def close(self) -> None:
        pass


async def test_a_call_joining_a_check_begun_before_the_server_came_back_checks_again() -> None:
    """A check that started while the server was starting ends with "starting up" after it is
    back: a call that asked after the check began must not take that finding as the server's
    state now (it failed with `StoreUnavailable` right after a restart), but look again."""
    server = Server()
    outage = Outage(server.connect, "test", grace=0.0)
    outage.since = asyncio.get_running_loop().time() - 10  # a known outage
    first = asyncio.ensure_future(outage.probe())  # the check under way during the restart
    await server.began.wait()
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(outage.probe(within=5))  # asked once the server is back
    await asyncio.sleep(0.01)
    server.attempts[0].set_exception(psycopg.OperationalError(STARTING))
    assert await first is None and outage.since is not None  # its own finding: down
    for _ in range(100):
        if len(server.attempts) == 2:
            break
        await asyncio.sleep(0.01)
    assert len(server.attempts) == 2, "the later call did not check again"
    conn = Conn()
    server.attempts[1].set_result(conn)
    found: Any = await second
    assert found is conn
    assert outage.since is None


async def test_calls_that_ask_after_a_check_began_and_find_it_down_check_once_more_only() -> None:
    """While the server stays down, a joining call tries once more, not in a loop, and a call
    that started the check itself takes its finding."""
    server = Server()
    outage = Outage(server.connect, "test", grace=0.0)
    own = asyncio.ensure_future(outage.probe())
    await server.began.wait()
    await asyncio.sleep(0.01)
    joined = asyncio.ensure_future(outage.probe(within=5))
    await asyncio.sleep(0.01)
    server.attempts[0].set_exception(psycopg.OperationalError("connection refused"))
    assert await own is None
    for _ in range(100):
        if len(server.attempts) == 2:
            break
        await asyncio.sleep(0.01)
    server.attempts[1].set_exception(psycopg.OperationalError("connection refused"))
    assert await joined is None
    assert len(server.attempts) == 2
    assert outage.since is not None


async def test_a_call_on_another_loop_does_not_join_that_loops_check() -> None:
    """A runtime's sync twins run on a loop of their own: a call on this loop while a check of
    the server begun on that loop is still under way starts a check of its own (it waited on the
    other loop's future, a bare ValueError out of a store call)."""
    gate = threading.Event()
    calls: list[asyncio.AbstractEventLoop] = []

    async def connect() -> Any:
        calls.append(asyncio.get_running_loop())
        if len(calls) == 1:
            await asyncio.to_thread(gate.wait, 10)
        raise psycopg.OperationalError(STARTING)

    outage = Outage(connect, "test", grace=0.0)
    async with other_loop() as other:
        try:
            theirs = asyncio.run_coroutine_threadsafe(outage.probe(5.0), other)
            while not calls:
                await asyncio.sleep(0.01)
            assert await outage.probe(1.0) is None  # its own check, which found the server down
            assert calls == [other, asyncio.get_running_loop()]
            assert outage.since is not None
            gate.set()
            assert await asyncio.wrap_future(theirs) is None
        finally:
            gate.set()


async def test_closing_on_this_loop_cancels_another_loops_check_there_without_waiting_on_it() -> (
    None
):
    """The check under way may be another loop's (a `*_sync` call's during an outage): closing
    the store from this loop cancels it on its own loop and returns (cancelling it from this
    thread and waiting on its future here could wait for ever: nothing wakes this loop)."""
    cancelled = threading.Event()

    async def connect() -> Any:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        raise AssertionError("not cancelled")

    outage = Outage(connect, "test", grace=0.0)
    async with other_loop() as other:
        theirs = asyncio.run_coroutine_threadsafe(outage.probe(30.0), other)
        while outage._probing is None:
            await asyncio.sleep(0.01)
        await asyncio.wait_for(outage.close(), 5)
        assert await asyncio.to_thread(cancelled.wait, 5)  # cancelled on its own loop
        assert await asyncio.wrap_future(theirs) is None
