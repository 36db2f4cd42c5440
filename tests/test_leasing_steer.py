"""A steering message sent from another process (the server, say) reaches the drive running the
turn as one sent in its own process does: a tool body running sees `ctx.abort_signal` set at the
drive's next lease renewal, and a call the steer left to run again sees it set from its start,
whichever process drives it. Run on both stores."""

from __future__ import annotations

import asyncio
import time

import signoff as so
from signoff.testing import Capture, call, call_tools, reply, scripted_agent, timeline, tool_results

from ._leasing import event_types
from ._steer import ALICE, BOB, events


def _crawler(entered: asyncio.Event, seen: list[bool], patience: float = 8) -> so.Tool:
    """`crawl`: a long task that sets `entered`, waits up to `patience` seconds for its abort
    signal (a steer or a cancel), and notes in `seen` whether the signal was set."""

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is steered or cancelled."""
        entered.set()
        try:
            await asyncio.wait_for(ctx.abort_signal.wait(), timeout=patience)
        except TimeoutError:
            pass
        seen.append(ctx.abort_signal.is_set())
        return "stopped"

    return crawl


async def test_a_steer_made_in_another_process_sets_the_running_body_s_abort_signal(
    store_url: str,
) -> None:
    """A tool body waits on `ctx.abort_signal`; another process steers the turn. The drive's next
    lease renewal finds the message and sets the signal, as a steer made in its own process does:
    the body stops at once and the model reads the message. It used to run on to its own end."""
    entered = asyncio.Event()
    seen: list[bool] = []
    crawl = _crawler(entered, seen)

    model = Capture(reply("Stopped; what next?"))
    agent = scripted_agent("bot", [call_tools(call("crawl")), model], tools=[crawl])
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=3.0) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0) as server,
    ):
        sid = await rt.create_session("bot", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        started = time.monotonic()
        steered = await server.send(sid, "stop, I found it", principal=ALICE)
        assert steered.status == "running" and not steered.queued  # the other process drives it
        r = await asyncio.wait_for(drive, timeout=20)
        assert seen == [True]
        assert time.monotonic() - started < 4  # a renewal (every 1 s), not the body's 8 s
        assert r.status == "completed" and r.text == "Stopped; what next?"
        assert [getattr(m, "text", None) for m in model.last][-1] == "stop, I found it"
        types = await event_types(rt, sid)
        assert types.index("turn.message") < types.index("tool.completed")


async def test_a_queued_message_from_another_process_leaves_the_abort_signal_clear(
    store_url: str,
) -> None:
    """A message that waits for the turn's end (`turn_policy="queue"`) steers nothing: the
    renewals that read it leave the running body alone."""
    entered = asyncio.Event()
    go = asyncio.Event()
    seen: list[bool] = []

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A task that notes its abort signal once told to finish."""
        entered.set()
        await asyncio.wait_for(go.wait(), timeout=10)
        seen.append(ctx.abort_signal.is_set())
        return "done"

    agent = scripted_agent(
        "bot", [call_tools(call("crawl")), reply("Crawled."), reply("Next.")], tools=[crawl]
    )
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=1.5) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0) as server,
    ):
        sid = await rt.create_session("bot", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        queued = await server.send(sid, "then this", principal=ALICE, turn_policy="queue")
        assert queued.queued
        head = await rt.store.head(sid)
        renewals = 0
        renew = rt.store.renew_lease

        async def counting(*args: object, **kwargs: object) -> bool:
            nonlocal renewals
            renewals += 1
            return await renew(*args, **kwargs)  # type: ignore[arg-type]

        rt.store.renew_lease = counting  # type: ignore[method-assign]
        while renewals < 3:  # renewals after the message was recorded read it
            await asyncio.sleep(0.05)
        assert await rt.store.head(sid) == head
        go.set()
        r = await asyncio.wait_for(drive, timeout=20)
        assert seen == [False]
        assert r.status == "completed"


async def test_a_call_steered_from_another_process_runs_again_with_its_abort_signal_set(
    store_url: str,
) -> None:
    """A workflow call waits on its question; another process steers the turn without driving
    it (`inline=False`). The process that drives it next runs the call again with the signal
    set, as the process that steered would have: it used to run with the signal clear."""
    seen: list[tuple[str, bool]] = []

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Choose a plan (options only); notes the abort signal on every run."""
        seen.append(("pick", ctx.abort_signal.is_set()))
        a = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
        return a.value

    @so.tool
    async def probe(ctx: so.ToolContext) -> bool:
        """Reports whether its abort signal is set."""
        seen.append(("probe", ctx.abort_signal.is_set()))
        return ctx.abort_signal.is_set()

    model = Capture(call_tools(call("probe")))
    agent = scripted_agent(
        "bot", [call_tools(call("pick")), model, reply("ok")], tools=[pick, probe]
    )
    async with (
        so.Runtime([agent], store=store_url) as rt,
        so.Runtime([agent], store=store_url, inline=False) as server,
    ):
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        sid = r.session_id
        assert r.status == "waiting"
        steered = await server.send(sid, "something else", principal=ALICE)
        assert steered.status == "running"
        r = await rt.generate(session_id=sid)
        assert r.status == "completed"
        assert seen == [("pick", False), ("pick", True), ("probe", False)]
        [result] = tool_results(model.last)
        assert result.is_error is True  # the withdrawn question stopped the call
        assert timeline(await events(rt, sid))[-3:] == [
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]


async def test_a_cancel_behind_hundreds_of_queued_messages_still_sets_the_abort_signal(
    store_url: str,
) -> None:
    """Hundreds of messages wait behind the running turn (colleagues writing while it runs)
    before another process cancels it: the renewals read past them all, and the body stops.
    They used to read only the first 500 events after the drive's last, again and again, so
    the cancel behind them never reached the body."""
    entered = asyncio.Event()
    seen: list[bool] = []
    # The body waits from its start, and the 510 sends before the cancel took up to 8 s of a
    # loaded machine: the test times the stop from the cancel instead (below).
    crawl = _crawler(entered, seen, patience=60)

    agent = scripted_agent("bot", [call_tools(call("crawl")), reply("ok")], tools=[crawl])
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=3.0) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0, inline=False) as server,
    ):
        sid = await rt.create_session("bot", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        for i in range(510):
            assert (await server.send(sid, f"and {i}", principal=BOB)).queued
        started = time.monotonic()
        assert (await server.cancel(sid, "user left")).status == "cancelled"
        await asyncio.wait_for(drive, timeout=20)
        assert seen == [True]
        assert time.monotonic() - started < 4  # a renewal, not the body's patience


async def test_messages_queued_behind_an_unread_steer_are_read_once_by_the_renewals(
    store_url: str,
) -> None:
    """A steer the drive had not read yet (its tool body taking steps, not stopping) kept every
    renewal and step check reading from the steer on: with messages queued behind it, the rows
    read grew with their square. The steer is signalled once found, and signalled again while
    unread, without reading what follows it again."""
    entered, done = asyncio.Event(), asyncio.Event()

    @so.tool
    async def work(ctx: so.ToolContext) -> str:
        """A long job in steps."""
        entered.set()
        i = 0
        while not done.is_set():

            async def step(i: int = i) -> int:
                return i

            await ctx.step(f"s{i}", step)
            i += 1
            await asyncio.sleep(0.02)
        return "done"

    queued = 30
    steps = [call_tools(call("work")), *[reply(f"r{i}") for i in range(queued + 2)]]
    agent = scripted_agent("a", steps, tools=[work])
    async with so.Runtime([agent], store=store_url, lease_ttl=0.6) as rt:
        plain = rt.store.read_events
        rows = 0

        async def counted(*args: object, **kw: object) -> list[so.Event]:
            nonlocal rows
            found: list[so.Event] = await plain(*args, **kw)  # type: ignore[arg-type]
            if kw.get("types") == ("turn.cancelled", "turn.message"):
                rows += len(found)
            return found

        rt.store.read_events = counted  # type: ignore[method-assign]
        sid = await rt.create_session("a", auth=ALICE)
        turn = asyncio.ensure_future(rt.generate(session_id=sid, prompt="go", auth=ALICE))
        await entered.wait()
        sent = [asyncio.ensure_future(rt.send(sid, "actually, stop", principal=ALICE))]
        for i in range(queued):
            await asyncio.sleep(0.02)  # spread over the steps and renewals of the body
            sent.append(
                asyncio.ensure_future(
                    rt.send(sid, f"later {i}", principal=BOB, turn_policy="queue")
                )
            )
        await asyncio.gather(*sent)
        done.set()
        await turn
    assert rows <= 3 * (queued + 1), rows
