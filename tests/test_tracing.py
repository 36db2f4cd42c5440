"""OpenTelemetry traces (`_tracing`): the spans of drives, model calls and tool bodies, read
back from the SDK's in-memory exporter; and signoff unchanged without OpenTelemetry.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from pydantic import AfterValidator, SecretStr

import signoff as so
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, sqlite_runtime

from ._tracing import (
    SECRET,
    _agent,
    _by_name,
    _id,
    _parent,
    _text_of,
    broken,
    exporter,
    provider,
)

__all__ = ["exporter", "provider"]  # the fixtures, used by name


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
        sqlite_runtime(tmp_path, agent, trace_content="yes")  # type: ignore[arg-type]


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


def test_a_turn_imports_opentelemetry_only_once_a_provider_may_be_set(tmp_path: Path) -> None:
    """With OpenTelemetry installed but not imported, a turn does not import it (some
    milliseconds of a process's first turn) to find that no global provider is set: setting
    one imports it, or names it in OTEL_PYTHON_TRACER_PROVIDER. Once set, turns trace."""
    code = f"""
import os, sys
os.environ.pop("OTEL_PYTHON_TRACER_PROVIDER", None)
import signoff as so
from signoff.testing import reply, scripted_agent, sqlite_runtime

rt = sqlite_runtime({str(tmp_path)!r}, scripted_agent("a", [reply("hi")], repeat_last=True))
assert rt.generate_sync("a", "hello").status == "completed"
assert "opentelemetry.trace" not in sys.modules, "imported by a turn"
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
assert rt.generate_sync("a", "again").status == "completed"
rt.close_sync()
print(sorted(span.name for span in exporter.get_finished_spans()))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['chat', 'invoke_agent a']"


def test_a_tracer_provider_named_wrong_in_the_environment_turns_tracing_off(
    tmp_path: Path,
) -> None:
    """OTEL_PYTHON_TRACER_PROVIDER naming no provider makes OpenTelemetry raise StopIteration at
    every look for the global provider, which failed every turn ("coroutine raised
    StopIteration"). Turns run untraced, with one warning saying why."""
    code = f"""
import logging
import signoff as so
from signoff.testing import reply, scripted_agent, sqlite_runtime

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
rt = sqlite_runtime({str(tmp_path)!r}, scripted_agent("a", [reply("hi")], repeat_last=True))
print(rt.generate_sync("a", "hello").status, rt.generate_sync("a", "again").status)
rt.close_sync()
"""
    env = {**os.environ, "OTEL_PYTHON_TRACER_PROVIDER": "no_such_provider"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "completed completed"
    off = "tracing is off: the tracer provider OTEL_PYTHON_TRACER_PROVIDER='no_such_provider'"
    assert done.stderr.count(off) == 1, done.stderr


@pytest.mark.parametrize("named", [True, False])
def test_a_tracer_provider_named_without_opentelemetry_installed_is_one_warning(
    tmp_path: Path, named: bool
) -> None:
    """OTEL_PYTHON_TRACER_PROVIDER set in a process without OpenTelemetry: turns ran untraced
    with no word of why. One warning names the extra to install; none without the variable."""
    code = f"""
import logging, sys
sys.modules["opentelemetry"] = None  # as if not installed
import signoff as so
from signoff.testing import reply, scripted_agent, sqlite_runtime

logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
rt = sqlite_runtime({str(tmp_path)!r}, scripted_agent("a", [reply("hi")], repeat_last=True))
print(rt.generate_sync("a", "hello").status, rt.generate_sync("a", "again").status)
rt.close_sync()
"""
    env = {k: v for k, v in os.environ.items() if k != "OTEL_PYTHON_TRACER_PROVIDER"}
    if named:
        env["OTEL_PYTHON_TRACER_PROVIDER"] = "sdk_tracer_provider"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "completed completed"
    if named:
        off = (
            "tracing is off: OTEL_PYTHON_TRACER_PROVIDER='sdk_tracer_provider' names a tracer "
            "provider, but OpenTelemetry is not installed: pip install 'signoff[otel]'"
        )
        assert done.stderr.count(off) == 1, done.stderr
        assert done.stderr.count("signoff.runtime") == 1, done.stderr
    else:
        assert done.stderr == ""


async def test_a_result_over_its_bound_is_not_put_on_the_span_but_fails_it(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """A result the log refuses as too large (the model reads that error instead) is not
    written to the span either, content or not: an exporter would send megabytes, or drop
    the batch it is in. The span says what the log says: the call failed."""

    @so.tool(max_result_bytes=1000)
    async def dump(order: str) -> str:
        """Dump an order's history."""
        return f"{order} " + "history " * 500_000

    agent = scripted_agent(
        "support", [call_tools(call("dump", order="A1")), reply("too much")], tools=[dump]
    )
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True)
    r = await rt.generate("support", "go")
    (done,) = [e async for e in rt.events(r.session_id, follow=False) if e.type == "tool.completed"]
    await rt.close()
    assert done.data["status"] == "error" and "over the limit of 1000 bytes" in str(done.data)
    (tool,) = _by_name(exporter.get_finished_spans())["execute_tool dump"]
    attributes = tool.attributes or {}
    assert "gen_ai.tool.call.result" not in attributes
    assert tool.status.status_code == StatusCode.ERROR
    assert attributes["error.type"] == "payload_too_large"
    assert "over the limit of 1000 bytes" in str(tool.status.description)
    assert "signoff.tool.outcome" not in attributes


class _Order:
    """What a validator may turn a tool's parameter into: an object with no JSON form."""

    def __init__(self, ref: str) -> None:
        self.ref = ref

    def __str__(self) -> str:
        return f"order {self.ref}"


# What pydantic warns of, dumping the object in Python mode, is only a warning outside the tests.
@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings:UserWarning")
async def test_tool_input_with_no_json_form_is_traced_by_its_text_and_the_call_runs(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """A call that runs untraced runs the same with `trace_content=True`: input a validator
    made into an object with no JSON form is shown by its text, not pydantic's serialization
    error escaping the drive."""
    got: list[str] = []

    @so.tool
    async def look(order: Annotated[str, AfterValidator(_Order)], pin: SecretStr) -> str:
        """Look an order up."""
        got.append(order.ref)  # type: ignore[attr-defined]
        return "found"

    proposal = call_tools(so.ToolCall(id="c1", name="look", input={"order": "7", "pin": "4321"}))
    agent = scripted_agent("support", [proposal, reply("done")], tools=[look])
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True)
    r = await rt.generate("support", "go")
    await rt.close()
    assert r.status == "completed" and got == ["7"]
    (tool,) = _by_name(exporter.get_finished_spans())["execute_tool look"]
    attributes = tool.attributes or {}
    shown = json.loads(str(attributes["gen_ai.tool.call.arguments"]))
    assert shown == {"order": "order 7", "pin": "**********"}  # the secret still masked
    assert attributes["signoff.tool.outcome"] == "ok"


class _Mute:
    """An object a validator may make that cannot even be shown as text."""

    def __str__(self) -> str:
        raise RuntimeError("no text either")


_ran: list[object] = []


@so.tool(name="tally")
async def _keyed(x: Annotated[Any, AfterValidator(lambda v: {frozenset(["k"]): v})]) -> str:
    """Tally."""
    _ran.append(x)
    return "tallied"


@so.tool(name="tally")
async def _mute(x: Annotated[Any, AfterValidator(lambda v: _Mute())]) -> str:
    """Tally."""
    _ran.append(x)
    return "tallied"


_NO_JSON = {  # a tool whose validator makes something of input {"x": 7}; how a span shows it
    "keyed by a frozenset": (_keyed, {"x": {"frozenset({'k'})": 7}}),
    "with no text": (_mute, {"x": "<unrepresentable: _Mute>"}),
}


@pytest.mark.parametrize("case", list(_NO_JSON))
async def test_tool_input_json_rejects_is_traced_by_its_text_and_the_call_runs_once(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider, case: str
) -> None:
    """Input a validator made into what `json.dumps` rejects (a frozenset key; an object whose
    `str` raises) failed the start of the tool's span, after `tool.started` was recorded: the
    turn was left running, to fail the same at every retry. Its key or value is shown by its
    text now, or a placeholder if that raises too, and the call runs as it would untraced."""
    tally, shown = _NO_JSON[case]
    _ran.clear()
    proposal = call_tools(so.ToolCall(id="c1", name="tally", input={"x": 7}))
    agent = scripted_agent("support", [proposal, reply("done")], tools=[tally])
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True)
    r = await rt.generate("support", "go")
    await rt.close()
    assert r.status == "completed" and len(_ran) == 1
    spans = _by_name(exporter.get_finished_spans())
    (tool,) = spans["execute_tool tally"]
    attributes = tool.attributes or {}
    assert json.loads(str(attributes["gen_ai.tool.call.arguments"])) == shown
    assert attributes["signoff.tool.outcome"] == "ok"
    # The model spans show the call's input so too: the reply that proposed it, and the next.
    first, second = ((s.attributes or {}) for s in spans["chat"])
    output = json.loads(str(first["gen_ai.output.messages"]))
    assert output[0]["parts"][0]["arguments"] == shown
    sent = json.loads(str(second["gen_ai.input.messages"]))
    assert sent[1]["tool_calls"][0]["input"] == shown


async def test_a_secret_tool_input_is_masked_on_the_chat_spans_too(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """A `SecretStr` parameter was masked on its `execute_tool` span only: the model span that
    proposed the call (`gen_ai.output.messages`) and every later one (`gen_ai.input.messages`)
    showed it in clear. Each shows the call's input as the tool validated it now; input that
    fails validation is shown as sent but for its secret, and a call of no tool as sent."""
    secret = "hunter2-TOPSECRET"

    @so.tool
    async def login(user: str, password: SecretStr) -> str:
        """Log in."""
        return "logged in " + user

    proposal = call_tools(
        call("login", call_id="c1", user="bob", password=secret),
        call("login", call_id="c2", user=7, password=secret),  # fails: user is no string
        call("nope", call_id="c3", password="sent as is"),
    )
    agent = scripted_agent("support", [proposal, reply("done")], tools=[login])
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True)
    r = await rt.generate("support", "log in")
    await rt.close()
    assert r.status == "completed"
    spans = exporter.get_finished_spans()
    assert secret not in _text_of(spans)
    shown = [
        {"user": "bob", "password": "**********"},
        {"user": 7, "password": "**********"},
        {"password": "sent as is"},
    ]
    first, second = _by_name(spans)["chat"]
    output = json.loads(str((first.attributes or {})["gen_ai.output.messages"]))
    assert [p["arguments"] for p in output[0]["parts"]] == shown
    assert [p["id"] for p in output[0]["parts"]] == ["c1", "c2", "c3"]
    sent = json.loads(str((second.attributes or {})["gen_ai.input.messages"]))
    assert [c["input"] for c in sent[1]["tool_calls"]] == shown
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["c1", "c2", "c3"]
    (tool,) = _by_name(spans)["execute_tool login"]
    assert json.loads(str((tool.attributes or {})["gen_ai.tool.call.arguments"])) == shown[0]
