"""The database's clock is measured over the query alone: a reading of it that first waited
for a pooled connection (a busy pool, a server restarting) must not put the process's
reckoning ahead of the database by half that wait, for it would then take over leases other
processes still hold and run their calls again."""

from __future__ import annotations

import asyncio
from typing import Any

import signoff as so
from signoff.stores.postgres import PostgresStore

from .test_leasing_clock import _agent


def _one_connection(url: str) -> str:
    return url + ("&" if "?" in url else "?") + "pool_max=1"


async def _hold_the_only_connection(store: PostgresStore, seconds: float) -> None:
    async def body(conn: Any) -> None:
        await conn.execute("SELECT pg_sleep(%s)", (seconds,))

    await store._read(body, "holding the connection")


async def _database_time(store: PostgresStore) -> float:
    async def body(conn: Any) -> float:
        cur = await conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8")
        row = await cur.fetchone()
        return float(row[0])

    return await store._read(body, "reading the clock")


async def test_a_clock_reading_that_waited_for_a_connection_is_not_ahead(
    pg_store_url: str,
) -> None:
    """With its only pooled connection busy for 1.6 s, a process measures the database's
    clock: it reckons it as it is (within a few hundredths of a second), not 0.8 s ahead."""
    url = _one_connection(pg_store_url)
    async with so.Runtime([], store=url) as rt:
        store = rt.store
        assert isinstance(store, PostgresStore)
        busy = asyncio.create_task(_hold_the_only_connection(store, 1.6))
        await asyncio.sleep(0.1)
        await rt._sync_lease_clock()
        await busy
        theirs = await _database_time(store)
        assert abs(rt.now() - theirs) < 0.1


async def test_a_process_whose_clock_reading_waited_takes_no_live_lease_over(
    pg_store_url: str,
) -> None:
    """A process that measured the database's clock while its pool was busy still sees the
    lease another process holds (and renews) as live: the call runs once."""
    runs: list[str] = []
    release = asyncio.Event()
    agent = _agent(runs, release)
    url = _one_connection(pg_store_url)
    async with (
        so.Runtime([agent], store=pg_store_url, lease_ttl=1.5) as holder,
        so.Runtime([agent], store=url, lease_ttl=0.6, lease_wait=0.3) as other,
    ):
        store = other.store
        assert isinstance(store, PostgresStore)
        busy = asyncio.create_task(_hold_the_only_connection(store, 4.0))
        await asyncio.sleep(0.1)
        await other._sync_lease_clock()
        await busy
        sid = await holder.create_session("support")
        drive = asyncio.create_task(holder.generate("support", "Refund", session_id=sid))
        while not runs:
            await asyncio.sleep(0.01)
        taking = asyncio.create_task(other.generate(session_id=sid))
        try:
            await asyncio.wait({taking}, timeout=5)
            assert runs == [f"{sid}:1:call_refund"]  # not run again by `other`
            assert taking.done() and taking.result().status == "running"  # busy elsewhere
        finally:
            release.set()
            done = await asyncio.wait_for(drive, 10)
            await asyncio.wait_for(taking, 10)
        assert done.status == "completed"
    assert runs == [f"{sid}:1:call_refund"]
