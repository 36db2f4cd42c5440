"""The upgrade that gives session rows their initiator (SQLite schema 7, PostgreSQL migration
8): a store of the schema before, with no such columns, gets them filled from each session's
first event as this signoff writes them, and an upgrade killed halfway leaves the old schema."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from signoff.stores import InitiatorFilter, SQLiteStore
from signoff.stores.postgres import STORE_SCHEMA

from ._audit import alter
from ._child_deadlines import before_child_deadlines
from ._forks import Scripts
from ._procs import query
from ._wal import SPILL, uncommitted_frames
from .conftest import make_store
from .test_initiators import ALICE, _populate
from .test_postgres_upgrade import everything, versions
from .test_sqlite_upgrade import _child_env, dump

DAMAGED = b"\x07not a document"


def _columns(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT id, initiator, tenant FROM {t}sessions ORDER BY id")


def back_to_the_schema_before(url: str) -> None:
    """The store as the schema before this upgrade had it: no initiator columns nor indexes."""
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url[len("sqlite:///") :])) as conn, conn:
            conn.execute("DROP INDEX sessions_by_initiator")
            conn.execute("DROP INDEX sessions_by_tenant")
            conn.execute("ALTER TABLE sessions DROP COLUMN initiator")
            conn.execute("ALTER TABLE sessions DROP COLUMN tenant")
            conn.execute("UPDATE meta SET value = '6' WHERE key = 'schema'")
        return
    before_child_deadlines(url)  # migration 11's, after this one
    alter(url, "DROP INDEX {t}sessions_by_initiator")
    alter(url, "DROP INDEX {t}sessions_by_tenant")
    alter(url, "ALTER TABLE {t}sessions DROP COLUMN initiator, DROP COLUMN tenant")
    for index in ("events_pkey", "audit_pkey", "audit_by_session"):  # and migration 9's fill
        alter(url, f"ALTER INDEX {{t}}{index} RESET (fillfactor)")
    alter(url, "DELETE FROM {t}schema_version WHERE version >= 8")


async def _written(url: str) -> list[tuple[Any, ...]]:
    """A store of this signoff's with a session of each kind of initiator; its columns."""
    store = make_store(url)
    await store.open()
    try:
        await _populate(store)
    finally:
        await store.close()
    return _columns(url)


async def test_an_upgrade_fills_initiators_as_this_signoff_writes_them(store_url: str) -> None:
    """Each session row gets the initiator and tenant this signoff writes when it creates one
    (none for a session started without a principal, a subagent's its parent's); one whose
    first event cannot be read gets none a filter matches, so only an admin lists it."""
    written = await _written(store_url)
    back_to_the_schema_before(store_url)
    alter(
        store_url,
        "UPDATE {t}events SET data = {p} WHERE seq = 1 AND sk = "
        "(SELECT sk FROM {t}sessions WHERE id = 'ses_bob')",
        DAMAGED,
    )
    store = make_store(store_url)
    await store.open()
    try:
        picks = InitiatorFilter(principal=ALICE, tenant="acme")
        listed = [s.id for s in await store.sessions(initiated_by=picks)]
        assert listed == ["ses_child", "ses_moved", "ses_alice"]
        assert await store.count_sessions(initiated_by=picks) == 3
    finally:
        await store.close()
    expected = [row if row[0] != "ses_bob" else ("ses_bob", None, None) for row in written]
    assert _columns(store_url) == expected


async def test_the_files_of_older_signoffs_get_initiators_too(tmp_path: Path) -> None:
    """Each SQLite fixture of an older signoff (schema 1 to 4) is upgraded through every step
    to this one's: its sessions, started from Python, are marked so (none unknown)."""
    fixtures = Path(__file__).parent / "fixtures" / "upgrade"
    for fixture in sorted(fixtures.glob("sqlite-*.db")):
        db = tmp_path / fixture.name
        db.write_bytes(fixture.read_bytes())
        store = SQLiteStore(f"sqlite:///{db}")
        await store.open()
        await store.close()
        rows = _columns(f"sqlite:///{db}")
        assert rows and {row[1:] for row in rows} == {("", None)}, fixture.name


_DIE_IN_UPGRADE = (
    SPILL
    + """
import asyncio, sys
from signoff.stores.sqlite import _connection, SQLiteStore

fill = _connection.keep_session_initiators

def filled(conn):
    fill(conn)
    die()  # every row filled, the schema not yet marked, nothing committed

_connection.keep_session_initiators = filled
asyncio.run(SQLiteStore("sqlite:///" + sys.argv[1]).open())
sys.exit(3)  # not killed: the upgrade never reached the point
"""
)


async def test_a_sqlite_upgrade_killed_halfway_leaves_schema_6(
    tmp_path: Path, scripts: Scripts
) -> None:
    """The upgrade runs in the opening transaction: a process killed after filling every row
    (SIGKILL, what it wrote in the WAL but not committed) leaves the file at schema 6 as it
    was, and the next opening upgrades it."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    written = await _written(url)
    back_to_the_schema_before(url)
    before = dump(tmp_path / "old.db")
    child = scripts.run(_DIE_IN_UPGRADE, str(tmp_path / "old.db"), env=_child_env())
    assert child.returncode == -signal.SIGKILL, child.stderr
    wal = tmp_path / "old.db-wal"
    assert wal.stat().st_size == int(child.stdout)
    assert uncommitted_frames(wal) > 0
    assert dump(tmp_path / "old.db") == before
    assert query(url, "SELECT value FROM meta WHERE key = 'schema'") == [("6",)]
    store = SQLiteStore(url)
    await store.open()
    await store.close()
    assert _columns(url) == written


_DIE_IN_MIGRATION = """
import asyncio, os, signal, sys
from signoff.stores.postgres import PostgresStore, _schema
fill = _schema.FILLS[8]
async def filled(conn, s):
    await fill(conn, s)
    os.kill(os.getpid(), signal.SIGKILL)  # every row filled, migration 8 not recorded
_schema.FILLS[8] = filled
asyncio.run(PostgresStore(sys.argv[1]).open())
"""


async def test_a_postgres_migration_killed_halfway_leaves_migration_7(
    pg_store_url: str, scripts: Scripts
) -> None:
    """Migration 8 runs in one transaction with its fill: a process killed after filling every
    row leaves the database at migration 7, every object and row as it was, and the next
    opening migrates it."""
    written = await _written(pg_store_url)
    back_to_the_schema_before(pg_store_url)
    old, before = versions(pg_store_url), everything(pg_store_url)
    child = scripts.run(_DIE_IN_MIGRATION, pg_store_url, env=_child_env())
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert versions(pg_store_url) == old and old[-1][0] == 7
    assert everything(pg_store_url) == before
    store = make_store(pg_store_url)
    await store.open()
    await store.close()
    assert [v for v, _ in versions(pg_store_url)] == list(range(1, STORE_SCHEMA + 1))
    assert _columns(pg_store_url) == written


@pytest.mark.parametrize("found", [5, 6])
async def test_a_file_marked_older_than_it_is_keeps_its_columns(tmp_path: Path, found: int) -> None:
    """A file that has the columns but an older mark (written, then marked back by hand) is
    filled again, not refused: the upgrade adds only what is missing."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    written = await _written(url)
    alter(url, "UPDATE sessions SET initiator = NULL, tenant = NULL")
    alter(url, "UPDATE meta SET value = {p} WHERE key = 'schema'", str(found))
    store = SQLiteStore(url)
    await store.open()
    await store.close()
    assert _columns(url) == written
