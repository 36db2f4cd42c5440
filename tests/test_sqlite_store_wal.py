"""The SQLite store's WAL at rest: a park, and the end of a turn that waited for a person, fold it
into the database file unless a lease or a reader elsewhere still needs it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import pytest

import signoff as so
from signoff.stores import Commit, SQLiteStore
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

from ._sqlite_store import event, new_session, store

__all__ = ["store"]  # the fixture, used by name


# -- the WAL at rest ------------------------------------------------------------------------------


def wal_bytes(path: Path) -> int:
    wal = Path(f"{path}-wal")
    return wal.stat().st_size if wal.exists() else 0


def refund_agent(log: ExecutionLog) -> so.Agent:
    @log.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, float]:
        return {"refunded": amount}

    proposal = call_tools(call("issue_refund", order_id="1", amount=5))
    return scripted_agent("a", [proposal, reply("Done.")], tools=[issue_refund])


def park(sid: str, seq: int, token: int | None) -> Commit:
    """A commit that parks a turn on a person and gives the drive's lease back."""
    waiting = so.Event(
        session_id=sid, seq=seq, type="turn.waiting", at=float(seq), data={"on": "input"}
    )
    return Commit(
        session_id=sid,
        expected_seq=seq - 1,
        events=[waiting],
        lease_token=token,
        release_lease=True,
    )


async def fill_wal(store: SQLiteStore, sid: str, upto: int) -> None:
    for seq in range(2, upto + 1):
        await store.commit(
            Commit(session_id=sid, expected_seq=seq - 1, events=[event(sid, seq, x="y" * 200)])
        )


async def test_a_parked_session_is_one_file_of_live_pages(tmp_path: Path) -> None:
    # Parking the turn gives the drive's lease back; with no lease left the WAL is folded into
    # the database and truncated, so the database file alone holds the parked session.
    log = ExecutionLog()
    async with so.Runtime([refund_agent(log)], store=f"sqlite:///{tmp_path / 'a.db'}") as rt:
        r = await rt.generate("a", prompt="refund order 1")
        assert r.status == "waiting"
        assert wal_bytes(tmp_path / "a.db") == 0
        (tmp_path / "copy").mkdir()
        (tmp_path / "copy" / "a.db").write_bytes((tmp_path / "a.db").read_bytes())
        decision = so.Decision(id=r.pending[0].id, approved=True, reason="ok")
        done = await rt.generate(session_id=r.session_id, approvals=[decision])
        assert done.text == "Done." and log.count("issue_refund") == 1
        # The turn waited for a person, so its end folds the WAL too: the session at rest is
        # one file again.
        assert wal_bytes(tmp_path / "a.db") == 0
    # The copy taken while it waited, without any WAL, is the parked session whole.
    log2 = ExecutionLog()
    async with so.Runtime([refund_agent(log2)], store=f"sqlite:///{tmp_path / 'copy/a.db'}") as rt:
        assert [p.id for p in await rt.pending()] == [r.pending[0].id]
        done = await rt.generate(session_id=r.session_id, approvals=[decision])
        assert done.text == "Done." and log2.count("issue_refund") == 1


async def test_a_turn_without_a_person_leaves_its_wal_to_sqlite(tmp_path: Path) -> None:
    # Back-to-back turns nobody waits on should not pay a checkpoint each: SQLite's own
    # autocheckpoint and `journal_size_limit` bound their WAL.
    log = ExecutionLog()

    @log.tool()
    async def look_up(order_id: str) -> str:
        return "shipped"

    script = [call_tools(call("look_up", order_id="1")), reply("Shipped.")] * 2
    agent = scripted_agent("a", script, tools=[look_up])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 'a.db'}") as rt:
        r = await rt.generate("a", prompt="where is order 1")
        assert r.text == "Shipped." and wal_bytes(tmp_path / "a.db") > 0
        r = await rt.generate(session_id=r.session_id, prompt="and now?")
        assert r.text == "Shipped." and log.count("look_up") == 2
        assert wal_bytes(tmp_path / "a.db") > 0


async def test_a_turn_resumed_in_another_runtime_folds_the_wal_as_it_ends(tmp_path: Path) -> None:
    # Whoever drives the turn on after the answer knows it waited: the state says so, not a
    # memory of this process.
    url = f"sqlite:///{tmp_path / 'a.db'}"
    async with so.Runtime([refund_agent(ExecutionLog())], store=url) as rt:
        r = await rt.generate("a", prompt="refund order 1")
    log = ExecutionLog()
    async with so.Runtime([refund_agent(log)], store=url) as rt:
        decision = so.Decision(id=r.pending[0].id, approved=True)
        done = await rt.generate(session_id=r.session_id, approvals=[decision])
        assert done.text == "Done." and log.count("issue_refund") == 1
        assert wal_bytes(tmp_path / "a.db") == 0


async def test_a_drive_end_folds_the_wal_only_when_its_turn_waited(
    store: SQLiteStore, tmp_path: Path
) -> None:
    await new_session(store, "s1")
    await fill_wal(store, "s1", 30)
    for seq, waited in ((31, False), (32, True)):
        token = await store.acquire_lease("s1", "A", 10, now=seq)
        done = so.Event(session_id="s1", seq=seq, type="turn.completed", at=float(seq), data={})
        await store.commit(
            Commit(
                session_id="s1",
                expected_seq=seq - 1,
                events=[done],
                lease_token=token,
                release_lease=True,
                waited=waited,
            )
        )
        assert (wal_bytes(tmp_path / "state.db") == 0) is waited
    assert len(await store.read_events("s1")) == 32


async def test_only_a_park_folds_the_wal(store: SQLiteStore, tmp_path: Path) -> None:
    await new_session(store, "s1")
    await fill_wal(store, "s1", 30)
    token = await store.acquire_lease("s1", "A", 10, now=1)
    assert token is not None
    await store.release_lease("s1", "A", token)  # a drive that had nothing to do
    assert wal_bytes(tmp_path / "state.db") > 0
    token = await store.acquire_lease("s1", "A", 10, now=2)
    await store.commit(park("s1", 31, token))
    assert wal_bytes(tmp_path / "state.db") == 0
    assert len(await store.read_events("s1")) == 31


async def test_the_wal_stays_while_another_lease_is_held(
    store: SQLiteStore, tmp_path: Path
) -> None:
    await new_session(store, "s1")
    await new_session(store, "s2")
    t1 = await store.acquire_lease("s1", "A", 10, now=1)
    t2 = await store.acquire_lease("s2", "B", 10, now=1)
    assert t1 == 1 and t2 == 1
    await fill_wal(store, "s1", 30)
    await store.commit(park("s1", 31, t1))
    assert wal_bytes(tmp_path / "state.db") > 0  # s2's drive is still running here
    await store.commit(park("s2", 2, t2))
    assert wal_bytes(tmp_path / "state.db") == 0
    assert len(await store.read_events("s1")) == 31


async def test_leases_that_lapsed_unreleased_neither_keep_the_wal_nor_pile_up(
    store: SQLiteStore, tmp_path: Path
) -> None:
    """A worker's failed drive keeps its lease until it lapses, and a stalled one may lose it to
    another process: neither is given back here, yet neither may stop every later park from
    folding the WAL, nor be remembered for ever."""
    await new_session(store, "s1")
    await new_session(store, "s2")
    failed = await store.acquire_lease("s1", "A", 10, now=1)  # kept: it lapses at 11
    lost = await store.acquire_lease("s2", "A", 10, now=1)  # taken over elsewhere at 12
    assert failed == lost == 1
    await fill_wal(store, "s1", 30)
    token = await store.acquire_lease("s1", "B", 10, now=20)  # the retry, after it lapsed
    assert token == 2
    await store.commit(park("s1", 31, token))
    assert wal_bytes(tmp_path / "state.db") == 0
    assert len(store._leased) == 0


async def test_a_reader_elsewhere_keeps_the_wal_and_nobody_waits(tmp_path: Path) -> None:
    # The fold never waits on another connection: a reader in another process would otherwise
    # stall the drive that gave its lease back for the whole busy timeout.
    store = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}", busy_timeout=60)
    await new_session(store, "s1")
    await fill_wal(store, "s1", 30)
    reader = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    try:
        reader.execute("BEGIN")
        assert reader.execute("SELECT COUNT(*) FROM events").fetchone()[0] == 30
        token = await store.acquire_lease("s1", "A", 10, now=1)
        await asyncio.wait_for(store.commit(park("s1", 31, token)), timeout=20)
        assert wal_bytes(tmp_path / "state.db") > 0
        reader.execute("COMMIT")
        token = await store.acquire_lease("s1", "A", 10, now=2)
        await store.commit(park("s1", 32, token))
        assert wal_bytes(tmp_path / "state.db") == 0
    finally:
        reader.close()
        await store.close()


async def test_a_store_opened_through_a_symlink_folds_the_wal_beside_its_file(
    tmp_path: Path,
) -> None:
    # SQLite keeps the -wal and -shm beside the file a symlink names, not beside the link: a
    # park must find and fold that WAL, and the store's size count it.
    (tmp_path / "data").mkdir()
    link = tmp_path / "state.db"
    link.symlink_to(tmp_path / "data" / "a.db")
    log = ExecutionLog()
    async with so.Runtime([refund_agent(log)], store=f"sqlite:///{link}") as rt:
        await rt.generate("a", prompt="refund order 1")  # the schema, the first park
        store = rt.store
        assert isinstance(store, SQLiteStore)
        await new_session(store, "s1")
        await fill_wal(store, "s1", 6)
        assert wal_bytes(tmp_path / "data" / "a.db") > 0 and not Path(f"{link}-wal").exists()
        assert store.file_bytes() > (tmp_path / "data" / "a.db").stat().st_size
        token = await store.acquire_lease("s1", "w", 30, 0)
        await store.commit(park("s1", 7, token))
        assert wal_bytes(tmp_path / "data" / "a.db") == 0


async def test_a_store_opened_by_a_relative_path_folds_its_wal_after_a_chdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The fold, and the store's size, looked for the -wal by the path as given: after a chdir
    # a relative one named no file, so a park left the WAL unfolded.
    monkeypatch.chdir(tmp_path)
    store = SQLiteStore("sqlite:///state.db")
    await new_session(store, "s1")
    await fill_wal(store, "s1", 6)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    try:
        assert wal_bytes(tmp_path / "state.db") > 0
        token = await store.acquire_lease("s1", "w", 30, 0)
        await store.commit(park("s1", 7, token))
        assert wal_bytes(tmp_path / "state.db") == 0
        files = [tmp_path / name for name in ("state.db", "state.db-shm")]
        assert store.file_bytes() == sum(f.stat().st_size for f in files) > 0
        assert not list(elsewhere.iterdir())
    finally:
        await store.close()
