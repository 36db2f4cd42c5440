"""Text holding a lone surrogate (a file name decoded with `surrogateescape`, in a tool's error or
result; the store keeps it as it is) goes on a span with each one as its escape (`\\udce9`): the
OTLP exporter cannot encode one, and dropped the attribute, or for a status description the whole
batch, other sessions' spans included."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import signoff as so
from signoff._text import is_utf8
from signoff._trace_content import MESSAGES_MAX, json_text, messages_json
from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime

from ._tracing import _by_name, exporter, provider

__all__ = ["exporter", "provider"]  # the fixtures, used by name

NAME = b"caf\xe9.txt".decode("utf-8", "surrogateescape")  # "caf\udce9.txt"
ESCAPED = "caf\\udce9.txt"


def _not_utf8(spans: Sequence[ReadableSpan]) -> list[str]:
    """Where the spans carry text UTF-8 cannot hold: names, every string attribute (in a list
    too), event and link attributes, status descriptions."""
    found: list[str] = []

    def check(where: str, value: Any) -> None:
        for text in value if isinstance(value, list | tuple) else [value]:
            if isinstance(text, str) and not is_utf8(text):
                found.append(where)

    for span in spans:
        check(f"{span.name!r}", span.name)
        check(f"{span.name!r} status", span.status.description)
        for key, value in (span.attributes or {}).items():
            check(f"{span.name!r} {key}", value)
        for event in span.events:
            check(f"{span.name!r} event {event.name!r}", event.name)
            for key, value in (event.attributes or {}).items():
                check(f"{span.name!r} event {event.name!r} {key}", value)
        for link in span.links:
            for key, value in (link.attributes or {}).items():
                check(f"{span.name!r} link {key}", value)
    return found


def _read(text: str) -> str:
    """JSON `text` as JSON reads it, written again without escapes: its lone surrogates raw."""
    return json.dumps(json.loads(text), ensure_ascii=False)


async def test_a_tool_raising_with_a_lone_surrogate_is_traced_as_utf8(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    @so.tool
    async def read_backup(prefix: str) -> str:
        """Read a file's backup."""
        raise RuntimeError(f"no backup of {NAME}")

    agent = scripted_agent(
        "files", [call_tools(call("read_backup", prefix="caf")), reply("none")], tools=[read_backup]
    )
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True)
    r = await rt.generate("files", "read the backup")
    await rt.close()
    assert r.status == "completed"
    finished = exporter.get_finished_spans()
    assert _not_utf8(finished) == []
    (tool,) = _by_name(finished)["execute_tool read_backup"]
    assert tool.status.description == f"RuntimeError: no backup of {ESCAPED}"
    (exc,) = [e for e in tool.events if e.name == "exception"]
    assert (exc.attributes or {})["exception.message"] == f"no backup of {ESCAPED}"
    assert ESCAPED in str((exc.attributes or {})["exception.stacktrace"])
    # the model is told of the error: the next call's conversation holds it, as JSON reads it
    chat = _by_name(finished)["chat"][-1]
    assert f"no backup of {NAME}" in _read(str((chat.attributes or {})["gen_ai.input.messages"]))


async def test_a_tool_result_holding_a_lone_surrogate_is_traced_as_utf8(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    @so.tool
    async def list_files() -> list[str]:
        """List the files."""
        return [NAME, "notes.txt"]

    steps = [call_tools(call("list_files")), reply(f"two: {NAME}"), reply("still two")]
    agent = scripted_agent("files", steps, tools=[list_files])
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True)
    r = await rt.generate("files", "what files are there?")
    again = await rt.generate(prompt="and now?", session_id=r.session_id)
    await rt.close()
    assert r.status == again.status == "completed"
    finished = exporter.get_finished_spans()
    assert _not_utf8(finished) == []
    spans = _by_name(finished)
    (tool,) = spans["execute_tool list_files"]
    result = str((tool.attributes or {})["gen_ai.tool.call.result"])
    assert ESCAPED in result and json.loads(result) == [NAME, "notes.txt"]  # JSON's own escape
    *_, last = spans["chat"]
    sent = str((last.attributes or {})["gen_ai.input.messages"])
    assert _read(sent).count(NAME) == 2  # the call's result and the reply, later in the session
    output = str((spans["chat"][1].attributes or {})["gen_ai.output.messages"])
    assert json.loads(output)[0]["parts"][0]["content"] == f"two: {NAME}"


async def test_a_model_error_holding_a_lone_surrogate_is_traced_as_utf8(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    agent = scripted_agent("files", [so.ModelError(f"provider refused: {NAME}")])
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True)
    r = await rt.generate("files", "read the backup")
    await rt.close()
    assert r.status == "failed"
    finished = exporter.get_finished_spans()
    assert _not_utf8(finished) == []
    spans = _by_name(finished)
    (model,) = spans["chat"]
    assert model.status.description == f"ModelError: provider refused: {ESCAPED}"
    (drive,) = spans["invoke_agent files"]
    assert drive.status.status_code == StatusCode.ERROR
    assert drive.status.description == f"ModelError: provider refused: {ESCAPED}"


def test_the_bound_on_the_conversation_counts_the_escapes() -> None:
    """A lone surrogate is 3 bytes as UTF-8 would encode it, but 6 as its escape: the bound is
    on the text the span carries."""
    messages = [so.UserMessage(text=NAME * 2_000) for _ in range(20)]
    text = messages_json(messages, lambda c: c.input)
    assert len(text.encode()) <= MESSAGES_MAX
    marker, *kept = json.loads(text)
    assert marker == {"kind": "omitted", "messages": 20 - len(kept)} and kept
    assert kept[-1]["text"] == NAME * 2_000
    alone = messages_json([so.UserMessage(text=NAME * 20_000)], lambda c: c.input)
    assert len(alone.encode()) <= MESSAGES_MAX
    assert json.loads(json_text(NAME)) == NAME


async def test_an_error_of_lone_surrogates_is_cut_after_it_is_escaped(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """The 16,384-character bound was applied before escaping, so a message of lone surrogates
    went on the span six times as long (98,240 characters for 20,000 of them)."""

    @so.tool
    async def read_backup(prefix: str) -> str:
        """Read a file's backup."""
        raise RuntimeError("\udce9" * 20_000)

    agent = scripted_agent(
        "files", [call_tools(call("read_backup", prefix="caf")), reply("none")], tools=[read_backup]
    )
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True)
    await rt.generate("files", "read the backup")
    await rt.close()
    (tool,) = _by_name(exporter.get_finished_spans())["execute_tool read_backup"]
    (exc,) = [e for e in tool.events if e.name == "exception"]
    for text in (tool.status.description, (exc.attributes or {})["exception.message"]):
        assert isinstance(text, str)
        assert 16_000 < len(text) <= 16_384 + len(" [cut]"), len(text)
