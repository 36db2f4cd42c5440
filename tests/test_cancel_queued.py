"""Cancelling a turn in inline mode (no worker: the caller's runtime drives its turns) starts the
message that waited for that turn's end, as the turn's own end would have, whether the turn
waited on a person, ran with no drive holding it, or ran under a drive (which goes on to the
message itself); the cancel reports the cancelled turn. Run on both stores."""

from __future__ import annotations

import asyncio
from typing import Any

import signoff as so
from signoff.testing import Capture, call, call_tools, reply, scripted_agent, timeline

from ._steer import ALICE, BOB, events, plan_agent, texts


async def test_cancelling_a_waiting_turn_starts_the_message_queued_behind_it(
    store_url: str,
) -> None:
    """Bob's message waits for Alice's turn, which waits on her answer; she cancels it. Bob's
    message starts its turn then, as it would at the end of hers: it used to sit in the queue
    until the next call on the session, with nothing running it."""
    bob_turn = Capture(reply("Hi Bob."))
    async with so.Runtime([plan_agent(bob_turn)], store=store_url) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        sid = r.session_id
        b = await rt.send(sid, "bob here", principal=BOB)
        assert b.queued and b.status == "waiting"
        c = await rt.cancel(sid)
        assert c.status == "cancelled" and c.turn_id == r.turn_id
        assert texts(bob_turn.last)[-1] == ("user", "bob here")
        state = await rt.state(sid)
        assert state.queued == [] and state.turn is not None
        assert state.turn.status == "completed" and state.turn.id != r.turn_id
        assert timeline(await events(rt, sid))[-6:] == [
            "turn.cancelled",
            "session.waiting",
            "turn.started",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]


def _crawl_agent(bob_turn: Any, entered: asyncio.Event) -> so.Agent:
    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is cancelled."""
        entered.set()
        await asyncio.wait_for(ctx.abort_signal.wait(), timeout=10)
        return "stopped"

    return scripted_agent("bot", [call_tools(call("crawl")), bob_turn], tools=[crawl])


async def test_cancelling_a_running_turn_no_drive_holds_starts_the_queued_message(
    store_url: str,
) -> None:
    """Alice's turn runs, but its drive was stopped (its caller gave up on it): nothing holds
    the turn. Bob's message waits behind it (sent through a process that leaves turns to
    workers: an inline one's send drives the turn on itself); Alice cancels the turn, and Bob's
    message starts."""
    entered = asyncio.Event()
    bob_turn = Capture(reply("Hi Bob."))
    agent = _crawl_agent(bob_turn, entered)
    async with so.Runtime([agent], store=store_url) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        drive.cancel()
        await asyncio.wait({drive})
        assert (await rt.state(sid)).status == "running"
        async with so.Runtime([agent], store=store_url, inline=False) as queuing:
            b = await queuing.send(sid, "bob here", principal=BOB)
        assert b.queued and b.status == "running"
        c = await rt.cancel(sid)
        assert c.status == "cancelled"
        assert texts(bob_turn.last)[-1] == ("user", "bob here")
        state = await rt.state(sid)
        assert state.queued == [] and state.status == "idle"


async def test_a_drive_whose_turn_is_cancelled_goes_on_to_the_queued_message(
    store_url: str,
) -> None:
    """A drive runs Alice's turn when she cancels it with Bob's message waiting: one of the
    two calls runs Bob's turn, once, and Alice's `generate` still reports her turn cancelled."""
    entered = asyncio.Event()
    bob_turn = Capture(reply("Hi Bob."))
    async with so.Runtime([_crawl_agent(bob_turn, entered)], store=store_url) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        b = await rt.send(sid, "bob here", principal=BOB)
        assert b.queued and b.status == "running"
        c = await rt.cancel(sid)
        r = await asyncio.wait_for(drive, timeout=20)
        assert c.status == r.status == "cancelled" and c.turn_id == r.turn_id
        assert len(bob_turn.conversations) == 1
        state = await rt.state(sid)
        assert state.queued == [] and state.status == "idle"


async def test_a_drive_that_finds_the_queued_message_taken_reports_its_turn_cancelled(
    store_url: str,
) -> None:
    """Alice's turn is cancelled elsewhere under her drive; before the drive takes the lease
    again for Bob's message, another call starts Bob's turn and holds it. Alice's `generate`
    reports her turn `cancelled`, as when her drive runs Bob's turn itself: it used to report
    Bob's turn, `running`, as if it were hers."""
    entered = asyncio.Event()
    holds, release = asyncio.Event(), asyncio.Event()

    async def bob_model(conversation: list[so.Message]) -> so.ModelResponse:
        holds.set()
        await asyncio.wait_for(release.wait(), timeout=10)
        return reply("Hi Bob.")

    agent = _crawl_agent(bob_model, entered)
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=3.0, lease_wait=0) as rt,
        so.Runtime([agent], store=store_url, inline=False) as workers,
        so.Runtime([agent], store=store_url) as other,
    ):
        sid = await rt.create_session("bot", auth=ALICE)
        acquire = rt._acquire
        taken: list[asyncio.Task[so.GenerateResult]] = []

        async def acquired(session_id: str, owner: str, wait: float | None = None) -> int | None:
            if entered.is_set() and not taken:  # the drive's second pass: Bob's turn
                taken.append(asyncio.create_task(other.generate(session_id=session_id)))
                await asyncio.wait_for(holds.wait(), timeout=10)
            return await acquire(session_id, owner, wait)

        rt._acquire = acquired  # type: ignore[method-assign]
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        assert (await rt.send(sid, "bob here", principal=BOB)).queued
        c = await workers.cancel(sid)
        r = await asyncio.wait_for(drive, timeout=10)
        release.set()
        [bob] = taken
        b = await asyncio.wait_for(bob, timeout=10)
        assert (r.status, r.turn_id) == ("cancelled", c.turn_id)
        assert b.status == "completed" and b.text == "Hi Bob." and b.turn_id != c.turn_id


async def test_a_cancel_whose_turn_ends_meanwhile_leaves_the_queued_message_s_turn_alone(
    store_url: str,
) -> None:
    """Alice cancels her turn just as it ends and Bob's message, which waited, starts its turn:
    the cancel finds its turn ended and reports it, as it does when no turn follows. It used to
    go round again and cancel Bob's turn, which no one asked to cancel."""
    finish, bob_started, bob_release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    @so.tool
    async def crawl() -> str:
        """A task that ends when told to."""
        await asyncio.wait_for(finish.wait(), timeout=10)
        return "crawled"

    async def bob_model(conversation: list[so.Message]) -> so.ModelResponse:
        bob_started.set()
        await asyncio.wait_for(bob_release.wait(), timeout=10)
        return reply("Hi Bob.")

    steps: list[Any] = [call_tools(call("crawl")), reply("Crawled."), bob_model]
    agent = scripted_agent("bot", steps, tools=[crawl])
    async with (
        so.Runtime([agent], store=store_url) as rt,
        so.Runtime([agent], store=store_url) as other,
    ):
        sid = await rt.create_session("bot", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        while "tool.started" not in [e.type for e in await events(rt, sid)]:
            await asyncio.sleep(0.01)
        assert (await rt.send(sid, "bob here", principal=BOB)).queued
        make = other._driver

        def driver(state: Any, lease: tuple[str, int] | None) -> Any:
            made = make(state, lease)
            record = made.record

            async def late(*args: Any, **kwargs: Any) -> Any:
                finish.set()  # the turn ends, and Bob's starts, as the cancel is recorded
                await asyncio.wait_for(bob_started.wait(), timeout=10)
                return await record(*args, **kwargs)

            made.record = late  # type: ignore[method-assign]
            return made

        other._driver = driver  # type: ignore[method-assign]
        c = await other.cancel(sid, "stop")
        bob_release.set()
        await asyncio.wait_for(drive, timeout=10)
        log = await events(rt, sid)
        alice, bob = [e.turn_id for e in log if e.type == "turn.started"]
        assert (c.status, c.turn_id, c.text) == ("completed", alice, "Crawled.")
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.id == bob
        assert (state.turn.status, state.queued) == ("completed", [])
        assert "turn.cancelled" not in [e.type for e in log]
