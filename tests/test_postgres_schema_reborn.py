"""The PostgreSQL store's schema dropped and made anew between two calls of a running process
(a staging reset, a restore over it), no call of its meeting the gap: what the process cached
of its sessions (their row keys, the runtime's folded states) must not read the new schema's
rows as theirs, since row keys are reused there by other sessions."""

from __future__ import annotations

import pytest

import signoff as so
from signoff._exceptions import UnknownSession
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore

from ._pg_events import T0, ev, new_session
from ._shipping import shipping_agent
from .test_postgres import admin


async def test_a_schema_made_anew_between_two_calls_reads_no_other_sessions_rows(
    pg_store_url: str,
) -> None:
    store = PostgresStore(pg_store_url)
    other: PostgresStore | None = None
    try:
        sid = await new_session(store)
        audited = [ev(sid, 2, "tool.started")]
        await store.commit(Commit(session_id=sid, expected_seq=1, events=audited))
        assert [e.seq for e in await store.read_events(sid)] == [1, 2]
        assert await store.acquire_lease(sid, "w", 60, T0) == 1
        assert [e.stream for e in await store.audit(stream=sid)] == [sid]
        async with await admin(pg_store_url) as conn:
            await conn.execute(f'DROP SCHEMA "{store.schema}" CASCADE')
        # Made anew by another process, with a session whose row key is the one ours had,
        # leased by the same owner with the same token.
        other = PostgresStore(pg_store_url)
        theirs = await new_session(other)
        audited = [ev(theirs, 2, "tool.started"), ev(theirs, 3, "tool.started")]
        await other.commit(Commit(session_id=theirs, expected_seq=1, events=audited))
        assert len(await other.audit(stream=theirs)) == 2
        assert await other.acquire_lease(theirs, "w", 60, T0) == 1
        with pytest.raises(UnknownSession):
            await store.read_events(sid)  # not their events
        assert await store.audit(stream=sid) == []
        assert not await store.renew_lease(sid, "w", 1, 600, T0)
        await store.release_lease(sid, "w", 1)
        # Their lease is untouched: neither renewed nor released by calls naming our session.
        assert await other.acquire_lease(theirs, "x", 60, T0 + 1) is None
        async with await admin(pg_store_url) as conn:
            cur = await conn.execute(f'SELECT owner, expires_at FROM "{store.schema}".leases')
            assert await cur.fetchall() == [("w", T0 + 60)]
        assert [e.seq for e in await store.read_events(theirs)] == [1, 2, 3]
    finally:
        await store.close()
        if other is not None:
            await other.close()


async def test_a_session_made_anew_behind_the_runtimes_cached_state_is_read_again(
    pg_store_url: str,
) -> None:
    """A restore brings back a session as it was, with fewer events than this runtime folded:
    its cached state (a head the store no longer has) is dropped, not kept and committed on."""
    async with so.Runtime([shipping_agent([])], store=pg_store_url) as rt:
        parked = await rt.generate("a", prompt="ship order 7")
        sid = parked.session_id
        state = await rt.state(sid)
        assert state.seq > 1 and state.pending_requests()
        created = [e async for e in rt.events(sid, follow=False) if e.seq == 1]
        async with await admin(pg_store_url) as conn:
            await conn.execute('DROP SCHEMA "signoff" CASCADE')
        other = PostgresStore(pg_store_url)
        try:
            await other.create_session(sid, "a", created, None)
            state = await rt.state(sid)
            assert state.seq == 1 and not state.pending_requests()
        finally:
            await other.close()
