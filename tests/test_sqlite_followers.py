"""Followers on SQLite (`wait_for_change` for a session): one poll per `poll_interval` shared by
every wait of a store and event loop, which reads the heads of all followed sessions in one query
only when the file changed, instead of one head read per follower per poll."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._events import Event
from signoff.stores import Commit
from signoff.stores.sqlite import SQLiteStore

POLL = 0.05
"""The waits' `poll_interval` here, as the default."""


def _ev(sid: str, seq: int, type_: Any = "turn.started") -> Event:
    return Event(session_id=sid, seq=seq, type=type_, at=1_700_000_000.0 + seq, turn_id="trn_1")


async def _new_session(store: SQLiteStore) -> str:
    sid = f"ses_{uuid.uuid4().hex[:20]}"
    await store.create_session(sid, "support", [_ev(sid, 1, "session.created")], None)
    return sid


@pytest.fixture
async def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'state.db'}"


@pytest.fixture
async def store(url: str) -> AsyncIterator[SQLiteStore]:
    store = SQLiteStore(url)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def _head_reads(store: SQLiteStore, polls: list[str] | None = None) -> list[str]:
    """Every statement the store's connection runs that reads a session's head (and into
    `polls`, each look of the shared poll at the file's version)."""
    seen: list[str] = []

    def traced(sql: str) -> None:
        if "head FROM sessions" in sql:
            seen.append(sql)
        elif polls is not None and "data_version" in sql:
            polls.append(sql)

    store.conn.set_trace_callback(traced)
    return seen


async def test_idle_followers_share_one_poll_and_read_no_heads_while_nothing_changes(
    store: SQLiteStore, url: str
) -> None:
    sids = [await _new_session(store) for _ in range(20)]
    polls: list[str] = []
    reads = _head_reads(store, polls)
    waits = [asyncio.create_task(store.wait_for_change(sid, 30, after=1)) for sid in sids]
    ended: list[int] = []  # how many looks the shared poll had taken when the follower woke
    waits[3].add_done_callback(lambda _: ended.append(len(polls)))
    await asyncio.sleep(POLL * 8)
    # Each follower read its head once, on starting to wait, and the shared poll read them all
    # once, to learn where the file stood; nothing changed since, so no head was read again (it
    # used to be one read per follower a poll: 160 more here).
    assert len(reads) <= len(sids) + 1
    assert not any(w.done() for w in waits)
    # A commit by another connection (another process, say) wakes its follower at the shared
    # poll's next look (one under way may see it; one more when the loop is slow to run the
    # follower), however long the machine takes, and only it: the shared poll reads all the
    # heads in one query.
    other = SQLiteStore(url)
    await other.open()
    try:
        await other.commit(Commit(session_id=sids[3], expected_seq=1, events=[_ev(sids[3], 2)]))
        committed = len(polls)
        assert await asyncio.wait_for(waits[3], 10) is True
        assert ended[0] - committed <= 3, (committed, ended)
    finally:
        await other.close()
    await asyncio.sleep(POLL * 3)
    assert [w.done() for w in waits].count(True) == 1
    assert len(reads) <= len(sids) + 4
    # A commit through this store wakes its follower too.
    await store.commit(Commit(session_id=sids[5], expected_seq=1, events=[_ev(sids[5], 2)]))
    assert await asyncio.wait_for(waits[5], 10) is True
    await asyncio.sleep(POLL * 3)
    assert [w.done() for w in waits].count(True) == 2
    for w in waits:
        w.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    # Nobody follows any more: the shared poll stops.
    await asyncio.sleep(POLL * 3)
    assert store._follows == {}


async def test_a_follower_without_after_and_one_timing_out_share_the_poll_too(
    store: SQLiteStore,
) -> None:
    sid = await _new_session(store)
    reads = _head_reads(store)
    started = time.monotonic()
    assert await store.wait_for_change(sid, POLL * 6) is False
    assert time.monotonic() - started >= POLL * 6 - 0.01
    assert len(reads) <= 2  # its own, and the shared poll's first
    waiting = asyncio.create_task(store.wait_for_change(sid, 30))
    await asyncio.sleep(POLL * 2)
    assert not waiting.done()
    await store.commit(Commit(session_id=sid, expected_seq=1, events=[_ev(sid, 2)]))
    assert await asyncio.wait_for(waiting, 10) is True


async def test_a_follower_of_a_session_deleted_by_another_connection_learns_it(
    store: SQLiteStore, url: str
) -> None:
    sid, kept = await _new_session(store), await _new_session(store)
    waiting = asyncio.create_task(store.wait_for_change(sid, 30, after=1))
    bystander = asyncio.create_task(store.wait_for_change(kept, 30, after=1))
    await asyncio.sleep(POLL * 2)
    other = SQLiteStore(url)
    await other.open()
    try:
        conn = other.conn
        with conn:
            sk = conn.execute("SELECT sk FROM sessions WHERE id=?", (sid,)).fetchone()[0]
            conn.execute("DELETE FROM events WHERE sk=?", (sk,))
            conn.execute("DELETE FROM sessions WHERE sk=?", (sk,))
    finally:
        await other.close()
    with pytest.raises(so.UnknownSession):
        await asyncio.wait_for(waiting, 10)
    await asyncio.sleep(POLL * 3)
    assert not bystander.done()
    bystander.cancel()
    await asyncio.gather(bystander, return_exceptions=True)
