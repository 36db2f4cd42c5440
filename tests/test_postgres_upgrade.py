"""A PostgreSQL migration killed halfway (SIGKILL, no rollback from the client): the database
stays at the level it was, every object and row as before, and the next openings finish the
upgrade once, after which sessions parked by the older signoff resume."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from typing import Any

import psycopg
import pytest

from signoff.stores.postgres import STORE_SCHEMA
from tests import test_upgrade
from tests._forks import Scripts
from tests.conftest import PG_BIN
from tests.test_sqlite_upgrade import _child_env

reference = test_upgrade.reference  # the uninterrupted run the resumed sessions must match

_DIE_IN_MIGRATION = """
import asyncio, os, signal, sys
import psycopg
from signoff.stores.postgres import PostgresStore
last = int(sys.argv[2])
execute = psycopg.AsyncConnection.execute
async def die_after(self, query, params=None, **kwargs):
    cur = await execute(self, query, params, **kwargs)
    if "schema_version (version, description)" in str(query) and params[0] == last:
        os.kill(os.getpid(), signal.SIGKILL)  # migration `last` done, its transaction open
    return cur
psycopg.AsyncConnection.execute = die_after
asyncio.run(PostgresStore(sys.argv[1]).open())
"""

_OPEN = """
import asyncio, sys
from signoff.stores.postgres import PostgresStore
async def main():
    store = PostgresStore(sys.argv[1])
    await store.open()
    await store.close()
asyncio.run(main())
"""


def restore(url: str, fixture: str) -> dict[str, Any]:
    """The database of an older signoff, from its dump; returns the fixture's manifest."""
    command = [str(PG_BIN / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", url]
    subprocess.run(
        command, input=(test_upgrade.FIXTURES / f"{fixture}.sql").read_bytes(), check=True
    )
    manifest: dict[str, Any] = json.loads((test_upgrade.FIXTURES / f"{fixture}.json").read_text())
    return manifest


def everything(url: str) -> dict[str, Any]:
    """What a half-applied migration would change: the schema's columns, constraints, indexes,
    functions, table settings and comments, and every row of every table."""
    with psycopg.connect(url) as conn:

        def rows(sql: str) -> list[tuple[Any, ...]]:
            return conn.execute(sql).fetchall()

        found: dict[str, Any] = {
            "columns": rows(
                "SELECT table_name, column_name, data_type, is_nullable, column_default "
                "FROM information_schema.columns WHERE table_schema = 'signoff' ORDER BY 1, 2"
            ),
            "constraints": rows(
                "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                "WHERE connamespace = 'signoff'::regnamespace ORDER BY 1"
            ),
            "indexes": rows(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'signoff' ORDER BY 1"
            ),
            "functions": rows(
                "SELECT proname FROM pg_proc WHERE pronamespace = 'signoff'::regnamespace "
                "ORDER BY 1"
            ),
            "tables": rows(
                "SELECT relname, reloptions, obj_description(oid, 'pg_class') FROM pg_class "
                "WHERE relnamespace = 'signoff'::regnamespace AND relkind = 'r' ORDER BY 1"
            ),
        }
        for (table,) in rows(
            "SELECT relname FROM pg_class WHERE relnamespace = 'signoff'::regnamespace "
            "AND relkind = 'r' ORDER BY 1"
        ):
            found[table] = rows(
                f"SELECT md5(string_agg(t::text, '|' ORDER BY t::text)), COUNT(*) "
                f'FROM signoff."{table}" t'
            )
    return found


def versions(url: str) -> list[tuple[int, Any]]:
    with psycopg.connect(url) as conn:
        return conn.execute(
            "SELECT version, applied_at FROM signoff.schema_version ORDER BY version"
        ).fetchall()


@pytest.mark.parametrize(
    ("fixture", "dies_after"),
    [
        ("postgres-2e32584", 3),  # from 2: between migration 3 and migration 4
        ("postgres-2e32584", STORE_SCHEMA),  # every step from 3 on done but the commit
        ("postgres-06121db", 6),  # from 5: between two migrations with steps in Python
    ],
)
async def test_a_migration_killed_halfway_leaves_the_old_level_and_finishes_next_time(
    fixture: str,
    dies_after: int,
    pg_url: str,
    reference: test_upgrade.Reference,
    scripts: Scripts,
) -> None:
    """All pending migrations run in one transaction: a process killed in it leaves the
    database at its old level with nothing of the newer ones, two processes opening it
    together afterwards migrate it once, and the parked sessions resume."""
    manifest = restore(pg_url, fixture)
    old = versions(pg_url)
    before = everything(pg_url)
    child = scripts.run(_DIE_IN_MIGRATION, pg_url, str(dies_after), env=_child_env())
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert versions(pg_url) == old and old[-1][0] < dies_after
    assert everything(pg_url) == before

    racers = [
        subprocess.Popen([sys.executable, "-c", _OPEN, pg_url], env=_child_env()) for _ in range(2)
    ]
    assert [r.wait(timeout=60) for r in racers] == [0, 0]
    now = versions(pg_url)
    assert [v for v, _ in now] == list(range(1, STORE_SCHEMA + 1))
    assert now[: len(old)] == old
    assert len({at for _, at in now[len(old) :]}) == 1  # applied together, by one opening
    with psycopg.connect(pg_url) as conn:
        doubled = conn.execute(
            "SELECT stream FROM signoff.audit WHERE n = 0 GROUP BY stream HAVING COUNT(*) > 1"
        ).fetchall()
    assert doubled == []  # migration 5's chain heads, taken once
    await test_upgrade._resume_and_check(pg_url, manifest, reference)
