"""Parked turns on the spans (`_tracing`): a question and its answer, and the drive that resumes a
parked turn linking to the drive that parked it, through a stored trace context.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime

from ._audit import alter
from ._procs import query
from ._tracing import (
    _agent,
    _by_name,
    _id,
    exporter,
    provider,
    refund,
)

__all__ = ["exporter", "provider"]  # the fixtures, used by name


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


async def test_a_resume_after_an_untraced_park_links_to_the_last_traced_one(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """An untraced runtime stores no trace context when it parks the turn again: the next
    traced drive links to the last traced drive that parked it (docs/tracing.md)."""
    agent = scripted_agent(
        "support",
        [
            call_tools(call("refund", order="A1", amount=5.0)),
            call_tools(call("refund", order="B2", amount=7.0)),
            reply("both refunded"),
        ],
        tools=[refund],
    )
    async with sqlite_runtime(tmp_path, agent, tracer_provider=provider) as rt:
        r = await rt.generate("support", "refund A1 and B2")
    async with sqlite_runtime(tmp_path, agent) as rt:  # no provider: untraced
        ok = so.Decision(id=r.pending[0].id, approved=True)
        r2 = await rt.generate(session_id=r.session_id, approvals=[ok])
        assert r2.status == "waiting"
        parked = [w.get("traceparent") for w in await _waiting_data(rt, r.session_id)]
    async with sqlite_runtime(tmp_path, agent, tracer_provider=provider) as rt:
        ok = so.Decision(id=r2.pending[0].id, approved=True)
        assert (await rt.generate(session_id=r.session_id, approvals=[ok])).status == "completed"
    first, last = _by_name(exporter.get_finished_spans())["invoke_agent support"]
    assert parked == [_traceparent(first), None]
    assert [_id_of(link.context) for link in last.links] == [_id(first)]


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
