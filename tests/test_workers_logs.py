"""What a worker's log says of a turn it ran: a failed one is a warning with its error code,
message and whether a retry can resume it (it said only `failed`, so the operator had to
read the session's log to learn why); one whose lease was lost says so in one warning (it said the
status the worker that took the turn over left, `completed`, as if it were its own)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Any

import pytest

import signoff as so
from signoff.testing import ManualClock

from ._workers import ORDER, is_, until, working


async def test_a_failed_turn_is_logged_with_why(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([so.ModelError("the provider answered 529 overloaded")]),
    )
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(worker):
                await until(lambda: is_(front, r.session_id, "failed"))
        (line,) = [rec for rec in caplog.records if "failed" in rec.getMessage()]
        assert line.levelname == "WARNING"
        assert line.getMessage() == (
            f"session {r.session_id}: failed (model_error: ModelError: the provider answered 529 "
            "overloaded); retryable"
        )


async def test_a_worker_that_lost_its_lease_says_so_not_what_the_other_worker_did(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose tool body outlived its lease (another worker took the turn over and
    completed it meanwhile) finds its lease gone when it records the result: its log says it
    lost the lease, not `session X: completed`, which was the other worker's doing."""
    started, go_on = asyncio.Event(), asyncio.Event()
    runs: list[str] = []

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        if len(runs) == 1:  # the first worker's run outlives its lease
            started.set()
            await go_on.wait()
        return {"refunded": amount}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([call, so.ModelResponse(text="Done.")]),
        tools=[issue_refund],
    )

    def said(sid: str) -> list[str]:
        """What the workers logged of the session, in order."""
        return [
            r.getMessage()
            for r in caplog.records
            if r.name == "signoff.worker" and f"session {sid}" in r.getMessage()
        ]

    # The second worker's clock is an hour ahead: for it the first one's lease (30 s, renewed
    # only after 10) has lapsed, so it takes the turn over at once.
    later = ManualClock(time.time() + 3600)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=30) as first,
        so.Runtime([agent], store=store_url, inline=False, clock=later) as second,
    ):
        sid = (await front.generate("support", prompt="Refund order 1042")).session_id
        with caplog.at_level(logging.INFO, logger="signoff"):  # the runtime's lines too
            async with working(first):
                await asyncio.wait_for(started.wait(), 10)
                async with working(second):
                    await until(lambda: is_(front, sid, "completed"))
                go_on.set()  # the first worker's body returns; recording it finds the lease gone

                async def four_lines() -> bool:
                    return len(said(sid)) == 4

                await until(four_lines)
        state = await front.state(sid)
    claimed, taken_over, completed, lost = said(sid)
    token = re.fullmatch(rf"claimed session {sid} \(lease (\d+)\)", claimed)
    assert token is not None and taken_over.startswith(f"claimed session {sid} "), taken_over
    assert completed == f"session {sid}: completed"  # the second worker's own line
    # One line, a warning, said by the worker: the runtime warned "lease N was lost; leaving
    # the turn" and the worker then said it again, at info.
    about_the_lease = [
        (r.name, r.levelname, r.getMessage())
        for r in caplog.records
        if r.getMessage().startswith(f"session {sid}: lease")
    ]
    assert about_the_lease == [
        (
            "signoff.worker",
            "WARNING",
            f"session {sid}: lease {token[1]} lost (the drive stalled past it or could not renew "
            "it); the turn is left to the process that takes it over",
        )
    ]
    assert lost == about_the_lease[0][2]
    assert runs == [f"{sid}:1:call_refund"] * 2
    assert state.turn is not None and state.turn.text == "Done."
