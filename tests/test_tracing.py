"""OpenTelemetry traces (`_tracing`): the spans of drives, model calls and tool bodies, read
back from the SDK's in-memory exporter; and signoff unchanged without OpenTelemetry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import signoff as so
from signoff._model_step import ModelStep
from signoff._tracing import tracing_for
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, sqlite_runtime

from ._procs import query
from .test_audit import alter

SECRET = "card 4111-1111-1111-1111"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


@so.tool(approval=so.always())
async def refund(order: str, amount: float) -> str:
    """Refund an order."""
    return f"refunded {amount} on {order} for {SECRET}"


@so.tool
async def lookup(order: str) -> str:
    """Look an order up."""
    return f"order {order}: {SECRET}"


@so.tool
async def broken(order: str) -> str:
    """Always fails."""
    raise RuntimeError("the bank is down")


def _agent() -> so.Agent:
    usage = so.Usage(input_tokens=120, output_tokens=30, cost_usd=0.002)
    return scripted_agent(
        "support",
        [
            call_tools(
                call("lookup", order="A1"), call("refund", order="A1", amount=5.0), usage=usage
            ),
            reply("done", usage=so.Usage(input_tokens=200, output_tokens=5)),
        ],
        tools=[lookup, refund],
        instructions="Be kind.",
    )


def _by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in spans:
        found.setdefault(span.name, []).append(span)
    return found


def _parent(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def _id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def _text_of(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> str:
    """Everything the spans carry, as text: names, attributes, events."""
    parts = []
    for s in spans:
        parts.append(s.name)
        parts.append(json.dumps(dict(s.attributes or {}), default=str))
        for e in s.events:
            parts.append(e.name + json.dumps(dict(e.attributes or {}), default=str))
    return "\n".join(parts)


async def test_a_parked_turn_resumed_by_a_new_runtime_is_two_drives_with_their_spans(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    clock = ManualClock(1_000.0)
    rt = sqlite_runtime(tmp_path, _agent(), tracer_provider=provider, clock=clock)
    r = await rt.generate("support", "refund A1")
    assert r.status == "waiting"
    await rt.close()
    first = _by_name(exporter.get_finished_spans())
    assert sorted(first) == ["chat", "execute_tool lookup", "invoke_agent support"]
    drive = first["invoke_agent support"][0]
    model = first["chat"][0]
    tool = first["execute_tool lookup"][0]
    assert drive.kind == SpanKind.INTERNAL and model.kind == SpanKind.CLIENT
    assert drive.parent is None  # no span of the caller's was current
    assert _parent(model) == _id(drive) and _parent(tool) == _id(drive)
    turn_id = r.turn_id
    assert turn_id is not None
    for span in (drive, model, tool):
        attrs = span.attributes or {}
        assert attrs["signoff.session_id"] == r.session_id == attrs["gen_ai.conversation.id"]
        assert attrs["signoff.turn_id"] == turn_id
    d = drive.attributes or {}
    assert d["gen_ai.operation.name"] == "invoke_agent" and d["gen_ai.agent.name"] == "support"
    assert d["signoff.drive.resumed"] is False and d["signoff.turn.status"] == "waiting"
    assert drive.status.status_code == StatusCode.UNSET
    (parked,) = [e for e in drive.events if e.name == "signoff.turn.parked"]
    assert parked.attributes is not None
    assert list(parked.attributes["signoff.request_ids"]) == [r.pending[0].id]  # type: ignore[arg-type]
    assert list(parked.attributes["signoff.request_kinds"]) == ["tool-approval"]  # type: ignore[arg-type]
    m = model.attributes or {}
    assert m["gen_ai.operation.name"] == "chat" and m["gen_ai.agent.name"] == "support"
    assert (m["gen_ai.usage.input_tokens"], m["gen_ai.usage.output_tokens"]) == (120, 30)
    assert m["signoff.usage.cost_usd"] == pytest.approx(0.002)
    t = tool.attributes or {}
    assert t["gen_ai.operation.name"] == "execute_tool" and t["gen_ai.tool.name"] == "lookup"
    assert t["gen_ai.tool.call.id"] and t["signoff.tool.outcome"] == "ok"

    # Days later, another process (a new Runtime on the same file) takes the approval.
    exporter.clear()
    three_days = 3 * 86_400.0
    clock.advance(three_days)
    later = sqlite_runtime(tmp_path, _agent(), tracer_provider=provider, clock=clock)
    done = await later.generate(
        session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
    )
    assert done.status == "completed" and done.turn_id == turn_id
    await later.close()
    second = _by_name(exporter.get_finished_spans())
    assert sorted(second) == ["chat", "execute_tool refund", "invoke_agent support"]
    (drive2,) = second["invoke_agent support"]
    d2 = drive2.attributes or {}
    assert d2["signoff.turn_id"] == turn_id and d2["signoff.drive.resumed"] is True
    assert d2["signoff.turn.status"] == "completed" and d2["signoff.waited_seconds"] == three_days
    (resumed,) = [e for e in drive2.events if e.name == "signoff.turn.resumed"]
    assert resumed.attributes is not None
    assert list(resumed.attributes["signoff.request_ids"]) == [r.pending[0].id]  # type: ignore[arg-type]
    assert list(resumed.attributes["signoff.request_outcomes"]) == ["approved"]  # type: ignore[arg-type]
    assert not [e for e in drive2.events if e.name == "signoff.turn.parked"]
    assert _parent(second["execute_tool refund"][0]) == _id(drive2)
    assert _parent(second["chat"][0]) == _id(drive2)


async def test_spans_carry_no_message_text_tool_input_or_result_by_default(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    rt = sqlite_runtime(tmp_path, _agent(), tracer_provider=provider)
    await rt.generate("support", f"refund A1, paid with {SECRET}")
    await rt.close()
    text = _text_of(exporter.get_finished_spans())
    assert SECRET not in text and "Be kind" not in text and "amount" not in text
    assert "gen_ai.input.messages" not in text and "gen_ai.tool.call.result" not in text


async def test_trace_content_puts_messages_tool_input_and_results_on_the_spans(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    rt = sqlite_runtime(tmp_path, _agent(), tracer_provider=provider, trace_content=True)
    await rt.generate("support", "refund A1 please")
    await rt.close()
    spans = _by_name(exporter.get_finished_spans())
    m = spans["chat"][0].attributes or {}
    sent = json.loads(str(m["gen_ai.input.messages"]))
    assert any("refund A1 please" in json.dumps(message) for message in sent)
    assert "Be kind." in str(m["gen_ai.system_instructions"])
    output = json.loads(str(m["gen_ai.output.messages"]))
    names = [p["name"] for p in output[0]["parts"] if p["type"] == "tool_call"]
    assert names == ["lookup", "refund"]
    t = spans["execute_tool lookup"][0].attributes or {}
    assert json.loads(str(t["gen_ai.tool.call.arguments"])) == {"order": "A1"}
    assert SECRET in json.loads(str(t["gen_ai.tool.call.result"]))


async def test_a_failing_tool_fails_its_span_and_the_turn_goes_on(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    agent = scripted_agent(
        "support", [call_tools(call("broken", order="A1")), reply("sorry")], tools=[broken]
    )
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider)
    r = await rt.generate("support", "go")
    await rt.close()
    assert r.status == "completed"
    spans = _by_name(exporter.get_finished_spans())
    (tool,) = spans["execute_tool broken"]
    assert tool.status.status_code == StatusCode.ERROR
    assert tool.status.description == "RuntimeError"  # its message may quote the tool input
    assert (tool.attributes or {})["error.type"] == "RuntimeError"
    (exc,) = [e for e in tool.events if e.name == "exception"]
    assert dict(exc.attributes or {}) == {"exception.type": "RuntimeError"}
    drive = spans["invoke_agent support"][0]
    assert drive.status.status_code == StatusCode.UNSET  # the model reads the error and goes on


@so.tool
async def leaky(order: str) -> str:
    """Fails with its input in the error."""
    raise ValueError(f"no order {order} for {SECRET}")


def _leaky_agent() -> so.Agent:
    """A tool failing with its input in the error, then a model failing with a message's text."""

    def fail(messages: list[so.Message]) -> so.ModelResponse:
        raise so.ModelError(f"refused: {json.dumps([m.model_dump(mode='json') for m in messages])}")

    return scripted_agent("support", [call_tools(call("leaky", order=SECRET)), fail], tools=[leaky])


def _status_and_events(spans: tuple[ReadableSpan, ...] | list[ReadableSpan]) -> str:
    """The spans' status descriptions and exception events, as text."""
    return "\n".join(
        f"{s.name} {s.status.description} "
        + json.dumps([dict(e.attributes or {}) for e in s.events], default=str)
        for s in spans
    )


async def test_errors_carry_no_message_or_stack_trace_by_default(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    rt = sqlite_runtime(tmp_path, _leaky_agent(), tracer_provider=provider)
    r = await rt.generate("support", f"refund A1, paid with {SECRET}")
    await rt.close()
    assert r.status == "failed" and r.error is not None and SECRET in str(r.error)
    finished = exporter.get_finished_spans()
    text = _text_of(finished) + _status_and_events(finished)
    assert SECRET not in text and "exception.message" not in text
    assert "exception.stacktrace" not in text
    spans = _by_name(finished)
    (tool,) = spans["execute_tool leaky"]
    assert tool.status.description == "ValueError"
    model = spans["chat"][1]  # the first proposed the call of `leaky`
    assert model.status.description == "ModelError (model_error)"
    (exc,) = [e for e in model.events if e.name == "exception"]
    assert dict(exc.attributes or {}) == {"exception.type": "signoff._exceptions.ModelError"}
    (drive,) = spans["invoke_agent support"]
    assert drive.status.status_code == StatusCode.ERROR
    assert drive.status.description == "model_error"


async def test_trace_content_records_errors_in_full(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    rt = sqlite_runtime(tmp_path, _leaky_agent(), tracer_provider=provider, trace_content=True)
    await rt.generate("support", "refund A1")
    await rt.close()
    spans = _by_name(exporter.get_finished_spans())
    (tool,) = spans["execute_tool leaky"]
    assert tool.status.description == f"ValueError: no order {SECRET} for {SECRET}"
    (exc,) = [e for e in tool.events if e.name == "exception"]
    attributes = exc.attributes or {}
    assert attributes["exception.message"] == f"no order {SECRET} for {SECRET}"
    assert "raise ValueError" in str(attributes["exception.stacktrace"])
    (drive,) = spans["invoke_agent support"]
    assert str(drive.status.description).startswith("ModelError: refused: ")


@pytest.mark.parametrize("error", [SystemExit, KeyboardInterrupt])
async def test_a_model_call_ended_by_any_base_exception_ends_its_spans(
    tmp_path: Path,
    exporter: InMemorySpanExporter,
    provider: TracerProvider,
    monkeypatch: pytest.MonkeyPatch,
    error: type[BaseException],
) -> None:
    # Raised by the step itself: from the model's own task it would stop the event loop.
    async def stop(self: object, request: object) -> None:
        raise error()

    monkeypatch.setattr(ModelStep, "_complete", stop)
    rt = sqlite_runtime(
        tmp_path, scripted_agent("support", [reply("hi")]), tracer_provider=provider
    )
    caller = provider.get_tracer("app")
    with caller.start_as_current_span("worker") as outer:
        with pytest.raises(error):
            await rt.generate("support", "go")
        assert trace.get_current_span() is outer
    await rt.close()
    spans = _by_name(exporter.get_finished_spans())
    (model,) = spans["chat"]
    assert model.status.status_code == StatusCode.ERROR
    assert (model.attributes or {})["error.type"] == error.__name__
    (drive,) = spans["invoke_agent support"]
    assert _parent(model) == _id(drive)
    assert drive.status.status_code == StatusCode.ERROR


@pytest.mark.parametrize("error", [GeneratorExit, SystemExit, KeyboardInterrupt])
def test_a_span_left_by_any_base_exception_is_ended_and_no_longer_current(
    exporter: InMemorySpanExporter, provider: TracerProvider, error: type[BaseException]
) -> None:
    tracing = tracing_for(provider, False)
    state = cast(Any, SimpleNamespace(id="s1", agent="support", turn=None))
    request = SimpleNamespace(instructions="", messages=[])
    before = trace.get_current_span()
    for start in (
        lambda: tracing.drive("s1"),
        lambda: tracing.model(state, object(), request),
        lambda: tracing.tool(state, "c1", "lookup", {}),
    ):
        span = start()
        with pytest.raises(error), span:
            assert trace.get_current_span() is span.span
            raise error()
        assert trace.get_current_span() is before
    finished = exporter.get_finished_spans()
    assert [s.name for s in finished] == ["invoke_agent", "chat", "execute_tool lookup"]
    assert all(s.status.status_code == StatusCode.ERROR for s in finished)


async def test_a_failing_model_fails_its_span_and_the_drive(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    agent = scripted_agent("support", [ConnectionError("model unavailable")])
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider)
    r = await rt.generate("support", "go")
    await rt.close()
    assert r.status == "failed" and r.retryable
    spans = _by_name(exporter.get_finished_spans())
    (model,) = spans["chat"]
    assert model.status.status_code == StatusCode.ERROR
    assert (model.attributes or {})["error.type"] == "ConnectionError"
    assert [e.name for e in model.events] == ["exception"]
    (drive,) = spans["invoke_agent support"]
    d = drive.attributes or {}
    assert drive.status.status_code == StatusCode.ERROR
    assert d["signoff.turn.status"] == "failed" and d["error.type"] == "model_error"
    assert d["signoff.turn.retryable"] is True


async def test_a_store_error_fails_the_drive_span(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    rt = sqlite_runtime(tmp_path, _agent(), tracer_provider=provider)
    await rt.open()
    commit = rt.store.commit

    async def refuse(*args: Any, **kwargs: Any) -> Any:
        if exporter.get_finished_spans():  # once the model has answered: its record fails
            raise so.StoreError("disk full")
        return await commit(*args, **kwargs)

    rt.store.commit = refuse  # type: ignore[method-assign]
    with pytest.raises(so.StoreError, match="disk full"):
        await rt.generate("support", "go")
    rt.store.commit = commit  # type: ignore[method-assign]
    await rt.close()
    (drive,) = _by_name(exporter.get_finished_spans())["invoke_agent support"]
    assert drive.status.status_code == StatusCode.ERROR
    assert (drive.attributes or {})["error.type"] == "store_error"
    assert [e.name for e in drive.events] == ["exception"]


async def test_a_lost_lease_fails_the_drive_span(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    rt = sqlite_runtime(tmp_path, _agent(), tracer_provider=provider)
    await rt.open()
    commit = rt.store.commit

    async def taken_over(*args: Any, **kwargs: Any) -> Any:
        if exporter.get_finished_spans():  # another process took the lease meanwhile
            raise so.LeaseLost("the lease is held by another owner")
        return await commit(*args, **kwargs)

    rt.store.commit = taken_over  # type: ignore[method-assign]
    r = await rt.generate("support", "go")
    rt.store.commit = commit  # type: ignore[method-assign]
    await rt.close()
    assert r.status == "running"  # another process drives the turn now
    (drive,) = _by_name(exporter.get_finished_spans())["invoke_agent support"]
    assert drive.status.status_code == StatusCode.ERROR
    assert (drive.attributes or {})["error.type"] == "lease_lost"
    assert "signoff.turn.status" not in (drive.attributes or {})


async def test_a_drive_started_in_the_callers_span_is_its_child(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    rt = sqlite_runtime(tmp_path, _agent(), tracer_provider=provider)
    caller = provider.get_tracer("app")
    with caller.start_as_current_span("POST /tickets") as outer:
        await rt.generate("support", "refund A1")
        assert trace.get_current_span() is outer  # the drive made its own span current only
    await rt.close()
    spans = _by_name(exporter.get_finished_spans())
    (request,) = spans["POST /tickets"]
    (drive,) = spans["invoke_agent support"]
    assert _parent(drive) == _id(request)
    assert drive.context is not None and request.context is not None
    assert drive.context.trace_id == request.context.trace_id


async def test_the_global_tracer_provider_is_used_by_default(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider, monkeypatch
) -> None:
    rt = sqlite_runtime(tmp_path, scripted_agent("support", [reply("hi")], repeat_last=True))
    assert (await rt.generate("support", "before any provider is set")).status == "completed"
    # As `trace.set_tracer_provider(provider)` would, for this test only (it sets it once),
    # after the runtime was made and ran its first drive with no provider.
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    await rt.generate("support", "hello")
    await rt.close()
    spans = _by_name(exporter.get_finished_spans())
    assert sorted(spans) == ["chat", "invoke_agent support"]
    (drive,) = spans["invoke_agent support"]
    assert drive.instrumentation_scope is not None
    assert (drive.instrumentation_scope.name, drive.instrumentation_scope.version) == (
        "signoff",
        so.__version__,
    )


def test_a_wrong_tracer_provider_or_trace_content_is_refused(tmp_path: Path) -> None:
    agent = scripted_agent("support", [reply("hi")])
    with pytest.raises(so.UsageError, match="TracerProvider, not str"):
        sqlite_runtime(tmp_path, agent, tracer_provider="jaeger")
    with pytest.raises(so.UsageError, match="trace_content must be True or False"):
        sqlite_runtime(tmp_path, agent, trace_content="yes")


def test_without_opentelemetry_a_turn_runs_and_nothing_of_it_is_imported(tmp_path: Path) -> None:
    code = f"""
import sys

class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"{{name}} is blocked")
        return None

sys.meta_path.insert(0, Blocked())
import signoff as so
from signoff.testing import reply, scripted_agent, sqlite_runtime

rt = sqlite_runtime({str(tmp_path)!r}, scripted_agent("a", [reply("hi")]))
r = rt.generate_sync("a", "hello")
assert r.status == "completed" and r.text == "hi", r
rt.close_sync()
assert not [m for m in sys.modules if m.startswith("opentelemetry")]
try:
    so.Runtime([], tracer_provider=object())
except so.UsageError as exc:
    print(exc)
"""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'signoff[otel]'" in done.stdout


async def test_a_tool_parked_on_a_question_and_its_answer_are_on_the_spans(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    @so.tool
    async def transfer(ctx: so.ToolContext, amount: float) -> str:
        """Move money, once the customer agrees to the fee."""
        answer = await ctx.ask("Fee is 2.5%. Proceed?", options=["yes", "no"])
        return f"sent {amount}" if answer.value == "yes" else "cancelled"

    agent = scripted_agent(
        "bank", [call_tools(call("transfer", amount=10.0)), reply("ok")], tools=[transfer]
    )
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider)
    r = await rt.generate("bank", "send 10")
    assert r.status == "waiting" and r.pending[0].kind == "question"
    first = _by_name(exporter.get_finished_spans())
    (tool,) = first["execute_tool transfer"]
    assert (tool.attributes or {})["signoff.tool.outcome"] == "asking"
    assert tool.status.status_code == StatusCode.UNSET
    (parked,) = [e for e in first["invoke_agent bank"][0].events if e.name == "signoff.turn.parked"]
    assert list((parked.attributes or {})["signoff.request_kinds"]) == ["question"]  # type: ignore[arg-type]
    exporter.clear()
    await rt.respond(r.session_id, [so.InputResponse(request_id=r.pending[0].id, option_id="yes")])
    await rt.close()
    second = _by_name(exporter.get_finished_spans())
    (drive,) = second["invoke_agent bank"]
    (resumed,) = [e for e in drive.events if e.name == "signoff.turn.resumed"]
    assert list((resumed.attributes or {})["signoff.request_ids"]) == [r.pending[0].id]  # type: ignore[arg-type]
    assert (second["execute_tool transfer"][0].attributes or {})["signoff.tool.outcome"] == "ok"


def _traceparent(span: ReadableSpan) -> str:
    """The W3C `traceparent` of a finished span."""
    c = span.context
    assert c is not None
    return f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"


async def _waiting_data(rt: so.Runtime, session_id: str) -> list[dict[str, Any]]:
    """The data of the session's `turn.waiting` events, oldest first."""
    return [e.data async for e in rt.events(session_id, follow=False) if e.type == "turn.waiting"]


async def _park(store_url: str, provider: TracerProvider | None) -> so.GenerateResult:
    async with so.Runtime([_agent()], store=store_url, tracer_provider=provider) as rt:
        r = await rt.generate("support", "refund A1")
    assert r.status == "waiting"
    return r


async def _approve(
    store_url: str, provider: TracerProvider, r: so.GenerateResult
) -> so.GenerateResult:
    """Approve `r`'s request from a new runtime, as another process days later would."""
    async with so.Runtime([_agent()], store=store_url, tracer_provider=provider) as rt:
        done = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
    assert done.status == "completed"
    return done


async def test_the_drive_that_resumes_a_parked_turn_links_to_the_drive_that_parked_it(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    r = await _park(store_url, provider)
    (parker,) = _by_name(exporter.get_finished_spans())["invoke_agent support"]
    assert not parker.links  # the turn's first drive: nothing before it
    exporter.clear()
    await _approve(store_url, provider, r)
    (drive,) = _by_name(exporter.get_finished_spans())["invoke_agent support"]
    assert drive.context is not None and parker.context is not None
    assert drive.context.trace_id != parker.context.trace_id  # a trace of its own
    (link,) = drive.links
    assert (link.context.trace_id, link.context.span_id) == (
        parker.context.trace_id,
        parker.context.span_id,
    )
    assert link.context.trace_flags == parker.context.trace_flags and link.context.is_remote
    assert dict(link.attributes or {}) == {"signoff.link": "resumed_from"}
    # What the store keeps of it: the W3C trace context, nothing else.
    async with so.Runtime([_agent()], store=store_url) as rt:
        (waiting,) = await _waiting_data(rt, r.session_id)
    assert waiting["traceparent"] == _traceparent(parker)
    assert sorted(waiting) == ["on", "request_ids", "traceparent"]


async def test_each_resume_links_to_the_drive_that_last_parked_the_turn(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    agent = scripted_agent(
        "support",
        [
            call_tools(call("refund", order="A1", amount=5.0)),
            call_tools(call("refund", order="B2", amount=7.0)),
            reply("both refunded"),
        ],
        tools=[refund],
    )
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider)
    r = await rt.generate("support", "refund A1 and B2")
    r2 = await rt.generate(
        session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
    )
    assert r2.status == "waiting"
    r3 = await rt.generate(
        session_id=r.session_id, approvals=[so.Decision(id=r2.pending[0].id, approved=True)]
    )
    assert r3.status == "completed"
    first, second, third = _by_name(exporter.get_finished_spans())["invoke_agent support"]
    assert not first.links
    assert [_id_of(link.context) for link in second.links] == [_id(first)]
    assert [_id_of(link.context) for link in third.links] == [_id(second)]
    parked = [w.get("traceparent") for w in await _waiting_data(rt, r.session_id)]
    assert parked == [_traceparent(first), _traceparent(second)]
    await rt.close()


def _id_of(context: trace.SpanContext) -> int:
    return int(context.span_id)


async def test_a_turn_parked_without_tracing_resumes_with_no_link(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    r = await _park(store_url, None)  # no provider given, and no global one set
    async with so.Runtime([_agent()], store=store_url) as rt:
        (waiting,) = await _waiting_data(rt, r.session_id)
    assert "traceparent" not in waiting  # nothing stored without tracing
    await _approve(store_url, provider, r)
    (drive,) = _by_name(exporter.get_finished_spans())["invoke_agent support"]
    assert not drive.links
    assert (drive.attributes or {})["signoff.drive.resumed"] is True


_VALID = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
_EDITS = [
    (_VALID, 0xB7AD6B7169203331),  # the control: an edit the next drive does read
    ("garbage", None),
    (42, None),
    ({"trace_id": "0af7651916cd43dd8448eb211c80319c"}, None),
    ("00-00000000000000000000000000000000-0000000000000000-01", None),  # all zeros: invalid
    ("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-zz", None),
    (_VALID.upper(), None),  # W3C ids are lower case
    (_VALID + "-", None),
    ("01" + _VALID[2:], None),  # a version this signoff does not write
]


@pytest.mark.parametrize(("edit", "linked"), _EDITS, ids=range(len(_EDITS)))
async def test_a_malformed_stored_trace_context_is_ignored(
    store_url: str,
    exporter: InMemorySpanExporter,
    provider: TracerProvider,
    edit: object,
    linked: int | None,
) -> None:
    r = await _park(store_url, provider)
    async with so.Runtime([_agent()], store=store_url) as rt:
        (waiting,) = [
            e async for e in rt.events(r.session_id, follow=False) if e.type == "turn.waiting"
        ]
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", r.session_id)
    edited = json.dumps({**waiting.data, "traceparent": edit})
    alter(
        store_url, "UPDATE {t}events SET data={p} WHERE sk={p} AND seq={p}", edited, sk, waiting.seq
    )
    exporter.clear()
    await _approve(store_url, provider, r)
    (drive,) = _by_name(exporter.get_finished_spans())["invoke_agent support"]
    assert [_id_of(link.context) for link in drive.links] == ([] if linked is None else [linked])
    assert drive.status.status_code == StatusCode.UNSET


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


async def test_trace_content_records_an_error_whose_message_cannot_be_read(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    # The SDK's record_exception reads the message: it raised out of the drive, which left the
    # turn half done (the tool's call started, its failure never recorded).
    @so.tool
    async def odd(order: str) -> str:
        """Fails with an exception whose message raises."""
        raise _Unprintable()

    def fail(messages: list[so.Message]) -> so.ModelResponse:
        raise _Unprintable()

    agent = scripted_agent("support", [call_tools(call("odd", order="A1")), fail], tools=[odd])
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True)
    r = await rt.generate("support", "go")
    await rt.close()
    assert (r.status, r.retryable) == ("failed", True)
    assert r.error is not None and "_Unprintable" in r.error["message"]
    spans = _by_name(exporter.get_finished_spans())
    (tool,) = spans["execute_tool odd"]
    assert str(tool.status.description).startswith("_Unprintable: <its message could not be read")
    (exc,) = [e for e in tool.events if e.name == "exception"]
    assert str((exc.attributes or {})["exception.type"]).endswith("_Unprintable")
    model = spans["chat"][1]
    assert model.status.status_code == StatusCode.ERROR
