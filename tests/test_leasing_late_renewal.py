"""A drive that stalled renews its lease before it runs a step (`Leasing._confirm`); when the
renewal's answer comes only once the lease it renewed has lapsed again (the process stalled
while the renewal was on its way), another process may have taken the turn over meanwhile: the
drive asks again instead of running the step on a lapsed lease. On both stores."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import signoff as so
from signoff import _leasing
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

TTL = 60.0


def _agent(ran: list[str], who: str, hold: asyncio.Event | None = None) -> so.Agent:
    @so.tool
    async def plan(ctx: so.ToolContext) -> str:
        """Quote a fee."""
        if hold is not None:
            await hold.wait()

        async def quote() -> float:
            ran.append(who)
            return 12.5

        return f"fee {await ctx.step('quote', quote)}"

    return scripted_agent("planner", [call_tools(call("plan")), reply("Planned.")], tools=[plan])


async def test_a_renewal_answered_after_its_lease_lapsed_is_asked_again_before_a_step(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the late answer (True: the renewal had gone through) let the step run, though
    the lease it renewed had lapsed meanwhile and another runtime had run the step already."""
    clock = ManualClock()
    awake = [0.0]  # the lease clock that never steps (`_AWAKE`), moved by hand
    monkeypatch.setattr(_leasing, "_AWAKE", lambda: awake[0])
    ran: list[str] = []
    hold = asyncio.Event()
    first = so.Runtime([_agent(ran, "first", hold)], store=store_url, clock=clock, lease_ttl=TTL)
    second = so.Runtime([_agent(ran, "second")], store=store_url, clock=clock, lease_ttl=TTL)
    renewed, answer = asyncio.Event(), asyncio.Event()
    store: Any = first.store
    renew = store.renew_lease

    async def late(*args: Any, **kwargs: Any) -> bool:
        got: bool = await renew(*args, **kwargs)
        if hold.is_set() and not renewed.is_set():  # the renewal before the step, held back
            renewed.set()
            await answer.wait()
        return got

    monkeypatch.setattr(store, "renew_lease", late)
    async with first, second:
        sid = await first.create_session("planner")
        turn = asyncio.create_task(first.generate(session_id=sid, prompt="plan it"))
        for _ in range(1000):  # until the body waits on `hold` (bounded: 10 s)
            if await _body_running(first, sid):
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("the tool body did not start")
        awake[0] += TTL  # the drive stalled: its lease is renewed before the step
        hold.set()
        await asyncio.wait_for(renewed.wait(), 10)
        clock.advance(TTL + 1)  # meanwhile the renewed lease lapsed, and another took over
        done = await second.generate(session_id=sid)
        assert done.status == "completed" and ran == ["second"]
        answer.set()
        await asyncio.wait_for(turn, 10)
        assert ran == ["second"], ran  # the first drive ran no step on its lapsed lease
        ended = (await second.state(sid)).turn
        assert ended is not None and ended.text == "Planned."


async def _body_running(rt: so.Runtime, sid: str) -> bool:
    turn = (await rt.state(sid)).turn
    return turn is not None and any(c.status == "running" for c in turn.calls.values())
