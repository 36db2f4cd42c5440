"""The row locks between a fenced commit and the statements on its lease, on PostgreSQL: a commit
held up in flight (waiting on an event row another transaction is inserting) must not hold back
a renewal of its own lease (it did: the commit held the lease row `FOR SHARE`, which an
`UPDATE` waits for, so under heavy load a drive's lease lapsed while it committed), while a
takeover and a claim still wait for it (or pass the session by), so the commit stays fenced: a
takeover applies after it, never before it and never beside it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import psycopg
import pytest

from signoff._exceptions import AppendConflict, LeaseLost
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore

from ._pg_events import T0, ev, new_session
from ._postgres_commit import two

__all__ = ["two"]  # the fixture, used by name

TTL = 10.0


@pytest.fixture
async def observer(pg_store_url: str) -> AsyncIterator[psycopg.AsyncConnection[tuple[object, ...]]]:
    conn = await psycopg.AsyncConnection.connect(pg_store_url, autocommit=True)
    async with conn:
        yield conn


async def _hold_event_row(url: str, sid: str, seq: int) -> psycopg.AsyncConnection[object]:
    """A transaction that inserted event `seq` of the session and has not ended: a commit
    writing that event waits for it once it holds its session and lease rows. (Its foreign key
    is not checked: that check would lock the session row, which the commit locks first.)"""
    holder = await psycopg.AsyncConnection.connect(url, autocommit=True)
    await holder.execute("SET session_replication_role = replica")
    await holder.execute("BEGIN")
    await holder.execute(
        "INSERT INTO signoff.events (sk, seq, type, turn, at, v, data) "
        "SELECT sk, %s, 'x', '', 0, 1, ''::bytea FROM signoff.sessions WHERE id=%s",
        (seq, sid),
    )
    return holder


async def _waiting(observer: psycopg.AsyncConnection[tuple[object, ...]], like: str) -> None:
    """Until a statement matching `like` waits for a lock."""
    for _ in range(1000):
        cur = await observer.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND datname = current_database() AND query LIKE %s",
            (like,),
        )
        row = await cur.fetchone()
        if row is not None and row[0] == 1:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"no statement like {like!r} waited for a lock")


async def _slow_commit(
    pg: PostgresStore, url: str, observer: psycopg.AsyncConnection[tuple[object, ...]], sid: str
) -> tuple[int, psycopg.AsyncConnection[object], asyncio.Task[None]]:
    """The session's lease (owner w1), and a commit under it held up in flight (of event 2)."""
    token = await pg.acquire_lease(sid, "w1", TTL, T0)
    assert token is not None
    holder = await _hold_event_row(url, sid, 2)
    commit = asyncio.create_task(
        pg.commit(
            Commit(
                session_id=sid,
                expected_seq=1,
                events=[ev(sid, 2)],
                lease_token=token,
                status="running",
            )
        )
    )
    await _waiting(observer, '%INSERT INTO "signoff".events%')
    return token, holder, commit


async def _lease_row(
    observer: psycopg.AsyncConnection[tuple[object, ...]], sid: str
) -> tuple[object, ...] | None:
    cur = await observer.execute(
        "SELECT l.owner, l.token, l.expires_at FROM signoff.leases l "
        "JOIN signoff.sessions s ON s.sk = l.sk WHERE s.id = %s",
        (sid,),
    )
    return await cur.fetchone()


async def test_a_renewal_is_not_held_behind_a_slow_fenced_commit(
    pg: PostgresStore,
    pg_store_url: str,
    observer: psycopg.AsyncConnection[tuple[object, ...]],
) -> None:
    """The drive's renewal goes through at once while its commit waits; the commit then
    applies under the lease, which the renewal kept."""
    sid = await new_session(pg)
    token, holder, commit = await _slow_commit(pg, pg_store_url, observer, sid)
    async with holder:
        started = time.monotonic()
        renewal = asyncio.create_task(pg.renew_lease(sid, "w1", token, TTL, T0 + 5))
        # The commit is held until the ROLLBACK below: a renewal waiting for it never ends here.
        done, _ = await asyncio.wait({renewal}, timeout=10.0)
        took = time.monotonic() - started
        try:
            assert done, f"the renewal waited {took:.1f}s for the commit in flight"
            assert renewal.result() is True
            assert await _lease_row(observer, sid) == ("w1", token, T0 + 5 + TTL)
            assert not commit.done()  # still held up: the renewal did not wait for it
        finally:
            await holder.execute("ROLLBACK")
            await asyncio.wait_for(asyncio.gather(renewal, commit), 10)
    assert await pg.head(sid) == 2


async def test_a_takeover_waits_for_a_fenced_commit_in_flight_which_applies_first(
    two: tuple[PostgresStore, PostgresStore],
    pg_store_url: str,
    observer: psycopg.AsyncConnection[tuple[object, ...]],
) -> None:
    """Another process takes the lapsed lease over while the holder's commit is in flight: the
    takeover waits, and a claim passes the session by, until the commit ended; the commit
    applied under the old token, every later one of that token is refused, and the new holder
    commits from the head the old one left (never beside it)."""
    a, b = two
    sid = "ses_taken_over_in_flight"
    await a.create_session(sid, "support", [ev(sid, 1, "session.created")], None, status="running")
    # Claimable (running, its lease lapsed by then) unless locked: claimed once, given back.
    assert await b.claim("w3", TTL, T0 + 100, 10) == [(sid, 1)]
    await b.release_lease(sid, "w3", 1)
    token, holder, commit = await _slow_commit(a, pg_store_url, observer, sid)
    async with holder:
        takeover = asyncio.create_task(b.acquire_lease(sid, "w2", TTL, T0 + 100))
        try:
            await _waiting(observer, '%INSERT INTO "signoff".leases%')
            assert await b.claim("w3", TTL, T0 + 100, 10) == []  # locked: passed by
            await asyncio.sleep(0.2)
            assert not takeover.done() and not commit.done()
            assert await _lease_row(observer, sid) == ("w1", token, T0 + TTL)
        finally:
            await holder.execute("ROLLBACK")
        await asyncio.wait_for(commit, 10)  # applied, under the old token
        taken = await asyncio.wait_for(takeover, 10)
    assert taken == token + 1
    assert await a.head(sid) == 2
    with pytest.raises(LeaseLost):
        await a.commit(
            Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], lease_token=token)
        )
    assert not await a.renew_lease(sid, "w1", token, TTL, T0 + 101)  # renewal after takeover
    with pytest.raises(AppendConflict):  # the new holder's guess of the head is the old one's
        await b.commit(
            Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)], lease_token=taken)
        )
    await b.commit(Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)], lease_token=taken))
    assert [e.seq for e in await a.read_events(sid)] == [1, 2, 3]
