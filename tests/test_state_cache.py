"""`Runtime.state()` while a turn is being driven in the same process: reading the state must
not fold events into the cached state that the driver is about to apply itself."""

from __future__ import annotations

import asyncio
from pathlib import Path

import signoff as so
from signoff.stores import Commit, SQLiteStore
from signoff.testing import call, call_tools, reply, scripted_agent


class SlowAfterCommit(SQLiteStore):
    """Yields to other tasks after each commit is written, before the committer resumes."""

    async def commit(self, commit: Commit) -> None:
        await super().commit(commit)
        await asyncio.sleep(0.005)


async def test_reading_the_state_during_a_drive_does_not_break_it(tmp_path: Path) -> None:
    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        await asyncio.sleep(0.005)
        return "shipped"

    steps = [call_tools(call("lookup", order_id=str(i))) for i in range(5)]
    agent = scripted_agent("support", [*steps, reply("done")], tools=[lookup])
    rt = so.Runtime([agent], store=SlowAfterCommit(f"sqlite:///{tmp_path / 'state.db'}"))
    session_id = await rt.create_session("support")
    await rt.state(session_id)  # cached: the reader below folds tails into it
    stop = asyncio.Event()

    async def reader() -> int:
        reads = 0
        while not stop.is_set():
            await rt.state(session_id)
            reads += 1
            await asyncio.sleep(0)
        return reads

    reading = asyncio.create_task(reader())
    try:
        r = await rt.generate(session_id=session_id, prompt="where are my orders?")
    finally:
        stop.set()
        reads = await reading
    assert r.status == "completed" and r.text == "done" and reads > 10
    state = await rt.state(session_id)
    assert state.seq == await rt.store.head(session_id)
    assert state.status == "idle"
    await rt.close()
