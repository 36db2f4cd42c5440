"""`Runtime.work()` on a runtime that drives its own calls' turns (`inline=True`, the default):
its deadline sweep only makes the sessions whose deadlines passed runnable, and its claims drive
them, so they run `concurrency` at once and a `stop` is heeded between them."""

from __future__ import annotations

import asyncio
from typing import Any

import signoff as so

from ._workers import until


def slow_after_deadline(
    inside: list[str], release: asyncio.Event, expires_in: float = 0.3
) -> so.Agent:
    """A call whose approval times out; the model call after it waits for `release`."""

    @so.tool(approval=so.always(expires_in=expires_in))
    async def pay(invoice: str) -> dict[str, Any]:
        """Pay an invoice."""
        return {"paid": invoice}

    async def told(request: Any) -> so.ModelResponse:
        inside.append("in")
        await release.wait()
        return so.ModelResponse(text="Nobody approved it in time.")

    ask = so.ModelResponse(tool_calls=[so.ToolCall(id="c1", name="pay", input={"invoice": "I"})])
    return so.Agent(name="pay", model=so.models.Scripted([ask, told]), tools=[pay])


async def _waiting(rt: so.Runtime, n: int) -> list[str]:
    ids = []
    for _ in range(n):
        r = await rt.generate("pay", prompt="pay I")
        assert r.status == "waiting"
        ids.append(r.session_id)
    return ids


async def test_a_sweep_leaves_the_turns_it_makes_runnable_to_claims(store_url: str) -> None:
    """An inline runtime's worker drove each session whose deadline passed inside its sweep, one
    after another: three took three model calls in a row with `concurrency=3`, and no claim was
    made meanwhile."""
    inside: list[str] = []
    release = asyncio.Event()
    async with so.Runtime([slow_after_deadline(inside, release)], store=store_url) as rt:
        ids = await _waiting(rt, 3)
        await asyncio.sleep(0.4)  # their deadlines pass
        stop = asyncio.Event()
        task = asyncio.create_task(rt.work(concurrency=3, stop=stop, idle_wait=0.05))
        try:
            await until(lambda: _at_least(inside, 3), timeout=5)
        finally:
            release.set()
            stop.set()
            await asyncio.wait_for(task, 10)
        for sid in ids:
            turn = (await rt.state(sid)).turn
            assert turn is not None and turn.status == "completed"


async def test_a_stop_during_a_sweep_is_heeded_between_its_sessions(store_url: str) -> None:
    """Stopped while its sweep drove the first of several sessions whose deadline passed, an
    inline runtime's worker drove all the others too before it returned."""
    inside: list[str] = []
    release = asyncio.Event()
    async with so.Runtime([slow_after_deadline(inside, release)], store=store_url) as rt:
        ids = await _waiting(rt, 3)
        await asyncio.sleep(0.4)
        stop = asyncio.Event()
        task = asyncio.create_task(rt.work(concurrency=1, stop=stop, idle_wait=0.05))
        try:
            await until(lambda: _at_least(inside, 1), timeout=5)
            stop.set()
            release.set()
            await asyncio.wait_for(task, 10)
        finally:
            release.set()
            stop.set()
            await asyncio.wait_for(task, 10)
        assert len(inside) == 1
        statuses = {r.id: r.status for r in await rt.store.sessions(limit=10)}
        # the others' deadlines recorded, their turns left runnable: to the next claim
        assert sorted(statuses[sid] for sid in ids) == ["idle", "running", "running"]


async def _at_least(seen: list[str], n: int) -> bool:
    return len(seen) >= n
