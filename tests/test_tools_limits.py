"""Tool results and errors over their limits: results over max_result_bytes are tool errors and
not stored, messages of megabytes are cut, unreadable ones still make an error result.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

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

BIG = "x" * 2_000_000  # over the default max_result_bytes of 1 MiB


async def _answered_yes(agent: so.Agent, store_url: str) -> list[so.Event]:
    """Run the turn, answer its one question "yes", check it completed: its events."""
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate(agent.name, prompt="go")
        (question,) = r.pending
        r = await rt.respond(
            r.session_id, [so.InputResponse(request_id=question.id, option_id="yes")]
        )
        assert r.status == "completed"
        return [e async for e in rt.events(r.session_id, follow=False)]


async def test_a_result_over_the_limit_is_a_tool_error_and_is_not_stored(store_url: str) -> None:
    """One result too big for the model's context would fail every retry of the turn: it is
    refused as a tool error the model reads, and its bytes never reach the store."""

    @so.tool
    async def dump(x: int) -> str:
        """Dump everything."""
        return BIG

    seen = Capture(reply("too much, narrowing"))
    agent = scripted_agent("a", [call_tools(call("dump", x=1)), seen], tools=[dump])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
        events = [e async for e in rt.events(r.session_id, follow=False)]
    (result,) = tool_results(seen.last)
    assert result.is_error
    assert "over the limit of 1048576" in result.content["error"]
    assert "return less" in result.content["error"]
    assert max(len(json.dumps(e.data)) for e in events) < 10_000


async def test_max_result_bytes_is_set_per_tool_or_per_agent(tmp_path: Path) -> None:
    @so.tool(max_result_bytes=100)
    async def small(x: int) -> str:
        """Small."""
        return "y" * 200

    @so.tool
    async def roomy(x: int) -> str:
        """Roomy."""
        return "y" * 200

    seen = Capture()
    agent = scripted_agent(
        "a",
        [call_tools(call("small", x=1), call("roomy", x=1)), seen],
        tools=[small, roomy],
        limits=so.Limits(max_result_bytes=150),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
    small_result, roomy_result = tool_results(seen.last)
    assert "over the limit of 100 bytes" in small_result.content["error"]
    assert "over the limit of 150 bytes" in roomy_result.content["error"]
    with pytest.raises(so.UsageError, match="max_result_bytes"):
        so.Limits(max_result_bytes=0)
    with pytest.raises(so.UsageError, match="max_result_bytes"):
        so.Tool(lambda x: x, name="t", max_result_bytes=-1)


async def test_a_step_result_over_the_limit_is_journaled_as_its_failure(store_url: str) -> None:
    """A step's effect ran: its too-big result raises `ResultTooLarge`, journaled like any
    step failure, so a replay raises it again instead of running the effect twice."""
    runs: list[int] = []

    @so.tool
    async def fetch(ctx: so.ToolContext, x: int) -> str:
        """Fetch, then ask."""

        def effect() -> str:
            runs.append(x)
            return BIG

        try:
            await ctx.step("download", effect)
        except so.TooLarge as exc:
            caught = str(exc)
        answer = await ctx.ask("Proceed?", options=["yes", "no"])
        return f"{caught} / {answer.value}"

    seen = Capture()
    agent = scripted_agent("a", [call_tools(call("fetch", x=1)), seen], tools=[fetch])
    events = await _answered_yes(agent, store_url)
    assert runs == [1]
    (result,) = tool_results(seen.last)
    assert "step 'download' returned 2000002 bytes, over the limit of 1048576" in result.content
    assert max(len(json.dumps(e.data)) for e in events) < 10_000


async def test_a_step_failure_of_megabytes_is_journaled_cut(store_url: str) -> None:
    """A step that raises with a message of megabytes (an error quoting a whole response) is
    journaled cut, like a tool's error, not stored whole (twice: message and arguments); the
    replay raises `StepFailed` with the cut message, and the step runs once."""
    runs: list[int] = []
    caught: list[tuple[str, int, bool]] = []

    @so.tool
    async def fetch(ctx: so.ToolContext, x: int) -> str:
        """Fetch, then ask."""

        def effect() -> str:
            runs.append(x)
            raise ValueError(BIG)

        try:
            await ctx.step("download", effect)
        except Exception as exc:
            caught.append((type(exc).__name__, len(str(exc)), str(exc).endswith("[cut]")))
        return (await ctx.ask("Proceed?", options=["yes", "no"])).value

    agent = scripted_agent("a", [call_tools(call("fetch", x=1)), reply("ok")], tools=[fetch])
    events = await _answered_yes(agent, store_url)
    assert runs == [1]
    (step,) = [e for e in events if e.type == "tool.step"]
    assert len(json.dumps(step.data)) < 300_000
    error = step.data["error"]
    assert error["message"] == BIG[: 1048576 // 4] + " [cut]"
    assert error["args"] is None  # the message twice over, and no longer what it raised
    cut = len("step 'download' raised ValueError: ") + len(error["message"])
    assert caught == [("ValueError", len(BIG), False), ("StepFailed", cut, True)]


async def test_an_approval_payload_over_the_limit_is_a_tool_error(tmp_path: Path) -> None:
    @so.tool
    async def gate(ctx: so.ToolContext, x: int) -> str:
        """Gate."""
        ctx.request_approval({"blob": BIG})

    seen = Capture()
    agent = scripted_agent("a", [call_tools(call("gate", x=1)), seen], tools=[gate])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert (r.status, r.pending) == ("completed", [])
    (result,) = tool_results(seen.last)
    assert "over the limit of 1048576" in result.content["error"]


async def test_an_exception_message_of_megabytes_is_cut(tmp_path: Path) -> None:
    @so.tool
    async def noisy(x: int) -> str:
        """Fails loudly."""
        raise ValueError(BIG)

    seen = Capture()
    agent = scripted_agent("a", [call_tools(call("noisy", x=1)), seen], tools=[noisy])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
    (result,) = tool_results(seen.last)
    assert result.content["error"].startswith("ValueError: xxx")
    assert result.content["error"].endswith("[cut]")
    assert len(result.content["error"]) < 300_000


class Unprintable(Exception):
    """An exception whose message cannot be read: its `__str__` raises."""

    def __str__(self) -> str:
        raise RuntimeError("no message")


async def test_an_exception_whose_message_cannot_be_read_is_still_an_error_result(
    tmp_path: Path,
) -> None:
    # Formatting it raised out of the drive: the session stayed running with the call started,
    # and every later drive ran the body again and raised again.
    @so.tool
    async def broken(x: int) -> int:
        """Fails oddly."""
        raise Unprintable()

    @so.tool
    async def stepping(ctx: so.ToolContext, x: int) -> str:
        """A step fails oddly; the body catches it."""

        def fail() -> None:
            raise Unprintable()

        try:
            await ctx.step("fail", fail)
        except Unprintable:
            return "caught"
        return "not raised"

    seen = Capture(reply("done"))
    agent = scripted_agent(
        "a",
        [call_tools(call("broken", x=1), call("stepping", x=1)), seen],
        tools=[broken, stepping],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
    first, second = tool_results(seen.last)
    assert first.is_error
    assert "Unprintable" in first.content["error"]
    assert "RuntimeError" in first.content["error"]  # what its message raised, in its place
    assert (second.is_error, second.content) == (False, "caught")


HUGE = 10**5000  # more digits than Python turns into text by default (4,300)


async def test_an_integer_too_long_for_json_is_a_tool_error_and_is_not_stored(
    store_url: str,
) -> None:
    """A result, a step's result or an approval payload holding an integer past Python's digit
    limit cannot be written as JSON: each is refused as `TooLarge` (the step's journaled, so it
    is not run again), the model reads the error, and no event holds the number. It was a bare
    ValueError out of the drive, the call left started."""
    runs: list[int] = []

    @so.tool
    async def count(x: int) -> int:
        """Count everything."""
        return HUGE

    @so.tool
    async def stepping(ctx: so.ToolContext, x: int) -> str:
        """A step returns too long a number, then the body asks."""

        def effect() -> int:
            runs.append(x)
            return -HUGE

        try:
            await ctx.step("tally", effect)
        except so.TooLarge as exc:
            caught = str(exc)
        answer = await ctx.ask("Proceed?", options=["yes", "no"])
        return f"{caught} / {answer.value}"

    @so.tool
    async def gate(ctx: so.ToolContext, x: int) -> str:
        """Gate on a payload holding too long a number."""
        ctx.request_approval({"total": [HUGE]})

    seen = Capture(reply("done"))
    agent = scripted_agent(
        "a",
        [call_tools(call("count", x=1), call("stepping", x=2), call("gate", x=3)), seen],
        tools=[count, stepping, gate],
    )
    events = await _answered_yes(agent, store_url)
    assert runs == [2]
    by_tool = {m.tool_name: m for m in tool_results(seen.last)}
    counted, stepped, gated = by_tool["count"], by_tool["stepping"], by_tool["gate"]
    assert counted.is_error
    assert "TooLarge" in counted.content["error"]
    assert "an integer of 5001 digits" in counted.content["error"]
    assert not stepped.is_error
    assert "an integer of 5001 digits" in stepped.content
    assert stepped.content.endswith(" / yes")
    assert gated.is_error
    assert "an integer of 5001 digits" in gated.content["error"]
    assert max(len(json.dumps(e.data)) for e in events) < 2_000


def test_a_lowered_digit_limit_is_the_bound_of_a_result() -> None:
    """A process that lowered Python's digit limit (to 640, the least it allows) cannot write
    longer integers as JSON: a result holding one is `TooLarge` there, at any depth."""
    from signoff._tool_json import jsonable

    before = sys.get_int_max_str_digits()
    try:
        sys.set_int_max_str_digits(640)
        assert jsonable({"n": [10**640 - 1, -(10**640 - 1)]}) == {
            "n": [10**640 - 1, -(10**640 - 1)]
        }
        with pytest.raises(so.TooLarge, match="an integer of 641 digits, over the limit of 640"):
            jsonable({"n": [1, {"m": -(10**640)}]})
    finally:
        sys.set_int_max_str_digits(before)


@pytest.mark.parametrize("approved", [True, False])
async def test_an_approval_policys_reason_of_megabytes_is_cut(
    store_url: str, approved: bool
) -> None:
    """An approval policy's `Approved(reason)` reaches the model beside the call's result, its
    `Denied(reason)` as the call's result: one of megabytes went whole into a result over the
    tool's `max_result_bytes`, stored and read again by every later model call of the session.
    It is cut, as a reviewer's reason is."""
    runs: list[str] = []

    def verdict(ctx: so.ApprovalContext) -> so.Approved | so.Denied:
        why = "because " + BIG
        return so.Approved(why) if approved else so.Denied(why)

    @so.tool(approval=so.policy(verdict), max_result_bytes=4000)
    async def refund(order_id: str) -> str:
        """Refund an order."""
        runs.append(order_id)
        return "refunded"

    seen = Capture(reply("ok"))
    agent = scripted_agent("a", [call_tools(call("refund", order_id="1")), seen], tools=[refund])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
        events = [e async for e in rt.events(r.session_id, follow=False)]
    (result,) = tool_results(seen.last)
    shown = json.dumps(result.content)
    assert len(shown) < 4000
    assert "because xxx" in shown and "[cut]" in shown
    assert max(len(json.dumps(e.data)) for e in events) < 10_000
    assert runs == (["1"] if approved else [])


async def test_a_result_of_control_characters_is_bounded_as_its_json(tmp_path: Path) -> None:
    """999 control characters are 5,996 bytes of JSON (`\\u0001` each): such a result, or a
    step's, passed a bound of 4,000 bytes unmeasured, and was stored over it."""
    blob = "\x01" * 999

    @so.tool
    async def dump(ctx: so.ToolContext, via: str) -> str:
        """Dump a blob, or step it."""
        if via == "result":
            return blob
        try:
            await ctx.step("blob", lambda: blob)
        except so.TooLarge as exc:
            return str(exc)
        return "stepped"

    seen = Capture()
    agent = scripted_agent(
        "a",
        [call_tools(call("dump", via="result"), call("dump", via="step")), seen],
        tools=[dump],
        limits=so.Limits(max_result_bytes=4000),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
        events = [e async for e in rt.events(r.session_id, follow=False)]
    result, stepped = tool_results(seen.last)
    assert result.is_error
    assert "5996 bytes, over the limit of 4000 bytes" in result.content["error"]
    assert "step 'blob' returned 5996 bytes, over the limit of 4000" in stepped.content
    assert not any("\x01" * 999 in json.dumps(e.data, ensure_ascii=False) for e in events)
