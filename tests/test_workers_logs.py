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


async def _lose_a_lease(
    store_url: str, caplog: pytest.LogCaptureFixture, *, store_fails_after: bool = False
) -> tuple[str, list[str], so.SessionState, list[str]]:
    """A worker whose tool body outlives its lease (another worker takes the turn over and
    completes it meanwhile) finds its lease gone when it records the result; with
    `store_fails_after`, its store fails from then on (as when a failing store cost the lease).
    The session, what the workers logged of it, its state and the tool's runs."""
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
        if store_fails_after:
            failing: list[bool] = []
            commit, head = first.store.commit, first.store.head

            async def fenced(*args: Any, **kw: Any) -> Any:
                try:
                    return await commit(*args, **kw)
                except so.LeaseLost:
                    failing.append(True)
                    raise

            async def gone(*args: Any, **kw: Any) -> Any:
                if failing:
                    raise so.StoreError("the store went away")
                return await head(*args, **kw)

            first.store.commit, first.store.head = fenced, gone  # type: ignore[method-assign]
        sid = (await front.generate("support", prompt="Refund order 1042")).session_id
        with caplog.at_level(logging.INFO, logger="signoff"):  # the runtime's lines too
            async with working(first):
                await asyncio.wait_for(started.wait(), 10)
                async with working(second):
                    await until(lambda: is_(front, sid, "completed"))
                go_on.set()  # the first worker's body returns; recording it finds the lease gone

                async def four_lines() -> bool:
                    return len(said(sid)) >= 4

                await until(four_lines)
        state = await front.state(sid)
    return sid, said(sid), state, runs


def _about_the_lease(caplog: pytest.LogCaptureFixture, sid: str) -> list[tuple[str, str, str]]:
    return [
        (r.name, r.levelname, r.getMessage())
        for r in caplog.records
        if r.getMessage().startswith(f"session {sid}: lease")
    ]


def _lost(sid: str, token: str) -> tuple[str, str, str]:
    return (
        "signoff.worker",
        "WARNING",
        f"session {sid}: lease {token} lost (the drive stalled past it or could not renew "
        "it); the turn is left to the process that takes it over",
    )


async def test_a_worker_that_lost_its_lease_says_so_not_what_the_other_worker_did(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Its log says it lost the lease, not `session X: completed`, which was the other worker's
    doing."""
    sid, lines, state, runs = await _lose_a_lease(store_url, caplog)
    claimed, taken_over, completed, lost = lines
    token = re.fullmatch(rf"claimed session {sid} \(lease (\d+)\)", claimed)
    assert token is not None and taken_over.startswith(f"claimed session {sid} "), taken_over
    assert completed == f"session {sid}: completed"  # the second worker's own line
    # One line, a warning, said by the worker: the runtime warned "lease N was lost; leaving
    # the turn" and the worker then said it again, at info.
    about_the_lease = _about_the_lease(caplog, sid)
    assert about_the_lease == [_lost(sid, token[1])]
    assert lost == about_the_lease[0][2]
    assert runs == [f"{sid}:1:call_refund"] * 2
    assert state.turn is not None and state.turn.text == "Done."


async def test_a_lease_lost_is_said_when_the_store_then_fails(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A drive that lost its lease and then could not read the session again (the store
    failing, as a failing store costs leases) is still said to have lost it, once; it was said
    by no one (the runtime leaves it to the worker, which was never told), and the worker said
    the turn failed, to be retried once its lease expires, though another worker had it."""
    sid, lines, _, runs = await _lose_a_lease(store_url, caplog, store_fails_after=True)
    token = re.fullmatch(rf"claimed session {sid} \(lease (\d+)\)", lines[0])
    assert token is not None
    assert _about_the_lease(caplog, sid) == [_lost(sid, token[1])]
    assert not [line for line in lines if "the turn failed in the worker" in line], lines
    assert runs == [f"{sid}:1:call_refund"] * 2


@pytest.mark.parametrize("stopping_first", [False, True])
async def test_a_worker_stopped_at_once_names_the_turns_it_interrupted(
    store_url: str, caplog: pytest.LogCaptureFixture, stopping_first: bool
) -> None:
    """`work()` cancelled (a second Ctrl-C or SIGTERM of `signoff worker`, while the first has it
    wait for its running turns) interrupts the turns it drives, their tool bodies where they
    stand: its log said only `SIGINT again: stopping now`, so an operator could not tell which
    sessions had a call cut short (to run again, with the same idempotency key, in the worker
    that takes them over)."""
    began = asyncio.Event()

    @so.tool(approval=so.never())
    async def nap(ctx: so.ToolContext) -> str:
        """Sleep a long while."""
        began.set()
        await asyncio.sleep(60)
        return "rested"

    call = so.ModelResponse(tool_calls=[so.ToolCall(id="c1", name="nap", input={})])
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([call, so.ModelResponse(text="Rested.")]),
        tools=[nap],
    )
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=600) as worker,
    ):
        sid = (await front.generate("support", prompt="nap")).session_id
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            stop = asyncio.Event()
            task = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
            await asyncio.wait_for(began.wait(), 10)
            if stopping_first:  # the first signal: it waits for the running turn
                stop.set()
                await until(lambda: asyncio.sleep(0, "stopping: waiting for 1" in caplog.text))
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "signoff.worker"]
    assert (
        "WARNING",
        f"stopping now: interrupting 1 running turn(s), their leases given back: {sid}",
    ) in said, said
