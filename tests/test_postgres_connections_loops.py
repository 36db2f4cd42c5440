"""One PostgreSQL store used from two event loops that both keep running: a runtime's async
calls on the test's loop while another thread makes its `*_sync` twins (on the runtime's bridge
loop). Each loop has a pool of its own, taken back when it calls again; a call still using its
loop's connection finishes on it; closing the store closes every loop's pool."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Coroutine
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import signoff as so
from signoff._exceptions import StoreError, StoreUnavailable
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore, _connections
from signoff.stores.postgres._borrowed import Pool
from signoff.stores.postgres._connections import CLOSE_THERE_WAIT
from signoff.stores.postgres._outage import PROBE_AFTER
from signoff.testing import ExecutionLog

from ._loops import other_loop
from ._pg_events import new_session
from ._relay import Relay
from ._sqlite_store import event
from .test_postgres_outage import with_options
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


class _Restarting(Relay):
    """A relay to PostgreSQL that can be down as a server restarting is: the connections open
    are cut and new ones reset at once (as a port nothing listens on refuses them) until `back()`;
    each one refused is put on `refusals`."""

    def __init__(self, host: str, port: int) -> None:
        super().__init__(host, port)
        self.down = False
        self.refusals: asyncio.Queue[None] = asyncio.Queue()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.down:
            writer.transport.abort()
            self.refusals.put_nowait(None)
            return
        await super()._accept(reader, writer)

    def stop(self) -> None:
        self.down = True
        self.silence()
        for writer in self.writers:
            writer.transport.abort()
        self.writers = []

    def back(self) -> None:
        self.down = False


@contextlib.asynccontextmanager
async def _restarting(url: str, **options: Any) -> AsyncIterator[tuple[_Restarting, str]]:
    """A `_Restarting` relay in front of the server of `url`, and the URL through it with
    `options` added."""
    params = conninfo_to_dict(url)
    relay = _Restarting(str(params["host"]), int(str(params["port"])))
    port = await relay.start()
    try:
        yield relay, with_options(url.replace(f":{params['port']}/", f":{port}/"), **options)
    finally:
        await relay.close()


async def _refused_again(relay: _Restarting, calling: asyncio.Future[Any]) -> None:
    """Wait for the relay to refuse another connection: `calling` must still be waiting then."""
    refused = asyncio.ensure_future(relay.refusals.get())
    try:
        await asyncio.wait({calling, refused}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        assert not calling.done(), f"it did not wait for the server: {calling.exception()!r}"
        assert refused.done(), "no connection was tried within 10 s"
    finally:
        refused.cancel()


def _there(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    """`coro` run on the other loop, as a future of this one."""
    return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


async def test_a_new_loops_first_call_during_a_restart_waits_for_the_server(
    pg_store_url: str,
) -> None:
    """An open store's first call from another event loop (a `*_sync` twin's, on the runtime's
    bridge loop; a second `asyncio.run()`) made while the server restarts waits for it, as a
    call on a loop that has its pool does, and goes through once it is back: its pool's opening
    failed at once ("cannot connect to PostgreSQL"), a restart not ridden out."""
    loop = asyncio.get_running_loop()
    async with _restarting(pg_store_url, outage_grace=30) as (relay, url):
        store = PostgresStore(url)
        async with other_loop() as other:
            try:
                sid = await new_session(store)
                relay.stop()
                calling = _there(other, store.head(sid))
                for _ in range(2):  # refused, and tried again
                    await _refused_again(relay, calling)
                relay.back()
                started = loop.time()
                assert await asyncio.wait_for(calling, 20) == 1
                assert loop.time() - started < 5  # soon after it is back
                assert await store.head(sid) == 1  # this loop's pool, back too
            finally:
                await store.close()


async def test_a_store_closed_while_a_new_loop_waits_out_an_outage_keeps_no_pool(
    pg_store_url: str,
) -> None:
    """Closed (on its first loop) while another loop's first call waits for the server: once the
    server is back, that call fails (`StoreError`, "closed") and no pool is left on the closed
    store. Before, the call opened a pool the closed store kept, its connections open for good."""
    async with _restarting(pg_store_url, outage_grace=30) as (relay, url):
        store = PostgresStore(url)
        async with other_loop() as other:
            try:
                sid = await new_session(store)
                relay.stop()
                calling = _there(other, store.head(sid))
                await _refused_again(relay, calling)
                await store.close()
                relay.back()
                with pytest.raises(StoreError, match="was closed while this call opened"):
                    await asyncio.wait_for(calling, 20)
                assert store._pool is None and not store._opened
            finally:
                await store.close()


async def test_a_new_loops_first_call_fails_as_a_call_does_once_the_outage_outlasts_its_grace(
    pg_store_url: str,
) -> None:
    """The server stays down: the call waits out the grace, then fails with the
    `StoreUnavailable` a call on a loop with its pool gives ("PostgreSQL unavailable ... for
    1.0s"), and a call after it fails at once."""
    loop = asyncio.get_running_loop()
    async with _restarting(pg_store_url, outage_grace=1) as (relay, url):
        store = PostgresStore(url)
        async with other_loop() as other:
            try:
                sid = await new_session(store)
                relay.stop()
                started = loop.time()
                with pytest.raises(StoreUnavailable) as caught:
                    await _there(other, store.head(sid))
                took = loop.time() - started
                assert "PostgreSQL unavailable" in str(caught.value), caught.value
                assert 1 <= took < 1 + 4, took
                started = loop.time()
                with pytest.raises(StoreUnavailable, match="PostgreSQL unavailable"):
                    await _there(other, store.head(sid))
                assert loop.time() - started < 3 * PROBE_AFTER + 1
            finally:
                await store.close()


async def test_a_server_gone_between_a_new_loops_check_and_its_pool_is_an_outage_too(
    pg_store_url: str,
) -> None:
    """Down after the new loop's first connection read the schema, before its pool connected:
    the same outage, `StoreUnavailable` once the grace is over, not a `StoreError` after the
    pool's whole timeout ("the pool opened 0 of the 1 connections")."""
    loop = asyncio.get_running_loop()
    async with _restarting(pg_store_url, outage_grace=1, pool_timeout=8) as (relay, url):
        store = PostgresStore(url)
        new_pool = store._new_pool

        def going_down(min_size: int, max_size: int, suffix: str) -> Pool:
            if asyncio.get_running_loop() is not loop:
                store._new_pool = new_pool  # type: ignore[method-assign]
                relay.down = True  # read by the relay on this loop: new connections are reset
            return new_pool(min_size, max_size, suffix)

        async with other_loop() as other:
            try:
                sid = await new_session(store)
                store._new_pool = going_down  # type: ignore[method-assign]
                started = loop.time()
                with pytest.raises(StoreUnavailable) as caught:
                    await _there(other, store.head(sid))
                assert "PostgreSQL unavailable" in str(caught.value), caught.value
                assert loop.time() - started < 1 + 4
                relay.back()
                assert await _there(other, store.head(sid)) == 1
            finally:
                await store.close()


async def test_a_new_loops_pool_refused_by_a_server_that_is_up_fails_at_once(
    pg_store_url: str,
) -> None:
    """A refusal that is no outage (here a database not accepting connections) is not waited
    out: the new loop's call fails at once with a `StoreError` saying why."""
    name = str(conninfo_to_dict(pg_store_url)["dbname"])
    admin_url = pg_store_url.replace(f"/{name}", "/postgres", 1)

    def allow(allowed: bool) -> None:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS {allowed}')

    loop = asyncio.get_running_loop()
    store = PostgresStore(with_options(pg_store_url, outage_grace=30))
    async with other_loop() as other:
        try:
            sid = await new_session(store)
            await asyncio.to_thread(allow, False)
            started = loop.time()
            with pytest.raises(StoreError, match="not currently accepting connections") as caught:
                await _there(other, store.head(sid))
            assert not isinstance(caught.value, StoreUnavailable)
            assert loop.time() - started < 5
        finally:
            await asyncio.to_thread(allow, True)
            await store.close()
