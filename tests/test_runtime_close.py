"""`Runtime.close` while the runtime's own async calls are still running on other tasks: they
are stopped first (their leases given back), as `*_sync` calls in other threads are, so none
goes on to open the store again behind the close."""

from __future__ import annotations

import asyncio
import time

import pytest

import signoff as so
from signoff import _closing
from signoff.testing import reply, scripted_agent

from .conftest import make_store


def _store_open(rt: so.Runtime) -> bool:
    """Whether the runtime's store holds a connection or a pool (SQLite's or PostgreSQL's)."""
    return any(getattr(rt.store, name, None) is not None for name in ("_conn", "_pool"))


async def test_close_stops_a_turn_driven_on_another_task_and_leaves_the_store_closed(
    store_url: str,
) -> None:
    """The drive went on after `close`, its next write opening the store again (SQLite's file,
    a PostgreSQL pool), which stayed open with nothing left to close it. It raises a
    `UsageError` now, its lease given back: the turn is resumable at once, elsewhere too."""
    started = asyncio.Event()

    async def slow(conversation: list[so.Message]) -> so.ModelResponse:
        started.set()
        await asyncio.sleep(3600)
        return reply("never")  # pragma: no cover

    rt = so.Runtime([scripted_agent("a", [slow])], store=store_url, lease_ttl=600)
    turn = asyncio.create_task(rt.generate("a", "x"))
    await started.wait()
    await rt.close()
    assert turn.done()
    with pytest.raises(so.UsageError, match="closed while this call ran"):
        await turn
    await asyncio.sleep(0.1)
    assert not _store_open(rt)
    store = make_store(store_url)
    try:
        (row,) = await store.sessions()
        assert row.status == "running"  # nothing half-stored: the turn is there to resume
        assert await store.acquire_lease(row.id, "another-worker", 30.0, time.time()) is not None
    finally:
        await store.close()


async def test_close_stops_a_follower_on_another_task_and_leaves_the_store_closed(
    store_url: str,
) -> None:
    """A follower of a session's events kept polling (or listening) after `close`, opening
    the store again; it raises a `UsageError` now, after the events it was given."""
    rt = so.Runtime([scripted_agent("a", [reply("hi")])], store=store_url)
    sid = (await rt.generate("a", "x")).session_id
    seen: list[int] = []

    async def follow() -> None:
        async for event in rt.events(sid):
            seen.append(event.seq)

    follower = asyncio.create_task(follow())
    while not seen or len(seen) < (await rt.state(sid)).seq:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.1)  # waiting for more now
    await rt.close()
    with pytest.raises(so.UsageError, match="closed while this call ran"):
        await asyncio.wait_for(follower, 10)
    await asyncio.sleep(0.1)
    assert not _store_open(rt)


async def test_close_sync_from_the_loop_a_turn_runs_on_stops_it_once_that_loop_is_back(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`close_sync` called on the loop a turn is driven on blocks that loop: the drive cannot
    unwind until it returns, so it is not waited for; it unwinds after, giving its lease back
    through a store it opens again, which it closes again before raising."""
    started = asyncio.Event()

    async def slow(conversation: list[so.Message]) -> so.ModelResponse:
        started.set()
        await asyncio.sleep(3600)
        return reply("never")  # pragma: no cover

    # A call is given 30 s to unwind (not 5 s): waiting for this one would fail the bound by far.
    monkeypatch.setattr(_closing, "UNWIND", 30.0)
    rt = so.Runtime([scripted_agent("a", [slow])], store=store_url, lease_ttl=600)
    turn = asyncio.create_task(rt.generate("a", "x"))
    await started.wait()
    began = time.monotonic()
    rt.close_sync()
    assert time.monotonic() - began < 5
    with pytest.raises(so.UsageError, match="closed while this call ran"):
        await asyncio.wait_for(turn, 10)
    assert not _store_open(rt)
    store = make_store(store_url)
    try:
        (row,) = await store.sessions()
        assert await store.acquire_lease(row.id, "another-worker", 30.0, time.time()) is not None
    finally:
        await store.close()


async def test_close_stops_a_follower_busy_with_an_event_at_its_next_step(store_url: str) -> None:
    """A follower whose caller was handling an event when `close` ran (not waiting in the
    runtime, so not among its running calls) went on: it yielded the rest of its batch, then
    read the store again, opening it behind the close, and followed for ever. Its next step
    raises the `UsageError` a waiting follower raises now, and the store stays closed."""
    rt = so.Runtime([scripted_agent("a", [reply("hi")], repeat_last=True)], store=store_url)
    sid = (await rt.generate("a", "x")).session_id
    head = (await rt.state(sid)).seq
    assert head > 2  # the rest of the first read's batch is still to be yielded
    busy, closed = asyncio.Event(), asyncio.Event()
    seen: list[int] = []

    async def follow() -> None:
        async for event in rt.events(sid):
            seen.append(event.seq)
            busy.set()
            await closed.wait()  # handling the event while the runtime is closed

    follower = asyncio.create_task(follow())
    await busy.wait()
    await rt.close()
    assert not follower.done()  # it was in its caller's code: nothing of the runtime's to stop
    async with so.Runtime([scripted_agent("a", [reply("more")])], store=store_url) as other:
        await other.generate("a", "y", session_id=sid)  # another process goes on with it
    closed.set()
    with pytest.raises(so.UsageError, match="closed while this call ran"):
        await asyncio.wait_for(follower, 10)
    assert seen == [1]
    await asyncio.sleep(0.1)
    assert not _store_open(rt)


async def test_a_runtime_opened_again_leaves_its_old_followers_stopped(store_url: str) -> None:
    """A later call opens a closed runtime again; a follower begun before the close, busy with
    an event across it, must not go on following on the reopened store: its next step raises
    `UsageError`. A follower begun after reads on as any call does."""
    rt = so.Runtime([scripted_agent("a", [reply("hi")], repeat_last=True)], store=store_url)
    sid = (await rt.generate("a", "x")).session_id
    head = (await rt.state(sid)).seq
    busy, closed = asyncio.Event(), asyncio.Event()
    seen: list[int] = []

    async def follow() -> None:
        async for event in rt.events(sid):
            seen.append(event.seq)
            if event.seq == head:
                busy.set()
                await closed.wait()

    follower = asyncio.create_task(follow())
    await busy.wait()
    await rt.close()
    await rt.generate("a", "y", session_id=sid)  # opens the store again, appends events
    new_head = (await rt.state(sid)).seq
    assert new_head > head
    closed.set()
    with pytest.raises(so.UsageError, match="closed while this call ran"):
        await asyncio.wait_for(follower, 10)
    assert seen == list(range(1, head + 1))
    fresh = [e.seq async for e in rt.events(sid, follow=False)]
    assert fresh == list(range(1, new_head + 1))
    await rt.close()
    assert not _store_open(rt)


async def test_a_follower_made_before_the_close_but_first_stepped_after_reads_as_a_new_call(
    store_url: str,
) -> None:
    """An `events()` generator is a call once it is first stepped, not when it is made: one made
    before the close and first stepped after it reads every event, opening the store again as
    any call does (README), and the next close closes it."""
    rt = so.Runtime([scripted_agent("a", [reply("hi")])], store=store_url)
    sid = (await rt.generate("a", "x")).session_id
    head = (await rt.state(sid)).seq
    stream = rt.events(sid, follow=False)
    await rt.close()
    assert not _store_open(rt)
    assert [e.seq async for e in stream] == list(range(1, head + 1))
    await rt.close()
    assert not _store_open(rt)
