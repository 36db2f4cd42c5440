"""The `*_sync` twins and their private loop: reentrant calls, Ctrl-C, garbage collection."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime

from .conftest import make_store


def _bridge_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "signoff-sync"}


def test_a_sync_call_from_inside_the_sync_api_fails_instead_of_hanging(tmp_path: Path) -> None:
    """A tool run by `generate_sync` that calls `pending_sync` would block the loop it needs."""
    seen: list[object] = []
    runtime: list[so.Runtime] = []

    @so.tool
    async def peek() -> int:
        """Count the open requests."""
        try:
            return len(runtime[0].pending_sync())
        except so.UsageError as exc:
            seen.append(exc)
            raise

    agent = scripted_agent("a", [call_tools(call("peek")), reply("ok")], tools=[peek])
    rt = sqlite_runtime(tmp_path, agent)
    runtime.append(rt)
    results: list[so.GenerateResult] = []
    caller = threading.Thread(target=lambda: results.append(rt.generate_sync("a", prompt="x")))
    caller.daemon = True
    caller.start()
    caller.join(10)
    try:
        assert not caller.is_alive(), "the nested *_sync call deadlocked the sync loop"
        assert [r.status for r in results] == ["completed"]
        assert len(seen) == 1 and "await" in str(seen[0])
    finally:
        if not caller.is_alive():
            rt.close_sync()


def test_ctrl_c_during_a_sync_call_cancels_it_and_the_runtime_stays_usable(
    tmp_path: Path,
) -> None:
    """The interrupted turn is not left running unseen on the private loop, holding its lease."""
    cancelled = threading.Event()

    async def hangs(conversation: list[so.Message]) -> so.ModelResponse:
        if cancelled.is_set():
            return reply("resumed")  # the interrupted turn, driven again
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, os.kill, os.getpid(), signal.SIGINT)  # the caller is waiting now
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return reply("never")  # pragma: no cover

    def interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    agent = scripted_agent("a", [hangs])
    rt = sqlite_runtime(tmp_path, agent)
    previous = signal.signal(signal.SIGINT, interrupt)
    try:
        sid = rt.create_session_sync("a")
        with pytest.raises(KeyboardInterrupt):
            rt.generate_sync(session_id=sid, prompt="x")
        assert cancelled.is_set()
        # The lease was released: the next call resumes the interrupted turn at once.
        assert rt.generate_sync(session_id=sid).status == "completed"
    finally:
        signal.signal(signal.SIGINT, previous)
        rt.close_sync()


def test_an_unclosed_runtime_that_is_collected_stops_its_sync_thread(tmp_path: Path) -> None:
    before = _bridge_threads()

    def use() -> None:
        rt = sqlite_runtime(tmp_path, scripted_agent("a", [reply("hi")]))
        assert rt.generate_sync("a", prompt="x").status == "completed"
        assert _bridge_threads() - before

    use()
    gc.collect()
    assert _bridge_threads() - before == set()


def test_an_unclosed_runtime_collected_after_sync_calls_ends_its_store_tasks_cleanly(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The bridge's loop held its tasks only weakly (as asyncio does): the PostgreSQL pool's
    workers, waiting on the pool's queue, became garbage with the runtime and were destroyed
    pending ("Task was destroyed but it is pending!"), their coroutines closed on a closed loop
    (an unraisable `RuntimeError`), instead of being cancelled as the loop stops."""
    before = _bridge_threads()

    def use() -> None:
        rt = so.Runtime([scripted_agent("a", [reply("hi")])], store=store_url)
        assert rt.generate_sync("a", prompt="x").status == "completed"

    use()
    gc.collect()
    assert _bridge_threads() - before == set()
    assert [r.getMessage() for r in caplog.records if r.levelname == "ERROR"] == []


def test_close_sync_stops_the_thread_and_a_later_call_starts_another(tmp_path: Path) -> None:
    before = _bridge_threads()
    rt = sqlite_runtime(tmp_path, scripted_agent("a", [reply("hi")], repeat_last=True))
    rt.generate_sync("a", prompt="x")
    rt.close_sync()
    rt.close_sync()
    assert _bridge_threads() - before == set()
    assert rt.generate_sync("a", prompt="y").status == "completed"
    rt.close_sync()
    assert _bridge_threads() - before == set()


def test_sync_calls_from_several_threads_at_once(tmp_path: Path) -> None:
    rt = sqlite_runtime(tmp_path, scripted_agent("a", [reply("hi")], repeat_last=True))
    statuses: list[str] = []

    def work() -> None:
        for _ in range(3):
            statuses.append(rt.generate_sync("a", prompt="x").status)

    threads = [threading.Thread(target=work) for _ in range(4)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert statuses == ["completed"] * 12
        assert len(rt.sessions_sync(limit=100)) == 12
    finally:
        rt.close_sync()


def _hanging_agent() -> tuple[so.Agent, threading.Event]:
    """Agent "a", whose model step never answers, and the event set once that step began."""
    started = threading.Event()

    async def hangs(conversation: list[so.Message]) -> so.ModelResponse:
        started.set()
        await asyncio.sleep(3600)
        return reply("never")  # pragma: no cover

    return scripted_agent("a", [hangs]), started


def _ends_closed(rt: so.Runtime, started: threading.Event, close: Callable[[], object]) -> None:
    """Run `generate_sync` on another thread and, once its model step hangs, `close`: that call
    must return, with a `UsageError` saying the runtime closed."""
    outcome: list[BaseException | so.GenerateResult] = []

    def call() -> None:
        try:
            outcome.append(rt.generate_sync("a", prompt="x"))
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    assert started.wait(10)
    close()
    caller.join(10)
    assert not caller.is_alive(), "the call never returned"
    (error,) = outcome
    assert isinstance(error, so.UsageError) and "closed" in str(error)


def test_close_sync_during_another_threads_call_ends_that_call(tmp_path: Path) -> None:
    """The call's task was left on a stopped loop: its caller waited for ever."""
    agent, started = _hanging_agent()
    rt = sqlite_runtime(tmp_path, agent)
    _ends_closed(rt, started, rt.close_sync)


@pytest.mark.parametrize("closing", ["close_sync", "close"])
def test_close_during_another_threads_call_leaves_the_store_closed_and_the_lease_free(
    store_url: str, closing: str
) -> None:
    """A `*_sync` call in flight is stopped before the store closes, not after: its drive gave
    its lease back through a store it opened again behind `close_sync` or `close` (SQLite's file
    left open, a PostgreSQL pool made on the stopping loop), and the session stayed unrunnable
    for the lease's TTL where it could not."""
    agent, started = _hanging_agent()
    rt = so.Runtime([agent], store=store_url, lease_ttl=600)
    if closing == "close_sync":
        _ends_closed(rt, started, rt.close_sync)
    else:
        _ends_closed(rt, started, lambda: asyncio.run(rt.close()))
    # nothing opened the store again behind close_sync
    assert getattr(rt.store, "_conn", None) is None and getattr(rt.store, "_pool", None) is None

    async def take() -> int | None:
        store = make_store(store_url)
        try:
            (row,) = await store.sessions()
            return await store.acquire_lease(row.id, "another-worker", 30.0, time.time())
        finally:
            await store.close()

    assert asyncio.run(take()) is not None  # given back: another process drives it now


def test_a_sync_call_racing_close_sync_in_another_thread_ends_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that took the bridge's loop just before another thread's `close_sync` stopped it
    was handed to that loop after: a closed loop raised `RuntimeError('Event loop is closed')`
    (its coroutine never awaited), and one stopped but not yet closed dropped it, its caller
    waiting for ever. It is handed over before the close can begin, so it runs or is stopped
    with a `UsageError` like any call the close finds running."""
    rt = sqlite_runtime(tmp_path, scripted_agent("a", [reply("hi")]))
    rt.sessions_sync()  # the bridge's loop is up
    submitting, closed = threading.Event(), threading.Event()
    handed = asyncio.run_coroutine_threadsafe

    def slowly(coro: Any, loop: asyncio.AbstractEventLoop) -> Any:
        if threading.current_thread().name == "caller":
            submitting.set()
            closed.wait(1)  # the close goes first, unless the call holds it off meanwhile
        return handed(coro, loop)

    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", slowly)
    outcome: list[object] = []

    def call() -> None:
        try:
            outcome.append(rt.sessions_sync())
        except BaseException as exc:
            outcome.append(exc)

    caller = threading.Thread(target=call, name="caller", daemon=True)
    caller.start()
    assert submitting.wait(10)
    rt.close_sync()
    closed.set()
    caller.join(10)
    assert not caller.is_alive(), "the call never returned"
    (result,) = outcome
    assert result == [] or (isinstance(result, so.UsageError) and "closed" in str(result)), result
    rt.close_sync()


async def test_a_sync_call_needing_a_lock_a_task_of_its_blocked_loop_holds_fails_at_once(
    store_url: str,
) -> None:
    """A `*_sync` call made on a loop blocks it; one that needed the session's lock while a
    task of that loop held it (a commit under way, on PostgreSQL) waited for ever, that task
    never running again to let it go. A read goes around the lock; a write is refused with a
    `UsageError` saying to await the async method, with nothing recorded."""
    rt = so.Runtime([scripted_agent("a", [reply("hi")], repeat_last=True)], store=store_url)
    sid = await rt.create_session("a")
    await rt.state(sid)  # cached: a write by another runtime leaves a tail to fold
    elsewhere = so.Runtime([scripted_agent("a", [reply("hi")])], store=store_url)
    assert (await elsewhere.generate(session_id=sid, prompt="x")).status == "completed"
    await elsewhere.close()
    lock, held = rt._lock_of(sid), asyncio.Event()

    async def hold() -> None:
        async with lock:
            held.set()
            await asyncio.sleep(0.2)

    holder = asyncio.create_task(hold())
    await held.wait()
    done = threading.Event()

    def rescue() -> None:  # were it to hang, close it from another thread: the call then fails
        if not done.is_set():
            rt.close_sync()

    watchdog = threading.Timer(10, rescue)
    watchdog.start()
    try:
        head = rt.state_sync(sid).seq  # read whole, as without a cache
        with pytest.raises(so.UsageError, match="await the async method"):
            rt.generate_sync(session_id=sid, prompt="y")
    finally:
        done.set()
        watchdog.cancel()
    await holder
    assert (await rt.state(sid)).seq == head  # nothing recorded
    assert (await rt.generate(session_id=sid, prompt="z")).status == "completed"
    await rt.close()


async def test_a_sync_call_queued_behind_a_task_of_its_blocked_loop_goes_first(
    tmp_path: Path,
) -> None:
    """Another thread's `cancel_sync` holds the session's lock (in its commit); a task of this
    loop queues on it (`rt.cancel`), then this loop calls `cancel_sync`. Handed the lock, the
    task could not run until that call returned, and the call waited behind it: the loop froze.
    The call now goes first; the task runs once the loop does."""

    @so.tool(approval=so.always())
    async def refund(order: str) -> str:
        """Refund an order."""
        return "ok"  # pragma: no cover

    agent = scripted_agent("a", [call_tools(call("refund", order="1"))], tools=[refund])
    rt = sqlite_runtime(tmp_path, agent)
    r = await rt.generate("a", prompt="refund order 1")
    assert r.status == "waiting"
    sid = r.session_id
    lock, holding = rt._lock_of(sid), threading.Event()
    commit = rt.store.commit

    async def slow_commit(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread().name == "signoff-sync" and not holding.is_set():
            holding.set()  # the other thread's call, holding the lock, waits for both behind
            deadline = time.monotonic() + 10
            while len(lock._waiters) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        return await commit(*args, **kwargs)

    rt.store.commit = slow_commit  # type: ignore[method-assign]
    statuses: list[str] = []
    other = threading.Thread(target=lambda: statuses.append(rt.cancel_sync(sid, "T").status))
    other.start()
    done = threading.Event()

    def rescue() -> None:  # were it to hang, close it from another thread: the call then fails
        if not done.is_set():
            rt.close_sync()

    watchdog = threading.Timer(10, rescue)
    try:
        assert await asyncio.to_thread(holding.wait, 10)
        task = asyncio.create_task(rt.cancel(sid, "A"))
        while not lock._waiters:
            await asyncio.sleep(0.01)
        watchdog.start()
        began = time.monotonic()
        assert rt.cancel_sync(sid, "S").status == "cancelled"
        assert time.monotonic() - began < 10
    finally:
        done.set()
        watchdog.cancel()
        await asyncio.to_thread(other.join, 30)
    assert (await task).status == "cancelled" and statuses == ["cancelled"]
    await rt.close()


async def test_a_sync_call_queued_behind_a_task_of_its_blocked_loop_keeps_going_first(
    tmp_path: Path,
) -> None:
    """As above, with a call that takes the lock twice (`respond_sync`: its answer's commit,
    then the drive): at its first release the lock went to the loop's queued task, the only
    waiter, and its second acquire was refused as a deadlock, the answer recorded. Left free
    while every waiter's loop is blocked, the lock goes on to the task once the loop runs."""

    @so.tool(approval=so.always())
    async def refund(order: str) -> str:
        """Refund an order."""
        return "refunded"

    steps = [call_tools(call("refund", order="1")), reply("done")]
    rt = sqlite_runtime(tmp_path, scripted_agent("a", steps, tools=[refund]))
    r = await rt.generate("a", prompt="refund order 1")
    [req] = r.pending
    sid, lock = r.session_id, rt._lock_of(r.session_id)
    other = asyncio.new_event_loop()  # another thread's call, holding the session's lock
    thread = threading.Thread(target=other.run_forever, daemon=True)
    thread.start()
    try:
        asyncio.run_coroutine_threadsafe(lock.acquire(), other).result(10)
        task = asyncio.create_task(rt.cancel(sid, "from the loop"))
        while not lock._waiters:
            await asyncio.sleep(0.01)

        def release_once_both_wait() -> None:
            deadline = time.monotonic() + 10
            while len(lock._waiters) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            other.call_soon_threadsafe(lock.release)

        releaser = threading.Thread(target=release_once_both_wait)
        releaser.start()
        approve = so.InputResponse(request_id=req.id, option_id="approve")
        done = rt.respond_sync(sid, [approve])
        releaser.join(10)
        assert (done.status, done.text) == ("completed", "done")
        assert (await asyncio.wait_for(task, 10)).cancelled is False
        assert not lock.locked() and not lock._waiters
    finally:
        other.call_soon_threadsafe(other.stop)
        thread.join(10)
        other.close()
        await rt.close()
