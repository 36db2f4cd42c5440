"""The PostgreSQL store's LISTEN/NOTIFY: what each commit notifies, and listeners that die or go
silent."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

import signoff as so
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore, _borrowed, _changes

from ._pg_events import T0, ev, new_session
from ._relay import Relay
from .test_postgres import admin

# -- LISTEN/NOTIFY ---------------------------------------------------------------------------

SENTINEL = "sentinel"


async def _notified_before_sentinel(conn: psycopg.AsyncConnection[Any], channel: str) -> list[str]:
    """The payloads `conn` (listening on `channel`) is notified of up to a sentinel it notifies
    now: PostgreSQL delivers notifications in the order their transactions committed, so every
    one the writes before it sent has come then, however long a loaded machine took to deliver
    it (reading for a fixed half second missed one), and none is counted twice or left out."""
    await conn.execute("SELECT pg_notify(%s, %s)", [channel, SENTINEL])
    payloads: list[str] = []
    async for n in conn.notifies(timeout=60):
        if n.payload == SENTINEL:
            return payloads
        payloads.append(n.payload)
    raise AssertionError(f"the sentinel was not notified within 60 s, after {payloads}")


async def test_each_commit_is_notified_with_session_and_seq(
    pg: PostgresStore, pg_store_url: str
) -> None:
    sid = await new_session(pg)
    conn = await admin(pg_store_url)
    async with conn:
        await conn.execute(f'LISTEN "{pg.channel}"')
        await pg.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2), ev(sid, 3)]))
        sid2 = await new_session(pg)
        payloads = [n.payload async for n in conn.notifies(timeout=5, stop_after=2)]
    assert payloads == [f"{sid} 3", f"{sid2} 1"]


async def test_releasing_a_session_with_work_wakes_workers(
    pg: PostgresStore, pg_store_url: str
) -> None:
    idle = await new_session(pg)
    busy = await new_session(pg)
    await pg.commit(Commit(session_id=busy, expected_seq=1, events=[ev(busy, 2)], status="running"))
    t_idle = await pg.acquire_lease(idle, "w1", 10, T0)
    t_busy = await pg.acquire_lease(busy, "w1", 10, T0)
    assert t_idle is not None and t_busy is not None
    conn = await admin(pg_store_url)
    async with conn:
        await conn.execute(f'LISTEN "{pg.channel}"')
        await pg.release_lease(busy, "w2", t_busy)  # not the owner: nothing released
        await pg.release_lease(idle, "w1", t_idle)  # no work left: nobody to wake
        await pg.release_lease(busy, "w1", t_busy)
        payloads = await _notified_before_sentinel(conn, pg.channel)
    assert payloads == [f"{busy} 0"]


async def test_a_failed_commit_notifies_nothing(pg: PostgresStore, pg_store_url: str) -> None:
    sid = await new_session(pg)
    conn = await admin(pg_store_url)
    async with conn:
        await conn.execute(f'LISTEN "{pg.channel}"')
        with pytest.raises(so.StoreError):
            await pg.commit(Commit(session_id=sid, expected_seq=7, events=[ev(sid, 8)]))
        assert await _notified_before_sentinel(conn, pg.channel) == []


async def test_waiters_survive_a_killed_listener(pg: PostgresStore, pg_store_url: str) -> None:
    sid = await new_session(pg)
    assert await pg.wait_for_change(sid, 0.05) is False  # starts the listener
    for _ in range(1000):  # subscribed: on a loaded machine that can take longer than the wait
        if pg._changes._listening.is_set():
            break
        await asyncio.sleep(0.01)
    conn = await admin(pg_store_url)
    async with conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid()"
        )
        rows = await cur.fetchall()
        assert len(rows) == 1
        waiting = asyncio.create_task(pg.wait_for_change(sid, 10))
        await asyncio.sleep(0.05)
        await conn.execute("SELECT pg_terminate_backend(%s)", (rows[0][0],))
        # Woken by the reconnect: a notification may have been missed meanwhile.
        assert await asyncio.wait_for(waiting, 10) is True
    for _ in range(200):  # the listener is back and delivers again
        waiting = asyncio.create_task(pg.wait_for_change(sid, 10))
        await asyncio.sleep(0.05)
        if waiting.done():
            continue
        head = await pg.head(sid)
        assert head is not None
        await pg.commit(Commit(session_id=sid, expected_seq=head, events=[ev(sid, head + 1)]))
        assert await asyncio.wait_for(waiting, 10) is True
        break
    else:
        raise AssertionError("the listener never came back")


async def test_a_listen_connection_gone_silent_is_given_up_and_listening_resumes(
    pg: PostgresStore, pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A LISTEN connection whose network went silent waits for ever for notifications that no
    longer come (nothing is sent on it, so nothing fails): the listener checks a connection
    quiet for a while, gives it up when it does not answer, and listens on a new one, so waits
    are woken by commits again."""
    severed: list[object] = []

    def cut(conn: object) -> None:
        severed.append(conn)
        _borrowed.sever(conn)  # type: ignore[arg-type]

    monkeypatch.setattr(_changes, "sever", cut)
    params = conninfo_to_dict(pg_store_url)
    proxy = Relay(str(params["host"]), int(str(params["port"])))
    port = await proxy.start()
    store = PostgresStore(pg_store_url.replace(f":{params['port']}/", f":{port}/"))
    store._changes.check_every = 0.3
    store._changes.check_within = 0.3
    try:
        sid = await new_session(pg)
        assert await store.wait_for_change(sid, 0.05) is False  # starts the listener
        for _ in range(1000):  # subscribed: its connection is up (not mid-handshake) when silenced
            if store._changes._listening.is_set():
                break
            await asyncio.sleep(0.01)
        seen = store._changes.seen
        proxy.silence()
        silenced = time.monotonic()
        # Quiet past `check_every`, no answer within `check_within`: the check is cut under it
        # (not cancelled: then psycopg waits 5 s more for the server to end a query it never
        # received), and listening resumes on a new connection (which wakes every waiter, as it
        # may have missed some). The minute is only for a listener that never resumes.
        while not (store._changes.seen > seen and store._changes._listening.is_set()):
            assert time.monotonic() - silenced < 60, "the silent connection was not given up"
            await asyncio.sleep(0.01)
        assert severed, "the silent connection's check was not cut under it"
        for head in range(1, 4):
            waiting = asyncio.create_task(store.wait_for_change(sid, 5))
            await asyncio.sleep(0.1)
            await pg.commit(Commit(session_id=sid, expected_seq=head, events=[ev(sid, head + 1)]))
            assert await asyncio.wait_for(waiting, 10) is True
    finally:
        await store.close()
        await proxy.close()
