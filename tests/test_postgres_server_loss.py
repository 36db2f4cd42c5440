"""The PostgreSQL store when the server goes away: a server gone after open, a pool killed while
idle, outages and restarts, and a read-only hot standby."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from signoff._exceptions import StoreError, StoreUnavailable
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore

from ._pg_events import T0, ev, new_session
from .conftest import PgCluster
from .test_postgres import admin


async def test_server_gone_after_open_is_a_store_error() -> None:
    cluster = PgCluster.start()
    try:
        store = PostgresStore(cluster.admin_url, timeout=0.3)
        await store.open()
        sid = await new_session(store)
        cluster.stop()
        with pytest.raises(StoreError):
            await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        with pytest.raises(StoreError):
            await store.head(sid)
        await store.close()
    finally:
        cluster.stop()


async def _kill_all_but(observer: psycopg.AsyncConnection[Any]) -> int:
    """Terminate every other client backend of this database (as a server restart would)."""
    cur = await observer.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
        "current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
    )
    return len(await cur.fetchall())


@pytest.mark.parametrize("op", ["read", "write"])
async def test_a_pool_of_connections_all_killed_while_idle_is_renewed(
    pg_store_url: str, op: str
) -> None:
    """After a server restart every idle connection in the pool is dead: the next read or write
    must not use them up one retry at a time and fail, but go on over fresh connections."""
    store = PostgresStore(pg_store_url, min_size=4, max_size=4)
    try:
        sid = await new_session(store)

        async def busy() -> None:
            await store.read_events(sid)
            await asyncio.sleep(0.05)

        await asyncio.gather(*(busy() for _ in range(4)))  # four connections, all idle now
        observer = await admin(pg_store_url)
        async with observer:
            assert await _kill_all_but(observer) >= 4
        if op == "read":
            assert [e.seq for e in await store.read_events(sid)] == [1]
        else:
            await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
            assert await store.head(sid) == 2
    finally:
        await store.close()


async def test_the_pool_reconnects_soon_after_an_outage() -> None:
    """psycopg_pool retries a lost connection backing off up to minutes apart, so a database back
    after an outage went unused, every call failing, for up to as long again as it was down:
    reconnecting starts over within seconds instead."""
    cluster = PgCluster.start()
    try:
        store = PostgresStore(cluster.admin_url, min_size=2, max_size=2, timeout=2)
        sid = await new_session(store)
        cluster.halt()
        with pytest.raises(StoreError):
            await store.head(sid)  # the pool finds its connections dead, and reconnects
        # Its reconnections fail, each waiting longer (psycopg_pool: 1, 2, 4, 8 s...): about 8 s
        # after the loss, the next would come only 6 to 8 s later.
        await asyncio.sleep(5.5)
        cluster.resume()
        await asyncio.sleep(0.3)
        # The server is back: a call now gets a connection within its wait (2 s here).
        assert await store.head(sid) == 1
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        assert await store.head(sid) == 2
        await store.close()
    finally:
        cluster.stop()


async def test_a_long_outage_fails_fast_and_the_store_recovers() -> None:
    """With PostgreSQL down, a call waits for it only as long as the outage grace (not the
    pool's whole timeout), then fails with `StoreUnavailable`; once the outage outlasts the
    grace, calls fail at once; when the server is back, the next call goes through."""
    cluster = PgCluster.start()
    try:
        store = PostgresStore(cluster.admin_url, min_size=2, max_size=2, timeout=30, grace=1.5)
        sid = await new_session(store)
        cluster.halt()
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(StoreUnavailable, match="PostgreSQL unavailable"):
            await store.head(sid)
        assert loop.time() - started < 5  # the grace and a probe, not the 30 s pool timeout
        for call in (
            lambda: store.head(sid),
            lambda: store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)])),
        ):
            started = loop.time()
            with pytest.raises(StoreUnavailable):
                await call()
            assert loop.time() - started < 1
        stop = asyncio.Event()

        async def hammer() -> None:  # calls failing all along, up to the moment it is back
            while not stop.is_set():
                with contextlib.suppress(StoreUnavailable):
                    await store.head(sid)
                await asyncio.sleep(0.02)

        hammering = asyncio.ensure_future(hammer())
        await asyncio.to_thread(cluster.resume)
        # the first call after the server is back finds it, not an earlier call's finding
        assert await store.head(sid) == 1  # nothing was written while it was down
        stop.set()
        await hammering
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        assert [e.seq for e in await store.read_events(sid)] == [1, 2]
        await store.close()
    finally:
        cluster.stop()


async def test_calls_during_a_brief_restart_go_through_once() -> None:
    """A restart shorter than the outage grace is ridden out: a read and a write made while
    the server is down both succeed once it is back, and the write is applied once."""
    cluster = PgCluster.start()
    try:
        store = PostgresStore(cluster.admin_url, min_size=2, max_size=2, timeout=30, grace=8)
        sid = await new_session(store)
        await asyncio.to_thread(cluster.halt)
        reading = asyncio.ensure_future(store.head(sid))
        writing = asyncio.ensure_future(
            store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        )
        await asyncio.sleep(1.5)
        assert not reading.done() and not writing.done()
        await asyncio.to_thread(cluster.resume)
        started = asyncio.get_running_loop().time()
        assert await asyncio.wait_for(reading, 10) in (1, 2)
        await asyncio.wait_for(writing, 10)
        assert asyncio.get_running_loop().time() - started < 3  # soon after it is back
        assert [e.seq for e in await store.read_events(sid)] == [1, 2]
        await store.close()
    finally:
        cluster.stop()


def test_the_outage_grace_url_option() -> None:
    assert PostgresStore("postgresql://u@h/db?outage_grace=2.5")._outage.grace == 2.5
    with pytest.raises(StoreError, match="outage_grace"):
        PostgresStore("postgresql://u@h/db?outage_grace=0")


async def test_a_hot_standby_is_read_and_refuses_writes_clearly() -> None:
    """After a failover to a hot standby (read-only): reads work, writes are a `StoreError` that
    says so and write nothing, a wait ends at its timeout though the listener cannot subscribe
    there, and the listener retries backing off rather than reconnecting ten times a second."""
    cluster = PgCluster.start()
    standby: PgCluster | None = None
    try:
        name = cluster.create_database()
        primary = PostgresStore(cluster.url(name))
        sid = await new_session(primary)
        await primary.close()
        standby = cluster.standby()
        store = PostgresStore(standby.url(name), timeout=2)
        assert await store.head(sid) == 1
        with pytest.raises(StoreError, match="read-only"):
            await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        with pytest.raises(StoreError, match="read-only"):
            await new_session(store)
        with pytest.raises(StoreError, match="read-only"):
            await store.claim("w", 10, T0, 10)
        assert [e.seq for e in await store.read_events(sid)] == [1]
        real_connect = store._changes._connect
        connects: list[float] = []

        async def counted() -> Any:
            connects.append(asyncio.get_running_loop().time())
            return await real_connect()

        store._changes._connect = counted
        started = asyncio.get_running_loop().time()
        assert await store.wait_for_change(sid, 1.5) is False
        assert asyncio.get_running_loop().time() - started < 2.0
        await asyncio.sleep(2.0)
        assert 1 <= len(connects) <= 8, f"{len(connects)} LISTEN connections in 3.5 s"
        await store.close()
    finally:
        if standby is not None:
            standby.stop()
        cluster.stop()


async def test_writes_go_back_to_the_primary_of_a_url_of_two_hosts_once_it_is_back() -> None:
    """A URL naming a primary and its standby (libpq's `target_session_attrs=any`): while the
    primary restarts, the pool's connections land on the standby, where a write fails, saying
    the server is read-only and that nothing was written. Back, the primary takes the writes
    again at once: a connection that met a read-only server is not pooled again (they were, so
    every write failed for as long as they lived, an hour by default)."""
    cluster = PgCluster.start()
    standby: PgCluster | None = None
    try:
        name = cluster.create_database()
        primary = PostgresStore(cluster.url(name))
        sid = await new_session(primary)
        await primary.close()
        standby = cluster.standby()
        ports = [conninfo_to_dict(c.admin_url)["port"] for c in (cluster, standby)]
        url = f"postgresql://postgres@127.0.0.1:{ports[0]},127.0.0.1:{ports[1]}/{name}"
        store = PostgresStore(url, min_size=2, max_size=2, timeout=5)
        try:
            assert await store.head(sid) == 1
            await asyncio.to_thread(cluster.halt)
            assert await store.head(sid) == 1  # read on the standby
            commit = Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)])
            with pytest.raises(StoreError, match="is read-only .*nothing was written"):
                await store.commit(commit)
            await asyncio.to_thread(cluster.resume)
            await store.commit(commit)
            await store.commit(Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)]))
            assert [e.seq for e in await store.read_events(sid)] == [1, 2, 3]
        finally:
            await store.close()
    finally:
        if standby is not None:
            standby.stop()
        cluster.stop()


async def _started(url: str) -> float:
    """When the server last started by its clock (seconds since the epoch): its postmaster, or
    its restart of every process after one crashed, which resets the shared statistics."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT extract(epoch FROM GREATEST(pg_postmaster_start_time(), "
            "pg_stat_get_bgwriter_stat_reset_time()))::float8"
        )
        row = await cur.fetchone()
        assert row is not None
        return float(row[0])


async def _crash(url: str) -> None:
    """Kill one server process (SIGKILL, as the OOM killer does): the server ends the others
    and starts them again (crash recovery), its postmaster running on."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute("SELECT pg_backend_pid()")
        row = await cur.fetchone()
        assert row is not None
        os.kill(int(row[0]), signal.SIGKILL)


@pytest.mark.parametrize("outage", ["restart", "crash"])
async def test_a_lease_lapsed_while_the_server_was_down_is_its_holders_for_a_ttl(
    outage: str,
) -> None:
    """A worker's leases lapse while the server is down (a tool it ran then keeps its result,
    to record once the store is back, README "Scale-out"): another worker that claimed them
    as soon as the server was back ran the tool again. For one lease TTL after the server
    starts (again, or its processes after one crashed) no other owner claims, acquires or
    commits its way to them, while their holder takes one back; the other is claimed once that
    TTL is over. A lease granted since the start is judged by its expiry alone, as ever."""
    ttl = 3.0
    cluster = PgCluster.start()
    url = cluster.admin_url
    holder, other = PostgresStore(url, grace=5), PostgresStore(url, grace=5)
    try:
        kept, left, fresh = (f"ses_{uuid.uuid4().hex[:20]}" for _ in range(3))
        for sid in (kept, left):
            first = [ev(sid, 1, "session.created")]
            await holder.create_session(sid, "support", first, None, status="running")
        before = await _started(url)
        now = await holder.server_time()
        # Granted so as to lapse soon: a lease last renewed well before the server stops.
        claimed = await holder.claim("a", ttl, now - ttl + 0.2, 10)
        assert sorted(claimed) == sorted([(kept, 1), (left, 1)])
        if outage == "restart":
            await asyncio.to_thread(cluster.halt)
            await asyncio.sleep(0.3)  # down for longer than the leases had left
            await asyncio.to_thread(cluster.resume)
        else:
            await _crash(url)
            await asyncio.sleep(0.3)  # the leases lapse meanwhile, or once it is back
        now = await other.server_time()  # once the server answers again
        started = await _started(url)
        assert started > before
        assert now - started < ttl - 1, "the server took too long to start for this test"
        # Granted since the start, lapsed at once: judged by its expiry alone.
        first = [ev(fresh, 1, "session.created")]
        lapsed = ("c", ttl, now - 10)
        await holder.create_session(fresh, "support", first, None, status="running", lease=lapsed)
        assert await other.claim("b", ttl, now, 10) == [(fresh, 2)]
        assert await holder.acquire_lease(kept, "a", 60, now) == 2  # its holder takes it back
        tries = 0
        while (now := await other.server_time()) < started + ttl - 0.2:
            assert await other.claim("b", ttl, now, 10) == []
            assert await other.acquire_lease(left, "b", ttl, now) is None
            assert await other.acquire_lease(kept, "b", ttl, now) is None
            seq = 1 + tries
            commit = Commit(
                session_id=left, expected_seq=seq, events=[ev(left, seq + 1)], grant=("b", ttl, now)
            )
            await other.commit(commit)  # written, its lease not granted
            assert commit.granted is None
            tries += 1
            await asyncio.sleep(0.1)
        assert tries >= 3
        while (now := await other.server_time()) <= started + ttl:
            await asyncio.sleep(0.05)
        assert await other.claim("b", ttl, now, 10) == [(left, 2)]
        assert await other.acquire_lease(kept, "b", ttl, now) is None  # the holder's, live
    finally:
        await holder.close()
        await other.close()
        cluster.stop()


async def test_a_lease_lapsed_while_the_server_was_down_is_claimed_back_by_its_own_owner() -> None:
    """The holder of a lease that lapsed while the server was down, still alive (a worker whose
    drives gave up their sessions as their leases ran out), claims it back as soon as the server
    answers, as before a restart: its tool waited a whole TTL after the restart. Another owner
    still waits that TTL out, and the holder's claim leaves the sessions it drives (`skip`)."""
    ttl = 3.0
    cluster = PgCluster.start()
    url = cluster.admin_url
    holder, other = PostgresStore(url, grace=5), PostgresStore(url, grace=5)
    try:
        mine, driven = (f"ses_{uuid.uuid4().hex[:20]}" for _ in range(2))
        for sid in (mine, driven):
            first = [ev(sid, 1, "session.created")]
            await holder.create_session(sid, "support", first, None, status="running")
        now = await holder.server_time()
        claimed = await holder.claim("a", ttl, now - ttl + 0.2, 10)  # lapses while it is down
        assert sorted(claimed) == sorted([(mine, 1), (driven, 1)])
        await asyncio.to_thread(cluster.halt)
        await asyncio.sleep(0.3)
        await asyncio.to_thread(cluster.resume)
        now = await other.server_time()
        started = await _started(url)
        assert now - started < ttl - 1, "the server took too long to start for this test"
        assert await other.claim("b", ttl, now, 10) == []
        assert await holder.claim("a", ttl, now, 10, skip=[driven]) == [(mine, 2)]
        assert await holder.claim("a", ttl, now, 10) == [(driven, 2)]
        assert await holder.claim("a", ttl, now, 10) == []  # its own, live: not taken again
        assert await other.claim("b", ttl, now, 10) == []
        assert await other.server_time() < started + ttl  # all within the holder's TTL
    finally:
        await holder.close()
        await other.close()
        cluster.stop()
