"""Stopping a running tool body from another thread: a `*_sync` cancel or steering message,
made while the runtime's async calls run on another loop, wakes a body waiting on
`ctx.abort_signal` at once, on the loop that waits."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent


@pytest.mark.parametrize("how", ["cancel_sync", "send_sync"])
async def test_a_sync_call_from_another_thread_wakes_the_body_waiting_on_its_abort_signal(
    tmp_path: Path, how: str
) -> None:
    """The event was set from the bridge's thread, which does not wake this loop: the body
    slept on until its own timeout (or the next lease renewal), seconds later."""
    entered = asyncio.Event()
    waited: list[tuple[bool, float]] = []

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is cancelled or steered."""
        entered.set()
        start = time.monotonic()
        try:
            await asyncio.wait_for(ctx.abort_signal.wait(), timeout=8)
        except TimeoutError:
            pass
        waited.append((ctx.abort_signal.is_set(), time.monotonic() - start))
        return "stopped early"

    agent = scripted_agent("bot", [call_tools(call("crawl")), reply("Stopped.")], tools=[crawl])
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        sid = await rt.create_session("bot")
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl"))
        await asyncio.wait_for(entered.wait(), timeout=10)
        results: list[so.GenerateResult] = []
        if how == "cancel_sync":
            other = threading.Thread(target=lambda: results.append(rt.cancel_sync(sid)))
        else:
            other = threading.Thread(target=lambda: results.append(rt.send_sync(sid, "stop")))
        other.start()
        r = await asyncio.wait_for(drive, timeout=20)
        await asyncio.to_thread(other.join, 10)
        [(aborted, seconds)] = waited
        assert aborted and seconds < 4, waited  # not the body's own 8 s
        assert r.status == ("cancelled" if how == "cancel_sync" else "completed")
        assert len(results) == 1


async def test_a_failed_turn_cancelled_after_is_not_retryable(store_url: str) -> None:
    """A turn that failed retryably and was then cancelled kept reporting `retryable: true` (its
    result, the HTTP session view): a client retrying on it got nothing, as no retry resumes a
    cancelled turn."""
    from signoff.server._models import session_view, turn_result
    from signoff.testing import Flaky

    agent = scripted_agent("bot", [Flaky(reply("hi"), failures=5)])
    async with so.Runtime([agent], store=store_url) as rt:
        failed = await rt.generate("bot", prompt="hello")
        assert (failed.status, failed.retryable) == ("failed", True)
        cancelled = await rt.cancel(failed.session_id, "never mind")
        assert (cancelled.status, cancelled.cancelled, cancelled.retryable) == (
            "cancelled",
            True,
            False,
        )
        assert turn_result(cancelled).retryable is False
        view = session_view(await rt.state(failed.session_id))
        assert view.turn is not None and (view.turn.status, view.turn.retryable) == (
            "cancelled",
            False,
        )
        retried = await rt.generate(session_id=failed.session_id)
        assert (retried.status, retried.retryable) == ("cancelled", False)
