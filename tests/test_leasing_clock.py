"""Leases on PostgreSQL are timed by the database's clock, as each process reckons it: a wall
clock stepped after the process measured its distance to the database's (NTP correcting it, a
virtual machine resumed) must not make it take over a lease another process still holds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import signoff as so

ORDER = {"order_id": "1042", "amount": 180.0}


def _agent(runs: list[str], release: asyncio.Event) -> so.Agent:
    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        await release.wait()
        return {"refunded": amount}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )
    steps = [call, so.ModelResponse(text="Done.")]
    return so.Agent(name="support", model=so.models.Scripted(steps), tools=[issue_refund])


async def test_a_wall_clock_stepped_after_opening_takes_no_live_lease_over(
    pg_store_url: str,
) -> None:
    """A process whose wall clock jumps an hour ahead once it is open still sees the lease
    another process holds (and renews) as live: it waits for it, and the call runs once."""
    runs: list[str] = []
    release = asyncio.Event()
    agent = _agent(runs, release)
    async with (
        so.Runtime([agent], store=pg_store_url, lease_ttl=1.0) as holder,
        so.Runtime([agent], store=pg_store_url, lease_ttl=1.0, lease_wait=0.3) as stepped,
    ):
        sid = await holder.create_session("support")
        drive = asyncio.create_task(holder.generate("support", "Refund", session_id=sid))
        while not runs:
            await asyncio.sleep(0.01)
        stepped.clock = lambda: time.time() + 3600  # its machine's clock stepped
        taking = asyncio.create_task(stepped.generate(session_id=sid))
        try:
            await asyncio.wait({taking}, timeout=5)
            assert runs == [f"{sid}:1:call_refund"]  # not run again by `stepped`
            assert taking.done() and taking.result().status == "running"  # busy elsewhere
        finally:
            release.set()
            done = await asyncio.wait_for(drive, 10)
            await asyncio.wait_for(taking, 10)
        assert done.status == "completed"
    assert runs == [f"{sid}:1:call_refund"]
