"""The PostgreSQL store in a schema a DBA created for it: its owner migrates it without the right
to create schemas in the database, and a role that may only use it opens it while another
upgrades it."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from psycopg.conninfo import conninfo_to_dict

from signoff._exceptions import StoreError
from signoff.stores import Commit
from signoff.stores.postgres import STORE_SCHEMA, PostgresStore

from ._pg_events import ev, new_session
from .test_postgres import admin


async def test_the_owner_of_a_schema_a_dba_created_migrates_it(pg_url: str) -> None:
    """`CREATE SCHEMA signoff AUTHORIZATION app` is how a DBA hands a schema to a role that may
    not create schemas in the database: that role may create tables in it, so `signoff db
    upgrade` (and a store opening it) as that role creates signoff's schema there instead of
    failing on the `CREATE SCHEMA IF NOT EXISTS` PostgreSQL checks the database's right for."""
    role = f"app_{uuid.uuid4().hex[:8]}"
    params = conninfo_to_dict(pg_url)
    app_url = f"postgresql://{role}@{params['host']}:{params['port']}/{params['dbname']}"
    conn = await admin(pg_url)
    async with conn:
        await conn.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            await conn.execute(f'CREATE SCHEMA signoff AUTHORIZATION "{role}"')
            assert await PostgresStore(app_url).migrate() == (0, STORE_SCHEMA)
            store = PostgresStore(app_url)
            try:
                sid = await new_session(store)
                await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
                assert [e.seq for e in await store.read_events(sid)] == [1, 2]
            finally:
                await store.close()
        finally:
            await conn.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


async def test_a_role_that_may_only_use_the_schema_opens_it_while_another_upgrades_it(
    pg_url: str,
) -> None:
    """An application's role, granted the use of a schema it may not change, started while
    `signoff db upgrade` ran as its owner: it read an older version, waited for the upgrade's
    lock, and once the upgrade was done still ran the `CREATE TABLE IF NOT EXISTS` that
    PostgreSQL refuses it ("permission denied for schema signoff"), failing to open a schema
    that needed nothing more."""
    role = f"app_{uuid.uuid4().hex[:8]}"
    params = conninfo_to_dict(pg_url)
    app_url = f"postgresql://{role}@{params['host']}:{params['port']}/{params['dbname']}"
    assert await PostgresStore(pg_url).migrate() == (0, STORE_SCHEMA)
    conn = await admin(pg_url)
    async with conn:
        await conn.execute(
            f'CREATE ROLE "{role}" LOGIN; GRANT USAGE ON SCHEMA signoff TO "{role}"; '
            f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA signoff TO "{role}"; '
            f'GRANT USAGE ON ALL SEQUENCES IN SCHEMA signoff TO "{role}"'
        )
        store = PostgresStore(app_url)
        try:
            # The upgrade under way: its last version not committed yet, its lock held.
            cur = await conn.execute(
                "DELETE FROM signoff.schema_version WHERE version = %s RETURNING description",
                (STORE_SCHEMA,),
            )
            (description,) = await cur.fetchone() or ("",)
            await conn.execute("SELECT pg_advisory_lock(hashtext(%s))", ('"signoff".migrate',))
            opening = asyncio.create_task(store.open())
            for _ in range(500):  # until it waits for the upgrade's lock
                cur = await conn.execute(
                    "SELECT COUNT(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
                )
                if (await cur.fetchone()) == (1,) or opening.done():
                    break
                await asyncio.sleep(0.02)
            await conn.execute(
                "INSERT INTO signoff.schema_version (version, description) VALUES (%s, %s)",
                (STORE_SCHEMA, description),
            )
            await conn.execute("SELECT pg_advisory_unlock_all()")
            await asyncio.wait_for(opening, 30)
            sid = await new_session(store)
            await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
            assert [e.seq for e in await store.read_events(sid)] == [1, 2]
        finally:
            await store.close()
            await conn.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')


async def test_a_role_without_the_use_of_the_schema_is_told_what_to_grant(pg_url: str) -> None:
    """A role not granted USAGE on the schema, or SELECT on its tables, got PostgreSQL's word
    alone ("permission denied for schema signoff"), naming neither the store's schema when the
    URL chose it nor the grants signoff needs."""
    role = f"app_{uuid.uuid4().hex[:8]}"
    params = conninfo_to_dict(pg_url)
    app_url = f"postgresql://{role}@{params['host']}:{params['port']}/{params['dbname']}"
    assert await PostgresStore(pg_url).migrate() == (0, STORE_SCHEMA)
    conn = await admin(pg_url)
    async with conn:
        await conn.execute(f'CREATE ROLE "{role}" LOGIN')
        try:
            for grant, denied in (
                ("", "permission denied for schema signoff"),
                (f'GRANT USAGE ON SCHEMA signoff TO "{role}"', "for table schema_version"),
            ):
                if grant:
                    await conn.execute(grant)
                store = PostgresStore(app_url)
                with pytest.raises(StoreError) as info:
                    await store.open()
                await store.close()
                message = str(info.value)
                assert denied in message and "(schema 'signoff')" in message, message
                assert "grant it USAGE on the schema, SELECT, INSERT, UPDATE and DELETE" in message
        finally:
            await conn.execute(f'DROP OWNED BY "{role}"; DROP ROLE "{role}"')
