"""A worker that stalls past the lease of a session it is driving (a loaded machine): its own
next claim must not take that session again and start a second drive of it in the same process,
which ran the tool a second time while the first body was still running."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import pytest

import signoff as so

from ._workers import ORDER, is_, until, working

TTL = 1.0


async def test_a_worker_stalled_past_its_lease_does_not_claim_the_session_it_drives(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The process stalls in a tool body past the lease; once it runs again, its claim loop
    asks for sessions before the drive's renewal gets through. The lapsed lease is its own
    drive's: the claim leaves it, the renewal keeps it (no other process took it), and the
    call runs once, its result recorded by the drive that ran it."""
    runs: list[str] = []
    stalled = asyncio.Event()
    claimed_after = asyncio.Event()  # a claim asked for after the stall has answered

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        if len(runs) == 1:
            time.sleep(TTL * 1.3)  # the whole process stalls past its lease: nothing runs
            stalled.set()
            await asyncio.sleep(TTL / 2)  # then the body goes on
        return {"refunded": amount}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([call, so.ModelResponse(text="Done.")]),
        tools=[issue_refund],
    )
    async with so.Runtime([agent], store=store_url, inline=False, lease_ttl=TTL) as rt:
        claim, renew = rt.store.claim, rt.store.renew_lease

        async def claiming(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            after = stalled.is_set()
            try:
                return await claim(*args, **kwargs)
            finally:
                if after:
                    claimed_after.set()

        async def late_renewal(*args: Any) -> bool:
            if stalled.is_set():  # a loaded machine: the claim gets through first
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(TTL / 20):  # within the renewal's grace
                        await claimed_after.wait()
            return await renew(*args)

        rt.store.claim = claiming  # type: ignore[method-assign]
        rt.store.renew_lease = late_renewal  # type: ignore[method-assign,assignment]
        r = await rt.generate("support", prompt="Refund order 1042")
        with caplog.at_level(logging.INFO, logger="signoff"):
            async with working(rt, concurrency=2):
                await until(lambda: is_(rt, r.session_id, "completed"))
        assert claimed_after.is_set()
        assert runs == [f"{r.session_id}:1:call_refund"]  # once, by the one drive
        assert caplog.text.count(f"claimed session {r.session_id}") == 1
        assert "lost" not in caplog.text
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert types.count("tool.started") == 1 and types.count("tool.completed") == 1
