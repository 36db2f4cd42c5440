"""A session's TTL against a turn a live drive is running (a tool slower than the TTL): the
session is not idle, so a follower of its events goes on following it, not `SessionExpired`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

import signoff as so
from signoff._types import SessionStatus
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent


def slow_agent(started: asyncio.Event, go: asyncio.Event) -> so.Agent:
    """Agent `a`: its turn calls `slow`, which waits for `go`; sessions expire 60 s after their
    last event."""

    @so.tool()
    async def slow(x: str) -> str:
        """Take a while."""
        started.set()
        await go.wait()
        return "done"

    return scripted_agent(
        "a",
        [call_tools(call("slow", x="1")), reply("ok")],
        tools=[slow],
        limits=so.Limits(ttl=60),
    )


async def followed_past_the_ttl(
    rt: so.Runtime, session_id: str, last: str, go: asyncio.Event, turn: asyncio.Task[Any]
) -> tuple[list[str], so.GenerateResult]:
    """Follow the session's events, up to one of type `last`, from `rt`, whose clock passed the
    TTL while a drive runs the turn (`turn`, its tool waiting for `go`): once the follower met
    the TTL passed and looked again (or ended, raising), the tool goes on. The types it saw,
    and the turn's result."""
    read_events = rt.store.read_events
    empty = [0]

    async def counted(*args: Any, **kwargs: Any) -> Any:
        batch = await read_events(*args, **kwargs)
        empty[0] += not batch
        return batch

    rt.store.read_events = counted  # type: ignore[method-assign]
    seen: list[str] = []

    async def follow() -> None:
        async for event in rt.events(session_id):
            seen.append(event.type)
            if event.type == last:
                return

    follower = asyncio.create_task(follow())
    try:
        while not follower.done() and empty[0] < 3:  # it met the TTL passed, looked again
            await asyncio.sleep(0.01)
        if follower.done():
            await follower  # it ended: SessionExpired
    finally:
        go.set()
        result = await turn
    await asyncio.wait_for(follower, 5)
    return seen, result


async def test_a_follower_of_a_turn_running_past_the_ttl_follows_it_to_the_end(
    store_url: str,
) -> None:
    """The follower met the TTL passed (its last event, tool.started, 61 s old) and raised
    `SessionExpired` though the drive holding the turn's lease ran on and completed it: the
    stream ended with an error and the turn's end went unseen. A turn held by a live drive is
    followed on; one whose drive died (its lease lapsed) still expires."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    async with so.Runtime(
        [slow_agent(started, go)], store=store_url, clock=clock, lease_ttl=600, poll_interval=0.01
    ) as rt:
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        await started.wait()
        [row] = await rt.sessions()
        clock.advance(61)
        seen, result = await followed_past_the_ttl(rt, row.id, "turn.completed", go, turn)
        assert result.status == "completed" and result.text == "ok"
        assert seen[-3:] == ["tool.completed", "model.completed", "turn.completed"]


async def test_a_follower_of_a_running_turn_no_drive_holds_still_meets_the_expiry(
    store_url: str,
) -> None:
    """A turn left running with no drive holding it (no worker came, or its process died):
    the follower records the expiry, reads it, and raises `SessionExpired`."""
    clock = ManualClock()
    agent = slow_agent(asyncio.Event(), asyncio.Event())
    async with so.Runtime(
        [agent], store=store_url, clock=clock, inline=False, poll_interval=0.01
    ) as rt:
        r = await rt.generate("a", prompt="hi")
        assert r.status == "running"
        clock.advance(61)
        seen: list[str] = []
        with pytest.raises(so.SessionExpired):
            async for event in rt.events(r.session_id):
                seen.append(event.type)
        assert seen[-1] == "turn.failed"


async def test_a_listing_shows_a_turn_running_past_the_ttl_running(store_url: str) -> None:
    """`rt.sessions()` listed the session `failed` (and under `status="failed"`, not under
    `"running"`) while the drive holding its turn ran it on past the TTL and then completed it:
    a live drive's turn is shown as the store holds it, `running`."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    async with so.Runtime(
        [slow_agent(started, go)], store=store_url, clock=clock, lease_ttl=600
    ) as rt:
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        try:
            await started.wait()
            clock.advance(61)
            assert [r.status for r in await rt.sessions()] == ["running"]
            assert [r.status for r in await rt.sessions(status="running")] == ["running"]
            assert await rt.sessions(status="failed") == []
        finally:
            go.set()
            result = await turn
        assert result.status == "completed"
        assert [r.status for r in await rt.sessions()] == ["idle"]


async def test_a_state_read_without_the_agent_shows_a_turn_running_past_the_ttl_running(
    store_url: str,
) -> None:
    """A runtime without the session's agent shows a passed TTL it cannot record as recording
    it leaves the session (failed); but not one whose turn a live drive runs on past the TTL
    (a slow tool): that session is not idle, so it reads `running`, as listed."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    async with (
        so.Runtime([slow_agent(started, go)], store=store_url, clock=clock, lease_ttl=600) as rt,
        so.Runtime([], store=store_url, clock=clock) as reader,
    ):
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        try:
            await started.wait()
            clock.advance(61)
            [row] = await reader.sessions()
            shown = await reader.state(row.id)
            assert (row.status, shown.status, shown.turn_status) == ("running",) * 3
        finally:
            go.set()
            result = await turn
        assert result.status == "completed"
        assert (await reader.state(row.id)).status == "idle"


@pytest.mark.parametrize("status", [None, "running", "failed"])
async def test_a_listing_probes_a_turn_running_past_the_ttl_once(
    store_url: str, status: SessionStatus | None
) -> None:
    """Whether a live drive holds a turn the TTL caught running is a read of its lease (it was
    a lease taken and released, a write): one `rt.sessions()` asked two to four times for one
    session (its expiry, then which are held, again on the page). The first look's answer is
    used throughout. (The listing is another process's: the drive's own knows it drives the
    turn, asking nothing.)"""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    agent = slow_agent(started, go)
    async with (
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as rt,
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as other,
    ):
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        try:
            await started.wait()
            clock.advance(61)
            shown = [] if status == "failed" else ["running"]
            for lister, asked in ((other, 1), (rt, 0)):
                probes: list[str] = []
                read = lister.store.lease_held  # type: ignore[attr-defined]

                async def counted(
                    session_id: str,
                    *args: Any,
                    probes: list[str] = probes,
                    read: Any = read,
                    **kwargs: Any,
                ) -> Any:
                    probes.append(session_id)
                    return await read(session_id, *args, **kwargs)

                lister.store.lease_held = counted  # type: ignore[attr-defined]
                try:
                    listed = await lister.sessions(status=status)
                finally:
                    del lister.store.lease_held  # type: ignore[attr-defined]
                assert [r.status for r in listed] == shown
                assert len(probes) == asked
        finally:
            go.set()
            assert (await turn).status == "completed"


async def test_a_sweep_counts_no_expiry_for_a_turn_running_past_the_ttl(store_url: str) -> None:
    """`rt.expire_due()` left a session whose turn a live drive runs on past the TTL alone, as
    it should, but returned 1: it counted the lapsed sessions it looked at, not the expiries it
    recorded. It counts none now; once no drive holds a turn past its TTL, the one it records."""
    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()
    agent = slow_agent(started, go)
    async with (
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as rt,
        so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600) as sweeper,
    ):
        turn = asyncio.create_task(rt.generate("a", prompt="hi"))
        try:
            await started.wait()
            clock.advance(61)
            assert await sweeper.expire_due() == 0
            assert await rt.expire_due() == 0
        finally:
            go.set()
            assert (await turn).status == "completed"
    async with so.Runtime([agent], store=store_url, clock=clock, inline=False, lease_ttl=600) as rt:
        r = await rt.generate("a", prompt="hi")
        assert r.status == "running"  # left for a worker, which never comes
        clock.advance(61)
        assert await rt.expire_due() == 1
        assert (await rt.state(r.session_id)).status == "failed"
        assert await rt.expire_due() == 0
