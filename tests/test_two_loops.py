"""One runtime used from two event loops at once: an app's async calls on its loop while another
thread calls the `*_sync` twins, which run on the runtime's bridge loop (`_sync`). What the two
share per session (the lock that serializes this process's appends, the abort signal tool bodies
wait on) works from either loop: a waiter on one loop is woken when the other lets go.

Each test bounds its waits generously and asserts that the call returned long before the bound:
a waiter never woken hung until the bound (or for ever)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

import signoff as so
from signoff.stores import Commit, Store
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent

from ._steer import ALICE, BOB, refund_agent
from .conftest import make_store

BOUND = 30.0  # how long a call may take before the test gives up on it (a hang)
PROMPT = 10.0  # far below the bound, far above what the calls take on a loaded machine


def _slow_first_commit(store: Store, holding: threading.Event) -> None:
    """Make the first commit the main thread's loop makes wait a second before it commits, with
    the session's lock held (`Driver.record`), setting `holding` meanwhile."""
    commit = store.commit
    armed = [True]

    async def slow(c: Commit) -> None:
        if armed[0] and threading.current_thread() is threading.main_thread():
            armed[0] = False
            holding.set()
            await asyncio.sleep(1.0)
        return await commit(c)

    store.commit = slow  # type: ignore[method-assign,assignment]


@pytest.mark.parametrize("how", ["send_sync", "cancel_sync"])
async def test_a_sync_call_waiting_for_an_append_on_the_other_loop_goes_on_when_it_ends(
    store_url: str, how: str
) -> None:
    """The session's lock was an `asyncio.Lock`: the sync call, waiting on it on the bridge's
    loop, was never woken by the release on the app's loop (or, had that loop waited on it
    first, was refused: 'bound to a different event loop')."""
    store = make_store(store_url)
    holding = threading.Event()
    agent = refund_agent(ExecutionLog(), reply("Noted."), reply("Noted again."))
    async with so.Runtime([agent], store=store) as rt:
        r = await rt.generate("support", prompt="refund order 1042", auth=ALICE)
        assert r.status == "waiting"
        sid = r.session_id
        _slow_first_commit(store, holding)
        queued = asyncio.create_task(rt.send(sid, "note", principal=BOB))
        assert await asyncio.to_thread(holding.wait, BOUND)
        results: list[so.GenerateResult] = []
        errors: list[BaseException] = []

        def other() -> None:
            try:
                if how == "send_sync":
                    results.append(rt.send_sync(sid, "also", principal=BOB))
                else:
                    results.append(rt.cancel_sync(sid))
            except BaseException as exc:
                errors.append(exc)

        start = time.monotonic()
        thread = threading.Thread(target=other, daemon=True)
        thread.start()
        first = await asyncio.wait_for(queued, BOUND)
        await asyncio.to_thread(thread.join, BOUND)
        took = time.monotonic() - start
        assert not thread.is_alive(), "the sync call hung"
        assert errors == [] and len(results) == 1
        assert took < PROMPT, took
        assert first.queued
        state = await rt.state(sid)
        if how == "send_sync":
            assert results[0].queued
            assert [m["message"] for m in state.queued] == ["note", "also"]
        else:
            assert results[0].status == "cancelled"


async def test_the_abort_signal_a_body_waited_on_the_bridge_loop_works_on_the_app_loop(
    store_url: str,
) -> None:
    """The session's abort signal was an `asyncio.Event`, bound to the loop that first waited on
    it while it lived: a body of the next turn, driven on the app's loop, that waited on it was
    refused ('bound to a different event loop'), its call failed."""
    kept: list[asyncio.Event] = []  # a tool keeping its context, as a user's may

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A task that stops early when the turn is cancelled or steered."""
        kept.append(ctx.abort_signal)
        try:
            await asyncio.wait_for(ctx.abort_signal.wait(), timeout=0.05)
        except TimeoutError:
            pass
        return "crawled"

    turn = [call_tools(call("crawl")), reply("Done.")]
    agent = scripted_agent("bot", [*turn, *turn], tools=[crawl])
    async with so.Runtime([agent], store=store_url) as rt:
        sid = await rt.create_session("bot")
        first = await asyncio.wait_for(
            asyncio.to_thread(rt.generate_sync, session_id=sid, prompt="crawl"), BOUND
        )
        second = await asyncio.wait_for(rt.generate(session_id=sid, prompt="again"), BOUND)
        assert (first.status, second.status) == ("completed", "completed")
        results = [
            e.data.get("result")
            async for e in rt.events(sid, follow=False)
            if e.type == "tool.completed"
        ]
        assert results == ["crawled", "crawled"]
        assert len(kept) == 2


async def test_a_respond_and_a_cancel_sync_of_one_session_at_once_both_return(
    store_url: str,
) -> None:
    """`await rt.respond(...)` on the app's loop while another thread cancels the same turn:
    the cancel waited, on the bridge's loop, for the lock the answer's commit held, and hung."""
    store = make_store(store_url)
    holding = threading.Event()
    log = ExecutionLog()
    async with so.Runtime([refund_agent(log, reply("Refunded."))], store=store) as rt:
        r = await rt.generate("support", prompt="refund order 1042", auth=ALICE)
        (req,) = r.pending
        _slow_first_commit(store, holding)
        approve = [so.InputResponse(request_id=req.id, option_id="approve")]
        answering = asyncio.create_task(rt.respond(r.session_id, approve, principal=ALICE))
        assert await asyncio.to_thread(holding.wait, BOUND)
        results: list[so.GenerateResult] = []
        start = time.monotonic()
        thread = threading.Thread(
            target=lambda: results.append(rt.cancel_sync(r.session_id)), daemon=True
        )
        thread.start()
        answered = await asyncio.wait_for(answering, BOUND)
        await asyncio.to_thread(thread.join, BOUND)
        took = time.monotonic() - start
        assert not thread.is_alive(), "the cancel hung"
        assert took < PROMPT, took
        # The answer was recorded first (the cancel waited for its commit); the drive it started
        # either finished the turn before the cancel, or was stopped by it.
        [(outcome,)] = [[o.outcome for o in answered.outcomes]]
        assert outcome == "approved"
        assert {answered.status, results[0].status} <= {"completed", "cancelled"}
        assert (await rt.state(r.session_id)).turn_status == results[0].status
        assert log.count() <= 1
