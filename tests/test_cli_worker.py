"""`signoff db upgrade` (`_worker`): what it says it did, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from ._cli import invoke


def test_db_upgrade_says_what_it_did_on_sqlite(tmp_path: Path) -> None:
    """Created on a new file, up to date on the same file again, upgraded from an older mark;
    it said "up to date" after creating the schema."""
    from signoff.stores.sqlite import STORE_SCHEMA

    url = f"sqlite:///{tmp_path}/state.db"
    result = invoke("db", "upgrade", "--store", url)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"schema created (version {STORE_SCHEMA})"), result.output
    result = invoke("db", "upgrade", "--store", url)
    assert result.output.startswith(f"schema is up to date (version {STORE_SCHEMA})")
    older = max(2, STORE_SCHEMA - 1)  # schema 1 files have rows of another shape
    with sqlite3.connect(tmp_path / "state.db") as conn:
        conn.execute("UPDATE meta SET value=? WHERE key='schema'", (str(older),))
    conn.close()
    result = invoke("db", "upgrade", "--store", url)
    assert result.exit_code == 0, result.output
    expected = f"schema upgraded from version {older} to {STORE_SCHEMA}"
    assert result.output.startswith(expected), result.output
    with sqlite3.connect(tmp_path / "state.db") as conn:
        mark = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    conn.close()
    assert mark == (str(STORE_SCHEMA),)


def test_db_upgrade_says_what_it_did_on_postgres(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import signoff.stores.postgres._schema as module
    from signoff.stores.postgres import PostgresStore
    from signoff.stores.postgres._url import describe

    current = module.STORE_SCHEMA
    where = f"({describe(pg_url)}, schema 'signoff')"  # which database, and which schema of it
    result = invoke("db", "upgrade", "--store", pg_url)
    assert result.exit_code == 0, result.output
    assert result.output == f"schema created (version {current}) {where}\n"
    result = invoke("db", "upgrade", "--store", pg_url)
    assert result.output == f"schema is up to date (version {current}) {where}\n"
    # a database another schema (the signoff of migration 2) created, then upgraded
    older = pg_url + "?schema=older"
    monkeypatch.setattr(module, "MIGRATIONS", module.MIGRATIONS[:2])
    monkeypatch.setattr(module, "STORE_SCHEMA", 2)
    assert asyncio.run(PostgresStore(older, migrate=False).migrate()) == (0, 2)
    monkeypatch.undo()
    result = invoke("db", "upgrade", "--store", older)
    assert result.exit_code == 0, result.output
    where = f"({describe(older)}, schema 'older')"
    assert result.output == f"schema upgraded from version 2 to {current} {where}\n"
