"""What the tests of steps and calls under way at `Runtime.close` share: closing a runtime while
a call runs (in a thread, or while its record waits for the session's lock), and the turn
resumed by another runtime on the same store."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

import signoff as so

__all__ = ["HeldLock", "closed_mid_call", "resumed_to_the_end"]


async def closed_mid_call(
    rt: so.Runtime,
    prompt: str,
    started: threading.Event,
    turn: list[asyncio.Task[so.GenerateResult]],
) -> str:
    """Start a turn of `rt`'s one agent (its task put in `turn`), close `rt` once the call has
    `started`, and check the turn ended with the close: the session's id."""
    [agent] = rt.agents
    turn.append(asyncio.create_task(rt.generate(agent, prompt)))
    while not started.is_set():
        await asyncio.sleep(0.01)
    sid = (await rt.sessions())[0].id
    await rt.close()
    assert turn[0].done()
    with pytest.raises(so.UsageError, match="closed while this call ran"):
        await turn[0]
    return sid


async def resumed_to_the_end(agent: so.Agent, store_url: str, session_id: str) -> None:
    """The session's turn, resumed by another runtime on the store, completes."""
    again = so.Runtime([agent], store=store_url, lease_ttl=600)
    try:
        r = await again.generate(session_id=session_id)
        assert r.status == "completed", r
    finally:
        await again.close()


class HeldLock:
    """Another task holding a session's lock in `rt`, as a commit under way does, until the
    runtime closes: what a record that waits for it meets at `close`."""

    def __init__(self, rt: so.Runtime) -> None:
        self.rt = rt
        self.held = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def hold(self, session_id: str) -> None:
        self._task = asyncio.create_task(self._hold(session_id))

    async def _hold(self, session_id: str) -> None:
        async with self.rt._lock_of(session_id):
            self.held.set()
            await self._closing.wait()
            await asyncio.sleep(0.05)

    async def close_while_waited(
        self, session_id: str, turn: asyncio.Task[so.GenerateResult]
    ) -> None:
        """Once something waits for the lock, close the runtime and let the lock go as the close
        is under way; then the turn ends (`closed while this call ran`, if it did)."""
        lock = self.rt._lock_of(session_id)
        while not (self.held.is_set() and lock._waiters):
            await asyncio.sleep(0.01)
        stopping = asyncio.create_task(self.rt.close())
        await asyncio.sleep(0.01)
        self._closing.set()
        await stopping
        with contextlib.suppress(so.UsageError):
            await turn
        assert self._task is not None
        await self._task
