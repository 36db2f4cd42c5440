"""Two drives of one session in the same process: the first's lease lapses in the store while it
still runs (the process stalled, its renewals late); a second drive started here, or a probe of
whether the session is busy, must not take that lease over. It used to (a worker's claim skipped
the session, nothing else did): the second drive ran the call the first was still running. On
both stores."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import signoff as so
from signoff.testing import ManualClock

from ._leasing import ORDER, event_types, until

TTL = 3.0  # renewals every second: the takeover below comes long before the first one


def _agent(runs: list[str], go_on: asyncio.Event) -> so.Agent:
    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order; the first run waits until the test lets it go on."""
        runs.append(ctx.idempotency_key())
        if len(runs) == 1:
            await go_on.wait()
        return {"refunded": amount}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )
    model = so.models.Scripted([call, so.ModelResponse(text="Done.")])
    return so.Agent(name="support", model=model, tools=[issue_refund])


def _grants_while(rt: so.Runtime, running: Any) -> list[bool]:
    """For each lease the store grants from now on: whether `running()` held then."""
    acquire = rt.store.acquire_lease
    seen: list[bool] = []

    async def watched(*args: Any) -> int | None:
        token = await acquire(*args)
        if token is not None:
            seen.append(bool(running()))
        return token

    rt.store.acquire_lease = watched  # type: ignore[method-assign,assignment]
    return seen


@pytest.mark.parametrize("second", ["drive", "message"])
async def test_a_second_drive_here_does_not_take_over_a_lapsed_lease_the_first_still_runs_on(
    store_url: str, second: str
) -> None:
    """The first drive runs a tool body; its lease lapses by the clock before any renewal. A
    second call here (a retry of the turn, or a message, which probes whether the session is
    busy) finds the session busy; the first drive's body goes on, its renewal keeps the lease,
    and it finishes the turn: the call ran once, and no lease was granted while it ran."""
    clock = ManualClock(time.time())
    runs: list[str] = []
    go_on = asyncio.Event()
    agent = _agent(runs, go_on)
    async with so.Runtime(
        [agent], store=store_url, lease_ttl=TTL, lease_wait=0.3, clock=clock
    ) as rt:
        sid = await rt.create_session("support")
        first = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: bool(runs))
        grants = _grants_while(rt, lambda: not first.done() and not go_on.is_set())
        clock.advance(TTL * 2)  # the first drive's lease lapses in the store's eyes
        if second == "drive":
            result = await rt.generate("support", session_id=sid)
            assert result.status == "running"  # busy: driven here already
        else:
            with pytest.raises(so.SessionBusy):
                await rt.generate("support", "And the other one", session_id=sid)
        assert not first.done()  # provably still running all along
        assert True not in grants, "a lease was granted while the first drive ran"
        go_on.set()
        done = await asyncio.wait_for(first, 10)
        assert done.status == "completed", done
        assert runs == [f"{sid}:1:call_refund"]
        types = await event_types(rt, sid)
        assert types.count("tool.started") == 1 and types.count("tool.completed") == 1


async def test_a_second_drive_here_drives_the_turn_once_the_first_lost_its_lease(
    store_url: str,
) -> None:
    """A second drive waiting for the first (its lease lapsed here, its renewals failing) goes
    on once the first drive ends, having lost the lease: the turn is driven, not left busy."""
    clock = ManualClock(time.time())
    runs: list[str] = []
    go_on = asyncio.Event()
    agent = _agent(runs, go_on)
    async with so.Runtime(
        [agent], store=store_url, lease_ttl=0.6, lease_wait=10, clock=clock
    ) as rt:
        renew = rt.store.renew_lease

        async def failing(*args: Any) -> bool:
            if runs:
                raise so.StoreError("renewing the lease: connection lost (test)")
            return await renew(*args)

        rt.store.renew_lease = failing  # type: ignore[method-assign,assignment]
        sid = await rt.create_session("support")
        first = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: bool(runs))
        grants = _grants_while(rt, lambda: not first.done())
        clock.advance(1.0)  # lapsed: the first drive gives it up at its next renewal
        second = await asyncio.wait_for(rt.generate("support", session_id=sid), 10)
        assert grants and True not in grants, "a lease was granted while the first drive ran"
        assert (await asyncio.wait_for(first, 10)).status == "running"  # it lost the lease
        assert second.status == "completed", second
        assert runs == [f"{sid}:1:call_refund"] * 2
