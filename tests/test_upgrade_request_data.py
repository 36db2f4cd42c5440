"""Request rows without their own copy (SQLite store schema 11): a file upgraded from schema 1
kept that schema's `requests.data NOT NULL`, so every new request, whose row's `data` is NULL
when its event holds it, was refused and its turn left running. The upgrade from schema 1 now
makes `requests` as a new file has it, and schema 11 mends a file an older signoff upgraded."""

from __future__ import annotations

import re
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores.sqlite import STORE_SCHEMA, SQLiteStore, _connection
from tests import _upgrade
from tests._upgrade import BOB

from ._forks import Scripts
from ._wal import SPILL, uncommitted_frames
from .test_sqlite_upgrade import _child_env, dump
from .test_upgrade import FIXTURES, SQLITE, resume_all

UPGRADED_BY_OLDER = "sqlite-2e32584-dfbdcf8"
"""The schema 1 fixture as the signoff of commit dfbdcf8 upgraded it: marked 10, `requests.data`
still NOT NULL."""
FROM_SCHEMA_1 = ["sqlite-2e32584", UPGRADED_BY_OLDER]

KEPT_FROM_SCHEMA_1 = {
    ("table", "events"): "CREATE TABLE events(sk INTEGER NOT NULL,seq INTEGER NOT NULL,type TEXT "
    "NOT NULL,turn TEXT,at REAL NOT NULL,v INTEGER NOT NULL,data TEXT NOT NULL,PRIMARY KEY(sk,seq))"
    "WITHOUT ROWID",
    ("table", "meta"): "CREATE TABLE meta(key TEXT PRIMARY KEY,value TEXT NOT NULL)",
    ("table", "snapshots"): "CREATE TABLE snapshots(sk INTEGER PRIMARY KEY,seq INTEGER NOT NULL,"
    "data TEXT NOT NULL)",
}
"""What a file upgraded from schema 1 keeps of it, unlike a new file, and may: `data` declared
TEXT where a new file declares BLOB (a column of TEXT affinity keeps a blob as it is, and every
row since schema 2 writes one), and a NOT NULL on `meta.value`, which signoff never leaves NULL."""


def _copy(fixture: str, tmp_path: Path) -> Path:
    db = tmp_path / "state.db"
    shutil.copy(FIXTURES / f"{fixture}.db", db)
    return db


def _schema(db: Path) -> dict[tuple[str, str], str | None]:
    """Every table and index of the file, each defined by its SQL with whitespace normalised
    (that of a column `ALTER TABLE` added differs from that of one the table was made with)."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT type, name, sql FROM sqlite_schema").fetchall()
    conn.close()
    return {
        (kind, name): None
        if sql is None
        else re.sub(r"\s*([(),])\s*", r"\1", " ".join(sql.split()))
        for kind, name, sql in rows
    }


def _mark(db: Path) -> str:
    with sqlite3.connect(db) as conn:
        (found,) = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
    conn.close()
    return str(found)


def _data_not_null(db: Path) -> bool:
    with sqlite3.connect(db) as conn:
        columns = {row[1]: row[3] for row in conn.execute("PRAGMA table_info(requests)")}
    conn.close()
    return bool(columns["data"])


def _requests(db: Path) -> list[dict[str, Any]]:
    """Every request row, by column name (a rebuilt table orders its columns anew)."""
    with sqlite3.connect(db) as conn:
        conn.row_factory = sqlite3.Row
        rows = [dict(row) for row in conn.execute("SELECT * FROM requests ORDER BY id")]
    conn.close()
    return rows


async def _opened(db: Path) -> None:
    store = SQLiteStore(f"sqlite:///{db}")
    await store.open()
    await store.close()


@pytest.mark.parametrize("fixture", FROM_SCHEMA_1)
async def test_new_requests_in_a_file_upgraded_from_schema_1_wait_and_complete(
    fixture: str, tmp_path: Path
) -> None:
    """Every scenario started anew after the upgrade (approvals, questions, a workflow's, a
    two-person approval, a subagent's) parks on its new request and completes once answered."""
    db = _copy(fixture, tmp_path)
    _upgrade.RAN.clear()
    async with so.Runtime(_upgrade.agents(), store=f"sqlite:///{db}") as rt:
        sessions = await _upgrade.park(rt)  # each asserts its turn waits
        for name, sid in sessions.items():
            assert name == "answered" or await rt.pending(session_id=sid), name
        finals = await resume_all(rt, sessions)  # each asserts its turn completes
        assert finals["one"] == "user:go one | calls:refund | refund=refunded A1"
        assert await rt.verify_audit() == []
    assert _upgrade.RAN.count("refund A1") == 1
    _upgrade.RAN.clear()
    assert not _data_not_null(db)


@pytest.mark.parametrize("fixture", SQLITE)
async def test_an_upgraded_file_has_the_schema_of_a_new_one(fixture: str, tmp_path: Path) -> None:
    """Each older file, once upgraded, defines every table and index as a new file does, but
    for what a file from schema 1 keeps of it harmlessly (`KEPT_FROM_SCHEMA_1`)."""
    db = _copy(fixture, tmp_path)
    await _opened(db)
    new = tmp_path / "new.db"
    await _opened(new)
    expected = _schema(new)
    if fixture in FROM_SCHEMA_1:
        expected |= KEPT_FROM_SCHEMA_1
    assert _schema(db) == expected


async def test_a_file_an_older_signoff_upgraded_from_schema_1_is_mended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Marked 10 with `requests.data NOT NULL`: refused unupgraded, changing nothing; upgraded,
    its request rows are the same and may go without `data`; the signoff before refuses it."""
    db = _copy(UPGRADED_BY_OLDER, tmp_path)
    assert _mark(db) == "10" and _data_not_null(db)
    rows, before = _requests(db), dump(db)
    assert len(rows) > 5 and all(row["data"] is not None for row in rows)
    with pytest.raises(so.SchemaVersionError, match="store schema 10, .*signoff db upgrade"):
        await SQLiteStore(f"sqlite:///{db}", migrate=False).open()
    assert dump(db) == before
    store = SQLiteStore(f"sqlite:///{db}", migrate=False)
    assert await store.migrate() == (10, STORE_SCHEMA)
    await store.close()
    assert _mark(db) == str(STORE_SCHEMA) == "11" and not _data_not_null(db)
    assert _requests(db) == rows
    after = dump(db)
    monkeypatch.setattr(_connection, "STORE_SCHEMA", 10)  # the signoff before this one
    with pytest.raises(so.SchemaVersionError, match="store schema 11; this signoff knows up to 10"):
        await SQLiteStore(f"sqlite:///{db}").open()
    monkeypatch.undo()
    assert dump(db) == after


async def test_a_file_marked_10_that_needs_no_mending_keeps_its_table(tmp_path: Path) -> None:
    """A file made at schema 2 or later already lets `data` be NULL: schema 11 only marks it."""
    db = tmp_path / "s.db"
    agent = _upgrade.agents()[0]
    async with so.Runtime([agent], store=f"sqlite:///{db}") as rt:
        parked = await rt.generate("one", prompt="go one")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value='10' WHERE key='schema'")
        table = "SELECT rootpage, sql FROM sqlite_schema WHERE name='requests'"
        kept = conn.execute(table).fetchone()
    conn.close()
    rows = _requests(db)
    await _opened(db)
    with sqlite3.connect(db) as conn:
        assert conn.execute(table).fetchone() == kept  # the same table, not one made anew
    conn.close()
    assert _mark(db) == str(STORE_SCHEMA) and _requests(db) == rows
    assert rows[0]["id"] == parked.pending[0].id and rows[0]["data"] is None


_DIE_IN_MENDING = (
    SPILL
    + """
import asyncio, sys
from signoff.stores.sqlite import _connection, SQLiteStore

def at_commit(conn):
    if sys.argv[2] == "commit":
        die()  # every step of the upgrade done but its commit

mend = _connection.let_requests_hold_no_copy

def rebuilt(conn):
    mend(conn)
    if sys.argv[2] == "rebuilt":
        die()  # the rows copied to the new table, the old one dropped, nothing marked

_connection.let_requests_hold_no_copy = rebuilt
asyncio.run(SQLiteStore("sqlite:///" + sys.argv[1]).open())
sys.exit(3)  # not killed: the upgrade never reached the point
"""
)


@pytest.mark.parametrize("dies", ["rebuilt", "commit"])
async def test_a_mending_killed_halfway_leaves_the_old_table_and_finishes_next_time(
    tmp_path: Path, scripts: Scripts, dies: str
) -> None:
    """The rebuild runs in the opening transaction: a process killed in it (SIGKILL, no
    rollback), with what it wrote in the WAL but not committed, leaves the file as the older
    signoff left it, and the next opening mends it, two processes opening it at once once."""
    db = _copy(UPGRADED_BY_OLDER, tmp_path)
    rows, before = _requests(db), dump(db)
    child = scripts.run(_DIE_IN_MENDING, str(db), dies, env=_child_env())
    assert child.returncode == -signal.SIGKILL, child.stderr
    wal = Path(f"{db}-wal")
    assert wal.stat().st_size == int(child.stdout)  # as the killed upgrade left it
    assert uncommitted_frames(wal) > 2  # its pages, on disk, no commit among them
    assert dump(db) == before and _mark(db) == "10" and _data_not_null(db)
    opening = "import asyncio, sys; from signoff.stores.sqlite import SQLiteStore; "
    opening += "asyncio.run(SQLiteStore(sys.argv[1]).open())"
    racers = [
        subprocess.Popen([sys.executable, "-c", opening, f"sqlite:///{db}"], env=_child_env())
        for _ in range(2)
    ]
    assert [r.wait(timeout=60) for r in racers] == [0, 0]
    assert _mark(db) == str(STORE_SCHEMA) and not _data_not_null(db)
    assert _requests(db) == rows
    async with so.Runtime(_upgrade.agents(), store=f"sqlite:///{db}") as rt:
        parked = await rt.generate("one", prompt="go one")
        vote = {"request_id": parked.pending[0].id, "option_id": "approve"}
        assert (await rt.respond(parked.session_id, [vote], principal=BOB)).status == "completed"
