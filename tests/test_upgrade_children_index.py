"""The upgrade that puts the index of children on their status and deadline (SQLite schema 8,
PostgreSQL migration 10, and 11 after it, which indexes a copy of the deadline kept for children
only): a store of the schema before, with the index on the status alone, gets it redefined in
place, a kill midway leaves the old one, and an older signoff refuses the upgraded store."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from signoff._exceptions import SchemaVersionError, StoreError
from signoff.stores import Store
from signoff.stores.postgres import MIGRATIONS, PostgresStore
from signoff.stores.postgres import STORE_SCHEMA as PG_SCHEMA
from signoff.stores.sqlite import STORE_SCHEMA as SQLITE_SCHEMA
from signoff.stores.sqlite import SQLiteStore

from ._audit import alter
from ._child_deadlines import before_child_deadlines
from ._forks import Scripts
from ._procs import query
from ._wal import SPILL
from .test_postgres_upgrade import _DIE_IN_MIGRATION, everything, versions
from .test_sqlite_upgrade import _child_env, dump
from .test_store_lapsed_ancestors import _populate


def _index(url: str) -> str:
    """How the store defines `sessions_children`."""
    if url.startswith("sqlite:///"):
        sql = "SELECT sql FROM sqlite_master WHERE name = 'sessions_children'"
    else:
        sql = "SELECT indexdef FROM pg_indexes WHERE indexname = 'sessions_children'"
    ((found,),) = query(url, sql)
    return " ".join(str(found).split())


def _mark(url: str) -> int:
    if url.startswith("sqlite:///"):
        return int(query(url, "SELECT value FROM meta WHERE key = 'schema'")[0][0])
    return int(query(url, "SELECT MAX(version) FROM {t}schema_version")[0][0])


def _back_to_the_schema_before(url: str) -> None:
    """The store as the schema before this upgrade had it: its children indexed by status."""
    before_child_deadlines(url)  # PostgreSQL's migration 11, after this one
    alter(url, "DROP INDEX {t}sessions_children")
    alter(url, "CREATE INDEX sessions_children ON {t}sessions (status) WHERE parent IS NOT NULL")
    if url.startswith("sqlite:///"):
        alter(url, "UPDATE meta SET value = '7' WHERE key = 'schema'")
    else:
        alter(url, "DELETE FROM {t}schema_version WHERE version >= 10")


def _store(url: str, *, migrate: bool = True) -> Store:
    if url.startswith("sqlite:///"):
        return SQLiteStore(url, migrate=migrate)
    return PostgresStore(url, migrate=migrate)


async def _written(url: str) -> None:
    store = _store(url)
    await store.open()
    try:
        await _populate(store)
    finally:
        await store.close()


async def _lapsed(url: str, now: float) -> list[str]:
    store = _store(url)
    await store.open()
    try:
        found: list[str] = await store.lapsed_ancestors(now)  # type: ignore[attr-defined]
    finally:
        await store.close()
    return found


def _older_signoff(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as the signoff before the upgrade, until `monkeypatch.undo()`."""
    if url.startswith("sqlite:///"):
        import signoff.stores.sqlite._connection as sqlite_module

        monkeypatch.setattr(sqlite_module, "STORE_SCHEMA", 7)
        return
    import signoff.stores.postgres._schema as pg_module

    monkeypatch.setattr(pg_module, "MIGRATIONS", MIGRATIONS[:9])
    monkeypatch.setattr(pg_module, "STORE_SCHEMA", 9)


async def test_the_index_of_children_is_redefined_in_place(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store of the schema before is refused unupgraded, then upgraded when opened: the same
    index, now on the status and the deadline, serves the same answers; the signoff before
    refuses the upgraded store and changes nothing of it."""
    sqlite = store_url.startswith("sqlite:///")
    current, before = (SQLITE_SCHEMA, 7) if sqlite else (PG_SCHEMA, 9)
    await _written(store_url)
    new = _index(store_url)
    assert f"(status, {'' if sqlite else 'child_'}expires_at)" in new
    assert "parent IS NOT NULL" in new
    _back_to_the_schema_before(store_url)
    old = _index(store_url)
    assert "expires_at" not in old
    unupgraded = _store(store_url, migrate=False)
    with pytest.raises(StoreError, match="signoff db upgrade"):
        await unupgraded.open()
    assert _index(store_url) == old and _mark(store_url) == before
    assert await _lapsed(store_url, 200.0) == ["ses_p", "ses_r"]  # read alike, through the upgrade
    assert _index(store_url) == new and _mark(store_url) == current
    _older_signoff(store_url, monkeypatch)
    with pytest.raises(SchemaVersionError, match=f"store schema( version)? {current}"):
        await _store(store_url).open()
    monkeypatch.undo()
    assert _index(store_url) == new and _mark(store_url) == current


_DIE_IN_SQLITE_UPGRADE = (
    SPILL
    + """
import asyncio, sys
from signoff.stores.sqlite import _connection, SQLiteStore

def at_commit(conn):
    if sys.argv[2] == "commit":
        die()  # every step of the upgrade done but its commit

redefine = _connection.order_children_by_expiry

def dropped(conn):
    redefine(conn)
    if sys.argv[2] == "dropped":
        die()  # the old index dropped, the new one not made, nothing marked

_connection.order_children_by_expiry = dropped
asyncio.run(SQLiteStore("sqlite:///" + sys.argv[1]).open())
sys.exit(3)  # not killed: the upgrade never reached the point
"""
)


async def test_an_upgrade_killed_midway_leaves_the_old_index_and_finishes_next_time(
    store_url: str, scripts: Scripts
) -> None:
    """The redefinition runs in the upgrade's one transaction: a process killed in it (SIGKILL,
    after the old index is dropped, or with everything done but the commit) leaves the store as
    it was, the old index and mark, and the next opening upgrades it."""
    await _written(store_url)
    new = _index(store_url)
    _back_to_the_schema_before(store_url)
    old = _index(store_url)
    if store_url.startswith("sqlite:///"):
        db = Path(store_url[len("sqlite:///") :])
        before: Any = dump(db)
        for point in ("dropped", "commit"):
            child = scripts.run(_DIE_IN_SQLITE_UPGRADE, str(db), point, env=_child_env())
            assert child.returncode == -signal.SIGKILL, child.stderr
            assert dump(db) == before
    else:
        before = everything(store_url), versions(store_url)
        child = scripts.run(_DIE_IN_MIGRATION, store_url, "10", env=_child_env())
        assert child.returncode == -signal.SIGKILL, child.stderr
        assert (everything(store_url), versions(store_url)) == before
    assert _index(store_url) == old and "expires_at" not in old
    assert await _lapsed(store_url, 100.0) == ["ses_p"]
    assert _index(store_url) == new
