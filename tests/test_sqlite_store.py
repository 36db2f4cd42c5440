"""The SQLite store: WAL, compare-and-set commits that write all or nothing, leases, the queue."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores import Commit, PendingFilter, Resolve, SQLiteStore

from ._sqlite_store import count, event, new_session, store

__all__ = ["store"]  # the fixture, used by name


def request(
    sid: str,
    rid: str,
    *,
    agent: str = "a",
    tool: str = "refund",
    kind: Any = "tool-approval",
    at: float = 1.0,
) -> so.InputRequest:
    action = so.Action(call_id=f"call_{rid}", tool_name=tool, input={}, input_hash="sha256:0")
    return so.InputRequest(
        kind=kind,
        id=rid,
        session_id=sid,
        turn_id="trn_1",
        agent=agent,
        action=action if kind == "tool-approval" else None,
        question=None if kind == "tool-approval" else "which one?",
        created_at=at,
    )


def settle(rid: str) -> Resolve:
    return Resolve(request_id=rid, status="settled", outcome="approved", resolution={"ok": True})


async def test_wal_mode_is_on(store: SQLiteStore, tmp_path: Path) -> None:
    with sqlite3.connect(tmp_path / "state.db") as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert store.file_bytes() > 0


async def test_commit_appends_and_moves_the_head(store: SQLiteStore) -> None:
    await new_session(store, "s1")
    await store.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)]))
    assert await store.head("s1") == 2
    assert [e.seq for e in await store.read_events("s1")] == [1, 2]
    assert [e.seq for e in await store.read_events("s1", after=1)] == [2]
    assert [e.type for e in await store.read_events("s1", types=["session.created"])] == [
        "session.created"
    ]
    assert len(await store.read_events("s1", limit=1)) == 1


async def test_stale_expected_seq_raises_and_writes_nothing(store: SQLiteStore) -> None:
    await new_session(store, "s1")
    await store.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)]))
    events_before = await count(store, "events")
    stale = Commit(
        session_id="s1",
        expected_seq=1,
        events=[event("s1", 2), event("s1", 3)],
        new_requests=[request("s1", "req_new")],
        snapshot={"seq": 3, "v": so.SCHEMA_VERSION},
    )
    with pytest.raises(so.AppendConflict, match="seq 2, not 1"):
        await store.commit(stale)
    assert await store.head("s1") == 2
    assert await count(store, "events") == events_before
    assert await store.get_request("req_new") is None
    assert await count(store, "snapshots") == 0


async def test_resolve_of_a_closed_request_rolls_back_the_whole_commit(
    store: SQLiteStore,
) -> None:
    await new_session(store, "s1")
    await store.commit(
        Commit(
            session_id="s1",
            expected_seq=1,
            events=[event("s1", 2)],
            new_requests=[request("s1", "req_a"), request("s1", "req_b")],
        )
    )
    await store.commit(
        Commit(session_id="s1", expected_seq=2, events=[event("s1", 3)], resolve=[settle("req_a")])
    )
    stored = await store.get_request("req_a")
    assert stored is not None and stored.status == "settled" and stored.resolution == {"ok": True}
    events_before = await count(store, "events")
    with pytest.raises(so.RequestClosed) as info:
        await store.commit(
            Commit(
                session_id="s1",
                expected_seq=3,
                events=[event("s1", 4), event("s1", 5)],
                # req_b would settle, but req_a is closed: neither may change
                resolve=[settle("req_b"), settle("req_a")],
                new_requests=[request("s1", "req_c")],
                snapshot={"seq": 5, "v": so.SCHEMA_VERSION},
                durable=True,
            )
        )
    assert info.value.request_ids == ["req_a"]
    assert await store.head("s1") == 3
    assert await count(store, "events") == events_before
    b = await store.get_request("req_b")
    assert b is not None and b.status == "pending"
    assert await store.get_request("req_c") is None
    assert await count(store, "snapshots") == 0
    # the connection is usable afterwards: the transaction really ended
    await store.commit(
        Commit(session_id="s1", expected_seq=3, events=[event("s1", 4)], resolve=[settle("req_b")])
    )
    assert await store.head("s1") == 4


async def test_resolve_cannot_reach_another_sessions_request(store: SQLiteStore) -> None:
    await new_session(store, "s1")
    await new_session(store, "s2")
    await store.commit(
        Commit(
            session_id="s2",
            expected_seq=1,
            events=[event("s2", 2)],
            new_requests=[request("s2", "req_other")],
        )
    )
    with pytest.raises(so.RequestClosed):
        await store.commit(
            Commit(
                session_id="s1",
                expected_seq=1,
                events=[event("s1", 2)],
                resolve=[settle("req_other")],
            )
        )
    other = await store.get_request("req_other")
    assert other is not None and other.status == "pending"
    assert await store.head("s1") == 1


async def test_unknown_sessions_and_duplicates(store: SQLiteStore) -> None:
    with pytest.raises(so.UnknownSession):
        await store.commit(Commit(session_id="nope", expected_seq=1, events=[event("nope", 2)]))
    with pytest.raises(so.UnknownSession):
        await store.read_events("nope")
    with pytest.raises(so.UnknownSession):
        await store.acquire_lease("nope", "w", 10, 0)
    assert await store.load("nope") is None
    assert await store.head("nope") is None
    await new_session(store, "s1")
    with pytest.raises(so.StoreError, match="already exists"):
        await new_session(store, "s1")


# -- leases and fencing ---------------------------------------------------------------------------


async def test_lease_acquire_renew_release_and_fencing(store: SQLiteStore) -> None:
    await new_session(store, "s1")
    assert await store.acquire_lease("s1", "A", 10, now=100) == 1
    assert await store.acquire_lease("s1", "B", 10, now=105) is None  # held by A
    assert await store.acquire_lease("s1", "A", 10, now=106) == 2  # re-acquiring fences the old
    # an append under the stale token is refused, and nothing is written
    with pytest.raises(so.LeaseLost):
        await store.commit(
            Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)], lease_token=1)
        )
    assert await store.head("s1") == 1
    await store.commit(
        Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)], lease_token=2)
    )
    assert await store.renew_lease("s1", "A", 1, 10, now=107) is False
    assert await store.renew_lease("s1", "B", 2, 10, now=107) is False
    assert await store.renew_lease("s1", "A", 2, 10, now=108) is True  # now until 118
    assert await store.acquire_lease("s1", "B", 10, now=115) is None
    assert await store.acquire_lease("s1", "B", 10, now=118.5) == 3  # A's lease expired
    with pytest.raises(so.LeaseLost):
        await store.commit(
            Commit(session_id="s1", expected_seq=2, events=[event("s1", 3)], lease_token=2)
        )
    assert await store.head("s1") == 2
    assert await store.renew_lease("s1", "A", 2, 10, now=119) is False
    await store.release_lease("s1", "A", 2)  # not A's any more: no effect
    assert await store.acquire_lease("s1", "A", 10, now=120) is None
    await store.release_lease("s1", "B", 3)
    assert await store.acquire_lease("s1", "A", 10, now=120) == 4  # free at once after release
    with pytest.raises(so.LeaseLost):
        await store.commit(
            Commit(session_id="s1", expected_seq=2, events=[event("s1", 3)], lease_token=3)
        )


async def test_two_stores_on_one_file(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    a, b = SQLiteStore(url), SQLiteStore(url)
    try:
        await new_session(a, "s1")
        assert await b.head("s1") == 1
        await a.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)]))
        assert await b.head("s1") == 2
        with pytest.raises(so.AppendConflict):
            await b.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2, x=1)]))
        assert (await a.read_events("s1"))[-1].data == {}
        assert await a.acquire_lease("s1", "A", 10, 0) == 1
        assert await b.acquire_lease("s1", "B", 10, 1) is None
    finally:
        await a.close()
        await b.close()


# -- the queue ------------------------------------------------------------------------------------


async def test_pending_filters(store: SQLiteStore) -> None:
    await new_session(store, "s1", agent="support")
    await new_session(store, "s2", agent="billing")
    await store.commit(
        Commit(
            session_id="s1",
            expected_seq=1,
            events=[event("s1", 2)],
            new_requests=[
                request("s1", "r1", agent="support", tool="refund", at=10),
                request("s1", "r2", agent="support", tool="lookup", at=20),
                request("s1", "r3", agent="support", kind="question", at=30),
            ],
        )
    )
    await store.commit(
        Commit(
            session_id="s2",
            expected_seq=1,
            events=[event("s2", 2)],
            new_requests=[
                request("s2", "r4", agent="billing", tool="refund", at=15),
                request("s2", "r5", agent="billing", tool="refund", at=25),
            ],
        )
    )
    await store.commit(
        Commit(session_id="s2", expected_seq=2, events=[event("s2", 3)], resolve=[settle("r5")])
    )

    async def ids(**kw: Any) -> list[str]:
        flt = PendingFilter(**kw)
        found = [r.id for r in await store.pending(flt)]
        if "limit" not in kw and "offset" not in kw:
            assert await store.count_pending(flt) == len(found)
        return found

    assert await ids() == ["r1", "r4", "r2", "r3"]  # pending, oldest first
    assert await ids(agent="billing") == ["r4"]
    assert await ids(tool_name="refund") == ["r1", "r4"]
    assert await ids(kind="question") == ["r3"]
    assert await ids(session_id="s1") == ["r1", "r2", "r3"]
    assert await ids(created_before=20) == ["r1", "r4"]
    assert await ids(created_after=15) == ["r2", "r3"]
    assert await ids(status=None) == ["r1", "r4", "r2", "r5", "r3"]
    assert await ids(status="settled") == ["r5"]
    assert await ids(limit=2) == ["r1", "r4"]
    assert await ids(limit=2, offset=2) == ["r2", "r3"]
    assert await ids(agent="support", tool_name="refund", session_id="s2") == []
    (settled,) = await store.pending(PendingFilter(status="settled"))
    assert settled.status == "settled"
    (pending_r1,) = await store.pending(PendingFilter(tool_name="refund", agent="support"))
    assert pending_r1 == request("s1", "r1", agent="support", tool="refund", at=10)


def _poll_steps(store: SQLiteStore) -> int:
    """SQLite VM steps one poll of `wait_for_change(None, ...)` runs (in thousands, rounded up)."""
    steps = [0]

    def step() -> int:
        steps[0] += 1
        return 0

    store.conn.set_progress_handler(step, 1000)
    try:
        store._mark(None)
    finally:
        store.conn.set_progress_handler(None, 1000)
    return steps[0]


async def test_waiting_for_any_change_costs_the_same_however_many_sessions(
    store: SQLiteStore,
) -> None:
    """An idle worker polls for a commit anywhere every 50 ms. Counting and summing every
    session's row to notice one grew with the store for ever (about 100 ms a poll at 500,000
    sessions, under the store's lock); what a poll costs must not depend on the history."""
    await new_session(store, "s0")
    few = _poll_steps(store)
    rows = [(f"ses_{i:06d}", "a", 1, "idle", 1.0, 1.0) for i in range(20_000)]
    with store.conn:  # one transaction
        store.conn.execute("BEGIN")
        store.conn.executemany(
            "INSERT INTO sessions (id, agent, head, status, created_at, updated_at) "
            "VALUES (?,?,?,?,?,?)",
            rows,
        )
    assert _poll_steps(store) <= few + 1
    # and a commit still wakes it, by this store or another on the file
    other = SQLiteStore(store.url)
    try:
        for writer, seq in ((store, 1), (other, 2)):

            async def later(writer: SQLiteStore = writer, seq: int = seq) -> None:
                await asyncio.sleep(0.1)
                change = Commit(session_id="s0", expected_seq=seq, events=[event("s0", seq + 1)])
                await writer.commit(change)

            task = asyncio.create_task(later())
            assert await store.wait_for_change(None, 10) is True
            await task
        assert await store.wait_for_change(None, 0.2) is False
    finally:
        await other.close()
