"""A worker that stalls past the lease of a session it is driving (a loaded machine): its own
next claim must not take that session again and start a second drive of it in the same process,
which ran the tool a second time while the first body was still running.

The stall is the clocks leases go by moved past the lease at once (the runtime's, and the one
that never steps, `_AWAKE`), with no await between: nothing else runs meanwhile, as in a process
that stalled. Stalling the process for real (`time.sleep`) raced the grace a renewal found past
its deadline is given (a tenth of the TTL, real time): on a loaded machine the renewal (on
PostgreSQL, the lease pool's first connection) came too late, the drive rightly gave its lease
up, and the next claim ran the call again (at-least-once), which read as the bug."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

import signoff as so
from signoff import _leasing
from signoff.testing import ManualClock

from ._workers import ORDER, is_, until, working

TTL = 60.0  # no renewal of the drive's comes on its own during the test (the first: TTL / 3)
STALL = TTL * 1.3


async def test_a_worker_stalled_past_its_lease_does_not_claim_the_session_it_drives(
    store_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process stalls in a tool body past the lease; once it runs again, its claim loop
    asks for sessions before the drive's renewal (the one before the body's step) gets
    through. The lapsed lease is its own drive's: the claim leaves it, the renewal keeps it (no
    other process took it), and the call runs once, its result recorded by the drive that ran
    it. Were the session not left, the claim would take the lease over (lease 2), the drive's
    renewal be refused, and a second drive run the call again."""
    clock = ManualClock(time.time())
    awake = [0.0]
    monkeypatch.setattr(_leasing, "_AWAKE", lambda: awake[0])
    runs: list[str] = []
    refunds: list[float] = []
    after: list[str] = []  # what happened after the stall, in order
    stalled = asyncio.Event()
    claimed_after = asyncio.Event()  # a claim asked for after the stall has answered

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        clock.advance(STALL)  # the whole process stalls past its lease: nothing runs
        awake[0] += STALL
        stalled.set()

        async def refund() -> float:  # run once the drive's lease is confirmed (renewed)
            refunds.append(amount)
            return amount

        return {"refunded": await ctx.step("refund", refund)}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([call, so.ModelResponse(text="Done.")]),
        tools=[issue_refund],
    )
    async with so.Runtime([agent], store=store_url, inline=False, lease_ttl=TTL, clock=clock) as rt:
        claim, renew = rt.store.claim, rt.store.renew_lease

        async def claiming(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            asked_after = stalled.is_set()
            try:
                return await claim(*args, **kwargs)
            finally:
                if asked_after and not claimed_after.is_set():
                    after.append("claimed")
                    claimed_after.set()

        async def late_renewal(*args: Any) -> bool:
            if stalled.is_set():  # a loaded machine: the claim gets through first
                await asyncio.wait_for(claimed_after.wait(), 10)
            live = await renew(*args)
            if stalled.is_set():
                after.append(f"renewed {live}")
            return live

        rt.store.claim = claiming  # type: ignore[method-assign]
        rt.store.renew_lease = late_renewal  # type: ignore[method-assign,assignment]
        r = await rt.generate("support", prompt="Refund order 1042")
        with caplog.at_level(logging.INFO, logger="signoff"):
            async with working(rt, concurrency=2):
                await until(lambda: is_(rt, r.session_id, "completed"))
        assert after[:2] == ["claimed", "renewed True"], after  # the premise, in that order
        assert runs == [f"{r.session_id}:1:call_refund"]  # once, by the one drive
        assert refunds == [ORDER["amount"]]
        assert caplog.text.count(f"claimed session {r.session_id}") == 1
        assert "lost" not in caplog.text and "taken over" not in caplog.text
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert types.count("tool.started") == 1 and types.count("tool.completed") == 1
