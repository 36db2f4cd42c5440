"""Followers on PostgreSQL (`wait_for_change` given `after`): woken by LISTEN/NOTIFY, with one
shared re-check of their heads per `poll_interval` as the safety net against a lost notification,
not one read per follower."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest

import signoff as so
from signoff.stores import Commit
from signoff.stores.postgres import PostgresStore

from ._pg_events import ev, new_session
from ._ttl import ttl_agent
from .test_postgres import admin

POLL = 0.1
"""The stores' `poll_interval` here: the bound on a wake-up whose notification was lost is this
plus one read."""


def _woken_after(waiting: asyncio.Task[bool], shared: Sequence[object]) -> list[int]:
    """How many shared re-checks of the heads had started when `waiting` ended, filled in as it
    ends: a follower whose notification was lost is woken by the one under way at the commit or
    the next (one more when the loop is slow to run the waiter; a re-check that left it for
    later would be many more), however long the machine takes."""
    ended: list[int] = []
    waiting.add_done_callback(lambda _: ended.append(len(shared)))
    return ended


async def _listening(store: PostgresStore) -> None:
    for _ in range(1000):  # subscribed: on a loaded machine that can take a while
        if store._changes._listening.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the listener never subscribed")


@pytest.fixture
async def store(pg_store_url: str) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(pg_store_url, poll_interval=POLL)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


def _counting(
    monkeypatch: pytest.MonkeyPatch, store: PostgresStore, name: str
) -> list[Sequence[str] | str]:
    calls: list[Sequence[str] | str] = []
    read: Callable[..., Awaitable[object]] = getattr(store, name)

    async def counted(arg: Sequence[str] | str, **options: object) -> object:
        calls.append(arg)
        return await read(arg, **options)

    monkeypatch.setattr(store, name, counted)
    return calls


async def test_healthy_followers_share_one_recheck_instead_of_a_read_each(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sids = [await new_session(store) for _ in range(20)]
    await store.wait_for_change(sids[0], 0.01)  # starts the listener
    await _listening(store)
    heads = _counting(monkeypatch, store, "head")
    shared = _counting(monkeypatch, store, "_session_heads")
    waits = [asyncio.create_task(store.wait_for_change(sid, 30, after=1)) for sid in sids]
    await asyncio.sleep(POLL * 8)
    # Each follower read its head once, on starting to wait; since then one read a poll for
    # all of them (it used to be one per follower a poll: 160 here).
    assert len(heads) == len(sids)
    assert 1 <= len(shared) <= 10
    assert all(sorted(ids) == sorted(sids) for ids in shared)
    assert not any(w.done() for w in waits)
    # A notified commit still wakes its follower at once, and only it.
    await store.commit(Commit(session_id=sids[3], expected_seq=1, events=[ev(sids[3], 2)]))
    assert await asyncio.wait_for(waits[3], 5) is True
    await asyncio.sleep(POLL * 3)
    assert [w.done() for w in waits].count(True) == 1
    for w in waits:
        w.cancel()
    await asyncio.gather(*waits, return_exceptions=True)
    # Nobody follows any more: the shared re-check reads nothing.
    await asyncio.sleep(POLL * 3)
    count = len(shared)
    await asyncio.sleep(POLL * 5)
    assert len(shared) == count


async def test_a_notification_lost_while_listening_still_wakes_the_follower(
    store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sid = await new_session(store)
    await store.wait_for_change(sid, 0.01)
    await _listening(store)
    monkeypatch.setattr(store._changes, "_wake", lambda session_id: None)  # every NOTIFY lost
    shared = _counting(monkeypatch, store, "_session_heads")
    waiting = asyncio.create_task(store.wait_for_change(sid, 30, after=1))
    ended = _woken_after(waiting, shared)
    await asyncio.sleep(POLL * 2)
    assert not waiting.done()
    await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
    committed = len(shared)
    assert await asyncio.wait_for(waiting, 10) is True
    assert ended[0] - committed <= 3, (committed, ended)


async def test_a_notification_lost_while_the_listener_reconnects_still_wakes_the_follower(
    store: PostgresStore, pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The LISTEN connection is killed and its reconnect held back 30 s: a commit meanwhile
    notifies nobody, yet the next shared re-check wakes its follower (it does not wait for the
    listener), and the followers of other sessions are not woken by it."""
    sid, other = await new_session(store), await new_session(store)
    await store.wait_for_change(sid, 0.01)
    await _listening(store)
    listener = store._changes
    reconnect = listener._connect
    held = asyncio.Event()

    async def slow_connect() -> object:
        held.set()
        await asyncio.sleep(30)
        return await reconnect()

    listener._connect = slow_connect  # type: ignore[assignment]
    shared = _counting(monkeypatch, store, "_session_heads")
    waiting = asyncio.create_task(store.wait_for_change(sid, 60, after=1))
    ended = _woken_after(waiting, shared)
    bystander = asyncio.create_task(store.wait_for_change(other, 60, after=1))
    conn = await admin(pg_store_url)
    async with conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity "
            "WHERE query LIKE 'LISTEN%%' AND pid <> pg_backend_pid() "
            "AND datname = current_database()"
        )
        rows = await cur.fetchall()
        assert len(rows) == 1
        await conn.execute("SELECT pg_terminate_backend(%s)", (rows[0][0],))
    await asyncio.wait_for(held.wait(), 10)  # the listener is down, trying to come back
    assert not listener._listening.is_set()
    await asyncio.sleep(POLL * 2)
    assert not waiting.done() and not bystander.done()
    await store.commit(Commit(session_id=sid, expected_seq=1, events=[ev(sid, 2)]))
    committed = len(shared)
    assert await asyncio.wait_for(waiting, 10) is True
    assert ended[0] - committed <= 3, (committed, ended)
    assert not bystander.done()
    bystander.cancel()
    await asyncio.gather(bystander, return_exceptions=True)


async def test_a_follower_of_a_deleted_session_learns_it_from_the_shared_recheck(
    store: PostgresStore, pg_store_url: str
) -> None:
    sid = await new_session(store)
    await store.wait_for_change(sid, 0.01)
    await _listening(store)
    waiting = asyncio.create_task(store.wait_for_change(sid, 30, after=1))
    await asyncio.sleep(POLL * 2)
    conn = await admin(pg_store_url)
    async with conn:
        # Deleted behind the store's back, with no notification: only the re-check can tell.
        s = f'"{store.schema}"'
        sk = f"(SELECT sk FROM {s}.sessions WHERE id = %s)"
        await conn.execute(f"DELETE FROM {s}.events WHERE sk = {sk}", (sid,))
        await conn.execute(f"DELETE FROM {s}.sessions WHERE id = %s", (sid,))
    with pytest.raises(so.UnknownSession):
        await asyncio.wait_for(waiting, 10)


async def test_an_idle_runtime_follower_reads_nothing_between_its_rechecks(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rt.events(follow=True)` on PostgreSQL used to give up its wait every ten
    `poll_interval`s and read the session's events and head again; woken by the store (whose
    shared re-check is the safety net), it now waits until its expiry or its periodic check
    that the session still exists is due. A store that cannot notify is polled as before."""
    agent = ttl_agent()  # its sessions expire 60 s after their last event: not in this test
    async with so.Runtime([agent], store=pg_store_url, poll_interval=0.02) as rt:
        r = await rt.generate("desk", prompt="reset")
        head = (await rt.state(r.session_id)).seq
        store = rt.store
        assert isinstance(store, PostgresStore)
        reads = _counting(monkeypatch, store, "read_events")
        heads = _counting(monkeypatch, store, "head")
        seen: list[int] = []

        async def follow() -> None:
            async for event in rt.events(r.session_id, follow=True):
                seen.append(event.seq)

        task = asyncio.create_task(follow())
        for _ in range(500):
            if seen and seen[-1] == head:
                break
            await asyncio.sleep(0.01)
        # Its first wait reads the head once: let that land, however loaded the machine (a
        # follower reading every ten poll_intervals, as it used to, never settles in 0.3 s).
        count = -1
        for _ in range(16):
            if len(reads) + len(heads) == count:
                break
            count = len(reads) + len(heads)
            await asyncio.sleep(0.3)
        await asyncio.sleep(1.0)  # fifty poll_intervals: it used to read 10 times meanwhile
        assert len(reads) + len(heads) == count
        assert not task.done()
        # Still woken at once by a change: a message answers the approval.
        await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=False)]
        )
        for _ in range(500):
            if len(seen) > head and seen[-1] == (await rt.state(r.session_id)).seq:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the follower was not woken by the new events")
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
