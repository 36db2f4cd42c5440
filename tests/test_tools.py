"""Tool definitions: schema from hints, description from the docstring, context, validation."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)


@so.tool
async def issue_refund(order_id: str, amount: float, reason: str = "none given") -> dict[str, Any]:
    """Refund an order in full or in part.

    Amounts over 100 need a person to approve.
    """
    return {"refunded": amount}


def test_schema_from_type_hints() -> None:
    schema = issue_refund.json_schema()
    assert schema["type"] == "object"
    assert schema["properties"]["order_id"]["type"] == "string"
    assert schema["properties"]["amount"]["type"] == "number"
    assert schema["properties"]["reason"]["default"] == "none given"
    assert sorted(schema["required"]) == ["amount", "order_id"]
    assert schema.get("additionalProperties") is False
    assert "title" not in schema


def test_description_from_the_docstring_first_paragraph() -> None:
    assert issue_refund.name == "issue_refund"
    assert issue_refund.description == "Refund an order in full or in part."

    @so.tool(name="refund-v2", description="Explicit description.")
    async def other(x: int) -> int:
        """Ignored."""
        return x

    assert other.name == "refund-v2"
    assert other.description == "Explicit description."


class Address(BaseModel):
    street: str
    zip: str


@dataclasses.dataclass
class Receipt:
    order_id: str
    amount: float


class Summary(BaseModel):
    ok: bool
    receipts: list[Receipt]


def test_rich_types_in_the_schema() -> None:
    @so.tool
    def ship(to: Address, speed: Literal["slow", "fast"], items: list[str]) -> str:
        """Ship items."""
        return "shipped"

    schema = ship.json_schema()
    assert schema["properties"]["speed"]["enum"] == ["slow", "fast"]
    assert schema["properties"]["items"]["type"] == "array"
    assert "Address" in str(schema)
    validated = ship.validate({"to": {"street": "s", "zip": "1"}, "speed": "fast", "items": []})
    assert validated.to == Address(street="s", zip="1")  # type: ignore[attr-defined]


def test_bad_definitions_are_usage_errors() -> None:
    def no_hint(x):
        """No hint."""

    def var_args(*args: int) -> None:
        """Var args."""

    def var_kwargs(**kwargs: int) -> None:
        """Var kwargs."""

    def positional_only(x: int, /) -> None:
        """Positional only."""

    for fn in (no_hint, var_args, var_kwargs, positional_only):
        with pytest.raises(so.UsageError, match=fn.__name__):
            so.tool(fn)
    with pytest.raises(so.UsageError):
        so.Tool("not a function")  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="name"):
        so.tool(name="has spaces")(var_kwargs)
    with pytest.raises(so.UsageError, match="run_as"):
        so.tool(run_as="root")(positional_only)


def test_a_tool_name_the_model_apis_refuse_is_a_usage_error() -> None:
    # OpenAI and Anthropic take tool names of [a-zA-Z0-9_-]{1,64} only: any other name made
    # every model request of the agent fail with a 400, at run time.
    def réserver(x: int) -> int:
        """Book."""
        return x

    with pytest.raises(so.UsageError, match="name"):
        so.tool(réserver)
    for bad in ("x" * 65, "n²", "ｘ"):
        with pytest.raises(so.UsageError, match="name"):
            so.tool(name=bad)(réserver)
    assert so.tool(name="x" * 64)(réserver).name == "x" * 64


def test_agent_definition_errors() -> None:
    model = so.models.Scripted([reply("x")])

    @so.tool
    async def t(x: int) -> int:
        """T."""
        return x

    with pytest.raises(so.UsageError, match="name"):
        so.Agent(name="", model=model)
    with pytest.raises(so.UsageError, match="two tools"):
        so.Agent(name="a", model=model, tools=[t, t])
    with pytest.raises(so.UsageError, match="not a Tool"):
        so.Agent(name="a", model=model, tools=[lambda x: x])  # type: ignore[list-item]
    with pytest.raises(so.UsageError, match="unknown tool"):
        so.Agent(name="a", model=model, tools=[t], guardrails=[so.tool_policy(deny=["nope"])])
    with pytest.raises(so.UsageError, match="two agents"):
        so.Runtime([so.Agent(name="a", model=model), so.Agent(name="a", model=model)])


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"model": "gpt-4o"}, "model must be a signoff model"),
        ({"model": None}, "model must be a signoff model"),
        ({"instructions": 5}, "instructions must be text"),
        ({"limits": {"max_steps": 3}}, "limits must be a so.Limits"),
        ({"name": 5}, "name"),
        ({"tools": so.ask_question()}, "tools must be a list of tools, not Tool"),
        ({"guardrails": so.tool_policy(deny=["x"])}, "guardrails must be a list of guardrails"),
    ],
)
def test_an_agent_refuses_a_model_instructions_or_limits_it_cannot_use(
    setting: dict[str, Any], message: str
) -> None:
    """`Agent(model="gpt-4o")` was accepted and then every turn failed with a model_error naming
    an AttributeError; `limits={...}` made `generate` a bare AttributeError. Both, and
    instructions that are not text, are refused where the agent is defined."""
    kwargs: dict[str, Any] = {"name": "a", "model": so.models.Scripted([reply("x")]), **setting}
    with pytest.raises(so.UsageError, match=message):
        so.Agent(**kwargs)


async def test_unknown_agent_name(tmp_path: Path) -> None:
    async with sqlite_runtime(tmp_path, scripted_agent("a", [reply("x")])) as rt:
        with pytest.raises(so.UsageError, match="unknown agent 'b'"):
            await rt.generate("b", prompt="hi")
        with pytest.raises(so.UsageError):
            await rt.generate("a")  # a new session needs a prompt
        with pytest.raises(so.UsageError):
            await rt.generate(prompt="hi")  # and an agent


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
        [call_tools(call("annotated", x=1, id="c1"), call("by_name", x=2, id="c2")), reply("ok")],
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

    @so.tool
    async def upload(ctx: so.ToolContext) -> str:
        """Uploads a file."""
        seen.append("started")
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
            async with asyncio.timeout(0.2):
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


# -- the testing helpers themselves ---------------------------------------------------------------


async def test_execution_log_records_each_execution(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund."""
        return "ok"

    @log.tool
    def lookup(order_id: str) -> str:
        """Look up."""
        return "found"

    assert isinstance(refund, so.Tool) and refund.approval.describe() == "Always"
    agent = scripted_agent(
        "a",
        [call_tools(call("lookup", order_id="1"), call("refund", order_id="1")), reply("ok")],
        tools=[refund, lookup],
    )
    alice = so.Principal(authenticator="t", principal_id="alice")
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=alice)
        assert log.count() == 1 and log.count("refund") == 0
        await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=True)],
            auth=alice,
        )
    assert [e.tool_name for e in log.executions] == ["lookup", "refund"]
    (run,) = log.of("refund")
    assert run.session_id == r.session_id
    assert run.call_id == r.pending[0].call_id
    assert run.idempotency_key.startswith(f"{r.session_id}:")
    assert run.idempotency_key.endswith(f":{run.call_id}")
    assert run.input == {"order_id": "1"}
    assert run.principal_id == "alice"
    assert log.keys("refund") == [run.idempotency_key]
    log.clear()
    assert log.count() == 0


def test_file_backed_execution_log_is_shared(tmp_path: Path) -> None:
    from signoff.testing import Execution

    path = tmp_path / "executions.jsonl"
    writer, reader = ExecutionLog(path), ExecutionLog(path)
    assert reader.executions == []
    e = Execution(tool_name="t", session_id="s", call_id="c", idempotency_key="s:c", input={"a": 1})
    writer.record(e)
    writer.record(e)
    assert reader.executions == [e, e]
    assert reader.count("t") == 2
    reader.clear()
    assert writer.count() == 0


BIG = "x" * 2_000_000  # over the default max_result_bytes of 1 MiB


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
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("a", prompt="go")
        (question,) = r.pending
        r = await rt.respond(
            r.session_id, [so.InputResponse(request_id=question.id, option_id="yes")]
        )
        assert r.status == "completed"
        events = [e async for e in rt.events(r.session_id, follow=False)]
    assert runs == [1]
    (result,) = tool_results(seen.last)
    assert "step 'download' returned 2000002 bytes, over the limit of 1048576" in result.content
    assert max(len(json.dumps(e.data)) for e in events) < 10_000


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
