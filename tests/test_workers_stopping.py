"""A worker told to stop (`signoff worker` on SIGTERM, `Runtime.work(stop=...)`) finishes the
turns in flight, but starts none after them: a message queued behind one is left, its lease
given back, to a worker that goes on."""

from __future__ import annotations

import asyncio
from typing import Any

import signoff as so

from ._workers import until, working


def chat_agent(inside: list[str], release: asyncio.Event) -> so.Agent:
    """Its first model call waits for `release`; the next answers at once."""

    async def first(request: Any) -> so.ModelResponse:
        inside.append("first")
        await release.wait()
        return so.ModelResponse(text="One.")

    async def then(request: Any) -> so.ModelResponse:
        inside.append("then")
        return so.ModelResponse(text="Two.")

    return so.Agent(name="chat", model=so.models.Scripted([first, then]))


async def test_a_stopping_worker_starts_no_queued_turn_and_leaves_it_to_others(
    store_url: str,
) -> None:
    """Stopped while it ran a turn with a message queued behind it, a worker went on to run the
    queued message's turn too (and the next, as long as messages kept coming) before it exited,
    when it could have given the session back to a worker that stays."""
    inside: list[str] = []
    release = asyncio.Event()
    agent = chat_agent(inside, release)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False) as stopping,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=600) as other,
    ):
        r = await front.generate("chat", prompt="Hello")
        stop = asyncio.Event()
        task = asyncio.create_task(stopping.work(concurrency=1, stop=stop, idle_wait=0.05))
        try:
            await until(lambda: _has(inside, "first"))
            queued = await front.send(r.session_id, "And then?", turn_policy="queue")
            assert queued.queued
            stop.set()
            release.set()
            await asyncio.wait_for(task, 10)
        finally:
            stop.set()
            release.set()
            await asyncio.wait_for(task, 10)
        assert inside == ["first"]  # the turn in flight finished; the queued one not started
        state = await front.state(r.session_id)
        assert state.status == "running" and state.queued
        # Its lease given back: a worker that goes on runs it at once, not after a lease TTL.
        async with working(other):
            await until(lambda: _has(inside, "then"), timeout=5)
            await until(lambda: _idle(front, r.session_id), timeout=5)
        assert inside == ["first", "then"]


async def _has(seen: list[str], what: str) -> bool:
    return what in seen


async def _idle(rt: so.Runtime, session_id: str) -> bool:
    return (await rt.state(session_id)).status == "idle"
