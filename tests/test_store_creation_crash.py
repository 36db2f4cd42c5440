"""A new store's creation SIGKILLed halfway (no rollback from the client): the SQLite file or the
PostgreSQL database is left with none of the schema, a store that may not migrate refuses it as
it would an empty one, and the next openings (two at once) create it once and run turns."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

import signoff as so
from signoff.stores.postgres import STORE_SCHEMA as PG_SCHEMA
from signoff.stores.postgres import PostgresStore
from signoff.stores.sqlite import STORE_SCHEMA as SQLITE_SCHEMA
from signoff.stores.sqlite import SQLiteStore
from signoff.testing import reply, scripted_agent

from . import _proof
from ._forks import Scripts
from ._wal import SPILL, uncommitted_frames
from .test_postgres_upgrade import _DIE_IN_MIGRATION, _OPEN, versions
from .test_sqlite_upgrade import _child_env

_DIE_IN_CREATION = (
    SPILL
    + """
import asyncio, sys
from signoff.stores.sqlite import _connection, SQLiteStore

def at_commit(conn):
    if sys.argv[2] == "commit":
        found = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        assert found == (str(_connection.STORE_SCHEMA),), found
        die()  # every table of the new file made and marked, all but the commit

switch = _connection._switch_to_wal

def in_wal(conn, timeout):
    switch(conn, timeout)
    if sys.argv[2] == "wal":  # the file exists, in WAL mode, and nothing is created yet
        _os.kill(_os.getpid(), _signal.SIGKILL)

_connection._switch_to_wal = in_wal
asyncio.run(SQLiteStore("sqlite:///" + sys.argv[1]).open())
sys.exit(3)  # not killed: the creation never reached the point
"""
)


async def a_turn_runs(url: str) -> None:
    """The store works: a session is created and its turn completes and reads back."""
    agent = scripted_agent("a", [reply("hello")])
    async with so.Runtime([agent], store=url) as rt:
        done = await rt.generate("a", prompt="hi")
        assert done.status == "completed" and done.text == "hello"
        assert [s.id for s in await rt.sessions()] == [done.session_id]
        assert await rt.verify_audit() == []


def tables(path: Path) -> list[str]:
    conn = sqlite3.connect(path)
    try:
        return [n for (n,) in conn.execute("SELECT name FROM sqlite_master ORDER BY name")]
    finally:
        conn.close()


@pytest.mark.parametrize("dies", ["wal", "commit"])
async def test_a_new_sqlite_file_killed_while_created_is_created_next_time(
    tmp_path: Path, scripts: Scripts, dies: str
) -> None:
    path = tmp_path / "s.db"
    child = scripts.run(_DIE_IN_CREATION, str(path), dies, env=_child_env())
    assert child.returncode == -signal.SIGKILL, child.stderr
    _proof.record("crash-outside:kills")
    if dies == "commit":
        assert uncommitted_frames(Path(f"{path}-wal")) > 2  # its pages on disk, uncommitted
    assert tables(path) == []  # nothing of the schema, however far it got

    url = f"sqlite:///{path}"
    with pytest.raises(so.SchemaVersionError, match="has no signoff schema"):
        await SQLiteStore(url, migrate=False).open()
    assert tables(path) == []
    opening = "import asyncio, sys; from signoff.stores.sqlite import SQLiteStore; "
    opening += "asyncio.run(SQLiteStore(sys.argv[1]).open())"
    racers = [
        subprocess.Popen([sys.executable, "-c", opening, url], env=_child_env()) for _ in range(2)
    ]
    assert [r.wait(timeout=60) for r in racers] == [0, 0]
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("SELECT value FROM meta").fetchall() == [(str(SQLITE_SCHEMA),)]
    finally:
        conn.close()
    await a_turn_runs(url)


@pytest.mark.parametrize("dies_after", [1, PG_SCHEMA])
async def test_a_new_postgres_schema_killed_while_created_is_created_next_time(
    pg_url: str, scripts: Scripts, dies_after: int
) -> None:
    """Killed after the first migration, or after the last one before the commit: the schema
    itself is not there either (it is created in the same transaction)."""
    child = scripts.run(_DIE_IN_MIGRATION, pg_url, str(dies_after), env=_child_env())
    assert child.returncode == -signal.SIGKILL, child.stderr
    _proof.record("crash-outside:kills")
    with psycopg.connect(pg_url) as conn:
        found = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = 'signoff'").fetchall()
    assert found == []

    with pytest.raises(so.SchemaVersionError):
        await PostgresStore(pg_url, migrate=False).open()
    racers = [
        subprocess.Popen([sys.executable, "-c", _OPEN, pg_url], env=_child_env()) for _ in range(2)
    ]
    assert [r.wait(timeout=60) for r in racers] == [0, 0]
    now = versions(pg_url)
    assert [v for v, _ in now] == list(range(1, PG_SCHEMA + 1))
    assert len({at for _, at in now}) == 1  # applied together, by one opening
    await a_turn_runs(pg_url)
