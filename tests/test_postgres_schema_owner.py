"""The PostgreSQL store in a schema a DBA created for it: its owner migrates it without the right
to create schemas in the database."""

from __future__ import annotations

import uuid

from psycopg.conninfo import conninfo_to_dict

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
