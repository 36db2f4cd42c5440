"""Writes the server committed whose acknowledgement the client never read, for real: a server
whose commits wait for a synchronous standby that does not exist holds each one after its
commit record is written, and `pg_terminate_backend` then ends the backend there (PostgreSQL
warns "the transaction has already committed locally"). Each write is found committed, once."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

import psycopg
import pytest

from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore

from ._pg_events import ev, new_session
from .conftest import PgCluster

T = TypeVar("T")


@pytest.fixture(scope="module")
def cluster() -> Iterator[PgCluster]:
    """A server of this module's own: the standby its commits wait for is set server-wide."""
    started = PgCluster.start()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def store(cluster: PgCluster) -> AsyncIterator[PostgresStore]:
    url = cluster.url(cluster.create_database())
    opened = PostgresStore(url, min_size=1, max_size=2)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


async def _acknowledgement_lost(cluster: PgCluster, write: Callable[[], Awaitable[T]]) -> T:
    """Run `write` while commits wait for a standby; end the backend whose commit waits, and
    let any write sent after it through."""
    async with await psycopg.AsyncConnection.connect(cluster.admin_url, autocommit=True) as conn:
        await conn.execute("CREATE TABLE IF NOT EXISTS public.probe (n int)")
        await conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'nobody'")
        await conn.execute("SELECT pg_reload_conf()")
        try:
            await _in_effect(cluster, conn)
            writing = asyncio.ensure_future(write())
            pid = await _waiting(conn)
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            await conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            await conn.execute("SELECT pg_reload_conf()")  # a write sent again goes through
            return await asyncio.wait_for(writing, 30)
        finally:
            await conn.execute("ALTER SYSTEM RESET synchronous_standby_names")
            await conn.execute("SELECT pg_reload_conf()")


async def _in_effect(cluster: PgCluster, conn: psycopg.AsyncConnection[Any]) -> None:
    """Wait until commits wait for the standby: the server takes the setting in a while."""
    async with await psycopg.AsyncConnection.connect(cluster.admin_url, autocommit=True) as probe:
        for _ in range(500):
            committing = asyncio.ensure_future(probe.execute("INSERT INTO public.probe VALUES (1)"))
            for _ in range(50):
                cur = await conn.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event = 'SyncRep'",
                    (probe.info.backend_pid,),
                )
                if await cur.fetchone() is not None:
                    await conn.execute("SELECT pg_cancel_backend(%s)", (probe.info.backend_pid,))
                    await asyncio.wait_for(committing, 10)  # committed, its wait cancelled
                    return
                if committing.done():
                    break
                await asyncio.sleep(0.01)
            await asyncio.wait_for(committing, 10)
    raise AssertionError("commits never waited for the standby")


async def _waiting(conn: psycopg.AsyncConnection[Any]) -> int:
    """The backend whose commit waits for the standby."""
    for _ in range(1000):
        cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'")
        rows = await cur.fetchall()
        if rows:
            return int(rows[0][0])
        await asyncio.sleep(0.02)
    raise AssertionError("no commit waits for the standby")


async def test_a_durable_commit_whose_acknowledgement_is_lost_is_found_committed_once(
    cluster: PgCluster, store: PostgresStore
) -> None:
    sid = await new_session(store)
    events = [ev(sid, 2, "tool.started"), ev(sid, 3, "tool.completed")]
    commit = Commit(session_id=sid, expected_seq=1, events=events, durable=True)
    await _acknowledgement_lost(cluster, lambda: store.commit(commit))
    assert await store.read_events(sid) == [ev(sid, 1, "session.created"), *events]
    await store.commit(Commit(session_id=sid, expected_seq=3, events=[ev(sid, 4)]))
    assert await store.head(sid) == 4


async def test_a_creation_whose_acknowledgement_is_lost_is_found_created_once(
    cluster: PgCluster, store: PostgresStore
) -> None:
    sid = f"ses_{uuid.uuid4().hex[:20]}"
    first = [ev(sid, 1, "session.created")]
    await _acknowledgement_lost(cluster, lambda: store.create_session(sid, "support", first, None))
    assert await store.read_events(sid) == first


async def test_a_claim_whose_acknowledgement_is_lost_returns_what_it_claimed(
    cluster: PgCluster, store: PostgresStore
) -> None:
    sid = await new_session(store)
    await store.commit(
        Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], status="running")
    )
    now = time.time()
    claimed = await _acknowledgement_lost(cluster, lambda: store.claim("w1", 30, now, 5))
    assert claimed == [(sid, 1)]
    assert await store.claim("w2", 30, now, 5) == []  # leased once, to w1


@pytest.mark.parametrize("before", ["old", "new"], ids=["another-hubs", "its-own"])
async def test_a_channel_claim_whose_acknowledgement_is_lost_says_when_the_one_before_lapsed(
    cluster: PgCluster, store: PostgresStore, before: str
) -> None:
    """A hub takes a claim that lapsed an hour ago, at position 100, another hub's or its own
    (its give-back failed, the store down): sent again after its acknowledgement was lost, the
    take still says it lapsed then (not at the expiry the first attempt set, this hub's own),
    so the hub starts at the end rather than deliver from a position that stale (`Claims.take`:
    `FRESH`). Its own claim's retry said the new expiry, 30 s ahead: judged fresh."""
    held, _, _ = await store.claim_channel("hub.slack", before, 30, time.time(), after_id=100)
    assert held
    async with (await store._get_pool()).connection() as conn:
        await conn.execute(
            f"UPDATE {store._s}.channel_claims SET expires_at = "
            "extract(epoch FROM clock_timestamp()) - 3600 WHERE name = 'hub.slack'"
        )
    took = await _acknowledgement_lost(
        cluster, lambda: store.claim_channel("hub.slack", "new", 30, time.time())
    )
    held, saved, since = took
    assert held and saved == 100
    assert since is not None and abs(since - (time.time() - 3600)) < 60
    assert await store.claim_channel("hub.slack", "other", 30, time.time()) == (False, None, None)
