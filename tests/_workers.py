"""The worker tests' refund agent and waits: a background `Runtime.work()`, and polling until a
session reaches a status (shared by the worker, leasing and candidate-recovery tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import signoff as so

__all__ = ["ORDER", "is_", "refund_agent", "until", "working"]


ORDER = {"order_id": "1042", "amount": 180.0}


def refund_agent(
    runs: list[str],
    *,
    approval: Any = None,
    delay: float = 0.0,
    hold: asyncio.Event | None = None,
    first: Callable[[list[so.Message]], Awaitable[so.ModelResponse]] | None = None,
    ttl: float | None = None,
    repeat_last: bool = False,
) -> so.Agent:
    """One refund call that needs approval (by default), then a text (every later turn's too,
    with `repeat_last`); the tool logs its key, then takes `delay` seconds, or waits until
    `hold` is set."""

    @so.tool(approval=approval or so.always())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        await asyncio.sleep(delay)
        if hold is not None:
            await hold.wait()
        return {"refunded": amount}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )
    steps: list[Any] = [first or call, so.ModelResponse(text="Done.")]
    return so.Agent(
        name="support",
        model=so.models.Scripted(steps, repeat_last=repeat_last),
        tools=[issue_refund],
        limits=so.Limits(ttl=ttl),
    )


@contextlib.asynccontextmanager
async def working(rt: so.Runtime, **kw: Any) -> AsyncIterator[asyncio.Event]:
    """Run `rt.work()` in the background; stop it gracefully (and check it returned) at exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(rt.work(stop=stop, idle_wait=0.05, **kw))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def is_(rt: so.Runtime, session_id: str, wanted: str) -> bool:
    """Whether the session's turn has status `wanted`."""
    turn = (await rt.state(session_id)).turn
    return turn is not None and turn.status == wanted
