"""The PostgreSQL store's schema dropped under a running process (a staging database reset, a
restore over it): every call is a `StoreGone` naming the schema, as a SQLite file replaced is,
and the store forgets what it knew of its sessions, so a schema made anew meanwhile is not
read through row keys that now belong to other sessions."""

from __future__ import annotations

import asyncio

import pytest

import signoff as so
from signoff._exceptions import StoreError, StoreGone, UnknownSession
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore

from ._pg_events import T0, ev, new_session
from ._shipping import shipping_agent
from .test_postgres import admin


async def test_a_schema_dropped_under_the_store_is_store_gone_and_its_sessions_forgotten(
    pg_store_url: str,
) -> None:
    store = PostgresStore(pg_store_url)
    other: PostgresStore | None = None
    try:
        sid = await new_session(store)
        await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
        assert [e.seq for e in await store.read_events(sid)] == [1, 2]
        async with await admin(pg_store_url) as conn:
            await conn.execute(f'DROP SCHEMA "{store.schema}" CASCADE')
        commit = Commit(session_id=sid, expected_seq=2, events=[ev(sid, 3)])
        for call in (
            lambda: store.head(sid),
            lambda: store.read_events(sid),
            lambda: store.commit(commit),
            lambda: new_session(store),
            lambda: store.claim("w", 10, T0, 10),
            lambda: store.renew_lease(sid, "w", 1, 10, T0),
        ):
            with pytest.raises(StoreGone, match=f"schema '{store.schema}' .* is gone") as caught:
                await call()
            assert "Restart the process" in str(caught.value)
        # Another process (or `signoff db upgrade`) makes the schema anew, and a session in it,
        # whose row key is the one the first session had.
        other = PostgresStore(pg_store_url)
        theirs = await new_session(other)
        await other.commit(Commit(session_id=theirs, expected_seq=1, events=[ev(theirs, 2)]))
        with pytest.raises(UnknownSession):
            await store.read_events(sid)  # not the other session's events
        assert await store.head(sid) is None
        assert [e.session_id for e in await store.read_events(theirs)] == [theirs, theirs]
    finally:
        await store.close()
        if other is not None:
            await other.close()


async def test_a_worker_whose_schema_is_dropped_stops_with_store_gone(pg_store_url: str) -> None:
    """As for a SQLite file deleted under it: retrying could never mend it (nor should the
    worker go on over a schema made anew, whose sessions are not those it knew)."""
    async with so.Runtime([shipping_agent([])], store=pg_store_url, inline=False) as worker:
        stop = asyncio.Event()
        task = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        try:
            await asyncio.sleep(0.3)
            assert not task.done()
            async with await admin(pg_store_url) as conn:
                await conn.execute('DROP SCHEMA "signoff" CASCADE')
            with pytest.raises(so.StoreGone, match="schema 'signoff'"):
                await asyncio.wait_for(task, 10)
        finally:
            stop.set()
            await asyncio.gather(task, return_exceptions=True)


async def test_a_table_dropped_from_a_current_schema_is_damage_not_a_restart(
    pg_store_url: str,
) -> None:
    """A table dropped by hand from a schema at this signoff's version: a restart migrates
    nothing, so the `StoreError` says the store is damaged, naming the table, and to restore it
    (not `StoreGone`'s restart, which `/healthz` and `signoff worker` answered with a restart
    for ever), in this process and the next. A schema at an older version is still
    `StoreGone`: opening it anew migrates it."""
    store = PostgresStore(pg_store_url)
    try:
        sid = await new_session(store)
        async with await admin(pg_store_url) as conn:
            await conn.execute(f'DROP TABLE "{store.schema}".deleted_sessions')
        for call in (lambda: store._was_deleted(sid), lambda: new_session(store)):
            with pytest.raises(StoreError, match="lacks deleted_sessions, dropped") as caught:
                await call()
            assert not isinstance(caught.value, StoreGone)
            assert "the store is damaged" in str(caught.value)
            assert "Restore it from a backup" in str(caught.value)
            assert "Restart the process" not in str(caught.value)
    finally:
        await store.close()
    again = PostgresStore(pg_store_url)  # the process restarted
    try:
        with pytest.raises(StoreError, match="lacks deleted_sessions, dropped") as caught:
            await again.delete_session(sid, now=T0)
        assert not isinstance(caught.value, StoreGone)
        async with await admin(pg_store_url) as conn:
            await conn.execute(
                f'DELETE FROM "{again.schema}".schema_version WHERE version = '
                f'(SELECT max(version) FROM "{again.schema}".schema_version)'
            )
        with pytest.raises(StoreGone, match="Restart the process"):
            await again._was_deleted(sid)
    finally:
        await again.close()
