"""`CallJournal` driven from another event loop: a plain tool's body that steps and asks on a
loop of its own (`asyncio.run` in its thread) parks at once, its thread ending with the park,
and an answer given in the same runtime or another resumes it, its step replayed, not run again."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import signoff as so
from signoff.testing import Capture, call, call_tools, reply, scripted_agent, tool_results

from .test_workflow import ALICE

GUARD = 10.0
"""Seconds the body's own loop waits at most: a journal whose events cannot wake that loop
fails the test with a `TimeoutError` instead of leaving its thread (and the suite) hanging."""


class PlainFlow:
    """A sync tool taking `ctx` that steps, then asks, through `asyncio.run` in its thread."""

    def __init__(self) -> None:
        self.steps = 0
        self.quoting = threading.Event()  # set as the step's function starts
        self.held: threading.Event | None = None  # what that function waits for, if set
        self.bodies: list[threading.Event] = []  # each run's, set as its thread leaves the body

        async def flow(ctx: so.ToolContext) -> dict[str, Any]:
            quote = await ctx.step("quote", self.quote)
            answer = await ctx.ask("go?", options=["yes", "no"])
            return {"quote": quote, "go": answer.value}

        @so.tool
        def plain_flow(ctx: so.ToolContext, n: int) -> dict[str, Any]:
            """Quote, then ask whether to go on."""
            ended = threading.Event()
            self.bodies.append(ended)
            try:
                return asyncio.run(asyncio.wait_for(flow(ctx), GUARD))
            finally:
                ended.set()

        self.tool = plain_flow

    def quote(self) -> int:
        self.steps += 1
        self.quoting.set()
        if self.held is not None:
            assert self.held.wait(GUARD)
        return 7

    def all_ended(self) -> bool:
        return all(ended.is_set() for ended in self.bodies)


def flow_agent(flow: PlainFlow) -> tuple[so.Agent, Capture]:
    seen = Capture(reply("done"))
    agent = scripted_agent(
        "bot", [call_tools(call("plain_flow", call_id="c1", n=1)), seen], tools=[flow.tool]
    )
    return agent, seen


def answered_once(flow: PlainFlow, seen: Capture) -> None:
    """The model read the body's result after the answer: its step ran once, the body twice
    (asking, then resumed), and every thread it ran in has ended."""
    [result] = tool_results(seen.last)
    assert result.content == {"quote": 7, "go": "yes"}
    assert flow.steps == 1 and len(flow.bodies) == 2
    assert flow.all_ended()


async def parked(rt: so.Runtime, flow: PlainFlow) -> str:
    """Start the session; it parks on the body's question within a second, the body's thread
    ended with the park."""
    started = time.monotonic()
    r = await asyncio.wait_for(rt.generate("bot", prompt="go", auth=ALICE), GUARD)
    assert r.status == "waiting", r
    assert [p.question for p in r.pending] == ["go?"]
    assert time.monotonic() - started < 1.5
    assert flow.all_ended()
    return r.session_id


async def test_a_plain_body_asking_on_its_own_loop_parks_and_resumes_in_the_runtime(
    store_url: str,
) -> None:
    flow = PlainFlow()
    agent, seen = flow_agent(flow)
    async with so.Runtime([agent], store=store_url) as rt:
        sid = await parked(rt, flow)
        r = await asyncio.wait_for(rt.send(sid, "yes", principal=ALICE), GUARD)
        assert r.status == "completed", r
    answered_once(flow, seen)


async def test_a_plain_body_asking_on_its_own_loop_is_answered_from_another_runtime(
    store_url: str,
) -> None:
    flow = PlainFlow()
    agent, seen = flow_agent(flow)
    async with so.Runtime([agent], store=store_url) as first:
        sid = await parked(first, flow)
        async with so.Runtime([agent], store=store_url) as second:
            r = await asyncio.wait_for(second.send(sid, "yes", principal=ALICE), GUARD)
            assert r.status == "completed", r
    answered_once(flow, seen)


async def test_a_plain_body_that_asks_on_its_own_loop_as_its_drive_is_cancelled_parks(
    store_url: str,
) -> None:
    """The drive is cancelled while the body's step runs: it waits for the plain body's thread,
    which records the step and asks; once it has parked it is stopped too (else each waited
    for the other for ever), and an answer resumes it, the step replayed."""
    flow = PlainFlow()
    flow.held = threading.Event()
    agent, seen = flow_agent(flow)
    async with so.Runtime([agent], store=store_url) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        drive = asyncio.create_task(rt.send(sid, "go", principal=ALICE))
        assert await asyncio.to_thread(flow.quoting.wait, GUARD)
        drive.cancel()
        await asyncio.sleep(0.05)
        flow.held.set()
        await asyncio.wait({drive}, timeout=GUARD)
        assert drive.cancelled()
        assert flow.all_ended()
        state = await rt.state(sid)
        assert [p.question for p in state.pending_requests()] == ["go?"]
        r = await asyncio.wait_for(rt.send(sid, "yes", principal=ALICE), GUARD)
        assert r.status == "completed", r
    answered_once(flow, seen)
