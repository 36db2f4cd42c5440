"""A lease is renewed even while every pooled connection of the process is busy: a renewal that
waited behind the process's own store calls for a connection (a worker that just claimed its
sessions, its pool still growing, on a loaded machine) let the lease lapse under a live drive,
whose call another worker then ran again (the chaos test's `start` in a process never killed)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import signoff as so
from signoff.stores.postgres import PostgresStore
from signoff.stores.postgres._connections import _reconnect_again

from ._pg_events import new_session
from .test_leasing_clock import _agent
from .test_postgres import admin


def _one_connection(url: str) -> str:
    return url + ("&" if "?" in url else "?") + "pool_max=1"


async def _hold_the_only_connection(store: PostgresStore, seconds: float) -> None:
    async def body(conn: Any) -> None:
        await conn.execute("SELECT pg_sleep(%s)", (seconds,))

    await store._read(body, "holding the connection")


@contextlib.asynccontextmanager
async def _main_connection_held(store: PostgresStore) -> AsyncIterator[asyncio.Task[None]]:
    """A call holding one of the main pool's connections until the block ends (the call, a
    task, is given: still running inside the block)."""
    holding, release = asyncio.Event(), asyncio.Event()

    async def body(conn: Any) -> None:
        holding.set()
        await release.wait()

    busy = asyncio.create_task(store._read(body, "holding the connection"))
    try:
        await asyncio.wait_for(holding.wait(), 10)
        yield busy
    finally:
        release.set()
    await busy


async def _finds_it_busy(
    other: so.Runtime, sid: str, runs: list[str], release: asyncio.Event
) -> None:
    """`other` asks to drive the session and must find its lease live. Had it taken the lease
    over, it would run the call again (a second run, waiting for `release`): that, not how long
    it took (a busy machine's), tells a take-over."""
    taking = asyncio.create_task(other.generate(session_id=sid))
    deadline = time.monotonic() + 10
    while not taking.done() and len(runs) == 1:
        assert time.monotonic() < deadline, ("neither busy nor taken over", runs)
        await asyncio.sleep(0.01)
    if not taking.done():  # it took the lease over: it runs the call again
        release.set()
        await asyncio.wait_for(taking, 10)
        raise AssertionError(("the session was taken over", runs))
    assert taking.result().status == "running"  # busy: the holder's lease is live


async def test_a_renewal_does_not_wait_for_a_busy_pool(pg_store_url: str) -> None:
    """With the pool's only connection busy until the test ends its call, a renewal of a lease
    gets through meanwhile, not once the connection is back."""
    store = PostgresStore(_one_connection(pg_store_url))
    await store.open()
    try:
        sid = await new_session(store)
        now = await store.server_time()
        token = await store.acquire_lease(sid, "me", 30.0, now)
        assert token is not None
        async with _main_connection_held(store) as busy:
            live = await asyncio.wait_for(store.renew_lease(sid, "me", token, 30.0, now), 10)
            assert not busy.done()
        assert live
    finally:
        await store.close()


async def test_a_drive_keeps_its_lease_while_its_pool_is_busy(pg_store_url: str) -> None:
    """A tool body runs for 3.75 s (2.5 TTLs) while the process's only pooled connection is busy
    the whole time: its lease is renewed meanwhile, so another process trying to take the
    session over finds it busy, and the call runs once, in the drive that started it."""
    runs: list[str] = []
    release = asyncio.Event()
    agent = _agent(runs, release)
    async with (
        so.Runtime([agent], store=_one_connection(pg_store_url), lease_ttl=1.5) as holder,
        so.Runtime([agent], store=pg_store_url, lease_ttl=0.6, lease_wait=0.1) as other,
    ):
        store = holder.store
        assert isinstance(store, PostgresStore)
        sid = await holder.create_session("support")
        drive = asyncio.create_task(holder.generate("support", "Refund", session_id=sid))
        while not runs:
            await asyncio.sleep(0.01)
        busy = asyncio.create_task(_hold_the_only_connection(store, 3.75))
        try:
            while not busy.done():  # another worker tries to take the session over meanwhile
                await _finds_it_busy(other, sid, runs, release)
                await asyncio.sleep(0.1)
            await busy
        finally:
            release.set()
            done = await asyncio.wait_for(drive, 10)
        assert done.status == "completed"
    assert runs == [f"{sid}:1:call_refund"]


async def test_a_slow_read_of_what_others_recorded_holds_up_no_renewal(store_url: str) -> None:
    """Each renewal reads what other processes recorded (a cancel, a steer) after it: that read
    taking 3.75 s (2.5 TTLs) on a slow store delays no renewal, so the lease stays live, another
    process finds the session busy, and the call runs once."""
    runs: list[str] = []
    release = asyncio.Event()
    agent = _agent(runs, release)
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=1.5) as holder,
        so.Runtime([agent], store=store_url, lease_ttl=0.6, lease_wait=0.1) as other,
    ):
        store = holder.store
        head = store.head
        slow = asyncio.Event()

        async def slow_head(session_id: str, *, shown: so.Event | None = None) -> int | None:
            if slow.is_set():
                slow.clear()  # the next renewal's read, once
                await asyncio.sleep(3.75)
            return await head(session_id, shown=shown)

        store.head = slow_head  # type: ignore[method-assign]
        sid = await holder.create_session("support")
        drive = asyncio.create_task(holder.generate("support", "Refund", session_id=sid))
        while not runs:
            await asyncio.sleep(0.01)
        slow.set()
        began = time.monotonic()
        try:
            while time.monotonic() - began < 4.5:
                await _finds_it_busy(other, sid, runs, release)
                await asyncio.sleep(0.1)
        finally:
            release.set()
            done = await asyncio.wait_for(drive, 10)
        assert done.status == "completed"
    assert runs == [f"{sid}:1:call_refund"]


@contextlib.asynccontextmanager
async def _limited_role(url: str, limit: int) -> AsyncIterator[str]:
    """The URL of a new role that may hold `limit` connections ("too many connections for
    role" past them: a full server, as far as that role can tell) and use the store's tables."""
    role = f"app_{uuid.uuid4().hex[:8]}"
    params = conninfo_to_dict(url)
    conn = await admin(url)
    async with conn:
        await conn.execute(
            f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT {limit}; '
            f'GRANT USAGE ON SCHEMA signoff TO "{role}"; '
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA signoff TO "{role}"; '
            f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA signoff TO "{role}"'
        )
        try:
            yield f"postgresql://{role}@{params['host']}:{params['port']}/{params['dbname']}"
        finally:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            await conn.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


async def test_a_renewal_the_server_refuses_a_lease_connection_uses_an_idle_one(
    pg_store_url: str,
) -> None:
    """The server refuses the lease pool any connection (the role's one is the main pool's, as
    a server full after the process opened): a renewal goes through on the main pool's idle
    connection, where it failed "refuses new connections, and none of the pool's is open"."""
    async with _limited_role(pg_store_url, 1) as url:
        store = PostgresStore(f"{url}?pool_min=1&pool_max=1")
        await store.open()
        try:
            sid = await new_session(store)
            now = await store.server_time()
            token = await store.acquire_lease(sid, "me", 30.0, now)
            assert token is not None
            for _ in range(3):  # the refusal once known, a renewal takes the idle one at once
                assert await asyncio.wait_for(store.renew_lease(sid, "me", token, 30.0, now), 10)
            # The lease pool's wait the first renewal gave up is no call waiting: its reconnects,
            # once they give up, are not started again for it (a full server refused a login a
            # second for as long as it stayed full, the log a line each).
            leases = store._pool.leases if store._pool is not None else None
            assert leases is not None
            checks: list[bool] = []

            async def check() -> None:
                checks.append(True)

            leases.check = check  # type: ignore[method-assign]
            await _reconnect_again(leases)
            assert checks == [] and leases.waiting == 0
            async with _main_connection_held(store) as busy:
                # The main pool's one busy with a call that may be long: not waited for.
                with pytest.raises(so.StoreError, match="refuses new connections") as info:
                    await asyncio.wait_for(store.renew_lease(sid, "me", token, 30.0, now), 10)
                assert not busy.done()
                assert "signoff-signoff-leases" in str(info.value)
        finally:
            await store.close()


async def test_a_drive_keeps_its_lease_while_the_server_is_full(pg_store_url: str) -> None:
    """Other clients take every connection the server has left once the process is open: the
    drive's renewals still get through (3.75 s, 2.5 TTLs, of a tool body), so the call runs
    once and completes, where its lease lapsed and the drive was stopped."""
    runs: list[str] = []
    release = asyncio.Event()
    agent = _agent(runs, release)
    async with (
        _limited_role(pg_store_url, 8) as url,
        so.Runtime([agent], store=f"{url}?pool_min=2", lease_ttl=1.5) as holder,
    ):
        sid = await holder.create_session("support")
        others: list[psycopg.AsyncConnection[Any]] = []
        try:
            while True:  # the server full, as far as the role goes
                try:
                    others.append(await psycopg.AsyncConnection.connect(url))
                except psycopg.OperationalError as exc:
                    assert "too many connections" in str(exc), exc
                    break
            drive = asyncio.create_task(holder.generate("support", "Refund", session_id=sid))
            try:
                while not runs:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(3.75)
            finally:
                release.set()
                done = await asyncio.wait_for(drive, 10)
        finally:
            for other in others:
                await other.close()
        assert done.status == "completed"
    assert runs == [f"{sid}:1:call_refund"]
