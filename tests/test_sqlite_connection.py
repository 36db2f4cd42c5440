"""The SQLite store's connection settings: what each commit that is not synced runs under."""

from __future__ import annotations

from pathlib import Path

import pytest

import signoff as so
from signoff.stores import Commit, SQLiteStore

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
