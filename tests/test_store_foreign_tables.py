"""A store opened where another program's tables already use the names signoff's schema
creates: refused on both stores, the file or schema left as it was, not marked as a store."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import psycopg
import pytest

import signoff as so
from signoff.stores.postgres import PostgresStore
from signoff.stores.sqlite import SQLiteStore

from ._cli import invoke


def _foreign_sqlite(path: Path, ddl: str) -> None:
    conn = sqlite3.connect(path)
    conn.execute(ddl)
    conn.execute("INSERT INTO events (id, name) VALUES (1, 'signup')")
    conn.commit()
    conn.close()


FOREIGN = [
    "CREATE TABLE events (id INTEGER PRIMARY KEY, name TEXT)",
    "CREATE TABLE events (id INTEGER PRIMARY KEY, name TEXT, seq INTEGER, sk INTEGER)",
]


@pytest.mark.parametrize("ddl", FOREIGN)
async def test_a_sqlite_file_with_another_programs_events_table_is_refused(
    tmp_path: Path, ddl: str
) -> None:
    """Another program's database with a table named `events` (or `audit`, `leases`...) was
    marked as a signoff store of this schema, `SCHEMA` skipping the table it found: `migrate`
    reported the schema created, then every session's first write failed on a missing column.
    It is refused, and the file keeps every byte (not even switched to WAL mode)."""
    db = tmp_path / "app.db"
    _foreign_sqlite(db, ddl)
    before = db.read_bytes()
    for attempt in (SQLiteStore(f"sqlite:///{db}").migrate, SQLiteStore(f"sqlite:///{db}").open):
        with pytest.raises(so.StoreError, match="another program's database") as info:
            await attempt()
        assert "(events)" in str(info.value)
    rt = so.Runtime([], store=f"sqlite:///{db}")
    with pytest.raises(so.StoreError, match="another program's database"):
        await rt.open()
    await rt.close()
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


async def test_a_sqlite_file_with_another_programs_meta_table_is_refused(tmp_path: Path) -> None:
    """Another program's `meta(key, value)` table was taken for signoff's own: the store was
    created in its database and its schema mark written into that program's table. A `meta`
    table without signoff's mark is refused as any other name is, the file kept as it was."""
    db = tmp_path / "app.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('app_version', '3')")
    conn.execute("CREATE TABLE users (id INTEGER)")
    conn.commit()
    conn.close()
    before = db.read_bytes()
    for attempt in (SQLiteStore(f"sqlite:///{db}").migrate, SQLiteStore(f"sqlite:///{db}").open):
        with pytest.raises(so.StoreError, match="another program's database") as info:
            await attempt()
        assert "(meta)" in str(info.value)
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]


def test_db_upgrade_refuses_a_sqlite_file_with_another_programs_tables(tmp_path: Path) -> None:
    """`signoff db upgrade` said "schema created" of such a file; it is one error line now,
    refused before the store opens it, as any other program's database is (`_store_files`)."""
    db = tmp_path / "app.db"
    _foreign_sqlite(db, FOREIGN[0])
    before = db.read_bytes()
    result = invoke("db", "upgrade", "--store", f"sqlite:///{db}")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: UsageError: {db} is not a signoff store but another")
    assert "(tables: events)" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert db.read_bytes() == before


def test_a_postgresql_schema_with_another_programs_events_table_is_refused(
    pg_url: str,
) -> None:
    """The same on PostgreSQL (a schema shared with another program, `?schema=public`): the
    migration is refused by name before it changes anything, leaving no `schema_version`
    behind."""
    url = f"{pg_url}?schema=public"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.events (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO public.events VALUES (1, 'signup')")
        for attempt in (PostgresStore(url).migrate, PostgresStore(url).open):
            with pytest.raises(so.StoreError, match="'public' already holds events, "):
                asyncio.run(attempt())
        result = invoke("db", "upgrade", "--store", url)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("error: StoreError: cannot migrate"), result.stderr
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema='public'"
        ).fetchall()
        assert tables == [("events",)]
        assert conn.execute("SELECT * FROM public.events").fetchall() == [(1, "signup")]


def test_a_store_created_while_another_process_checks_the_file_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check for tables without a mark reads the mark, then the table names: a process
    creating the store between the two reads (two opening a new file together) must not make
    the other one see signoff's tables without their mark and refuse the store as foreign."""
    from signoff.stores.sqlite import _connection
    from signoff.stores.sqlite._schema import names_taken as real

    db = tmp_path / "state.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")  # as a creation killed after the switch leaves it
    conn.close()
    other = SQLiteStore(f"sqlite:///{db}")
    checks: list[str] = []

    def created_meanwhile(conn: sqlite3.Connection) -> list[str]:
        checks.append("checked")
        if len(checks) == 1:
            other.open_sync()  # another process creates the store and commits
        return real(conn)

    monkeypatch.setattr(_connection, "names_taken", created_meanwhile)
    store = SQLiteStore(f"sqlite:///{db}")
    try:
        store.open_sync()
        assert other.schema_found == 0
    finally:
        asyncio.run(store.close())
        asyncio.run(other.close())


@pytest.mark.parametrize(
    ("ddl", "row"),
    [
        ("version INTEGER PRIMARY KEY, dirty BOOLEAN", "(20210101, false)"),
        ("version INTEGER PRIMARY KEY, dirty BOOLEAN", "(3, false)"),
        (
            "installed_rank INTEGER PRIMARY KEY, version VARCHAR(50), description TEXT",
            "(1, '1', 'x')",
        ),
    ],
)
def test_another_programs_schema_version_table_is_named_not_read_as_signoffs(
    pg_url: str, ddl: str, row: str
) -> None:
    """A schema shared with a program keeping its own `schema_version` table: its numbers were
    read as signoff's store schema, so a date-like version was "newer, upgrade signoff" (also
    from `db status`) and a small one had signoff's later migrations run on tables it lacks.
    The table is named as another program's, and nothing is written."""
    url = f"{pg_url}?schema=public"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE public.schema_version ({ddl})")
        conn.execute(f"INSERT INTO public.schema_version VALUES {row}")
        for attempt in (
            PostgresStore(url).migrate,
            PostgresStore(url).open,
            PostgresStore(url, migrate=False).open,
        ):
            with pytest.raises(so.StoreError, match="schema_version that is not signoff's") as info:
                asyncio.run(attempt())
            assert not isinstance(info.value, so.SchemaVersionError)
        for command in (["db", "upgrade"], ["db", "status"]):
            result = invoke(*command, "--store", url)
            assert result.exit_code == 1, result.output
            assert "that is not signoff's" in result.stderr, result.stderr
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema='public'"
        ).fetchall()
        assert tables == [("schema_version",)]


def _relations(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """Every schema and relation (tables, indexes, sequences) and function outside PostgreSQL's
    own: what a refused migration must leave as it was."""
    rows = conn.execute(
        "SELECT n.nspname, c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') "
        "UNION ALL SELECT n.nspname, p.proname || '()' FROM pg_proc p "
        "JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname NOT IN "
        "('pg_catalog', 'information_schema') UNION ALL SELECT nspname, '' FROM pg_namespace "
        "WHERE nspname NOT LIKE 'pg\\_%' AND nspname <> 'information_schema' ORDER BY 1, 2"
    ).fetchall()
    return [(row[0], row[1]) for row in rows]


def test_a_shared_schemas_tables_of_signoffs_names_are_named_before_any_change(
    pg_url: str,
) -> None:
    """A schema shared with another program (`?schema=public`) holding tables, an index and a
    function of the names signoff's schema creates: `db upgrade` said only `relation "leases"
    already exists`, the first it stumbled on. Every one is named before anything is created,
    with what to do (a schema of signoff's own), in one line."""
    url = f"{pg_url}?schema=public"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("CREATE TABLE public.leases (id INTEGER PRIMARY KEY)")
        conn.execute("CREATE TABLE public.audit (id INTEGER PRIMARY KEY, what TEXT)")
        conn.execute("CREATE TABLE public.orders (id INTEGER PRIMARY KEY, at DOUBLE PRECISION)")
        conn.execute("CREATE INDEX requests_due ON public.orders (at)")
        conn.execute(
            "CREATE FUNCTION public.request_closed(request TEXT) RETURNS BOOLEAN "
            "LANGUAGE sql AS 'SELECT true'"
        )
        before = _relations(conn)
        for attempt in (PostgresStore(url).migrate, PostgresStore(url).open):
            with pytest.raises(so.StoreError) as info:
                asyncio.run(attempt())
            message = str(info.value)
            assert "schema 'public' already holds audit, leases, requests_due and " in message
            assert "request_closed()" in message and "?schema=NAME" in message, message
        result = invoke("db", "upgrade", "--store", url)
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("error: StoreError: cannot migrate"), result.stderr
        assert "already holds audit, leases, requests_due and request_closed()" in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
        assert _relations(conn) == before
        # libpq's own search_path (`?options=-csearch_path=public`) moves none of signoff's
        # tables: they are named with their schema, signoff's own, and public is untouched
        result = invoke("db", "upgrade", "--store", f"{pg_url}?options=-csearch_path%3Dpublic")
        assert result.exit_code == 0, result.stderr
        assert "schema 'signoff'" in result.output
        assert [r for r in _relations(conn) if r[0] == "public"] == [
            r for r in before if r[0] == "public"
        ]


def test_a_pending_migrations_names_are_checked_not_the_stores_own(pg_url: str) -> None:
    """A store at migration 13: its own tables are no obstacle to the migrations after it, a
    foreign table of the name migration 14 creates is, named before anything changes."""
    url = f"{pg_url}?schema=shared"
    asyncio.run(PostgresStore(url).migrate())
    with psycopg.connect(pg_url, autocommit=True) as conn:
        last = conn.execute("SELECT MAX(version) FROM shared.schema_version").fetchone()
        assert last is not None
        conn.execute("ALTER TABLE shared.leases DROP COLUMN ttl, DROP COLUMN granted_at")  # 15's
        conn.execute("DROP INDEX shared.sessions_by_parent")
        conn.execute("DELETE FROM shared.schema_version WHERE version >= 14")
        conn.execute("CREATE TABLE shared.sessions_by_parent (id INTEGER)")
        before = _relations(conn)
        with pytest.raises(so.StoreError, match="already holds sessions_by_parent, "):
            asyncio.run(PostgresStore(url).migrate())
        assert _relations(conn) == before
        conn.execute("DROP TABLE shared.sessions_by_parent")
        assert asyncio.run(PostgresStore(url).migrate()) == (13, last[0])
