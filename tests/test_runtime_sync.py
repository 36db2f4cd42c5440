"""The runtime's sync twins: the same API from plain code and from inside a running loop."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores.postgres import _connections
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

from .test_runtime import ALICE, refund_agent, tools, waiting_session

# -- sync twins -----------------------------------------------------------------------------------


def test_sync_twins_from_plain_code(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("issue_refund", order_id="1", amount=5),
                call("issue_refund", order_id="2", amount=6),
            ),
            reply("done"),
            call_tools(call("issue_refund", order_id="3", amount=7)),
            reply("second done"),
        ],
        tools=tools(log),
    )
    rt = sqlite_runtime(tmp_path, agent)
    try:
        r = rt.generate_sync("a", prompt="refund", auth=ALICE)
        assert r.status == "waiting"
        queue = rt.pending_sync()
        assert [p.id for p in queue] == [p.id for p in r.pending]
        assert rt.pending_sync(session_id="ses_nope") == []
        r = rt.respond_sync(
            r.session_id,
            [so.InputResponse(request_id=queue[0].id, option_id="approve")],
            principal=ALICE,
        )
        assert r.status == "waiting"
        r = rt.generate_sync(
            session_id=r.session_id,
            approvals=[
                so.Decision(id=queue[0].id, approved=True),
                so.Decision(id=queue[1].id, approved=False),
            ],
            auth=ALICE,
        )
        assert r.status == "completed"
        assert r.outcomes == [
            so.Outcome(request_id=queue[0].id, outcome="approved", applied=False),
            so.Outcome(request_id=queue[1].id, outcome="cancelled", applied=True),
        ]
        assert log.count() == 1
        r = rt.generate_sync(session_id=r.session_id, prompt="again", auth=ALICE)
        assert r.status == "waiting"
        cancelled = rt.cancel_sync(r.session_id)
        assert cancelled.status == "cancelled"
        assert rt.state_sync(r.session_id).status == "cancelled"
        events = rt.events_sync(r.session_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        with pytest.raises(so.UnknownSession):
            rt.generate_sync(session_id="ses_nope", prompt="x")
    finally:
        rt.close_sync()


async def test_approvals_as_plain_dicts(tmp_path: Path) -> None:
    """The helix JSON shape: [{id, approved, reason}] straight from a request body."""
    log = ExecutionLog()
    seen = Capture(reply("ok"))
    async with sqlite_runtime(tmp_path, refund_agent(log, seen)) as rt:
        r = await waiting_session(rt)
        body: list[dict[str, Any]] = [{"id": r.pending[0].id, "approved": False, "reason": "no"}]
        done = await rt.generate(session_id=r.session_id, approvals=body)
        assert done.status == "completed"
        assert done.outcomes == [
            so.Outcome(request_id=r.pending[0].id, outcome="cancelled", applied=True)
        ]
        assert tool_results(seen.last)[0].content["reason"] == "no"
        assert log.count() == 0


async def test_sync_twins_inside_a_running_loop(tmp_path: Path) -> None:
    """Notebooks run an event loop already: the sync twins must not need the caller's loop."""
    log = ExecutionLog()
    rt = sqlite_runtime(tmp_path, refund_agent(log))
    try:
        r = rt.generate_sync("a", prompt="refund order 1")
        assert r.status == "waiting"
        (req,) = rt.pending_sync()
        done = rt.respond_sync(
            r.session_id, [so.InputResponse(request_id=req.id, option_id="approve")]
        )
        assert done.status == "completed"
        assert log.count() == 1
    finally:
        rt.close_sync()


async def test_close_sync_in_a_loop_that_used_the_async_api_does_not_wait_on_that_loop(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`close_sync` blocks the caller's loop while the bridge closes the store, and the store
    closes another loop's pool and listener on that loop, waiting 2 s for each: so this one
    took 4 s, for nothing, since this loop could run neither close until it returned. Those
    closes are left to this loop, which runs them once `close_sync` returns."""
    # Each wait on another loop 20 s (not 2 s): one on this loop would fail the bound by far.
    monkeypatch.setattr(_connections, "CLOSE_THERE_WAIT", 20.0)
    rt = so.Runtime([scripted_agent("a", [reply("hi")], repeat_last=True)], store=pg_store_url)
    sid = (await rt.generate("a", "x")).session_id  # this loop's pool
    here = rt.store._pool  # type: ignore[attr-defined]

    async def follow() -> None:
        async for _ in rt.events(sid, after=2):
            pass

    follower = asyncio.create_task(follow())  # this loop's listener
    while not rt.store._listeners:  # type: ignore[attr-defined]
        await asyncio.sleep(0.01)
    follower.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await follower
    assert rt.generate_sync("a", prompt="y").status == "completed"  # the bridge's pool
    began = time.monotonic()
    rt.close_sync()
    assert time.monotonic() - began < 5
    closing = asyncio.all_tasks() - {asyncio.current_task()}
    assert closing  # left to this loop, which runs them now
    await asyncio.wait(closing, timeout=10)
    assert here.closed
    assert rt.store._pool is None and not rt.store._listeners  # type: ignore[attr-defined]


# -- with: the sync twin of async with ------------------------------------------------------------


def _bridge_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name == "signoff-sync"}


def _closes(rt: so.Runtime, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A list that grows by one each time `rt`'s store is closed."""
    closes: list[int] = []
    close = rt.store.close

    async def counted() -> None:
        closes.append(1)
        await close()

    monkeypatch.setattr(rt.store, "close", counted)
    return closes


def test_a_with_block_opens_and_closes_the_store_on_either_store(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`with Runtime(...)` is `async with` for plain code: the store is opened on entry as the
    first `*_sync` call would, and closed at the end with `close_sync` (its loop's thread
    stopped). A call after the block opens it again, as one after `async with` does."""
    log = ExecutionLog()
    before = _bridge_threads()
    rt = so.Runtime([refund_agent(log)], store=store_url)
    closes = _closes(rt, monkeypatch)
    with rt as entered:
        assert entered is rt and rt._opened and closes == []
        r = rt.generate_sync("a", prompt="refund order 1")
        (req,) = rt.pending_sync()
        approve = [so.InputResponse(request_id=req.id, option_id="approve")]
        assert rt.respond_sync(r.session_id, approve).status == "completed"
        assert log.count() == 1
    assert closes == [1] and not rt._opened
    assert _bridge_threads() - before == set()
    try:
        assert rt.state_sync(r.session_id).turn_status == "completed"  # opened again
        assert rt._opened
    finally:
        rt.close_sync()
    assert closes == [1, 1] and _bridge_threads() - before == set()


def test_an_exception_in_a_with_block_still_closes_the_store(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _bridge_threads()
    rt = so.Runtime([scripted_agent("a", [reply("hi")])], store=store_url)
    closes = _closes(rt, monkeypatch)
    with pytest.raises(RuntimeError, match="boom"), rt:  # raised on, not swallowed
        assert rt.generate_sync("a", prompt="x").status == "completed"
        raise RuntimeError("boom")
    assert closes == [1] and not rt._opened
    assert _bridge_threads() - before == set()


def test_a_with_block_whose_open_fails_leaves_no_thread(tmp_path: Path) -> None:
    """A store that cannot be opened (a file that is not SQLite): `with` raised the open's
    error and left its sync loop's thread running, `__exit__` never called to stop it (an
    `async with` closes what its failed open began)."""
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not a database" * 1000)
    before = _bridge_threads()
    rt = so.Runtime([scripted_agent("a", [reply("hi")])], store=f"sqlite:///{garbage}")
    with pytest.raises(so.StoreError, match="not a database"), rt:
        pytest.fail("the block ran")  # pragma: no cover
    assert _bridge_threads() - before == set() and not rt._opened


def test_a_with_block_whose_open_fails_midway_closes_the_store(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store opened (a PostgreSQL pool's connections) before the runtime's open failed:
    it is closed, and the sync loop's thread stopped, before the error is raised."""
    before = _bridge_threads()
    rt = so.Runtime([scripted_agent("a", [reply("hi")])], store=store_url)
    closes = _closes(rt, monkeypatch)
    store_open = rt.store.open

    async def fails() -> None:
        await store_open()
        raise so.StoreError("refused after opening")

    monkeypatch.setattr(rt.store, "open", fails)
    with pytest.raises(so.StoreError, match="refused after opening"), rt:
        pytest.fail("the block ran")  # pragma: no cover
    assert closes == [1] and not rt._opened
    assert _bridge_threads() - before == set()


async def test_a_with_block_inside_a_running_loop_and_from_a_tool(tmp_path: Path) -> None:
    """In a running loop (a notebook), `with` works as the `*_sync` twins do there; from code
    the sync API runs (a tool), it is refused as a nested `*_sync` call is, not left hanging."""
    refused: list[so.UsageError] = []
    runtime: list[so.Runtime] = []

    @so.tool
    async def reopen() -> str:
        """Open the runtime again."""
        try:
            with runtime[0]:
                return "opened"  # pragma: no cover
        except so.UsageError as exc:
            refused.append(exc)
            raise

    agent = scripted_agent("a", [call_tools(call("reopen")), reply("ok")], tools=[reopen])
    before = _bridge_threads()
    with sqlite_runtime(tmp_path, agent) as rt:
        runtime.append(rt)
        assert rt.generate_sync("a", prompt="x").status == "completed"
    assert not rt._opened and _bridge_threads() - before == set()
    (error,) = refused
    assert "await the async method instead" in str(error)
