"""A tool, step or policy that raises `SystemExit` (an `argparse` parser given bad arguments, a
CLI's `main()`, a stray `sys.exit()`): its failure, not the end of the process running every
session (the event loop lets `SystemExit` through, out of `asyncio.run` or the server)."""

from __future__ import annotations

import argparse
import re
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import pytest
from pydantic import AfterValidator

import signoff as so
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)


def report(args: str) -> str:
    parser = argparse.ArgumentParser(prog="report", add_help=False)
    parser.add_argument("--days", type=int, required=True)
    return f"days={parser.parse_args(args.split()).days}"


async def test_a_tool_that_exits_fails_its_call_and_the_turn_goes_on(tmp_path: Path) -> None:
    """The sync tool's `SystemExit(2)` crossed the thread into the loop and out of
    `asyncio.run`: every session of the process stopped with it."""

    @so.tool
    def run_report(args: str) -> str:
        """Run the report CLI."""
        return report(args)

    @so.tool
    async def quit_now() -> str:
        """Leave."""
        sys.exit(3)

    seen = Capture(reply("Sorry."))
    calls = call_tools(call("run_report", args="--weeks 2"), call("quit_now"))
    agent = scripted_agent("ops", [calls, seen], tools=[run_report, quit_now])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="report")
        assert r.status == "completed", r
    bad_args, exited = tool_results(seen.last)
    assert bad_args.is_error and "SystemExit(2)" in str(bad_args.content)
    assert exited.is_error and "SystemExit(3)" in str(exited.content)


async def test_a_step_that_exits_is_journaled_as_its_failure(tmp_path: Path) -> None:
    """A step's `SystemExit` is its failure like any other: the tool may catch it, and the
    replay raises it again rather than running the step again."""
    runs: list[str] = []

    def parse(args: str) -> str:
        runs.append(args)
        return report(args)

    @so.tool
    async def run_report(ctx: so.ToolContext, args: str) -> str:
        """Run the report CLI, or ask for the days."""
        try:
            return str(await ctx.step("parse", parse, args))
        except RuntimeError as exc:
            answer = await ctx.ask(f"{exc}: how many days?")
            return f"days={answer.value}"

    seen = Capture(reply("Done."))
    agent = scripted_agent(
        "ops", [call_tools(call("run_report", args="--weeks 2")), seen], tools=[run_report]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="report")
        assert r.status == "waiting", r
        assert "SystemExit(2)" in str(r.pending[0].question)
        r = await rt.send(r.session_id, "7")
        assert r.status == "completed", r
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, "days=7")
    assert runs == ["--weeks 2"]


async def test_a_policy_that_exits_asks_a_person(tmp_path: Path) -> None:
    """A policy's `SystemExit` is its failure: the call fails closed, to a person."""

    def policy(ctx: so.ApprovalContext) -> bool:
        sys.exit(1)

    @so.tool(approval=policy)
    async def refund(order_id: str) -> str:
        """Refund."""
        return order_id

    agent = scripted_agent(
        "ops", [call_tools(call("refund", order_id="1")), reply("ok")], tools=[refund]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="refund")
        assert r.status == "waiting", r
        assert "SystemExit(1)" in str(r.pending[0].policy_error)


async def test_a_model_that_exits_fails_the_turn_retryably(tmp_path: Path) -> None:
    """A scripted step (or a custom model) that calls `sys.exit()`: the turn fails, retryable,
    naming it, as for any other error of the model."""

    def leave(conversation: list[so.Message]) -> so.ModelResponse:
        sys.exit(4)

    async with sqlite_runtime(tmp_path, scripted_agent("ops", [leave])) as rt:
        r = await rt.generate("ops", prompt="hi")
    assert (r.status, r.retryable) == ("failed", True)
    assert r.error is not None and "SystemExit(4)" in r.error["message"]


def _checked(args: str) -> str:
    if args == "--bad":
        sys.exit(2)  # as `argparse` does on arguments it cannot parse
    return args


@so.tool
async def run_checked(args: Annotated[str, AfterValidator(_checked)]) -> str:
    """Run the report CLI with checked arguments."""
    return args


async def test_a_validator_that_exits_is_invalid_input_the_model_reads(tmp_path: Path) -> None:
    """Its `SystemExit(2)` escaped `Tool.validate`, which turned only an `Exception` into invalid
    input: `generate` raised it, the session stayed `running`, and each resume raised it again
    (out of `asyncio.run`, or the server's loop)."""
    seen = Capture(reply("Sorry."))
    agent = scripted_agent(
        "ops", [call_tools(call("run_checked", args="--bad")), seen], tools=[run_checked]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="report")
        assert r.status == "completed", r
        [info] = await rt.sessions()
        assert info.status == "idle"
    [result] = tool_results(seen.last)
    assert result.is_error and "SystemExit(2)" in str(result.content), result


async def test_an_edit_a_validator_exits_on_is_refused(tmp_path: Path) -> None:
    """An edited input is validated by the tool's validators as the model's is: one exiting on
    it is an edit refused (`InvalidAnswer`, the request still pending), not the answering
    process's end."""
    gated = so.tool(run_checked.fn, name="run_gated", approval=so.always())
    agent = scripted_agent(
        "ops", [call_tools(call("run_gated", args="--days 2")), reply("Done.")], tools=[gated]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="report")
        [req] = r.pending
        answer = so.Decision(id=req.id, approved=True, edited_input={"args": "--bad"})
        with pytest.raises(so.InvalidAnswer, match=re.escape("SystemExit(2)")):
            await rt.generate(session_id=r.session_id, approvals=[answer])
        [still] = (await rt.state(r.session_id)).pending_requests()
        assert still.id == req.id


def _within(seconds: float, fn: Callable[[], object]) -> object:
    """`fn()`'s result, or the exception it raised, run in a thread given `seconds` to end."""
    ended: list[object] = []

    def run() -> None:
        try:
            ended.append(fn())
        except BaseException as exc:
            ended.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert ended, f"still waiting after {seconds}s"
    return ended[0]


def test_a_plain_tool_that_raises_keyboard_interrupt_fails_its_call(tmp_path: Path) -> None:
    """Raised in its thread (a Ctrl-C reaches the main thread, not that one), it crossed into
    the sync API's loop and ended it: `generate_sync` waited for ever."""

    @so.tool
    def stop() -> str:
        """Stop."""
        raise KeyboardInterrupt

    seen = Capture(reply("Sorry."))
    agent = scripted_agent("ops", [call_tools(call("stop")), seen], tools=[stop])
    with sqlite_runtime(tmp_path, agent) as rt:
        r = _within(20, lambda: rt.generate_sync("ops", prompt="stop"))
        assert isinstance(r, so.GenerateResult) and r.status == "completed", r
    (result,) = tool_results(seen.last)
    assert result.is_error and "KeyboardInterrupt" in str(result.content)


def test_an_async_tool_that_raises_keyboard_interrupt_interrupts_the_caller(
    tmp_path: Path,
) -> None:
    """On the sync API's loop it ended the loop's thread: the call, and every later one of the
    runtime, waited for ever. It reaches the caller now, as from `asyncio.run`."""

    @so.tool
    async def stop() -> str:
        """Stop."""
        raise KeyboardInterrupt

    agent = scripted_agent("ops", [call_tools(call("stop")), reply("Sorry.")], tools=[stop])
    with sqlite_runtime(tmp_path, agent) as rt:
        r = _within(20, lambda: rt.generate_sync("ops", prompt="stop"))
        assert isinstance(r, KeyboardInterrupt), r
        sessions = _within(20, lambda: rt.pending_sync())
        assert not isinstance(sessions, BaseException), sessions  # the loop still runs


class Abort(BaseException):
    """A library's own kind that is no `Exception` (gevent's `Timeout`, a job runner's abort)."""


async def test_a_tool_that_raises_another_base_exception_fails_its_call_once(
    tmp_path: Path,
) -> None:
    """It left `body_ended`: `generate` raised it, the session stayed `running`, and each
    resume (a worker's, at each lease lapse) ran the body again. Now it is the call's error, as
    a `SystemExit` is: an async body's on the loop, a plain one's from its thread."""
    runs: list[str] = []

    @so.tool
    async def on_loop() -> str:
        """Time out."""
        runs.append("loop")
        raise Abort("timed out")

    @so.tool
    def in_thread() -> str:
        """Time out."""
        runs.append("thread")
        raise Abort

    seen = Capture(reply("Sorry."))
    calls = call_tools(call("on_loop"), call("in_thread"))
    agent = scripted_agent("ops", [calls, seen], tools=[on_loop, in_thread])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="go")
        assert r.status == "completed", r
        [info] = await rt.sessions()
        assert info.status == "idle"
        assert (await rt.generate(session_id=r.session_id)).status == "completed"
    looped, threaded = tool_results(seen.last)
    assert looped.is_error and "the function raised Abort: timed out" in str(looped.content)
    assert threaded.is_error and "the function raised Abort" in str(threaded.content)
    assert sorted(runs) == ["loop", "thread"]


async def test_a_step_or_policy_that_raises_another_base_exception_fails_as_for_exit(
    tmp_path: Path,
) -> None:
    """A step's is journaled as its failure, which the tool may catch; a policy's asks a
    person."""
    steps: list[str] = []

    async def fetch() -> str:  # on the loop: a plain one's thread is the tool's above
        steps.append("fetch")
        raise Abort("slow")

    @so.tool
    async def report(ctx: so.ToolContext) -> str:
        """Report."""
        try:
            return str(await ctx.step("fetch", fetch))
        except RuntimeError as exc:
            return f"failed: {exc}"

    def policy(ctx: so.ApprovalContext) -> bool:
        raise Abort

    @so.tool(approval=policy)
    async def refund(order_id: str) -> str:
        """Refund."""
        return order_id

    seen = Capture(reply("ok"))
    calls = call_tools(call("report"), call("refund", order_id="1"))
    agent = scripted_agent("ops", [calls, seen], tools=[report, refund])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="go")
        assert r.status == "waiting", r
        [req] = r.pending
        assert "the function raised Abort" in str(req.policy_error)
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=req.id, approved=True)]
        )
        assert r.status == "completed", r
    reported, _ = tool_results(seen.last)
    assert reported.content == "failed: the function raised Abort: slow"
    assert steps == ["fetch"]


def _aborting(args: str) -> str:
    if args == "--slow":
        raise Abort("slow")
    return args


async def test_a_validator_that_raises_another_base_exception_is_invalid_input(
    tmp_path: Path,
) -> None:
    """As its `SystemExit`: it escaped `Tool.validate`, and the session stayed `running`."""

    @so.tool
    async def run_aborting(args: Annotated[str, AfterValidator(_aborting)]) -> str:
        """Run."""
        return args

    seen = Capture(reply("Sorry."))
    agent = scripted_agent(
        "ops", [call_tools(call("run_aborting", args="--slow")), seen], tools=[run_aborting]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="report")
        assert r.status == "completed", r
    [result] = tool_results(seen.last)
    assert result.is_error and "the function raised Abort: slow" in str(result.content), result
