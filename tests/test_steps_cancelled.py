"""A step whose own code raises a `CancelledError` (an inner future someone else cancelled, a
cancelled pool future's `.result()`) fails like any step, journaled, and replays the same; the
cancellation of the body itself (a close, a timeout around the step) still journals nothing."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from pathlib import Path

import pytest

import signoff as so
from signoff._steps import failure_of, raise_recorded
from signoff._sync import in_thread
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

from ._steps import closed_mid_call, resumed_to_the_end

ALICE = so.Principal(authenticator="okta", principal_id="alice", principal_type="user")


async def _steps_of(rt: so.Runtime, session_id: str) -> list[dict[str, object]]:
    return [e.data async for e in rt.events(session_id, follow=False) if e.type == "tool.step"]


async def test_an_async_step_raising_cancelled_error_itself_is_journaled_and_replayed(
    tmp_path: Path,
) -> None:
    """The step's function awaited a future another task cancelled; its body was not being
    cancelled. `except Exception` missed that `CancelledError`: nothing was journaled, and the
    replay after the answer found the step new (a `ReplayError`, the answer wasted)."""
    charges: list[str] = []

    async def charge(card: str) -> str:
        charges.append(card)  # the effect ran
        inner = asyncio.get_running_loop().create_future()
        inner.cancel("the bank's pool shut down")  # a library's inner task, cancelled
        await inner
        return "charged"

    @so.tool
    async def pay(ctx: so.ToolContext) -> str:
        """Charge the card, then ask whether to send a receipt."""
        try:
            how = str(await ctx.step("charge", charge, "4242"))
        except asyncio.CancelledError as exc:
            how = f"cancelled: {exc}"
        receipt = await ctx.ask("Send a receipt?", options=["yes", "no"])
        return f"{how} / {receipt.value}"

    seen = Capture(reply("Done."))
    agent = scripted_agent("shop", [call_tools(call("pay", call_id="p1")), seen], tools=[pay])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("shop", prompt="pay", auth=ALICE)
        assert [p.question for p in r.pending] == ["Send a receipt?"]
        [step] = await _steps_of(rt, r.session_id)
        assert step["error"] == {
            "module": "asyncio.exceptions",
            "type": "CancelledError",
            "message": "the bank's pool shut down",
            "args": ["the bank's pool shut down"],
        }
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, option_id="yes")],
            principal=ALICE,
        )
        assert r.status == "completed"
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (
        False,
        "cancelled: the bank's pool shut down / yes",
    )
    assert charges == ["4242"]  # not charged again on replay


async def test_a_step_cancelled_error_the_body_lets_through_is_the_calls_error(
    tmp_path: Path,
) -> None:
    """Uncaught, the step's own `CancelledError` ends the call with it as its error, as a tool
    body raising one of its own does, and the step is journaled."""

    async def upload() -> None:
        raise asyncio.CancelledError("the upload was cancelled")

    @so.tool
    async def send(ctx: so.ToolContext) -> str:
        """Upload the file."""
        await ctx.step("upload", upload)
        return "sent"

    seen = Capture(reply("It stopped."))
    agent = scripted_agent("a", [call_tools(call("send")), seen], tools=[send])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert (r.status, r.text) == ("completed", "It stopped.")
        [step] = await _steps_of(rt, r.session_id)
    [result] = tool_results(seen.last)
    assert result.is_error
    assert result.content == {"error": "CancelledError: the upload was cancelled"}
    assert step["error"]["type"] == "CancelledError"  # type: ignore[index]


def test_a_recorded_cancelled_error_is_raised_again_as_itself() -> None:
    """Replayed from its record, it is `asyncio.CancelledError` with its message; other
    `BaseException`s (`SystemExit`) are still never rebuilt."""
    error = failure_of(asyncio.CancelledError("gone"))
    with pytest.raises(asyncio.CancelledError, match="^gone$"):
        raise_recorded("s", error)
    interrupt = {"module": "builtins", "type": "KeyboardInterrupt", "message": "", "args": []}
    with pytest.raises(so.StepFailed, match="raised KeyboardInterrupt"):
        raise_recorded("s", interrupt)


def _cancelled_pool_result(message: str) -> str:
    """What `.result()` of a pool's future raises once `shutdown(cancel_futures=True)`
    cancelled it: `concurrent.futures.CancelledError`, an ordinary `Exception`."""
    future: concurrent.futures.Future[str] = concurrent.futures.Future()
    future.cancel()
    try:
        return future.result()
    except concurrent.futures.CancelledError as exc:
        raise concurrent.futures.CancelledError(message) from exc


async def test_a_plain_step_or_tool_raising_a_pools_cancelled_error_fails_by_its_name(
    tmp_path: Path,
) -> None:
    """In a thread, asyncio turned it into `asyncio.CancelledError`, a `BaseException`: the
    step went unjournaled (its replay a `ReplayError`), and a sync tool's error read
    `CancelledError: ` (class and message lost). It is a `RuntimeError` naming it, as a
    `StopIteration` is, journaled and replayed."""
    exports: list[str] = []

    def export() -> str:
        exports.append("export")
        return _cancelled_pool_result("pool shut down")

    @so.tool
    async def report(ctx: so.ToolContext) -> str:
        """Export, then ask whether to notify."""
        try:
            how = str(await ctx.step("export", export))
        except RuntimeError as exc:
            how = f"failed: {exc}"
        notify = await ctx.ask("Notify the customer?", options=["yes", "no"])
        return f"{how} / {notify.value}"

    @so.tool
    def sync_export() -> str:
        """Export in a thread."""
        return _cancelled_pool_result("pool shut down")

    named = "the function raised concurrent.futures.CancelledError: pool shut down"
    seen = Capture(reply("Done."))
    both = call_tools(call("report", call_id="r1"), call("sync_export", call_id="s1"))
    agent = scripted_agent("a", [both, seen], tools=[report, sync_export])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert [p.question for p in r.pending] == ["Notify the customer?"]
        [step] = await _steps_of(rt, r.session_id)
        assert step["error"]["type"] == "RuntimeError"  # type: ignore[index]
        assert step["error"]["message"] == named  # type: ignore[index]
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, option_id="yes")],
            principal=ALICE,
        )
        assert r.status == "completed"
    results = {m.call_id: (m.is_error, m.content) for m in tool_results(seen.last)}
    assert results == {
        "r1": (False, f"failed: {named} / yes"),
        "s1": (True, {"error": f"RuntimeError: {named}"}),
    }
    assert exports == ["export"]  # journaled: not exported again on replay


class PoolGone(concurrent.futures.CancelledError):
    """A subclass, which asyncio hands on as it is: left so."""


async def test_in_thread_names_a_pools_cancel_and_keeps_it_as_the_cause() -> None:
    with pytest.raises(RuntimeError, match="CancelledError: shut down$") as info:
        await in_thread(_cancelled_pool_result, "shut down")
    assert type(info.value.__cause__) is concurrent.futures.CancelledError

    def plain() -> None:
        raise concurrent.futures.CancelledError

    with pytest.raises(RuntimeError, match="^the function raised concurrent.futures.Cancel"):
        await in_thread(plain)

    def subclassed() -> None:
        raise PoolGone("gone")

    with pytest.raises(PoolGone, match="^gone$"):
        await in_thread(subclassed)


async def test_a_timeout_around_an_async_step_still_journals_nothing(tmp_path: Path) -> None:
    """A real cancel of the body's task (a timeout around the step) is no failure of the step:
    nothing is journaled, as before."""

    async def slow() -> str:
        await asyncio.sleep(30)
        return "late"

    @so.tool
    async def quote(ctx: so.ToolContext) -> str:
        """Quote, giving up after a moment."""
        try:
            async with asyncio.timeout(0.05):
                return str(await ctx.step("quote", slow))
        except TimeoutError:
            return "timed out"

    seen = Capture(reply("Done."))
    agent = scripted_agent("a", [call_tools(call("quote")), seen], tools=[quote])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
        assert await _steps_of(rt, r.session_id) == []
    [result] = tool_results(seen.last)
    assert (result.is_error, result.content) == (False, "timed out")


async def test_an_async_step_cancelled_by_close_is_not_journaled_and_runs_again(
    tmp_path: Path,
) -> None:
    """The drive's close cancels an async step where it awaits: its cancel goes on unjournaled,
    and the resumed turn runs the step again."""
    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    started = threading.Event()
    runs: list[str] = []

    async def charge() -> str:
        runs.append("charge")
        if len(runs) == 1:
            started.set()
            await asyncio.sleep(30)  # cancelled here by the close
        return "charged"

    @so.tool
    async def pay(ctx: so.ToolContext) -> str:
        """Charge the card."""
        return str(await ctx.step("charge", charge))

    def agent() -> so.Agent:
        return scripted_agent("shop", [call_tools(call("pay")), reply("Paid.")], tools=[pay])

    rt = so.Runtime([agent()], store=store_url, lease_ttl=600)
    turn: list[asyncio.Task[so.GenerateResult]] = []
    sid = await closed_mid_call(rt, "pay", started, turn)
    await resumed_to_the_end(agent(), store_url, sid)
    assert runs == ["charge", "charge"]
    async with so.Runtime([agent()], store=store_url) as again:
        [step] = await _steps_of(again, sid)
    assert step["result"] == "charged"
