"""Leases on PostgreSQL are timed by the database's clock, as each process reckons it: a wall
clock stepped after the process measured its distance to the database's (NTP correcting it, a
virtual machine resumed) must not make it take over a lease another process still holds."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import signoff as so
from signoff import _leasing as leasing

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


async def test_a_machine_resumed_from_suspend_times_its_leases_by_the_time_that_passed(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suspend (a laptop's lid closed, a guest suspended) stops `time.monotonic()` on Linux and
    macOS while the database's clock, and every other machine's, goes on. Were leases reckoned
    from it, the resumed process would time them an hour behind: the lease it renews would be
    lapsed for every other process, which would take it over and run the call again. Here the
    monotonic clock of one process lagging by an hour after it opened stands in for the suspend:
    the lease it holds is still seen live by the other, and the call runs once."""
    runs: list[str] = []
    release = asyncio.Event()
    agent = _agent(runs, release)
    other = so.Runtime([agent], store=pg_store_url, lease_ttl=0.6, lease_wait=0.3)
    await other.open()  # its clocks did not stop
    real = time.monotonic
    lag = [0.0]
    monkeypatch.setattr(leasing, "_MONOTONIC", lambda: real() - lag[0], raising=False)
    async with so.Runtime([agent], store=pg_store_url, lease_ttl=0.6) as resumed, other:
        sid = await resumed.create_session("support")
        drive = asyncio.create_task(resumed.generate("support", "Refund", session_id=sid))
        while not runs:
            await asyncio.sleep(0.01)
        lag[0] = 3600.0  # resumed: its monotonic clock missed the hour it slept
        await asyncio.sleep(1.0)  # renewals, and more than a TTL
        taking = asyncio.create_task(other.generate(session_id=sid))
        try:
            await asyncio.wait({taking}, timeout=5)
            assert runs == [f"{sid}:1:call_refund"]  # not run again by `other`
            assert taking.done() and taking.result().status == "running"  # busy elsewhere
        finally:
            release.set()
            done = await asyncio.wait_for(drive, 10)
            await asyncio.wait_for(taking, 10)
        assert done.status == "completed"
    assert runs == [f"{sid}:1:call_refund"]
