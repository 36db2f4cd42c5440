"""The leasing tests' refund agent, slow tool, lease take-over and renewal counting, and waits
for a worker to finish a turn (shared by the tests/test_leasing*.py files).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import signoff as so
from signoff.stores import Store

__all__ = [
    "ORDER",
    "SlowRefund",
    "counting_renewals",
    "event_types",
    "finished_by_a_worker",
    "once_each",
    "refund_agent",
    "take_over",
    "until",
    "working",
]


ORDER = {"order_id": "1042", "amount": 180.0}


def refund_agent(tool: so.Tool) -> so.Agent:
    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )
    steps = [call, so.ModelResponse(text="Done.")]
    return so.Agent(name="support", model=so.models.Scripted(steps), tools=[tool])


class SlowRefund:
    """A tool whose first run awaits a long sleep (noting how many of `renewals` were made when
    it is cancelled) and whose later runs return at once; every run logs its idempotency key."""

    def __init__(self) -> None:
        self.renewals: list[int] = []
        self.runs: list[str] = []
        self.cancelled = asyncio.Event()
        self.renewals_at_cancel: int | None = None
        runs, cancelled = self.runs, self.cancelled

        @so.tool(approval=so.never())
        async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
            """Refund an order."""
            runs.append(ctx.idempotency_key())
            if len(runs) == 1:
                try:
                    await asyncio.sleep(600)
                except asyncio.CancelledError:
                    self.renewals_at_cancel = len(self.renewals)
                    cancelled.set()
                    raise
            return {"refunded": amount}

        self.tool = issue_refund


def counting_renewals(store: Store, failing: Callable[[], bool] = lambda: False) -> list[int]:
    """Count `store`'s lease renewals (one entry each, as it starts); each fails (the store
    unreachable) while `failing()` says so."""
    renew = store.renew_lease
    made: list[int] = []

    async def counted(*args: Any) -> bool:
        made.append(1)
        if failing():
            raise so.StoreError("renewing the lease: connection lost (test)")
        return await renew(*args)

    store.renew_lease = counted  # type: ignore[method-assign,assignment]
    return made


async def take_over(store: Store, session_id: str) -> None:
    """Another process takes the session's lease over, as it may once the lease lapsed, then
    gives it back for a worker to claim."""
    server_time = getattr(store, "server_time", None)
    now = time.time() if server_time is None else await server_time()
    token = await store.acquire_lease(session_id, "elsewhere", 1.0, now + 3600)
    assert token is not None
    await store.release_lease(session_id, "elsewhere", token)


async def until(check: Callable[[], Awaitable[bool]] | Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while True:
        got = check()
        if not isinstance(got, bool):
            got = await got
        if got:
            return
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)


async def event_types(rt: so.Runtime, session_id: str) -> list[str]:
    return [e.type async for e in rt.events(session_id, follow=False)]


@contextlib.asynccontextmanager
async def working(rt: so.Runtime) -> AsyncIterator[None]:
    stop = asyncio.Event()
    task = asyncio.create_task(rt.work(stop=stop, idle_wait=0.05))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def finished_by_a_worker(
    store_url: str, tool: so.Tool | so.Agent, session_id: str
) -> list[str]:
    """Let a worker (of `tool`'s refund agent, or of the agent given) take the turn over and
    finish it; the session's event types after."""
    agent = tool if isinstance(tool, so.Agent) else refund_agent(tool)
    async with so.Runtime([agent], store=store_url, inline=False) as worker:
        async with working(worker):

            async def completed() -> bool:
                turn = (await worker.state(session_id)).turn
                return turn is not None and turn.status == "completed"

            await until(completed)
        return await event_types(worker, session_id)


def once_each(types: list[str]) -> bool:
    return all(types.count(t) == 1 for t in ("tool.started", "tool.completed", "turn.completed"))
