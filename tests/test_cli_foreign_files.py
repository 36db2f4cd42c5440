"""The commands that create or upgrade a SQLite store (`db upgrade`, `chat`, `worker`, `serve`)
given a file that is another program's database: refused, every byte of it kept; a new or
empty file, and an older signoff store, still work."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app
from signoff.stores.sqlite import STORE_SCHEMA

from ._cli import ROOT, TARGET, invoke


def _users(path: Path) -> None:
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO users VALUES (1, 'ada')")
    conn.commit()
    conn.close()


def _meta(path: Path) -> None:
    """A program of its own with a `meta` table, as signoff's, and no signoff mark in it."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)")
    conn.execute("INSERT INTO meta VALUES ('owner', 'billing')")
    conn.commit()
    conn.close()


FOREIGN: dict[str, Callable[[Path], None]] = {"users": _users, "meta": _meta}


def _no_work(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker that opens its store and, instead of claiming turns for ever, stops."""

    async def work(self: so.Runtime, **kw: object) -> None:
        return None

    monkeypatch.setattr(so.Runtime, "work", work)


def _no_server(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    import uvicorn

    started: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    return started


WRITING = [["db", "upgrade"], ["chat", TARGET], ["worker", TARGET], ["serve", TARGET]]


@pytest.mark.parametrize("kind", FOREIGN)
@pytest.mark.parametrize("command", WRITING)
def test_a_writing_command_refuses_another_programs_database(
    command: list[str], kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`db upgrade` said "schema created" of a database holding another program's `users`
    table, having written signoff's tables and its mark into it (into the program's own `meta`
    table too); `chat`, `worker` and `serve` did the same on opening it. Each is one error line
    and exit status 1 now, the file keeping every byte and nothing made beside it."""
    _no_work(monkeypatch)
    started = _no_server(monkeypatch)
    db = tmp_path / "app.db"
    FOREIGN[kind](db)
    before = db.read_bytes()
    result = CliRunner().invoke(app, [*command, "--store", f"sqlite:///{db}"], input="hi\n")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: UsageError: {db} is not a signoff store but another program's database "
        f"(tables: {kind}): give signoff a file of its own (a new path, or an empty file)\n"
    ), result.output
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["app.db"]
    assert started == []


def test_a_foreign_database_a_program_has_open_in_wal_mode_is_refused(tmp_path: Path) -> None:
    """A program holding its database open in WAL mode keeps its last commits in the -wal:
    the check reads through it, so a file whose tables are all still in the -wal is refused
    too (the reading commands' check skipped such a file, leaving it to the store)."""
    db = tmp_path / "app.db"
    conn = sqlite3.connect(db)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    conn.commit()
    try:
        assert (tmp_path / "app.db-wal").stat().st_size > 0
        for command in (["db", "upgrade"], ["pending"]):
            result = invoke(*command, "--store", f"sqlite:///{db}")
            assert result.exit_code == 1, result.output
            assert "another program's database (tables: users)" in result.stderr, result.output
        assert conn.execute("SELECT name FROM sqlite_master").fetchall() == [("users",)]
    finally:
        conn.close()


@pytest.mark.parametrize("kind", FOREIGN)
def test_a_reading_command_names_another_programs_database(kind: str, tmp_path: Path) -> None:
    """A database with a `meta` table of its own (no signoff mark) read as an older store:
    `pending` said to run `signoff db upgrade`, which then wrote signoff's tables into it."""
    db = tmp_path / "app.db"
    FOREIGN[kind](db)
    before = db.read_bytes()
    for command in (["pending"], ["sessions"], ["events", "ses_x"], ["db", "status"]):
        result = invoke(*command, "--store", f"sqlite:///{db}")
        assert result.exit_code == 1, (command, result.output)
        assert result.stderr == (
            f"error: UsageError: {db} is not a signoff store but another program's database "
            f"(tables: {kind}): pass the store's path with --store or SIGNOFF_STORE\n"
        ), (command, result.output)
    assert db.read_bytes() == before


@pytest.mark.parametrize("empty", ["new", "zero bytes", "no tables"])
def test_db_upgrade_creates_a_store_in_a_new_or_empty_file(empty: str, tmp_path: Path) -> None:
    """What is no program's database yet is made a store: a path where nothing is, an empty
    file (`touch`), a SQLite file with no table (a page size set, say)."""
    db = tmp_path / "state.db"
    if empty == "zero bytes":
        db.touch()
    elif empty == "no tables":
        conn = sqlite3.connect(db)
        conn.execute("PRAGMA page_size=8192")
        conn.execute("VACUUM")
        conn.close()
        assert db.stat().st_size > 0
    result = invoke("db", "upgrade", "--store", f"sqlite:///{db}")
    assert result.exit_code == 0, result.output
    assert result.output == f"schema created (version {STORE_SCHEMA}) (sqlite:///{db})\n"
    assert invoke("sessions", "--store", f"sqlite:///{db}").exit_code == 0


def test_db_upgrade_and_chat_still_upgrade_an_older_store(tmp_path: Path) -> None:
    """A store an older signoff wrote (its mark in `meta`) is no foreign database."""
    fixture = ROOT / "tests" / "fixtures" / "upgrade" / "sqlite-0c4a186.db"
    for command in (["db", "upgrade"], ["chat", TARGET]):
        db = tmp_path / f"{command[0]}.db"
        db.write_bytes(fixture.read_bytes())
        result = CliRunner().invoke(app, [*command, "--store", f"sqlite:///{db}"], input="")
        assert result.exit_code == 0, result.output
        conn = sqlite3.connect(db)
        try:
            mark = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        finally:
            conn.close()
        assert mark == (str(STORE_SCHEMA),)
