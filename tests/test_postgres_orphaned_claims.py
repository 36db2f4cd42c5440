"""A worker's claim whose connection is lost while the server still runs it (waiting on a lock)
is sent again, and the resend passes by the rows the first statement holds; what that one
commits later belongs to the worker with no drive of it. Its next claim gives those leases back
and takes them, rather than leaving them to lapse (30 s by default)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import psycopg
import pytest

from signoff import StoreError
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore

from ._pg_events import ev, new_session


@pytest.fixture
async def store(pg_store_url: str) -> AsyncIterator[PostgresStore]:
    """A store whose calls wait 1 s, then drop their connection (`operation_timeout`)."""
    opened = PostgresStore(pg_store_url, min_size=1, max_size=2, operation_timeout=1)
    await opened.open()
    try:
        yield opened
    finally:
        await opened.close()


async def _lock_waiter(conn: psycopg.AsyncConnection[Any], after: set[int]) -> int:
    """The pid of a backend (not in `after`) waiting on a lock."""
    for _ in range(1000):
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid <> ALL(%s)",
            (list(after),),
        )
        row = await cur.fetchone()
        if row is not None:
            return int(row[0])
        await asyncio.sleep(0.01)
    raise AssertionError("no claim waited on the lock")


async def _ended(conn: psycopg.AsyncConnection[Any], pid: int) -> None:
    for _ in range(1000):
        cur = await conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,))
        if await cur.fetchone() is None:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"backend {pid} still runs")


async def _runnable(store: PostgresStore) -> tuple[str, int]:
    """A new session with work to do whose lease row exists, free: its id and the row's token."""
    sid = await new_session(store)
    await store.commit(
        Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], status="running")
    )
    token = await store.acquire_lease(sid, "other", 30, await store.server_time())
    assert token is not None
    await store.release_lease(sid, "other", token)  # its lease row stays, free
    return sid, token


async def _cut_then_committed(
    store: PostgresStore,
    pg_store_url: str,
    claim: Awaitable[list[tuple[str, int]]],
    answered: Callable[[asyncio.Future[list[tuple[str, int]]]], Awaitable[None]],
) -> list[tuple[str, int]]:
    """Run `claim` while every lease row is locked: it locks its session's row, then waits, and
    its connection is cut after 1 s; `answered` checks what the call made of that. Then the lock
    is let go and the first statement, still running on the server, commits. The lease rows
    after it, (owner, token) each."""
    s = store._s
    async with (
        await psycopg.AsyncConnection.connect(pg_store_url, autocommit=True) as watch,
        await psycopg.AsyncConnection.connect(pg_store_url) as locker,
    ):
        await locker.execute(f"SELECT 1 FROM {s}.leases FOR UPDATE")
        claiming = asyncio.ensure_future(claim)
        first = await _lock_waiter(watch, {locker.info.backend_pid})
        await answered(claiming)
        await locker.rollback()  # the first statement, still running, now commits
        await _ended(watch, first)
        cur = await watch.execute(f"SELECT owner, token FROM {s}.leases ORDER BY sk")
        return [(str(owner), int(token)) for owner, token in await cur.fetchall()]


async def test_a_claim_committed_after_its_resend_is_given_back_and_taken_at_once(
    store: PostgresStore, pg_store_url: str
) -> None:
    sid, token = await _runnable(store)
    now = await store.server_time()

    async def sent_again(claiming: asyncio.Future[list[tuple[str, int]]]) -> None:
        # Cut after 1 s, found not committed, sent again: the session's row is the first's.
        assert await asyncio.wait_for(claiming, 30) == []

    rows = await _cut_then_committed(store, pg_store_url, store.claim("w", 30, now, 5), sent_again)
    assert rows == [("w", token + 1)]  # the worker's, and no drive of it
    later = await store.server_time()
    assert await store.claim("w", 30, later, 5) == [(sid, token + 2)]
    assert await store.claim("w", 30, later, 5) == []  # given back once


async def test_a_claim_whose_check_fails_too_is_given_back_once_it_commits(
    store: PostgresStore, pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check that asks whether a cut claim committed cannot reach the server either (it
    restarts): the claim fails with its outcome unknown, and what it committed later is still
    given back by the worker's next claim, not left to lapse."""
    sid, token = await _runnable(store)
    now = await store.server_time()
    checks: list[float] = []

    async def unreachable(owner: str, expires_at: float) -> list[tuple[str, int]]:
        checks.append(expires_at)
        raise StoreError("connection refused (the server restarting)")

    async def unknown(claiming: asyncio.Future[list[tuple[str, int]]]) -> None:
        with pytest.raises(StoreError, match="the outcome is unknown"):
            await asyncio.wait_for(claiming, 30)
        monkeypatch.undo()

    monkeypatch.setattr(store, "_leased_until", unreachable)
    rows = await _cut_then_committed(store, pg_store_url, store.claim("w", 30, now, 5), unknown)
    assert checks == [now + 30]
    assert rows == [("w", token + 1)]  # the worker's, and no drive of it
    later = await store.server_time()
    assert await store.claim("w", 30, later, 5) == [(sid, token + 2)]
    assert await store.claim("w", 30, later, 5) == []  # given back once


async def test_the_give_back_leaves_the_leases_of_the_workers_drives(
    store: PostgresStore, pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a clock that stands still (a test's), every claim and renewal of a worker sets the
    same expiry: the give-back of a claim left unsure took back the lease a live drive of the
    worker held (another worker then ran the session too). The sessions the worker drives
    (`skip`) are not given back."""
    driven = await new_session(store)
    await store.commit(
        Commit(session_id=driven, expected_seq=1, events=[ev(driven, 2)], status="running")
    )
    orphan, token = await _runnable(store)
    now = await store.server_time()
    assert await store.claim("w", 30, now, 1) == [(driven, 1)]

    async def unreachable(owner: str, expires_at: float) -> list[tuple[str, int]]:
        raise StoreError("connection refused (the server restarting)")

    async def unknown(claiming: asyncio.Future[list[tuple[str, int]]]) -> None:
        with pytest.raises(StoreError, match="the outcome is unknown"):
            await asyncio.wait_for(claiming, 30)
        monkeypatch.undo()

    monkeypatch.setattr(store, "_leased_until", unreachable)
    claim = store.claim("w", 30, now, 5, skip=[driven])
    await _cut_then_committed(store, pg_store_url, claim, unknown)
    assert await store.renew_lease(driven, "w", 1, 30, now)
    assert await store.claim("w", 30, now, 5, skip=[driven]) == [(orphan, token + 2)]
    assert await store.renew_lease(driven, "w", 1, 30, now)  # still the drive's
    assert await store.claim("w2", 30, now, 5) == []
