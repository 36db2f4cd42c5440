"""One SQLite store used from two threads at once: a runtime's async calls on the test's loop
while another thread makes its `*_sync` twins (which run on the runtime's bridge loop). Each
store call's transaction runs whole before another thread's starts, so every call succeeds and
the store holds exactly the sessions of the calls that did."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import signoff as so
from signoff.stores import Commit, PendingFilter
from signoff.stores.sqlite import SQLiteStore
from signoff.stores.sqlite._transactions import serialised
from signoff.testing import ExecutionLog, sqlite_runtime

from ._sqlite_store import count, event, new_session, store
from .test_runtime import refund_agent

__all__ = ["store"]  # the fixture

ROUNDS = 25


def sync_calls(
    rt: so.Runtime, made: list[str], failed: list[BaseException], rounds: int = ROUNDS
) -> None:
    """Start a turn and approve its refund, `rounds` times, from plain code."""
    for _ in range(rounds):
        try:
            r = rt.generate_sync("a", prompt="refund")
            made.append(r.session_id)
            (req,) = r.pending
            done = rt.respond_sync(
                r.session_id, [so.InputResponse(request_id=req.id, option_id="approve")]
            )
            assert done.status == "completed", done.status
        except BaseException as exc:  # reported to the test, which fails on any
            failed.append(exc)


async def two_thread_calls(rt: so.Runtime, log: ExecutionLog, rounds: int = ROUNDS) -> None:
    """`rounds` refunds asked and approved on this loop while another thread makes as many
    through the sync twins: every call succeeds, the store holds exactly the sessions made,
    each finished, with gap-free logs and nothing pending; the runtime is closed after."""
    made: list[str] = []
    failed: list[BaseException] = []
    try:
        await rt.open()
        thread = threading.Thread(target=sync_calls, args=(rt, made, failed, rounds))
        thread.start()
        try:
            for _ in range(rounds):
                r = await rt.generate("a", prompt="refund")
                made.append(r.session_id)
                (req,) = r.pending
                done = await rt.respond(
                    r.session_id, [so.InputResponse(request_id=req.id, option_id="approve")]
                )
                assert done.status == "completed"
                await asyncio.sleep(0)
        finally:
            await asyncio.to_thread(thread.join)
        assert failed == []
        stored = await rt.sessions(limit=1000)
        assert sorted(s.id for s in stored) == sorted(made)
        assert len(made) == 2 * rounds
        assert {s.status for s in stored} == {"idle"}  # each turn ended
        assert log.count() == 2 * rounds
        for sid in made:
            events = await rt.store.read_events(sid)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert await rt.store.pending(PendingFilter(limit=1000)) == []
    finally:
        await rt.close()


async def test_async_and_sync_calls_from_two_threads(tmp_path: Path) -> None:
    log = ExecutionLog()
    await two_thread_calls(sqlite_runtime(tmp_path, refund_agent(log)), log)


def test_store_calls_from_threads_each_on_its_own_loop(tmp_path: Path) -> None:
    """Four threads, each running its own event loop, create sessions, append to them and lease
    them on one store: each call's transaction is whole, so all of them land and nothing else."""
    shared = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}")
    failed: list[BaseException] = []

    async def work(n: int) -> None:
        for i in range(20):
            sid = f"ses_{n}_{i}"
            await new_session(shared, sid)
            token = await shared.acquire_lease(sid, f"w{n}", 30.0, 1.0)
            assert token == 1
            await shared.commit(
                Commit(
                    session_id=sid,
                    expected_seq=1,
                    events=[event(sid, 2)],
                    lease_token=token,
                )
            )
            assert await shared.head(sid) == 2
            await shared.release_lease(sid, f"w{n}", token)

    def run(n: int) -> None:
        try:
            asyncio.run(work(n))
        except BaseException as exc:  # reported to the test, which fails on any
            failed.append(exc)

    threads = [threading.Thread(target=run, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    async def check() -> None:
        assert failed == []
        assert await count(shared, "sessions") == 80
        assert await count(shared, "events") == 160
        assert not shared.conn.in_transaction
        await shared.close()

    asyncio.run(check())


async def test_waiting_for_a_change_leaves_the_store_to_other_threads(store: SQLiteStore) -> None:
    """`wait_for_change` holds the lock for each poll, not across its waits: a write from
    another thread lands while it waits, and it sees it."""
    await new_session(store, "ses_1")
    waiting = asyncio.create_task(store.wait_for_change("ses_1", 10.0, poll_interval=0.01))
    await asyncio.sleep(0.05)

    def append() -> None:
        commit = Commit(session_id="ses_1", expected_seq=1, events=[event("ses_1", 2)])
        asyncio.run(store.commit(commit))

    await asyncio.wait_for(asyncio.to_thread(append), 5.0)
    assert await asyncio.wait_for(waiting, 5.0) is True


class _Suspending(SQLiteStore):
    @serialised
    async def head(self, session_id: str, *, shown: so.Event | None = None) -> int | None:
        await asyncio.sleep(0)
        return None


async def test_a_store_call_that_would_await_under_the_lock_is_refused(tmp_path: Path) -> None:
    """One that suspended would hold the lock across the await (another thread's call would
    block this loop, another task's would share the lock): it fails, and the lock is let go."""
    s = _Suspending(f"sqlite:///{tmp_path / 'state.db'}")
    with pytest.raises(RuntimeError, match="awaited while holding"):
        await s.head("ses_1")
    assert s._lock.acquire(blocking=False)
    s._lock.release()
    await s.close()
