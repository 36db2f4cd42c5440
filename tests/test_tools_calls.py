"""Running tools: validated input, context, sync tools off the event loop, results made JSON-able,
exceptions and cancellation, approval payloads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import signoff as so
import signoff._tool_calls
from signoff.testing import (
    Capture,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)


@dataclasses.dataclass
class Receipt:
    order_id: str
    amount: float


class Summary(BaseModel):
    ok: bool
    receipts: list[Receipt]


async def test_validated_input_reaches_the_tool(tmp_path: Path) -> None:
    received: list[tuple[Any, ...]] = []

    @so.tool
    async def refund(order_id: str, amount: float, express: bool = False) -> str:
        """Refund."""
        received.append((order_id, amount, express))
        return "ok"

    agent = scripted_agent(
        "a", [call_tools(call("refund", order_id="7", amount="12.5")), reply("ok")], tools=[refund]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        await rt.generate("a", prompt="go")
    assert received == [("7", 12.5, False)]
    assert isinstance(received[0][1], float)


async def test_tool_context_is_passed_when_asked_for(tmp_path: Path) -> None:
    contexts: list[so.ToolContext] = []

    @so.tool
    async def annotated(ctx: so.ToolContext, x: int) -> int:
        """Annotated context."""
        contexts.append(ctx)
        return x

    @so.tool
    def by_name(ctx, x: int) -> int:
        """Context by name, sync body."""
        contexts.append(ctx)
        return x

    assert "ctx" not in annotated.json_schema()["properties"]
    assert "ctx" not in by_name.json_schema()["properties"]
    alice = so.Principal(authenticator="test", principal_id="alice")
    agent = scripted_agent(
        "a",
        [
            call_tools(call("annotated", x=1, call_id="c1"), call("by_name", x=2, call_id="c2")),
            reply("ok"),
        ],
        tools=[annotated, by_name],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=alice)
    first, second = contexts
    assert first.call_id == "c1" and second.call_id == "c2"
    assert first.tool_name == "annotated"
    assert first.session.id == r.session_id
    assert first.session.turn == r.turn_id
    assert first.session.auth.current == alice
    key = first.idempotency_key()
    assert key.startswith(f"{r.session_id}:") and key.endswith(":c1")
    assert first.idempotency_key("charge") == f"{key}:charge"
    assert second.idempotency_key() != key
    assert not first.abort_signal.is_set()


def _keyed_tool(keys: dict[tuple[str, str | None], str]) -> so.Tool:
    """A tool that records the key its call is given (`label` None) or the named one."""

    @so.tool
    async def keyed(ctx: so.ToolContext, label: str | None = None) -> str:
        """Send something once, keyed."""
        keys[(ctx.call_id, label)] = ctx.idempotency_key(label)
        return "sent"

    return keyed


async def test_no_two_calls_of_a_response_share_an_idempotency_key(tmp_path: Path) -> None:
    """A key was `session:response:call id`, a named one that and `:name`: call `a` asking for
    `x` got call `a:x`'s own key, and an external system deduping on it skipped one refund.
    A call id's `%` and `:` are escaped now, so no two calls' keys are alike."""
    keys: dict[tuple[str, str | None], str] = {}
    calls = [("a", "x"), ("a:x", None), ("b", "x:y"), ("b:x", "y"), ("b%3Ax", "y")]
    agent = scripted_agent(
        "a",
        [call_tools(*(call("keyed", call_id=c, label=n) for c, n in calls)), reply("ok")],
        tools=[_keyed_tool(keys)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
    assert r.status == "completed"
    assert set(keys) == set(calls)
    assert len(set(keys.values())) == len(calls), keys
    sid = r.session_id
    assert keys[("a", "x")] == f"{sid}:1:a:x"
    assert keys[("a:x", None)] == f"{sid}:1:a%3Ax"
    assert keys[("b%3Ax", "y")] == f"{sid}:1:b%253Ax:y"


async def test_an_ordinary_call_id_keeps_the_key_it_always_had(tmp_path: Path) -> None:
    keys: dict[tuple[str, str | None], str] = {}
    ids = ["call_abc", "toolu_01A09q90qw90lq917835lq9", "call_7-x.y"]
    agent = scripted_agent(
        "a",
        [call_tools(*(call("keyed", call_id=c, label="charge") for c in ids)), reply("ok")],
        tools=[_keyed_tool(keys)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        started = [e async for e in rt.events(r.session_id, follow=False)]
    assert keys == {(c, "charge"): f"{r.session_id}:1:{c}:charge" for c in ids}
    recorded = [e.data["idempotency_key"] for e in started if e.type == "tool.started"]
    assert recorded == [f"{r.session_id}:1:{c}" for c in ids]


async def test_a_call_recorded_with_an_older_key_runs_again_with_that_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call an older signoff started (its key recorded on `tool.started`, the call id's `:`
    unescaped) and parked on a question runs again, after the upgrade, with that same key and
    the same named keys: the external system it keys dedupes the run that follows."""
    runs: list[tuple[str, str]] = []

    @so.tool
    async def refund(ctx: so.ToolContext, order_id: str) -> str:
        """Refund an order once the customer confirms."""
        runs.append((ctx.idempotency_key(), ctx.idempotency_key("refund")))
        answer = await ctx.ask(f"Refund order {order_id}?", options=["yes", "no"])
        return answer.value

    agent = scripted_agent(
        "a",
        [call_tools(call("refund", call_id="functions.refund:0", order_id="7")), reply("ok")],
        tools=[refund],
    )

    def older(session_id: str, response: int, call_id: str) -> str:
        return f"{session_id}:{response}:{call_id}"  # the form before escaping

    monkeypatch.setattr(signoff._tool_calls, "call_key", older)
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="refund 7")
    assert r.status == "waiting"
    monkeypatch.undo()  # the upgrade: a new process reads the parked turn from the store
    async with sqlite_runtime(tmp_path, agent) as rt:
        answer = so.InputResponse(request_id=r.pending[0].id, option_id="yes")
        done = await rt.respond(r.session_id, [answer])
    assert done.status == "completed"
    old = f"{r.session_id}:1:functions.refund:0"
    assert runs == [(old, f"{old}:refund")] * 2


async def test_sync_tools_run_off_the_event_loop(tmp_path: Path) -> None:
    threads: list[str] = []

    @so.tool
    def blocking(x: int) -> int:
        """Blocking."""
        threads.append(threading.current_thread().name)
        return x + 1

    seen = Capture()
    agent = scripted_agent("a", [call_tools(call("blocking", x=1)), seen], tools=[blocking])
    async with sqlite_runtime(tmp_path, agent) as rt:
        await rt.generate("a", prompt="go")
    assert threads and threads[0] != threading.current_thread().name
    assert tool_results(seen.last)[0].content == 2


async def test_results_are_made_json_able(tmp_path: Path) -> None:
    @so.tool
    async def refund(order_id: str) -> Summary:
        """Refund."""
        return Summary(ok=True, receipts=[Receipt(order_id=order_id, amount=1.5)])

    seen = Capture()
    agent = scripted_agent("a", [call_tools(call("refund", order_id="9")), seen], tools=[refund])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
    assert tool_results(seen.last)[0].content == {
        "ok": True,
        "receipts": [{"order_id": "9", "amount": 1.5}],
    }


async def test_nan_and_infinities_are_stored_as_null(tmp_path: Path) -> None:
    """What a tool, a step or an approval payload hands back is stored as strict JSON (SSE
    clients and browsers refuse NaN), the same in memory as read back."""
    nan, inf = float("nan"), float("inf")

    @so.tool
    async def measure(ctx: so.ToolContext, x: int) -> dict[str, Any]:
        """Measure."""
        got = await ctx.step("probe", lambda: {"ratio": nan})
        if x == 1:
            ctx.request_approval({"worst": -inf, "seen": got})
        return {"mean": nan, "range": [-inf, 1.5, inf], "probe": got}

    seen = Capture()
    agent = scripted_agent(
        "a", [call_tools(call("measure", x=1), call("measure", x=2)), seen], tools=[measure]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        (request,) = r.pending
        assert request.payload == {"worst": None, "seen": {"ratio": None}}
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=request.id, approved=True)]
        )
        assert r.status == "completed"
        events = [e async for e in rt.events(r.session_id, follow=False)]

    def strict(text: str) -> Any:
        return json.loads(text, parse_constant=lambda c: pytest.fail(f"{c} stored"))

    for e in events:
        assert strict(json.dumps(e.data)) == e.data
    results = {m.call_id: m.content for m in tool_results(seen.last)}
    assert sorted(results.values(), key=str)[-1] == {
        "mean": None,
        "range": [None, 1.5, None],
        "probe": {"ratio": None},
    }


async def test_tool_exception_becomes_an_error_result(tmp_path: Path) -> None:
    @so.tool
    async def flaky(x: int) -> int:
        """Fails."""
        raise RuntimeError("payment provider timeout")

    seen = Capture(reply("the provider timed out"))
    agent = scripted_agent("a", [call_tools(call("flaky", x=1)), seen], tools=[flaky])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
    (result,) = tool_results(seen.last)
    assert result.is_error
    assert "payment provider timeout" in str(result.content)


async def test_stop_iteration_from_a_sync_tool_or_step_is_an_error_not_a_hang(
    store_url: str,
) -> None:
    """A sync function runs in a thread, whose `StopIteration` (an exhausted `next()`) asyncio
    cannot hand to the task awaiting it: the drive waited for ever. It is a `RuntimeError` the
    model reads, as a coroutine makes it, and a step's is journaled so."""
    ran: list[str] = []

    @so.tool
    def first(x: int) -> int:
        """The first of nothing."""
        ran.append("tool")
        return int(next(iter([])))

    @so.tool
    async def stepping(ctx: so.ToolContext, x: int) -> str:
        """A step takes the first of nothing."""
        try:
            await ctx.step("first", next, iter([]))
        except RuntimeError as exc:
            ran.append("step")
            return f"caught {exc}"
        return "not raised"

    seen = Capture(reply("done"))
    agent = scripted_agent(
        "a", [call_tools(call("first", x=1), call("stepping", x=1)), seen], tools=[first, stepping]
    )
    async with so.Runtime([agent], store=store_url) as rt:
        async with asyncio.timeout(20):
            r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
        events = [e async for e in rt.events(r.session_id, follow=False)]
    assert ran == ["tool", "step"]
    tool, step = tool_results(seen.last)
    assert tool.is_error
    assert tool.content == {"error": "RuntimeError: the function raised StopIteration"}
    assert (step.is_error, step.content) == (False, "caught the function raised StopIteration")
    [journaled] = [e.data["error"] for e in events if e.type == "tool.step"]
    assert (journaled["type"], journaled["message"]) == (
        "RuntimeError",
        "the function raised StopIteration",
    )


async def test_arguments_named_fn_or_name_reach_the_tool_and_the_step(tmp_path: Path) -> None:
    """A tool's parameter named `fn`, and a step function's keyword argument named `name` or
    `fn`, reach the function: they were taken for signoff's own parameters (a `TypeError` of
    `called_off_loop()` or `ToolContext.step()` every call)."""
    ran: list[tuple[str, str]] = []

    @so.tool
    def plot(fn: str) -> str:
        """Plot a function."""
        return f"plotted {fn}"

    @so.tool
    async def aplot(fn: str) -> str:
        """Plot a function."""
        return f"plotted {fn}"

    def create(name: str, fn: str) -> str:
        ran.append((name, fn))
        return f"{name}:{fn}"

    async def acreate(name: str, fn: str) -> str:
        return create(name, fn)

    @so.tool
    async def onboard(ctx: so.ToolContext) -> list[str]:
        """Create two users, then confirm."""
        made = [
            await ctx.step("create", create, name="alice", fn="admin"),
            await ctx.step("acreate", acreate, "bob", fn="viewer"),
        ]
        await ctx.ask("Confirm?", options=["yes", "no"])
        return made

    seen = Capture(reply("done"))
    calls = call_tools(call("plot", fn="sin"), call("aplot", fn="cos"), call("onboard"))
    agent = scripted_agent("a", [calls, seen], tools=[plot, aplot, onboard])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert [p.question for p in r.pending] == ["Confirm?"]
        r = await rt.send(r.session_id, "yes")
        assert r.status == "completed"
    contents = [(t.is_error, t.content) for t in tool_results(seen.last)]
    assert contents == [
        (False, "plotted sin"),
        (False, "plotted cos"),
        (False, ["alice:admin", "bob:viewer"]),
    ]
    assert ran == [("alice", "admin"), ("bob", "viewer")]  # once each: replayed after the answer


async def test_a_tool_raising_cancelled_error_itself_is_an_error_result(tmp_path: Path) -> None:
    # Nothing cancelled the turn: the body raised CancelledError on its own (an inner task it
    # awaited was cancelled, say). That is the call's error, not a turn left running for good.
    @so.tool
    async def inner(x: int) -> int:
        """Awaits a task someone else cancelled."""
        raise asyncio.CancelledError("the upload was cancelled")

    seen = Capture(reply("the upload stopped"))
    agent = scripted_agent("a", [call_tools(call("inner", x=1)), seen], tools=[inner])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert (r.status, r.text) == ("completed", "the upload stopped")
        [summary] = await rt.sessions()
        assert summary.status == "idle"
    (result,) = tool_results(seen.last)
    assert result.is_error
    assert "CancelledError: the upload was cancelled" in str(result.content)


async def test_a_caller_that_stops_waiting_stops_the_tool_body_too(tmp_path: Path) -> None:
    # The task driving the turn is cancelled (a timeout around generate, a client gone): the
    # body is cancelled with it, not left running unseen, journaling after its drive ended.
    seen: list[str] = []
    release = asyncio.Event()
    waiting: list[asyncio.Timeout] = []  # the caller's wait, which ends soon after the body starts

    @so.tool
    async def upload(ctx: so.ToolContext) -> str:
        """Uploads a file."""
        seen.append("started")
        if waiting:  # the first run's caller
            waiting.pop().reschedule(asyncio.get_running_loop().time() + 0.05)
        try:
            await release.wait()
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        seen.append(await ctx.step("send", lambda: "sent"))
        return "uploaded"

    agent = scripted_agent("a", [call_tools(call("upload")), reply("done")], tools=[upload])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("a")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(10) as wait:  # not counting the drive to the body
                waiting.append(wait)
                await rt.generate(session_id=sid, prompt="go")
        assert seen == ["started", "cancelled"]
        release.set()
        await asyncio.sleep(0.05)
        types = [e.type async for e in rt.events(sid, follow=False)]
        assert types[-1] == "tool.started" and "tool.step" not in types
        r = await rt.generate(session_id=sid)  # the interrupted call runs again, as after a crash
        assert (r.status, r.text) == ("completed", "done")
        assert seen == ["started", "cancelled", "started", "sent"]


async def test_request_approval_payload_must_be_json_able(tmp_path: Path) -> None:
    @so.tool
    async def wire(ctx: so.ToolContext, amount: float) -> str:
        """Wire."""
        ctx.request_approval({"lock": threading.Lock()})

    seen = Capture()
    agent = scripted_agent("a", [call_tools(call("wire", amount=1)), seen], tools=[wire])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
        assert r.pending == []
    (result,) = tool_results(seen.last)
    assert result.is_error
    assert "JSON" in str(result.content)


def test_approval_required_is_a_signal_not_an_error() -> None:
    signal = so.ApprovalRequired({"action": "refund"})
    assert signal.payload == {"action": "refund"}
    assert not isinstance(signal, so.SignoffError)
    import pickle

    assert pickle.loads(pickle.dumps(signal)).payload == {"action": "refund"}
