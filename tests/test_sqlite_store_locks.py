"""A SQLite write that finds the file's write lock held by another connection waits for it on the
event loop, not inside SQLite: the loop's other tasks (a server's requests, the leases' renewals)
go on meanwhile, and the write lands once the lock is free."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

import signoff as so
from signoff.stores import Commit, SQLiteStore, promptly
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

from ._sqlite_store import event, new_session


def hold_lock(path: Path, seconds: float) -> threading.Thread:
    """Hold the file's write lock from another connection for `seconds`, in a thread that has
    taken it by the time this returns."""
    taken = threading.Event()

    def hold() -> None:
        locker = sqlite3.connect(path, isolation_level=None)
        try:
            locker.execute("BEGIN IMMEDIATE")
            taken.set()
            threading.Event().wait(seconds)
            locker.execute("ROLLBACK")
        finally:
            locker.close()

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(10)
    return thread


async def ticks_while(work: asyncio.Future[object] | asyncio.Task[object]) -> int:
    """How many times a task sleeping 10 ms at a time ran while `work` was under way."""
    count = 0

    async def tick() -> None:
        nonlocal count
        while True:
            await asyncio.sleep(0.01)
            count += 1

    ticker = asyncio.create_task(tick())
    try:
        await work
    finally:
        ticker.cancel()
    return count


async def test_a_write_waiting_for_the_lock_leaves_the_event_loop_free(tmp_path: Path) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}", busy_timeout=30)
    await new_session(store, "s1")
    holder = hold_lock(tmp_path / "state.db", 0.6)
    try:
        write = asyncio.ensure_future(
            store.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)]))
        )
        ticks = await ticks_while(write)
    finally:
        holder.join()
    # Inside SQLite's busy handler the ticker would not have run until the write was done.
    assert ticks >= 20
    assert await store.head("s1") == 2
    assert not store.conn.in_transaction
    assert store.conn.execute("PRAGMA busy_timeout").fetchone() == (30_000,)
    await store.close()


@pytest.mark.parametrize("prompt", [False, True])
async def test_a_lock_held_past_the_wait_is_a_store_error_saying_how_long(
    tmp_path: Path, prompt: bool
) -> None:
    store = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}", busy_timeout=0.3)
    await new_session(store, "s1")
    locker = sqlite3.connect(tmp_path / "state.db", isolation_level=None)
    try:
        locker.execute("BEGIN IMMEDIATE")
        wanted = so.StoreBusy if prompt else so.StoreError
        with pytest.raises(wanted, match=r"locked \(another connection held the file's lock for"):
            if prompt:
                with promptly():
                    await store.acquire_lease("s1", "o", 10, 0)
            else:
                await store.acquire_lease("s1", "o", 10, 0)
        locker.execute("ROLLBACK")
    finally:
        locker.close()
    assert not await store.lease_held("s1", 1)
    assert await store.acquire_lease("s1", "o", 10, 0) == 1
    await store.close()


async def test_a_turned_back_write_runs_each_fault_hook_once(tmp_path: Path) -> None:
    # The crash suites kill a process at the n-th hook: a write run again after the lock was
    # free must not count its "before" twice.
    store = SQLiteStore(f"sqlite:///{tmp_path / 'state.db'}", busy_timeout=30)
    await new_session(store, "s1")
    seen: list[tuple[str, str]] = []
    store.set_fault_hook(lambda when, label: seen.append((when, label)))
    holder = hold_lock(tmp_path / "state.db", 0.3)
    try:
        await store.commit(Commit(session_id="s1", expected_seq=1, events=[event("s1", 2)]))
    finally:
        holder.join()
    assert seen == [("before", "session.waiting"), ("after", "session.waiting")]
    await store.close()


async def test_a_turn_finishes_once_another_connection_lets_go(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool()
    async def look_up(order_id: str) -> str:
        return "shipped"

    agent = scripted_agent(
        "a", [call_tools(call("look_up", order_id="1")), reply("Shipped.")], tools=[look_up]
    )
    url = f"sqlite:///{tmp_path / 'a.db'}"
    async with so.Runtime([agent], store=url) as rt:
        await rt.pending()  # the file and its schema exist
        holder = hold_lock(tmp_path / "a.db", 0.5)
        try:
            turn = asyncio.ensure_future(rt.generate("a", prompt="where is order 1"))
            ticks = await ticks_while(turn)
        finally:
            holder.join()
        assert turn.result().text == "Shipped." and log.count("look_up") == 1
        assert ticks >= 10


@pytest.mark.parametrize("call", ["open", "migrate"])
async def test_opening_a_store_waiting_for_the_lock_leaves_the_event_loop_free(
    tmp_path: Path, call: str
) -> None:
    """Creating the schema of a file another connection is writing waits for its lock; that
    wait was inside SQLite, on the loop, and held every task of it up to the busy timeout."""
    path = tmp_path / "state.db"
    holder = hold_lock(path, 0.6)
    store = SQLiteStore(f"sqlite:///{path}", busy_timeout=30)
    try:
        opening = asyncio.ensure_future(getattr(store, call)())
        ticks = await ticks_while(opening)
    finally:
        holder.join()
    assert ticks >= 20
    await new_session(store, "s1")
    assert await store.head("s1") == 1
    await store.close()
