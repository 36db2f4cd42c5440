"""`signoff db upgrade` (`_worker`): what it says it did, on SQLite and on PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

from ._cli import invoke, tenant_runtime


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


def test_db_status_checks_a_sqlite_store_and_creates_nothing(tmp_path: Path) -> None:
    """What an operator runs before a deploy: up to date is exit status 0 naming the version
    and the file; no store there is an error, and no file is made."""
    from signoff.stores.sqlite import STORE_SCHEMA

    db = tmp_path / "state.db"
    result = invoke("db", "status", "--store", f"sqlite:///{db}")
    assert result.exit_code == 1, result.output
    assert "no store at" in result.stderr and not db.exists()
    assert invoke("db", "upgrade", "--store", f"sqlite:///{db}").exit_code == 0
    before = db.read_bytes()
    result = invoke("db", "status", "--store", f"sqlite:///{db}")
    assert result.exit_code == 0, result.output
    assert result.output == f"schema is up to date (version {STORE_SCHEMA}) (sqlite:///{db})\n"
    assert db.read_bytes() == before


def test_db_status_checks_a_postgres_schema_and_creates_nothing(pg_url: str) -> None:
    import psycopg

    from signoff.stores.postgres._schema import STORE_SCHEMA
    from signoff.stores.postgres._url import describe

    result = invoke("db", "status", "--store", pg_url)
    assert result.exit_code == 1, result.output
    assert "(schema 'signoff') has no signoff schema" in result.stderr
    assert "run `signoff db upgrade` to create it" in result.stderr
    with psycopg.connect(pg_url) as conn:  # nothing was created
        found = "SELECT 1 FROM information_schema.schemata WHERE schema_name='signoff'"
        assert conn.execute(found).fetchall() == []
    assert invoke("db", "upgrade", "--store", pg_url).exit_code == 0
    result = invoke("db", "status", "--store", pg_url)
    assert result.exit_code == 0, result.output
    assert result.output == (
        f"schema is up to date (version {STORE_SCHEMA}) ({describe(pg_url)}, schema 'signoff')\n"
    )


def test_worker_names_the_schema_of_its_runtimes_store(
    pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A runtime whose store names its schema as an argument (`PostgresStore(url, schema=)`):
    the worker's first log line names the store with that schema, as it names one given as
    `?schema=`, so an operator of several tenants reads which one it works on."""
    import logging

    import signoff as so

    target = tenant_runtime(tmp_path, monkeypatch, "worker_schema_runtime", pg_url)

    async def work(self: so.Runtime, **kw: object) -> None:
        return None

    monkeypatch.setattr(so.Runtime, "work", work)
    with caplog.at_level(logging.INFO, logger="signoff.worker"):
        result = invoke("worker", target)
    assert result.exit_code == 0, result.output
    said = [r.getMessage() for r in caplog.records if r.name == "signoff.worker"]
    (started,) = [line for line in said if ", concurrency 16, lease " in line]
    assert "?schema=tenant_a, concurrency 16" in started, said


def test_worker_names_the_agents_whose_sessions_it_claims(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker claims only sessions of agents its runtime has: started with the wrong target,
    it sat idle beside sessions waiting for a worker, and nothing it logged said why. Its first
    line names its agents, so an operator reads which sessions it will never take."""
    import logging

    import signoff as so

    async def work(self: so.Runtime, **kw: object) -> None:
        return None

    monkeypatch.setattr(so.Runtime, "work", work)
    monkeypatch.setenv("SIGNOFF_TEST_RECORDS", str(tmp_path / "runs.jsonl"))
    store = f"sqlite:///{tmp_path / 'state.db'}"
    with caplog.at_level(logging.INFO, logger="signoff.worker"):
        result = invoke("worker", "tests._worker_procs:runtime", "--store", store)
    assert result.exit_code == 0, result.output
    said = [r.getMessage() for r in caplog.records if r.name == "signoff.worker"]
    (started,) = [line for line in said if ", concurrency 16, lease " in line]
    assert started.endswith(", lease 30.0s, agents: support"), said


def test_db_status_names_a_table_or_index_dropped_by_hand_on_sqlite(tmp_path: Path) -> None:
    """A store whose mark is current but which lacks a table or index of the schema: "up to
    date" read as healthy, and no migration makes them again. Exit status 1 names them."""
    db = tmp_path / "state.db"
    assert invoke("db", "upgrade", "--store", f"sqlite:///{db}").exit_code == 0
    with sqlite3.connect(db) as conn:
        conn.execute("DROP INDEX requests_due")
        conn.execute("DROP TABLE snapshots")
    conn.close()
    before = db.read_bytes()
    result = invoke("db", "status", "--store", f"sqlite:///{db}")
    assert result.exit_code == 1, result.output
    assert "up to date" not in result.output
    assert "lacks snapshots and requests_due, dropped outside signoff" in result.stderr
    assert "Restore it from a backup" in result.stderr
    assert db.read_bytes() == before


def test_db_status_names_an_index_or_function_dropped_by_hand_on_postgres(pg_url: str) -> None:
    import psycopg

    url = pg_url + "?schema=dropped"
    assert invoke("db", "upgrade", "--store", url).exit_code == 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP INDEX dropped.sessions_children")
        conn.execute("DROP FUNCTION dropped.request_closed")
    result = invoke("db", "status", "--store", url)
    assert result.exit_code == 1, result.output
    assert "lacks sessions_children and request_closed(), dropped outside" in result.stderr
    result = invoke("db", "upgrade", "--store", url)  # nothing to migrate, and nothing made
    assert result.exit_code == 1 and "up to date" not in result.output, result.output
    assert invoke("db", "status", "--store", url).exit_code == 1


def test_db_upgrade_refuses_a_sqlite_store_lacking_part_of_its_schema(tmp_path: Path) -> None:
    """A store whose mark is current but which lacks a table or index of the schema: `db
    upgrade` said "schema is up to date" with exit status 0, where `db status` calls it damaged.
    It fails as `db status` does, naming them, and changes nothing."""
    db = tmp_path / "state.db"
    assert invoke("db", "upgrade", "--store", f"sqlite:///{db}").exit_code == 0
    with sqlite3.connect(db) as conn:
        conn.execute("DROP INDEX requests_due")
        conn.execute("DROP TABLE snapshots")
    conn.close()
    before = db.read_bytes()
    result = invoke("db", "upgrade", "--store", f"sqlite:///{db}")
    assert result.exit_code == 1, result.output
    assert "up to date" not in result.output, result.output
    assert f"sqlite:///{db} has schema version " in result.stderr
    assert "lacks snapshots and requests_due, dropped outside signoff" in result.stderr
    assert "Restore it from a backup" in result.stderr
    assert db.read_bytes() == before


def test_db_upgrade_refuses_a_postgres_schema_lacking_part_of_it(pg_url: str) -> None:
    """`db upgrade` of a schema at the current version lacking an index dropped by hand said
    "schema is up to date" with exit status 0. It fails naming it, as `db status` does."""
    import psycopg

    from signoff.stores.postgres._schema import STORE_SCHEMA
    from signoff.stores.postgres._url import describe

    url = pg_url + "?schema=lacking"
    assert invoke("db", "upgrade", "--store", url).exit_code == 0
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP INDEX lacking.requests_due")
    result = invoke("db", "upgrade", "--store", url)
    assert result.exit_code == 1, result.output
    assert "up to date" not in result.output, result.output
    where = f"{describe(url)}, schema 'lacking'"
    assert f"{where} has schema version {STORE_SCHEMA} but lacks requests_due, dropped" in (
        " ".join(result.stderr.split())
    )


def test_db_upgrade_migrates_a_postgres_schema_then_names_what_it_lacks(
    pg_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real migration makes only what the newer migrations add, not an index of an older
    one dropped by hand: it said "upgraded" with exit status 0 on a store `db status` then
    called damaged. The migration done is said, then the damage, with exit status 1."""
    import psycopg

    import signoff.stores.postgres._schema as module
    from signoff.stores.postgres import PostgresStore
    from signoff.stores.postgres._url import describe

    current = module.STORE_SCHEMA
    # a schema of migration 2 that lost an index of migration 1, then upgraded
    older = pg_url + "?schema=older_lacking"
    monkeypatch.setattr(module, "MIGRATIONS", module.MIGRATIONS[:2])
    monkeypatch.setattr(module, "STORE_SCHEMA", 2)
    assert asyncio.run(PostgresStore(older, migrate=False).migrate()) == (0, 2)
    monkeypatch.undo()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("DROP INDEX older_lacking.requests_by_session")
    result = invoke("db", "upgrade", "--store", older)
    assert result.exit_code == 1, result.output
    where = f"{describe(older)}, schema 'older_lacking'"
    assert result.stdout == f"schema upgraded from version 2 to {current} ({where})\n"
    assert "lacks requests_by_session, dropped outside signoff" in result.stderr
    assert asyncio.run(PostgresStore(older, migrate=False).schema_version()) == current
