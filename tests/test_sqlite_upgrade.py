"""Opening a file written by store schema 1 upgrades it in place: nothing is lost, the audit
chain still verifies, and parked sessions resume."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores._codec import unpack_text
from signoff.stores.sqlite import STORE_SCHEMA, SQLiteStore
from signoff.testing import call, call_tools, reply, scripted_agent

from ._forks import Scripts
from ._wal import SPILL, uncommitted_frames

# Schema 1 as the first version wrote it: JSON text everywhere, a full copy of each request, and
# audit rows with their own stream, type, data, prev and hash (as hex text).
SCHEMA_1 = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    sk INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    agent TEXT NOT NULL,
    head INTEGER NOT NULL,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    expires_at REAL
);
CREATE INDEX IF NOT EXISTS sessions_by_status ON sessions (status, updated_at);
CREATE TABLE IF NOT EXISTS events (
    sk INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    type TEXT NOT NULL,
    turn TEXT,
    at REAL NOT NULL,
    v INTEGER NOT NULL,
    data TEXT NOT NULL,
    PRIMARY KEY (sk, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS snapshots (
    sk INTEGER PRIMARY KEY,
    seq INTEGER NOT NULL,
    data TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY,
    sk INTEGER NOT NULL,
    agent TEXT NOT NULL,
    kind TEXT NOT NULL,
    tool TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    outcome TEXT,
    data TEXT NOT NULL,
    resolution TEXT
);
CREATE INDEX IF NOT EXISTS requests_by_status ON requests (status, created_at);
CREATE INDEX IF NOT EXISTS requests_by_session ON requests (sk, status);
CREATE TABLE IF NOT EXISTS audit (
    id INTEGER PRIMARY KEY,
    stream TEXT NOT NULL,
    n INTEGER NOT NULL,
    type TEXT NOT NULL,
    at REAL NOT NULL,
    seq INTEGER,
    data TEXT NOT NULL,
    prev TEXT,
    hash TEXT NOT NULL,
    UNIQUE (stream, n)
);
CREATE TABLE IF NOT EXISTS leases (
    sk INTEGER PRIMARY KEY,
    owner TEXT NOT NULL,
    token INTEGER NOT NULL,
    expires_at REAL NOT NULL
);
"""


def refund_agent() -> so.Agent:
    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return f"refunded {order_id}"

    steps = [
        call_tools(call("refund", order_id=str(i))) if i % 2 == 0 else reply(f"done {i}")
        for i in range(8)
    ]
    return scripted_agent("support", steps, tools=[refund])


async def public_view(rt: so.Runtime, sessions: list[str]) -> dict[str, Any]:
    return {
        "events": {sid: [e.to_dict() for e in await rt.store.read_events(sid)] for sid in sessions},
        "pending": [r.model_dump() for r in await rt.pending()],
        "audit": [e.to_dict() for e in await rt.audit()],
    }


def write_schema_1(source: Path, target: Path, view: dict[str, Any]) -> None:
    """`source` (schema 2) rewritten as schema 1 would have stored it."""
    src = sqlite3.connect(source)
    dst = sqlite3.connect(target)
    dst.executescript(SCHEMA_1)
    dst.execute("INSERT INTO meta VALUES ('schema', '1')")
    sk_of = {}
    for row in src.execute(
        "SELECT sk, id, agent, head, status, created_at, updated_at, expires_at FROM sessions"
    ):
        dst.execute("INSERT INTO sessions VALUES (?,?,?,?,?,?,?,?)", row)
        sk_of[row[1]] = row[0]
    for sid, events in view["events"].items():
        for e in events:
            dst.execute(
                "INSERT INTO events VALUES (?,?,?,?,?,?,?)",
                (
                    sk_of[sid],
                    e["seq"],
                    e["type"],
                    e["turn_id"],
                    e["at"],
                    e["v"],
                    json.dumps(e["data"]),
                ),
            )
    for sk, seq, data in src.execute("SELECT sk, seq, data FROM snapshots"):
        dst.execute("INSERT INTO snapshots VALUES (?,?,?)", (sk, seq, unpack_text(data)))
    for row in src.execute("SELECT sk, owner, token, expires_at FROM leases"):
        dst.execute("INSERT INTO leases VALUES (?,?,?,?)", row)
    for (rid,) in src.execute("SELECT id FROM requests").fetchall():
        found = src.execute(
            "SELECT sk, agent, kind, tool, status, created_at, outcome, resolution "
            "FROM requests WHERE id=?",
            (rid,),
        ).fetchone()
        request = _request_of(view, rid)
        dst.execute(
            "INSERT INTO requests (id, sk, agent, kind, tool, status, created_at, outcome, data, "
            "resolution) VALUES (?,?,?,?,?,?,?,?,?,?)",
            (
                rid,
                *found[:6],
                found[6],
                json.dumps(request),
                None if found[7] is None else unpack_text(found[7]),
            ),
        )
    for e in view["audit"]:
        session_entry = e["seq"] is not None
        dst.execute(
            "INSERT INTO audit (id, stream, n, type, at, seq, data, prev, hash) "
            "VALUES (?,?,?,?,?,?,?,?,?)",
            (
                e["id"],
                e["stream"],
                e["n"],
                e["type"],
                e["at"],
                e["seq"],
                "null" if session_entry else json.dumps(e["data"]),
                e["prev"],
                e["hash"],
            ),
        )
    dst.commit()
    dst.close()
    src.close()


def _request_of(view: dict[str, Any], request_id: str) -> dict[str, Any]:
    for events in view["events"].values():
        for e in events:
            if e["type"] == "input.requested":
                for r in e["data"]["requests"]:
                    if r["id"] == request_id:
                        return dict(r)
    raise AssertionError(f"no input.requested event holds {request_id}")


async def test_a_schema_1_file_upgrades_in_place_and_resumes(tmp_path: Path) -> None:
    modern = tmp_path / "modern.db"
    async with so.Runtime([refund_agent()], store=f"sqlite:///{modern}") as rt:
        done = await rt.generate("support", prompt="first")
        done = await rt.generate(
            session_id=done.session_id,
            approvals=[so.Decision(id=done.pending[0].id, approved=True)],
        )
        assert done.status == "completed"
        parked = await rt.generate("support", prompt="second")
        assert parked.status == "waiting"
        sessions = [done.session_id, parked.session_id]
        before = await public_view(rt, sessions)
    assert before["pending"] and len(before["audit"]) > 5
    # An event of no turn after one of a turn (schema 1 wrote NULL for "no turn").
    last = before["events"][done.session_id][-1]
    assert last["type"] == "session.waiting" and last["turn_id"] is not None
    last["turn_id"] = None

    old = tmp_path / "old.db"
    write_schema_1(modern, old, before)
    async with so.Runtime([refund_agent()], store=f"sqlite:///{old}") as rt:
        after = await public_view(rt, sessions)
        assert after == before
        assert await rt.verify_audit() == []
        resumed = await rt.generate(
            session_id=parked.session_id,
            approvals=[so.Decision(id=parked.pending[0].id, approved=True)],
        )
        assert resumed.status == "completed" and resumed.text == "done 1"
        assert await rt.verify_audit() == []
        assert not await rt.pending()
    with sqlite3.connect(old) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == (
            str(STORE_SCHEMA),
        )
        columns = {r[1] for r in conn.execute("PRAGMA table_info(audit)")}
        assert "prev" not in columns and "sk" in columns


async def test_a_schema_2_file_is_taken_as_is_and_a_newer_one_refused(tmp_path: Path) -> None:
    """Schema 3 only adds row formats that schema 2 files do not have: such a file reads back
    and is marked current; a file from a newer signoff is refused before anything is read or
    written."""
    db = tmp_path / "s.db"
    agent = scripted_agent("a", [reply("hello")])
    async with so.Runtime([agent], store=f"sqlite:///{db}") as rt:
        done = await rt.generate("a", prompt="hi")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value='2' WHERE key='schema'")
    async with so.Runtime([agent], store=f"sqlite:///{db}") as rt:
        events = [e async for e in rt.events(done.session_id, follow=False)]
        assert events[-1].type == "session.waiting" and await rt.verify_audit() == []
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == (
            str(STORE_SCHEMA),
        )
        conn.execute("UPDATE meta SET value=? WHERE key='schema'", (str(STORE_SCHEMA + 1),))
    with pytest.raises(so.SchemaVersionError, match="Upgrade signoff"):
        async with so.Runtime([agent], store=f"sqlite:///{db}") as rt:
            await rt.pending()
    with sqlite3.connect(db) as conn:
        found = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        assert found == (str(STORE_SCHEMA + 1),)


async def test_a_damaged_schema_mark_is_a_store_error_and_changes_nothing(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    async with so.Runtime([scripted_agent("a", [reply("hi")])], store=f"sqlite:///{db}") as rt:
        await rt.generate("a", prompt="hi")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value='abc' WHERE key='schema'")
    store = SQLiteStore(f"sqlite:///{db}")
    with pytest.raises(so.StoreError, match="damaged: its store schema mark is 'abc'"):
        await store.open()
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("abc",)


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("UPDATE meta SET value='0' WHERE key='schema'", "store schema mark is '0'"),
        ("UPDATE meta SET value='-1' WHERE key='schema'", "store schema mark is '-1'"),
        ("DELETE FROM meta", "no store schema mark"),
        ("DROP TABLE meta", "no store schema mark"),
    ],
)
async def test_a_missing_or_impossible_schema_mark_is_refused(
    tmp_path: Path, damage: str, named: str
) -> None:
    """No signoff wrote schema 0 or below, nor tables without a mark (both go in one
    transaction): such a file is damaged, not taken as current and marked so, which would
    leave an older file's tables unconverted for good."""
    db = tmp_path / "s.db"
    async with so.Runtime([scripted_agent("a", [reply("hi")])], store=f"sqlite:///{db}") as rt:
        await rt.generate("a", prompt="hi")
    with sqlite3.connect(db) as conn:
        conn.execute(damage)
    conn.close()
    store = SQLiteStore(f"sqlite:///{db}")
    with pytest.raises(so.StoreError, match=named):
        await store.open()
    with sqlite3.connect(db) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        marks = conn.execute("SELECT value FROM meta").fetchall() if "meta" in tables else None
    conn.close()
    if damage.startswith("UPDATE"):
        assert marks == [(damage.split("'")[1],)]
    else:
        assert marks == ([] if damage.startswith("DELETE") else None)


async def test_a_schema_3_file_learns_its_tool_setting_chain_heads(tmp_path: Path) -> None:
    """Schema 3 kept no head for a tool-setting stream: the upgrade takes each one's last entry
    as its head, so entries removed from its end afterwards are named."""
    db = tmp_path / "s.db"
    url = f"sqlite:///{db}"
    for approval in (so.always(), so.never()):

        @so.tool(approval=approval)
        async def wipe(disk: str) -> str:
            """Wipe a disk."""
            return disk

        async with so.Runtime([scripted_agent("a", [reply("hi")], tools=[wipe])], store=url):
            pass  # each opening records the tool's setting
    with sqlite3.connect(db) as conn:
        heads = conn.execute("SELECT stream, seq, hash FROM audit WHERE n = 0").fetchall()
        conn.execute("DELETE FROM audit WHERE n = 0")  # as schema 3 wrote the file
        conn.execute("UPDATE meta SET value='3' WHERE key='schema'")
    async with so.Runtime([], store=url) as rt:
        assert await rt.verify_audit() == []
        entries = await rt.audit(stream="tools:a.wipe")
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == (
            str(STORE_SCHEMA),
        )
        assert conn.execute("SELECT stream, seq, hash FROM audit WHERE n = 0").fetchall() == heads
        assert heads and heads[0][1] == 2
        conn.execute("DELETE FROM audit WHERE id=?", (entries[-1].id,))
    async with so.Runtime([], store=url) as rt:
        problems = await rt.verify_audit()
        assert [(p.stream, p.n) for p in problems] == [("tools:a.wipe", 2)]


_DIE_IN_UPGRADE = (
    SPILL
    + """
import asyncio, sys
from signoff.stores.sqlite import _connection, SQLiteStore

def at_commit(conn):
    if sys.argv[2] == "commit":
        found = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
        assert found == (str(_connection.STORE_SCHEMA),), found
        die()  # every step of the upgrade done but its commit

upgrade = _connection.upgrade_from_1

def moved(conn):
    upgrade(conn)
    if sys.argv[2] == "moved":
        die()  # audit entries moved to the new table and the old one dropped, nothing marked

_connection.upgrade_from_1 = moved
asyncio.run(SQLiteStore("sqlite:///" + sys.argv[1]).open())
sys.exit(3)  # not killed: the upgrade never reached the point
"""
)


def dump(path: Path) -> list[str]:
    """Every table, index and row of a SQLite file, as SQL."""
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


@pytest.mark.parametrize("dies", ["moved", "commit"])
async def test_an_upgrade_killed_halfway_leaves_the_old_file_and_finishes_next_time(
    tmp_path: Path, scripts: Scripts, dies: str
) -> None:
    """The upgrade runs in the opening transaction: a process killed in it (SIGKILL, no
    rollback), after the audit entries moved or just before its commit, with what it wrote in
    the WAL but not committed, leaves the file at schema 1 as it was, and the next opening
    upgrades it, while two processes opening it at once upgrade it once."""
    modern = tmp_path / "modern.db"
    async with so.Runtime([refund_agent()], store=f"sqlite:///{modern}") as rt:
        parked = await rt.generate("support", prompt="first")
        before = await public_view(rt, [parked.session_id])
    old = tmp_path / "old.db"
    write_schema_1(modern, old, before)
    schema_1 = dump(old)
    child = scripts.run(_DIE_IN_UPGRADE, str(old), dies, env=_child_env())
    assert child.returncode == -signal.SIGKILL, child.stderr
    wal = Path(f"{old}-wal")
    assert wal.stat().st_size == int(child.stdout)  # as the killed upgrade left it
    assert uncommitted_frames(wal) > 2  # its pages, on disk, no commit among them
    assert dump(old) == schema_1  # every table and row of schema 1, nothing of the upgrade
    with sqlite3.connect(old) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone() == ("1",)
        assert "prev" in {r[1] for r in conn.execute("PRAGMA table_info(audit)")}
    conn.close()
    url = f"sqlite:///{old}"
    opening = "import asyncio, sys; from signoff.stores.sqlite import SQLiteStore; "
    opening += "asyncio.run(SQLiteStore(sys.argv[1]).open())"
    racers = [
        subprocess.Popen([sys.executable, "-c", opening, url], env=_child_env()) for _ in range(2)
    ]
    assert [r.wait(timeout=60) for r in racers] == [0, 0]
    async with so.Runtime([refund_agent()], store=url) as rt:
        assert await public_view(rt, [parked.session_id]) == before
        assert await rt.verify_audit() == []
        resumed = await rt.generate(
            session_id=parked.session_id,
            approvals=[so.Decision(id=parked.pending[0].id, approved=True)],
        )
        assert resumed.status == "completed"


def _child_env() -> dict[str, str]:
    src = str(Path(so.__file__).resolve().parent.parent)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


async def test_with_migrate_false_an_older_or_missing_file_is_refused_untouched(
    tmp_path: Path,
) -> None:
    """`SQLiteStore(url, migrate=False)`, as `PostgresStore`'s: an older schema is a
    `SchemaVersionError` naming `signoff db upgrade` that leaves every byte of the file, a file
    that is not there is not created, a current one opens, and `migrate()` still upgrades."""
    db = tmp_path / "s.db"
    agent = scripted_agent("a", [reply("hello")])
    async with so.Runtime([agent], store=f"sqlite:///{db}") as rt:
        done = await rt.generate("a", prompt="hi")
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE meta SET value='5' WHERE key='schema'")
    conn.close()
    before = db.read_bytes()
    store = SQLiteStore(f"sqlite:///{db}", migrate=False)
    with pytest.raises(so.SchemaVersionError) as info:
        await store.open()
    assert str(info.value) == (
        f"{db} is at store schema 5, this signoff needs {STORE_SCHEMA}: run `signoff db upgrade` "
        "(once no older signoff uses it)"
    )
    assert db.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]
    assert await store.migrate() == (5, STORE_SCHEMA)
    await store.close()
    current = SQLiteStore(f"sqlite:///{db}", migrate=False)
    await current.open()
    try:
        assert len(await current.read_events(done.session_id)) > 2
    finally:
        await current.close()
    missing = tmp_path / "new" / "s.db"
    with pytest.raises(so.SchemaVersionError, match=r"has no signoff schema.*signoff db upgrade"):
        await SQLiteStore(f"sqlite:///{missing}", migrate=False).open()
    assert not missing.parent.exists()


async def test_with_migrate_false_a_dangling_symlink_is_refused_creating_nothing(
    tmp_path: Path,
) -> None:
    """A symlink to a file not there was taken for a file (`lexists`), and SQLite then created
    its target before the missing schema was refused; now nothing is created, and `migrate()`
    still makes the store at the target, as it makes one at a new path."""
    target, link = tmp_path / "real.db", tmp_path / "link.db"
    link.symlink_to(target)
    store = SQLiteStore(f"sqlite:///{link}", migrate=False)
    with pytest.raises(so.SchemaVersionError, match=r"has no signoff schema.*signoff db upgrade"):
        await store.open()
    assert not os.path.lexists(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.db"]
    assert await store.migrate() == (0, STORE_SCHEMA)
    await store.close()
    assert target.is_file() and link.is_symlink()
    linked = SQLiteStore(f"sqlite:///{link}", migrate=False)  # a link to a store opens
    await linked.open()
    await linked.close()
