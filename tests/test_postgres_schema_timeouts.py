"""A PostgreSQL upgrade under the timeouts a DBA set for the database: they bound the
application's statements, not the migration, which waits for another process's and may spend a
while in Python between two statements (a fill over many rows)."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from signoff._exceptions import StoreError
from signoff.stores.postgres import STORE_SCHEMA, PostgresStore, _schema

from ._pg_events import new_session
from .test_postgres import admin


async def _set(url: str, setting: str, value: str) -> None:
    conn = await admin(url)
    async with conn:
        await conn.execute(f'ALTER DATABASE "{conn.info.dbname}" SET {setting} = {value}'.encode())


async def _version(url: str) -> int:
    conn = await admin(url)
    async with conn:
        cur = await conn.execute("SELECT MAX(version) FROM signoff.schema_version")
        row = await cur.fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("setting", ["statement_timeout", "lock_timeout"])
async def test_a_first_open_waits_for_another_processs_migration_past_a_dbas_timeout(
    pg_url: str, setting: str
) -> None:
    """Two processes opening a fresh database: the second waits for the first's migration lock.
    Under a DBA's `statement_timeout` or `lock_timeout` shorter than the first's migration, it
    failed ("canceling statement due to statement timeout"), and so did every process opening
    the database while another migrated it."""
    await _set(pg_url, setting, "100")
    blocker = await admin(pg_url)
    store = PostgresStore(pg_url)
    async with blocker:
        await blocker.execute("SET lock_timeout = 0; SET statement_timeout = 0")
        await blocker.execute("SELECT pg_advisory_lock(hashtext(%s))", ('"signoff".migrate',))
        opening = asyncio.create_task(store.open())
        try:
            for _ in range(400):  # until it waits for the lock (or has failed)
                cur = await blocker.execute(
                    "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                )
                if (await cur.fetchone()) == (1,) or opening.done():
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.5)  # five times the DBA's timeout: the other's migration
        finally:
            await blocker.execute("SELECT pg_advisory_unlock_all()")
        try:
            await asyncio.wait_for(opening, 30)
            sid = await new_session(store)
            assert await store.head(sid) == 1
        finally:
            await store.close()
    assert await _version(pg_url) == STORE_SCHEMA


async def test_a_migration_is_not_ended_by_a_dbas_idle_in_transaction_timeout(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fill of a migration reads rows, works on them in Python, then writes: on a large
    store that work outlasted a DBA's `idle_in_transaction_session_timeout`, the server ended
    the connection and rolled the upgrade back, every time it was tried."""
    await _set(pg_url, "idle_in_transaction_session_timeout", "100")
    fill = _schema.FILLS[8]

    async def slow_fill(conn: psycopg.AsyncConnection[Any], s: str) -> None:
        await asyncio.sleep(0.5)  # five times the DBA's timeout, between two statements
        await fill(conn, s)

    monkeypatch.setitem(_schema.FILLS, 8, slow_fill)
    store = PostgresStore(pg_url)
    try:
        await asyncio.wait_for(store.open(), 30)
        sid = await new_session(store)
        assert await store.head(sid) == 1
    finally:
        await store.close()
    assert await _version(pg_url) == STORE_SCHEMA


@pytest.mark.parametrize("setting", ["statement_timeout", "lock_timeout"])
async def test_a_call_a_dbas_timeout_ends_says_how_to_exempt_signoff(
    pg_store_url: str, setting: str
) -> None:
    """A read waiting on a lock past a DBA's `statement_timeout` or `lock_timeout` failed with
    the server's "canceling statement due to statement timeout" alone, which names neither the
    setting to change nor that signoff bounds its calls itself."""
    await _set(pg_store_url, setting, "100")
    store = PostgresStore(pg_store_url)
    try:
        sid = await new_session(store)
        blocker = await admin(pg_store_url)
        async with blocker:
            await blocker.execute("SET lock_timeout = 0; SET statement_timeout = 0")
            async with blocker.transaction():
                await blocker.execute("LOCK TABLE signoff.sessions IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(StoreError) as caught:
                    await asyncio.wait_for(store.load(sid), 20)
    finally:
        await store.close()
    message = str(caught.value)
    assert f"due to {setting.replace('_', ' ')}" in message, message
    assert f"ALTER ROLE ... SET {setting} = 0" in message, message
    assert "operation_timeout" in message, message


async def test_an_error_of_a_store_of_another_schema_shows_it_in_the_url(
    pg_store_url: str,
) -> None:
    """The URL in a store's errors left out `?schema=`, so two stores in one database (two
    tenants) failed with the same words; the default schema's URL stays as it was given."""
    await _set(pg_store_url, "statement_timeout", "100")
    database = "/" + pg_store_url.rsplit("/", 1)[1]
    other = PostgresStore(f"{pg_store_url}?schema=tenant_b")
    default = PostgresStore(pg_store_url)
    try:
        for store in (other, default):
            await store.open()
        blocker = await admin(pg_store_url)
        async with blocker:
            await blocker.execute("SET statement_timeout = 0")
            async with blocker.transaction():
                await blocker.execute(
                    "LOCK TABLE signoff.sessions, tenant_b.sessions IN ACCESS EXCLUSIVE MODE"
                )
                shown = []
                for store in (other, default):
                    with pytest.raises(StoreError) as caught:
                        await asyncio.wait_for(store.load("s_missing"), 20)
                    shown.append(str(caught.value))
    finally:
        for store in (other, default):
            await store.close()
    assert f"{database}?schema=tenant_b: canceling statement" in shown[0], shown[0]
    assert f"{database}: canceling statement" in shown[1], shown[1]
