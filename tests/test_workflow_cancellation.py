"""Stopping a workflow call: withdrawn questions, the abort signal set by steering and
cancelling, and turns replaced or cancelled under a running body."""

from __future__ import annotations

import asyncio
from pathlib import Path

import signoff as so
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    timeline,
    tool_results,
)

from ._replaced import assert_only_the_new_turn, assert_told_cancelled, replace_turn
from .test_workflow import ALICE, events


async def test_a_withdrawn_question_that_propagates_cancels_the_call(tmp_path: Path) -> None:
    bodies = 0

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Choose a plan; lets a withdrawal propagate."""
        nonlocal bodies
        bodies += 1
        a = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
        return a.value

    seen = Capture(reply("Okay, I'll stop."))
    agent = scripted_agent("sales", [call_tools(call("pick", call_id="p1")), seen], tools=[pick])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        [req] = r.pending
        r = await rt.send(r.session_id, "actually, cancel my account", principal=ALICE)
        assert r.status == "completed"
        assert bodies == 2  # re-ran once, and its ask raised QuestionWithdrawn
        log = await events(rt, r.session_id)
        assert timeline(log)[3:] == [
            "tool.started pick",
            "input.requested question:Which plan?",
            "turn.waiting",
            "input.resolved cancelled",
            "turn.message actually, cancel my account",
            "tool.completed pick cancelled",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        resolved = next(e for e in log if e.type == "input.resolved")
        assert resolved.data["request_id"] == req.id
        assert resolved.data["status"] == "withdrawn"
        # the model reads the message once the call settled: result first, then the message
        kinds = [(m.kind, getattr(m, "text", None)) for m in seen.last]
        assert kinds == [
            ("user", "upgrade me"),
            ("assistant", ""),
            ("tool", None),
            ("user", "actually, cancel my account"),
        ]
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert result.content["cancelled"] is True


async def test_steering_sets_the_abort_signal_of_a_running_workflow_call(
    tmp_path: Path,
) -> None:
    entered = asyncio.Event()

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is steered."""
        entered.set()
        await asyncio.wait_for(ctx.abort_signal.wait(), timeout=10)
        return "stopped early"

    seen = Capture(reply("Stopped; what next?"))
    agent = scripted_agent("bot", [call_tools(call("crawl")), seen], tools=[crawl])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        steered = await rt.send(sid, "stop, I found it", principal=ALICE)
        r = await running
        assert r.status == "completed"
        assert steered.status == "completed"
        assert r.text == "Stopped; what next?"
        [result] = tool_results(seen.last)
        assert result.content == "stopped early"
        assert [getattr(m, "text", None) for m in seen.last][-1] == "stop, I found it"
        assert timeline(await events(rt, sid))[1:] == [
            "turn.started",
            "model.completed",
            "tool.started crawl",
            "turn.message stop, I found it",
            "tool.completed crawl ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]


async def test_cancelling_sets_the_abort_signal_and_calls_no_model(tmp_path: Path) -> None:
    entered = asyncio.Event()
    aborted = asyncio.Event()

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is cancelled."""
        entered.set()
        await asyncio.wait_for(ctx.abort_signal.wait(), timeout=10)
        aborted.set()
        return "stopped early"

    model_calls = 0

    def never(conversation: list[so.Message]) -> so.ModelResponse:
        nonlocal model_calls
        model_calls += 1
        return reply("should not be called")

    agent = scripted_agent("bot", [call_tools(call("crawl")), never], tools=[crawl])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        c = await rt.cancel(sid, reason="user left")
        assert c.status == "cancelled"
        r = await running
        assert aborted.is_set()
        assert r.status == "cancelled"
        assert model_calls == 0
        tl = timeline(await events(rt, sid))
        assert tl[-2:] == ["turn.cancelled", "session.waiting"]
        assert "tool.completed crawl ok" not in tl


async def test_abort_signal_is_set_for_steered_calls_and_clear_for_the_next_ones(
    tmp_path: Path,
) -> None:
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

    agent = scripted_agent(
        "bot",
        [call_tools(call("pick")), call_tools(call("probe")), reply("ok")],
        tools=[pick, probe],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("bot", prompt="go", auth=ALICE)
        r = await rt.send(r.session_id, "something else", principal=ALICE)
        assert r.status == "completed"
        # the steered re-run sees it set; the model read the message; the next call starts clear
        assert seen == [("pick", False), ("pick", True), ("probe", False)]


async def test_a_call_proposed_after_a_steer_mid_run_starts_with_a_clear_signal(
    tmp_path: Path,
) -> None:
    entered = asyncio.Event()
    probes: list[bool] = []

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is steered."""
        entered.set()
        await asyncio.wait_for(ctx.abort_signal.wait(), timeout=10)
        return "stopped early"

    @so.tool
    async def probe(ctx: so.ToolContext) -> str:
        """Reports whether its abort signal is set."""
        probes.append(ctx.abort_signal.is_set())
        return "probed"

    agent = scripted_agent(
        "bot",
        [call_tools(call("crawl")), call_tools(call("probe")), reply("done")],
        tools=[crawl, probe],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        await rt.send(sid, "stop, probe instead", principal=ALICE)
        r = await asyncio.wait_for(running, timeout=10)
        assert r.status == "completed"
        assert probes == [False]  # the steer was for crawl, not for what the model did next


async def test_a_step_whose_turn_was_replaced_meanwhile_records_nothing_into_the_new_one(
    store_url: str,
) -> None:
    """While a step's function runs, another process cancels the turn and starts a new one
    (left running: this process holds the lease). The step's record finds its turn replaced:
    nothing of it lands in the new turn, a body that catches that runs no further step, and
    the new turn runs normally."""
    charged: list[str] = []
    sent: list[str] = []
    caught: list[str] = []
    new_turn: list[str] = []
    sid = ""

    @so.tool
    async def checkout(ctx: so.ToolContext) -> str:
        """Charge, then send the receipt."""

        async def charge() -> str:
            new_turn.append(await replace_turn(other, sid))
            charged.append("card")
            return "charged"

        try:
            await ctx.step("charge", charge)
        except Exception as exc:  # a body that catches too much goes on
            caught.append(type(exc).__name__)
        await ctx.step("receipt", sent.append, "receipt")
        return "done"

    def agent() -> so.Agent:
        script = [call_tools(call("checkout", call_id="c1")), reply("Tried again.")]
        return scripted_agent("shop", script, tools=[checkout])

    async with (
        so.Runtime([agent()], store=store_url) as rt,
        so.Runtime([agent()], store=store_url, lease_wait=0) as other,
    ):
        sid = await rt.create_session("shop", auth=ALICE)
        first = await rt.generate(session_id=sid, prompt="Check out", auth=ALICE)
        # This process drove the new turn once its own stopped; its caller is told its turn ended.
        await assert_told_cancelled(rt, sid, first, new_turn[0], "Tried again.")
        assert (charged, caught, sent) == (["card"], ["TurnStopped"], [])
        await assert_only_the_new_turn(rt, sid, new_turn[0])
        assert "tool.step checkout:charge" not in timeline(await events(rt, sid))


async def test_a_body_that_goes_on_after_its_turn_was_cancelled_runs_no_further_step(
    store_url: str,
) -> None:
    """Another process cancels the turn while a step's function runs; the body catches what its
    step raises and goes on to the next step. That step's function never runs: its effect could
    not be recorded on a cancelled turn, and would be run again by nobody."""
    sent: list[str] = []
    caught: list[str] = []
    sid = ""

    @so.tool
    async def checkout(ctx: so.ToolContext) -> str:
        """Charge, then send the receipt."""

        async def charge() -> str:
            assert (await other.cancel(sid, "changed my mind")).status == "cancelled"
            return "charged"

        try:
            await ctx.step("charge", charge)
        except Exception as exc:  # a body that catches too much goes on
            caught.append(type(exc).__name__)
        await ctx.step("receipt", sent.append, "receipt")
        return "done"

    agent = scripted_agent("shop", [call_tools(call("checkout", call_id="c1"))], tools=[checkout])
    async with (
        so.Runtime([agent], store=store_url) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0) as other,
    ):
        sid = await rt.create_session("shop", auth=ALICE)
        first = await rt.generate(session_id=sid, prompt="Check out", auth=ALICE)
        assert first.status == "cancelled"
        assert (caught, sent) == (["TurnStopped"], [])
        log = timeline(await events(rt, sid))
        assert log[-2:] == ["turn.cancelled", "session.waiting"], log
        assert await rt.verify_audit(sid) == []
