"""Errors on the spans (`_tracing`): a failing tool, model, store or lease fails its span, errors
carry no message or stack trace by default and in full with `trace_content`, and a span left
by any base exception is ended.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import signoff as so
from signoff._model_step import ModelStep
from signoff._tracing import tracing_for
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, sqlite_runtime

from ._tracing import (
    SECRET,
    _agent,
    _by_name,
    _id,
    _parent,
    _text_of,
    exporter,
    provider,
)

__all__ = ["exporter", "provider"]  # the fixtures, used by name


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


async def test_an_error_of_megabytes_is_cut_on_its_span_as_in_the_log(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """With content on, a tool's error quoting a page of megabytes (an upstream's error page,
    say) is not put whole on its span three times over (description, message, stack trace):
    each is cut, marked, as the log cuts what it stores."""

    @so.tool
    async def fetch(url: str) -> str:
        """Fetch a page."""
        raise RuntimeError("upstream said: " + "<p>error page</p> " * 200_000)

    agent = scripted_agent(
        "support", [call_tools(call("fetch", url="x")), reply("no")], tools=[fetch]
    )
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True)
    r = await rt.generate("support", "go")
    await rt.close()
    assert r.status == "completed"
    (tool,) = _by_name(exporter.get_finished_spans())["execute_tool fetch"]
    (exc,) = [e for e in tool.events if e.name == "exception"]
    attributes = exc.attributes or {}
    texts = [str(tool.status.description), *(str(v) for v in attributes.values())]
    assert sum(len(t) for t in texts) < 100_000  # 10.8 MB, before
    description = str(tool.status.description)
    assert description.startswith("RuntimeError: upstream said: <p>error page</p>")
    assert description.endswith(" [cut]")
    assert str(attributes["exception.message"]).startswith("upstream said: <p>error page</p>")
    assert str(attributes["exception.message"]).endswith(" [cut]")
    assert "raise RuntimeError" in str(attributes["exception.stacktrace"])
    assert attributes["exception.type"] == "RuntimeError"


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


_BILLED = so.Usage(input_tokens=1200, output_tokens=4096, cost_usd=0.05)


@so.tool
async def lookup(n: int) -> str:
    """Look up."""
    return "found"


@pytest.mark.parametrize(
    "answer",
    [
        so.ModelResponse(tool_calls=[call("lookup", n=1)], cut_off="max_tokens", usage=_BILLED),
        so.ModelError("refused after billing", usage=_BILLED),
        so.BudgetSpent("cut at the budget", usage=_BILLED),
    ],
    ids=["cut-off-with-a-call", "model-error", "budget-spent"],
)
async def test_a_reply_billed_but_refused_is_on_its_failed_span_as_in_the_sessions_usage(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider, answer: Any
) -> None:
    """The provider billed the reply, which signoff refused (cut off with a tool call, a
    `ModelError` or `BudgetSpent` carrying its `usage`): the session counts it, and so does the
    failed model span; it carried no usage at all."""
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([answer]),
        tools=[lookup],
        limits=so.Limits(max_tokens=10_000),
    )
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider)
    r = await rt.generate("support", "go")
    usage = (await rt.state(r.session_id)).usage
    await rt.close()
    assert r.status == ("waiting" if isinstance(answer, so.BudgetSpent) else "failed")
    assert (usage.input_tokens, usage.output_tokens) == (1200, 4096)
    (model,) = _by_name(exporter.get_finished_spans())["chat"]
    assert model.status.status_code == StatusCode.ERROR
    m = model.attributes or {}
    assert (m.get("gen_ai.usage.input_tokens"), m.get("gen_ai.usage.output_tokens")) == (
        1200,
        4096,
    )
    assert m["signoff.usage.cost_usd"] == pytest.approx(usage.cost_usd) == pytest.approx(0.05)
    assert "signoff.tool_calls" not in m  # the reply proposed none the turn could run


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


async def test_a_turn_failed_for_good_fails_the_drive_that_goes_on_to_a_queued_message(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """The drive that fails a turn at `max_steps` runs the message queued behind it too: its span
    still says the turn it failed, as the call's result does, not the queued turn's end."""
    agent = _agent()
    agent.limits = so.Limits(max_steps=1)
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider)
    alice = so.Principal(authenticator="okta", principal_id="alice")
    bob = so.Principal(authenticator="okta", principal_id="bob")
    r = await rt.generate("support", "refund A1", auth=alice)
    (req,) = r.pending
    assert (await rt.send(r.session_id, "bob here", principal=bob)).queued
    exporter.clear()
    approve = [so.InputResponse(request_id=req.id, option_id="approve")]
    done = await rt.respond(r.session_id, approve, principal=alice)
    state = await rt.state(r.session_id)
    await rt.close()
    assert (done.status, done.turn_id) == ("failed", r.turn_id)
    assert state.turn is not None and state.turn.status == "completed" and not state.queued
    (drive,) = _by_name(exporter.get_finished_spans())["invoke_agent support"]
    d = drive.attributes or {}
    assert drive.status.status_code == StatusCode.ERROR
    assert (d["signoff.turn.status"], d["signoff.turn_id"]) == ("failed", r.turn_id)
    assert d["error.type"] == "session_limit_reached"


async def test_a_drive_that_records_the_sessions_expiry_names_its_span_and_the_turns_end(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """A retry past the TTL records the expiry and raises `SessionExpired`: its span was a bare
    `invoke_agent`, with no agent, no turn id and no status, as the expiry came before the span
    named the turn. It names the turn as the drive found it and says how the expiry left it."""
    clock = ManualClock(1_000.0)
    agent = _agent()
    agent.limits = so.Limits(ttl=60)
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, clock=clock)
    r = await rt.generate("support", "refund A1")
    assert r.status == "waiting"
    parker = _by_name(exporter.get_finished_spans())["invoke_agent support"][0]
    exporter.clear()
    clock.advance(61)
    with pytest.raises(so.SessionExpired):
        await rt.generate(session_id=r.session_id)
    await rt.close()
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["invoke_agent support"]
    (drive,) = spans
    d = drive.attributes or {}
    assert d["signoff.session_id"] == r.session_id and d["gen_ai.agent.name"] == "support"
    assert d["signoff.turn_id"] == r.turn_id and d["signoff.drive.resumed"] is True
    assert (d["signoff.turn.status"], d["signoff.turn.retryable"]) == ("failed", False)
    assert d["error.type"] == "session_expired"
    assert drive.status.status_code == StatusCode.ERROR
    assert [link.context.span_id for link in drive.links] == [_id(parker)]


class _FailingProcessor(SpanProcessor):
    """A span processor that raises when a span starts, or ends (an exporter failing in it)."""

    def __init__(self, when: str) -> None:
        self.when = when

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.when == "start":
            raise RuntimeError("processor failed on start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.when == "end":
            raise RuntimeError("processor failed on end")


@pytest.mark.parametrize("when", ["start", "end"])
async def test_a_tracer_provider_that_raises_does_not_fail_the_turn(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, when: str
) -> None:
    runs: list[str] = []

    @so.tool
    async def lookup(order: str) -> str:
        """Look an order up."""
        runs.append(order)
        return f"order {order}"

    failing = TracerProvider()
    failing.add_span_processor(_FailingProcessor(when))
    agent = scripted_agent(
        "support", [call_tools(call("lookup", order="A1")), reply("found")], tools=[lookup]
    )
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=failing)
    r = await rt.generate("support", "look A1 up")
    again = await rt.generate(session_id=r.session_id)  # nothing left to run
    await rt.close()
    assert (r.status, r.text, again.status) == ("completed", "found", "completed")
    assert runs == ["A1"]  # the tool's result was recorded, not lost with its span
    assert f"processor failed on {when}" in caplog.text
