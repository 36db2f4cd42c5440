"""PostgreSQL's migration 11: a store of migration 10, its children indexed by status and
`expires_at`, gets a copy of each child's deadline (`child_expires_at`, NULL for any other
session) and the index of children on it, in place; a kill midway leaves migration 10, and the
signoff before refuses the upgraded store. SQLite keeps its schema (it has no HOT updates)."""

from __future__ import annotations

import signal
from typing import Any

import pytest

from signoff._exceptions import SchemaVersionError, StoreError
from signoff.stores.postgres import MIGRATIONS, STORE_SCHEMA, PostgresStore

from ._child_deadlines import before_child_deadlines
from ._forks import Scripts
from ._procs import query
from .test_postgres_upgrade import _DIE_IN_MIGRATION, everything, versions
from .test_sqlite_upgrade import _child_env
from .test_upgrade_children_index import _index, _lapsed, _mark, _written


def _deadlines(url: str) -> list[tuple[Any, ...]]:
    return query(url, "SELECT id, expires_at, child_expires_at FROM {t}sessions ORDER BY id")


def _older_signoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process as the signoff of migration 10, until `monkeypatch.undo()`."""
    import signoff.stores.postgres._schema as module

    monkeypatch.setattr(module, "MIGRATIONS", MIGRATIONS[:10])
    monkeypatch.setattr(module, "STORE_SCHEMA", 10)


async def test_the_copies_of_child_deadlines_are_filled_in_place(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store of migration 10 is refused unupgraded, then upgraded when opened: each child with
    a TTL gets its deadline copied as this signoff writes it (other sessions none), the index of
    children is on the copy, and the lapsed subagents read the same; the signoff of migration 10
    refuses the upgraded store and changes nothing of it."""
    url = pg_store_url
    await _written(url)  # children with and without a TTL, idle and live, sessions of no parent
    written, new = _deadlines(url), _index(url)
    assert "(status, child_expires_at)" in new and "parent IS NOT NULL" in new
    copied = {sid: child for sid, _, child in written if child is not None}
    assert copied == {"ses_p1": 100.0, "ses_r1": 200.0, "ses_s1": 50.0, "ses_u1": 10.0}
    before_child_deadlines(url)
    old = _index(url)
    assert "(status, expires_at)" in old
    with pytest.raises(StoreError, match="signoff db upgrade"):
        await PostgresStore(url, migrate=False).open()
    assert _index(url) == old and _mark(url) == 10
    assert await _lapsed(url, 100.0) == ["ses_p"]  # read alike, through the upgrade
    assert _deadlines(url) == written
    assert _index(url) == new and _mark(url) == STORE_SCHEMA
    assert await _lapsed(url, 99.9) == [] and await _lapsed(url, 200.0) == ["ses_p", "ses_r"]
    _older_signoff(monkeypatch)
    with pytest.raises(SchemaVersionError, match=f"store schema version {STORE_SCHEMA}"):
        await PostgresStore(url).open()
    monkeypatch.undo()
    assert _deadlines(url) == written and _index(url) == new and _mark(url) == STORE_SCHEMA


async def test_a_migration_killed_midway_leaves_migration_10(
    pg_store_url: str, scripts: Scripts
) -> None:
    """Migration 11 runs in one transaction: a process killed with it done but not committed
    (SIGKILL) leaves every object and row as migration 10 had them, and the next opening
    upgrades the store."""
    url = pg_store_url
    await _written(url)
    written, new = _deadlines(url), _index(url)
    before_child_deadlines(url)
    old, before = versions(url), everything(url)
    child = scripts.run(_DIE_IN_MIGRATION, url, "11", env=_child_env())
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert versions(url) == old and old[-1][0] == 10
    assert everything(url) == before
    assert await _lapsed(url, 100.0) == ["ses_p"]
    assert _deadlines(url) == written and _index(url) == new
