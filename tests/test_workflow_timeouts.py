"""Workflow tools that cancel their own async steps (a timeout around one, a `TaskGroup` that
fails): the cancel is journaled, and the replay waits to be cancelled again, taking the path
the body took, however long the timeout."""

from __future__ import annotations

import asyncio

import pytest

import signoff as so
from signoff import _tool_context
from signoff.testing import Capture, call, call_tools, reply, scripted_agent, tool_results

from .test_workflow import events


def _quoting(ran: list[str], timeout: float | None, *, bodies: list[str] | None = None) -> so.Tool:
    """A tool quoting from a provider that hangs, under `timeout` (None: none on replay, a
    changed tool), with a fallback price, and asking to charge it."""

    async def quote() -> int:
        ran.append("quote")
        await asyncio.Event().wait()  # the provider hangs
        return 42  # pragma: no cover

    def fallback() -> int:
        ran.append("fallback")
        return 7

    @so.tool
    async def charge(ctx: so.ToolContext) -> str:
        """Quote (or fall back to a list price) and charge once the customer agrees."""
        first = bodies is None or not bodies
        if bodies is not None:
            bodies.append("charge")
        try:
            if timeout is None and not first:
                price = await ctx.step("quote", quote)
            else:
                price = await asyncio.wait_for(ctx.step("quote", quote), timeout or 0.6)
        except TimeoutError:
            price = await ctx.step("fallback", fallback)
        answer = await ctx.ask(f"Charge {price}?", options=["yes", "no"])
        return f"charged {price}: {answer.value}"

    return charge


async def test_a_step_timed_out_after_longer_than_the_grace_replays_its_timeout(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The body timed the quote out and fell back to the list price, then asked. On replay the
    quote, never journaled, was a new step that waited for the recorded fallback, which only
    its own branch reaches once the timeout fires: past `REPLAY_GRACE` first, a ReplayError
    ("replayed step 'quote' ..., but recorded step 'fallback' there") failed the call for good
    after the person answered. The cancel is journaled, and the replay waits for it again."""
    monkeypatch.setattr(_tool_context, "REPLAY_GRACE", 0.3)  # under the 0.6 s timeout
    ran: list[str] = []
    seen = Capture(reply("Charged."))
    agent = scripted_agent("shop", [call_tools(call("charge")), seen], tools=[_quoting(ran, 0.6)])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="charge")
        assert [p.question for p in r.pending] == ["Charge 7?"]
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed", r
        steps = [e.data for e in await events(rt, r.session_id) if e.type == "tool.step"]
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, "charged 7: yes")
    assert ran == ["quote", "fallback"]  # the quote is not asked for again on replay
    assert [s["name"] for s in steps] == ["quote", "fallback"]
    assert 0.5 <= steps[0]["cancelled"] < 5 and "result" not in steps[0]
    assert "cancelled" not in steps[1]


async def test_a_step_cancelled_when_recorded_that_nothing_cancels_on_replay_is_a_replay_error(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tool changed: the quote it timed out is awaited without a timeout on replay. It
    waits for the recorded seconds and the grace, then is a ReplayError, and runs nothing."""
    monkeypatch.setattr(_tool_context, "REPLAY_GRACE", 0.3)
    ran: list[str] = []
    seen = Capture(reply("Failed."))
    tool = _quoting(ran, None, bodies=[])
    agent = scripted_agent("shop", [call_tools(call("charge")), seen], tools=[tool])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="charge")
        assert [p.question for p in r.pending] == ["Charge 7?"]
        r = await asyncio.wait_for(rt.send(r.session_id, "yes"), 10)
        assert r.status == "completed", r
    [result] = tool_results(seen.last)
    assert result.is_error is True
    error = result.content["error"]
    assert error.startswith("ReplayError: ") and "nothing cancelled it on replay" in error
    assert ran == ["quote", "fallback"]


async def test_a_step_its_task_group_cancelled_replays_the_groups_failure(
    store_url: str,
) -> None:
    """A sibling's step failed and the `TaskGroup` cancelled the slow step: its cancel is
    journaled, and on replay the sibling's recorded failure cancels it again, the group failing
    as it did, and the body going on from there to its answered question."""
    ran: list[str] = []

    async def slow() -> str:
        ran.append("slow")
        await asyncio.Event().wait()
        return "slow"  # pragma: no cover

    def check() -> str:
        ran.append("check")
        raise ValueError("out of stock")

    @so.tool
    async def order(ctx: so.ToolContext) -> str:
        """Reserve while checking the stock, and ask what to do if that fails."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(ctx.step("reserve", slow))
                group.create_task(ctx.step("check", check))
        except* ValueError as failed:
            reason = str(failed.exceptions[0])
        answer = await ctx.ask(f"{reason}: wait for stock?", options=["yes", "no"])
        return f"{reason}, {answer.value}"

    seen = Capture(reply("Done."))
    agent = scripted_agent("shop", [call_tools(call("order")), seen], tools=[order])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="order")
        assert [p.question for p in r.pending] == ["out of stock: wait for stock?"]
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed", r
        steps = {
            e.data["name"]: e.data for e in await events(rt, r.session_id) if e.type == "tool.step"
        }
    assert tool_results(seen.last)[0].content == "out of stock, yes"
    assert sorted(ran) == ["check", "slow"]
    assert "cancelled" in steps["reserve"] and "error" in steps["check"]
