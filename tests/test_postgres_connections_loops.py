"""One PostgreSQL store used from two event loops that both keep running: a runtime's async
calls on the test's loop while another thread makes its `*_sync` twins (on the runtime's bridge
loop). Each loop has a pool of its own, taken back when it calls again; a call still using its
loop's connection finishes on it; closing the store closes every loop's pool."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import psycopg
import pytest

import signoff as so
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore, _connections
from signoff.stores.postgres._connections import CLOSE_THERE_WAIT
from signoff.testing import ExecutionLog

from ._loops import other_loop
from ._sqlite_store import event
from .test_runtime import refund_agent
from .test_sqlite_store_threads import two_thread_calls

T = TypeVar("T")
ROUNDS = 25


async def test_async_and_sync_calls_from_two_threads(pg_store_url: str) -> None:
    log = ExecutionLog()
    rt = so.Runtime([refund_agent(log)], store=pg_store_url)
    await two_thread_calls(rt, log, ROUNDS)


def _backends(url: str) -> int:
    """Connections to the test's database other than this one."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


async def test_a_call_from_another_loop_while_this_ones_connection_is_in_use(
    pg_store_url: str,
) -> None:
    """The other loop's call gets a pool of its own; the call on this loop that holds a
    connection of the old pool finishes on it; closed on both loops, nothing stays connected."""
    store = PostgresStore(pg_store_url)
    other = asyncio.new_event_loop()

    def serve() -> None:  # as the runtime's bridge does: run, then finish what is left
        other.run_forever()
        left = asyncio.all_tasks(other)
        if left:
            other.run_until_complete(asyncio.gather(*left))
        other.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()

    def there(coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, other).result(10)

    try:
        await store.create_session("ses_1", "a", [event("ses_1", 1, "session.created")], None)
        pool = await store._get_pool()
        async with pool.connection() as conn:
            assert await asyncio.to_thread(there, store.head("ses_1")) == 1
            cur = await conn.execute("SELECT head FROM signoff.sessions WHERE id = 'ses_1'")
            assert await cur.fetchone() == (1,)
        for _ in range(3):  # back and forth: each loop takes its own pool back
            assert await store.head("ses_1") == 1
            assert await store._get_pool() is pool
            assert await asyncio.to_thread(there, store.head("ses_1")) == 1
        # A pool of one each, and its lease connection (opened in the background).
        assert await _backends_become(pg_store_url, 4) == 4
    finally:
        await store.close()  # closes this loop's pool, and the other's on its loop
        other.call_soon_threadsafe(other.stop)
        await asyncio.to_thread(thread.join, 10)
    assert not thread.is_alive()  # no pool left working on it
    assert await _backends_gone(pg_store_url)


async def _backends_become(url: str, expected: int) -> int:
    """How many backends the test's database has once there are `expected` (some connections
    are opened in the background), or after a few seconds if they never are."""
    for _ in range(100):
        count = await asyncio.to_thread(_backends, url)
        if count == expected:
            break
        await asyncio.sleep(0.05)
    return count


async def _backends_gone(url: str) -> bool:
    """Whether the server's backends of closed connections all exit (they do so a moment after
    their client closed them, under load more than one)."""
    for _ in range(100):
        if await asyncio.to_thread(_backends, url) == 0:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_closing_from_the_test_loop_finishes_the_bridge_pools_close_before_it_stops(
    pg_store_url: str,
) -> None:
    """`Runtime.close` on the test's loop closes the pool of its sync bridge on the bridge's
    loop, then stops that loop: the close must be over by then, not cancelled halfway (which
    left the pool's worker tasks pending, an unraisable warning later)."""
    rt = so.Runtime([refund_agent(ExecutionLog())], store=pg_store_url)
    await rt.open()
    await asyncio.to_thread(rt.sessions_sync)  # the bridge's loop now has a pool of its own
    store = rt.store
    assert isinstance(store, PostgresStore)
    await store.sessions()  # the test's loop takes its own pool back; the bridge's is put away
    (bridge_pool,) = store._parked.values()
    await rt.close()
    assert bridge_pool.closed
    assert await _backends_gone(pg_store_url)  # its connections too (their backends exit after)


async def test_a_loop_waiting_while_another_opens_its_pool_is_woken_and_gets_its_own(
    pg_store_url: str,
) -> None:
    """While the bridge loop opens its pool, a call on this loop waits for its turn to open one:
    it must be woken when that opening ends (a lock shared by the two loops was released from the
    other thread, which never woke this loop: a test hung for the 600 s of the pool's next timer)
    and must get a pool of this loop, not the other loop's."""
    store = PostgresStore(pg_store_url)
    async with other_loop() as other:
        entered, gate = threading.Event(), threading.Event()
        connect = store._connect

        async def held_connect() -> Any:
            if asyncio.get_running_loop() is other and not gate.is_set():
                entered.set()
                await asyncio.to_thread(gate.wait, 30)
            return await connect()

        store._connect = held_connect  # type: ignore[method-assign]
        try:
            theirs = asyncio.run_coroutine_threadsafe(store._get_pool(), other)
            assert await asyncio.to_thread(entered.wait, 10)
            ours = asyncio.ensure_future(store._get_pool())
            await asyncio.sleep(0.2)  # this loop's call is waiting now
            started = time.monotonic()
            gate.set()
            our_pool = await asyncio.wait_for(ours, 30)  # nothing else would wake this loop
            assert time.monotonic() - started < 5
            their_pool = await asyncio.wrap_future(theirs)
            assert our_pool is not their_pool
            assert await store._get_pool() is our_pool
            await store.create_session("ses_1", "a", [event("ses_1", 1, "session.created")], None)
            assert await store.head("ses_1") == 1
        finally:
            gate.set()
            await store.close()
    assert await _backends_gone(pg_store_url)


async def test_waits_on_two_loops_by_turns_keep_one_listen_connection_each(
    pg_store_url: str,
) -> None:
    """Waiting for changes on this loop, then on another, back and forth: each loop keeps one
    LISTEN connection of its own, woken by a commit from either loop (each switch left the
    previous listener running and started another: two more backends per round trip); closing
    the store from this loop closes both."""
    store = PostgresStore(pg_store_url)
    async with other_loop() as other:

        def there(coro: Coroutine[Any, Any, T]) -> T:
            return asyncio.run_coroutine_threadsafe(coro, other).result(10)

        try:
            await store.create_session("ses_1", "a", [event("ses_1", 1, "session.created")], None)
            counts = []
            for _ in range(4):
                assert not await store.wait_for_change("ses_1", 0.1)
                assert not await asyncio.to_thread(there, store.wait_for_change("ses_1", 0.1))
                counts.append(await _backends_become(pg_store_url, 6))
            # On each loop a pool of one, its lease connection and a listener.
            assert counts == [6] * 4
            waiting = asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(store.wait_for_change("ses_1", 20), other)
            )
            started = time.monotonic()
            await asyncio.sleep(0.2)
            token = await store.acquire_lease("ses_1", "w", 30.0, 1.0)
            assert token is not None
            await store.commit(
                Commit(
                    session_id="ses_1",
                    expected_seq=1,
                    events=[event("ses_1", 2)],
                    lease_token=token,
                )
            )
            assert await waiting  # woken by the commit on this loop, not by its timeout
            assert time.monotonic() - started < 5
        finally:
            await store.close()
    assert await _backends_gone(pg_store_url)


async def test_closing_while_another_loop_is_blocked_waits_for_it_once_not_per_connection(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another loop's pool and listener are closed on that loop, each waited for up to
    `CLOSE_THERE_WAIT`: one after the other, a loop blocked by its app's code held `close` up
    for as many waits as it had pool and listener (4 s). They are waited for together (the
    waits are counted: both at once), within one wait's time and a busy machine's delay."""
    waiting, most = [0], [0]
    wait_there = _connections._on_its_loop

    async def counted(*args: Any) -> None:
        waiting[0] += 1
        most[0] = max(most[0], waiting[0])
        try:
            await wait_there(*args)
        finally:
            waiting[0] -= 1

    monkeypatch.setattr(_connections, "_on_its_loop", counted)
    store = PostgresStore(pg_store_url)
    async with other_loop() as other:

        def there(coro: Coroutine[Any, Any, T]) -> T:
            return asyncio.run_coroutine_threadsafe(coro, other).result(10)

        await store.create_session("ses_1", "a", [event("ses_1", 1, "session.created")], None)
        assert not await asyncio.to_thread(there, store.wait_for_change("ses_1", 0.1))
        await store.head("ses_1")  # this loop's pool: the other's is put away
        (pool,) = store._parked.values()
        other.call_soon_threadsafe(time.sleep, 2.5 * CLOSE_THERE_WAIT)  # its app's code blocks it
        started = time.monotonic()
        await store.close()
        assert most == [2]  # the listener's and the pool's, at once
        assert time.monotonic() - started < 2 * CLOSE_THERE_WAIT  # not for as long as it blocks
        await asyncio.to_thread(there, _others_done())  # closed there once that loop runs again
        assert pool.closed
    assert await _backends_gone(pg_store_url)


async def _others_done() -> None:
    """Wait for the running loop's other tasks to end."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others)
