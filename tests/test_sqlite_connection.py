"""The SQLite store's connection settings: what each commit that is not synced runs under."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import signoff as so
from signoff.stores import Commit, SQLiteStore
from signoff.testing import reply, scripted_agent

NORMAL, FULL = 1, 2  # `PRAGMA synchronous` values


def _event(sid: str, seq: int, type: str = "session.waiting") -> so.Event:
    return so.Event(session_id=sid, seq=seq, type=type, at=float(seq), data={})  # type: ignore[arg-type]


async def test_commits_run_under_synchronous_normal_and_durable_ones_under_full(
    tmp_path: Path,
) -> None:
    """In WAL mode NORMAL loses no committed write when the process dies, only the last ones
    when the machine does; a connection left at OFF (or a durable commit's FULL left on) would
    lose or slow every commit after. Only a durable commit may run under FULL."""
    store = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}")
    await store.open()
    try:
        conn = store.conn
        assert conn.execute("PRAGMA synchronous").fetchone() == (NORMAL,)
        await store.create_session("ses_1", "a", [_event("ses_1", 1, "session.created")], None)
        seen: list[int] = []

        def traced(sql: str) -> None:
            if sql == "COMMIT":
                seen.append(conn.execute("PRAGMA synchronous").fetchone()[0])

        conn.set_trace_callback(traced)
        await store.commit(Commit(session_id="ses_1", expected_seq=1, events=[_event("ses_1", 2)]))
        await store.commit(
            Commit(session_id="ses_1", expected_seq=2, events=[_event("ses_1", 3)], durable=True)
        )
        conn.set_trace_callback(None)
        assert seen == [NORMAL, FULL]
        assert conn.execute("PRAGMA synchronous").fetchone() == (NORMAL,)
    finally:
        await store.close()


@pytest.mark.parametrize("name", ["file:state.db", "file::memory:"])
async def test_a_relative_path_starting_with_file_colon_is_that_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """SQLite (built with SQLITE_USE_URI, as Debian's is) reads a name starting with `file:` as
    a URI even when not asked to: `sqlite:///file:state.db` opened `state.db` (or an in-memory
    database) while the store watched for a file named `file:state.db`, found none, and refused
    every write as to a deleted file. The URL names the file by its path, as any other."""
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore(f"sqlite:///{name}")
    try:
        await store.create_session("ses_1", "a", [_event("ses_1", 1, "session.created")], None)
    finally:
        await store.close()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [
        name
    ]
    again = SQLiteStore(f"sqlite:///{tmp_path / name}")
    try:
        assert await again.head("ses_1") == 1
    finally:
        await again.close()


@pytest.mark.parametrize("reopen", ["open()", "first use"])
async def test_a_store_closed_then_opened_on_a_restored_file_serves_that_file(
    tmp_path: Path, reopen: str
) -> None:
    """A backup restored while the store was closed (a runtime closed and used again later, as
    it may be): once opened again it serves the file now there. What it remembered of the old
    file's sessions (their row keys, the text of their last events) must not outlive that: it
    read another session's log as this one's, and stored a new event deflated on the old file's
    last event, which no reader of the file could inflate. Opened by its first use, a read
    found the file replaced since the store last had it open, and refused every read after."""
    path = tmp_path / "state.db"
    prose = "the parcel arrived damaged and the customer asks for a refund " * 4
    store = SQLiteStore(f"sqlite:///{path}")
    for sid in ("ses_a", "ses_b"):
        await store.create_session(sid, "a", [_event(sid, 1, "session.created")], None)
        said = so.Event(session_id=sid, seq=2, type="turn.message", at=2.0, data={"m": prose})
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[said]))
        assert len(await store.read_events(sid)) == 2
    await store.close()
    backup = SQLiteStore(f"sqlite:///{tmp_path / 'backup.db'}")
    for sid in ("ses_b", "ses_a"):  # the other way round: each has the other's row key
        await backup.create_session(sid, "a", [_event(sid, 1, "session.created")], None)
        said = so.Event(session_id=sid, seq=2, type="turn.message", at=2.0, data={"of": sid})
        await backup.commit(Commit(session_id=sid, expected_seq=1, events=[said]))
    await backup.close()
    os.replace(tmp_path / "backup.db", path)
    after = {"m": prose, "of": "ses_b"}
    if reopen == "open()":
        await store.open()
    try:
        assert [e.data for e in await store.read_events("ses_a")] == [{}, {"of": "ses_a"}]
        event = so.Event(session_id="ses_b", seq=3, type="turn.message", at=3.0, data=after)
        await store.commit(Commit(session_id="ses_b", expected_seq=2, events=[event]))
    finally:
        await store.close()
    fresh = SQLiteStore(f"sqlite:///{path}")
    try:
        assert [e.data for e in await fresh.read_events("ses_b")] == [{}, {"of": "ses_b"}, after]
    finally:
        await fresh.close()


async def test_a_memory_store_keeps_its_sessions_when_a_runtime_using_it_closes() -> None:
    """A `:memory:` store's contents live in its one connection: a runtime that closes it (the
    first of two sharing it, or one used again after its `with` block) must not drop them, or
    the next call finds an empty store and answers `UnknownSession` for a session it made."""
    store = SQLiteStore("sqlite:///:memory:")
    agents = [scripted_agent("a", [reply("one"), reply("two")])]
    first, second = so.Runtime(agents, store=store), so.Runtime(agents, store=store)
    async with first, second:
        started = await first.generate("a", prompt="hi")
    async with second:
        went_on = await second.generate(session_id=started.session_id, prompt="again")
    assert (went_on.status, went_on.text) == ("completed", "two")
    alone = so.Runtime([scripted_agent("a", [reply("hello")])], store="sqlite:///:memory:")
    with alone:
        made = alone.generate_sync("a", prompt="hi")
    assert alone.state_sync(made.session_id).status == "idle"
    alone.close_sync()
