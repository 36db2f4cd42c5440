"""The conversation a model span carries with `trace_content=True` (`gen_ai.input.messages`):
whole while it is short, else its newest messages up to a byte bound, after a marker saying how
many older ones were left off; a newest message over the bound alone is cut."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import signoff as so
from signoff._tracing import MESSAGES_MAX
from signoff.testing import scripted_agent, sqlite_runtime

from ._tracing import _by_name, exporter, provider

__all__ = ["exporter", "provider"]  # the fixtures, used by name


def _echo(conversation: list[Any]) -> so.ModelResponse:
    return so.ModelResponse(text=f"noted, {len(conversation)} messages so far")


def _sent(exporter: InMemorySpanExporter) -> tuple[str, list[dict[str, Any]]]:
    """The last model span's `gen_ai.input.messages`, as text and as JSON."""
    chat = _by_name(exporter.get_finished_spans())["chat"][-1]
    text = str((chat.attributes or {})["gen_ai.input.messages"])
    return text, json.loads(text)


async def test_a_long_conversation_is_traced_as_its_newest_messages_up_to_the_bound(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    turns = 150
    rt = sqlite_runtime(
        tmp_path,
        scripted_agent("a", [_echo] * turns),
        tracer_provider=provider,
        trace_content=True,
    )
    r = await rt.generate("a", "turn 0 " + "x" * 500)
    for i in range(1, turns):
        await rt.generate(session_id=r.session_id, prompt=f"turn {i} " + "x" * 500)
    await rt.close()
    text, sent = _sent(exporter)
    assert len(text.encode()) <= MESSAGES_MAX
    marker, *kept = sent
    total = 2 * turns - 1  # each turn's prompt and reply, the last reply not yet made
    assert marker == {"kind": "omitted", "messages": total - len(kept)}
    assert 0 < marker["messages"] < total and len(kept) > 50
    assert kept[-1] == {"kind": "user", "text": f"turn {turns - 1} " + "x" * 500}
    assert kept[-2]["kind"] == "assistant"
    # the first turn's span had the whole conversation: one message, no marker
    first = _by_name(exporter.get_finished_spans())["chat"][0].attributes or {}
    assert json.loads(str(first["gen_ai.input.messages"])) == [
        {"kind": "user", "text": "turn 0 " + "x" * 500}
    ]


async def test_a_newest_message_over_the_bound_alone_is_cut(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    rt = sqlite_runtime(
        tmp_path, scripted_agent("a", [_echo]), tracer_provider=provider, trace_content=True
    )
    prompt = "é" * 1_000_000  # 2 MB as UTF-8
    await rt.generate("a", prompt)
    await rt.close()
    text, sent = _sent(exporter)
    assert len(text.encode()) <= MESSAGES_MAX
    marker, newest = sent
    assert marker == {"kind": "omitted", "messages": 0}
    assert newest["kind"] == "cut" and newest["json"].startswith('{"kind": "user", "text": "éé')
    assert newest["json"].endswith(" [cut]") and newest["bytes"] == len(
        json.dumps({"kind": "user", "text": prompt}, ensure_ascii=False).encode()
    )


def test_a_conversation_that_fits_is_whole_up_to_the_last_byte() -> None:
    """The room for the marker was taken before knowing whether one was needed: a
    conversation within about 40 bytes of the bound lost its oldest message to a marker."""
    from signoff._trace_content import json_text, messages_json

    def _messages(messages: list[so.UserMessage]) -> str:
        return messages_json(messages, lambda call: call.input)

    sent = [so.UserMessage(text="x" * 100) for _ in range(10)]
    for spare in (0, 1, 5, 40):
        whole = "[" + ", ".join(json_text(m) for m in sent) + "]"
        last = "x" * (100 + MESSAGES_MAX - len(whole.encode()) - spare)
        grown = [*sent[:-1], so.UserMessage(text=last)]
        text = _messages(grown)
        assert len(text.encode()) == MESSAGES_MAX - spare
        assert json.loads(text) == [{"kind": "user", "text": m.text} for m in grown]
    over = [so.UserMessage(text="y" * 100), *sent[1:-1], so.UserMessage(text=last + "x" * 41)]
    marker, *kept = json.loads(_messages(over))
    assert marker == {"kind": "omitted", "messages": 1}
    assert len(kept) == 9 and len(_messages(over).encode()) <= MESSAGES_MAX
