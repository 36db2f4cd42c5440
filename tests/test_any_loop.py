"""`AnyLoopLock` and `AnyLoopEvent`: shared by tasks of two event loops in two threads (a
runtime's async calls and its `*_sync` twins), each waiter woken on its own loop at once."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Awaitable, Callable

from signoff._any_loop import AnyLoopEvent, AnyLoopLock, blocking, waited_by

BOUND = 30.0  # a waiter never woken waits this long (a hang)
PROMPT = 5.0


def _on_another_loop(job: Callable[[], Awaitable[None]]) -> threading.Thread:
    """Run `job` on a new loop in a new thread, as the runtime's sync bridge runs calls."""
    thread = threading.Thread(target=lambda: asyncio.run(job()), daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread


async def test_a_lock_released_on_one_loop_wakes_its_waiter_on_another() -> None:
    lock = AnyLoopLock()
    await lock.acquire()
    waiting, got = threading.Event(), threading.Event()

    async def other() -> None:
        waiting.set()
        await asyncio.wait_for(lock.acquire(), BOUND)
        got.set()
        lock.release()

    thread = _on_another_loop(other)
    assert await asyncio.to_thread(waiting.wait, BOUND)
    await asyncio.sleep(0.2)  # it waits on the lock by now
    assert not got.is_set()
    start = time.monotonic()
    lock.release()
    assert await asyncio.to_thread(got.wait, BOUND)
    assert time.monotonic() - start < PROMPT
    await asyncio.to_thread(thread.join, BOUND)
    async with lock:  # given back: free for this loop again
        assert lock.locked()
    assert not lock.locked()


async def test_a_waiter_cancelled_as_the_lock_is_handed_to_it_passes_it_on() -> None:
    lock = AnyLoopLock()
    await lock.acquire()
    second = asyncio.create_task(lock.acquire())
    third = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)
    lock.release()  # handed to `second`, which is cancelled before it runs
    second.cancel()
    assert await asyncio.wait_for(third, BOUND)
    assert second.cancelled() and lock.locked()
    lock.release()
    assert not lock.locked()


async def test_a_waiter_cancelled_before_the_release_is_skipped() -> None:
    lock = AnyLoopLock()
    await lock.acquire()
    second = asyncio.create_task(lock.acquire())
    third = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)
    second.cancel()
    await asyncio.sleep(0)
    lock.release()
    assert await asyncio.wait_for(third, BOUND)
    assert second.cancelled() and lock.locked()
    lock.release()
    assert not lock.locked()


async def test_a_waiter_whose_loop_is_blocked_lets_the_call_blocking_it_go_first() -> None:
    """A `*_sync` call made on a loop blocks it: handed the lock, a task of that loop queued
    before the call could not run until the call returned, and the call, queued behind it on
    the bridge's loop, waited for ever. The lock now passes it over, and it is next after."""
    lock = AnyLoopLock()
    bridge = asyncio.new_event_loop()
    thread = threading.Thread(target=bridge.run_forever, daemon=True)
    thread.start()
    try:
        await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(lock.acquire(), bridge))
        queued = asyncio.create_task(lock.acquire())  # a task of this loop waits first
        await asyncio.sleep(0)
        here = asyncio.get_running_loop()

        async def sync_call() -> None:  # as `SyncBridge.run` runs a call made from `here`
            with waited_by(here):
                bridge.call_soon(lock.release)  # the other thread's call ends: after queuing
                await lock.acquire()
                lock.release()

        with blocking():  # this loop's thread waits for the call, as in a `*_sync` call
            call = asyncio.run_coroutine_threadsafe(sync_call(), bridge)
            try:
                call.result(PROMPT)
                hung = False
            except concurrent.futures.TimeoutError:
                hung = True  # given to `queued`, which runs once this loop does, then ends
        assert await asyncio.wait_for(queued, BOUND)  # it keeps its place: next
        lock.release()
        await asyncio.wait_for(asyncio.wrap_future(call), BOUND)
        assert not hung, "the call waited behind a task of the loop it blocked"
        assert not lock.locked()
    finally:
        bridge.call_soon_threadsafe(bridge.stop)
        await asyncio.to_thread(thread.join, BOUND)
        bridge.close()


async def test_a_waiter_of_a_blocked_loop_is_handed_the_lock_when_none_else_waits() -> None:
    lock = AnyLoopLock()
    await lock.acquire()
    queued = asyncio.create_task(lock.acquire())
    await asyncio.sleep(0)
    with blocking():
        lock.release()  # to `queued`, which runs once this loop does
    assert await asyncio.wait_for(queued, BOUND)
    lock.release()
    assert not lock.locked()


async def test_an_event_set_from_another_thread_wakes_waiters_on_each_loop() -> None:
    event = AnyLoopEvent()
    waiting, woke = threading.Event(), threading.Event()

    async def other() -> None:
        waiting.set()
        await asyncio.wait_for(event.wait(), BOUND)
        woke.set()

    thread = _on_another_loop(other)
    assert await asyncio.to_thread(waiting.wait, BOUND)
    here = asyncio.create_task(event.wait())
    await asyncio.sleep(0.2)
    assert not (woke.is_set() or here.done() or event.is_set())
    start = time.monotonic()
    await asyncio.to_thread(event.set)  # neither loop's thread
    assert await asyncio.wait_for(here, BOUND)
    assert await asyncio.to_thread(woke.wait, BOUND)
    assert time.monotonic() - start < PROMPT
    await asyncio.to_thread(thread.join, BOUND)
    event.clear()
    assert not event.is_set()
    with_timeout = asyncio.create_task(asyncio.wait_for(event.wait(), 0.05))
    await asyncio.wait({with_timeout})
    assert isinstance(with_timeout.exception(), TimeoutError)
