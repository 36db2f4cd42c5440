"""An `auto()` review is a model call like the agent's own, and its tokens count in the session's
usage: it gets a `chat` span too, a child of the span it runs under (the drive reviewing a
proposal, or whatever span answers with an edit), with `signoff.review.call_id` naming the call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import signoff as so
from signoff.models import ModelRequest
from signoff.testing import call, call_tools, reply, sqlite_runtime

from ._tracing import _id, _parent, exporter, provider

__all__ = ["exporter", "provider"]  # the fixtures, used by name

REVIEW = so.Usage(input_tokens=300, output_tokens=20, cost_usd=0.05)
TURN = so.Usage(input_tokens=10, output_tokens=2, cost_usd=0.01)


class Reviewer:
    """A named reviewer model answering `verdict`, or raising when `verdict` is None."""

    model = "gpt-reviewer"

    def __init__(self, verdict: str | None) -> None:
        self.verdict = verdict

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        if self.verdict is None:
            raise so.ModelError("the reviewer is down")
        text = json.dumps({"verdict": self.verdict, "reason": f"{self.verdict} it is"})
        return so.ModelResponse(text=text, usage=REVIEW)


def billing(reviewer: Any, *, review_edits: bool = False) -> so.Agent:
    @so.tool(approval=so.auto(reviewer, review_edits=review_edits))
    async def refund_charge(charge_id: str, amount: float) -> str:
        """Refund a charge."""
        return "refunded"

    proposal = call_tools(call("refund_charge", charge_id="ch_1", amount=40), usage=TURN)
    return so.Agent(
        name="billing",
        model=so.models.Scripted([proposal, reply("done", usage=TURN)]),
        tools=[refund_charge],
    )


async def test_a_review_of_a_proposal_is_a_chat_span_of_the_drive_with_its_usage(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    rt = sqlite_runtime(tmp_path, billing(Reviewer("clear")), tracer_provider=provider)
    r = await rt.generate("billing", "refund ch_1")
    assert r.status == "completed"
    spent = (await rt.state(r.session_id)).usage
    await rt.close()
    spans = exporter.get_finished_spans()
    (drive,) = [s for s in spans if s.name == "invoke_agent billing"]
    (review,) = [s for s in spans if s.name == "chat gpt-reviewer"]
    agents = [s for s in spans if s.name == "chat"]
    assert len(agents) == 2
    assert review.kind == SpanKind.CLIENT and _parent(review) == _id(drive)
    a = review.attributes or {}
    assert a["gen_ai.operation.name"] == "chat" and a["gen_ai.request.model"] == "gpt-reviewer"
    assert a["gen_ai.agent.name"] == "billing"
    assert a["signoff.session_id"] == r.session_id == a["gen_ai.conversation.id"]
    assert a["signoff.turn_id"] == r.turn_id
    (ran,) = [s for s in spans if s.name == "execute_tool refund_charge"]
    assert a["signoff.review.call_id"] == (ran.attributes or {})["gen_ai.tool.call.id"]
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (300, 20)
    assert a["signoff.usage.cost_usd"] == pytest.approx(0.05)
    assert a["signoff.tool_calls"] == 0
    assert not any(k in a for k in ("gen_ai.input.messages", "gen_ai.output.messages"))
    assert not any("signoff.review.call_id" in (s.attributes or {}) for s in agents)
    # The spans' usage adds up to what the session spent, the review's included.
    traced = [(s.attributes or {})["gen_ai.usage.input_tokens"] for s in [*agents, review]]
    assert sum(int(str(n)) for n in traced) == spent.input_tokens


async def test_a_review_shows_its_messages_only_with_trace_content(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    agent = billing(Reviewer("caution"))
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, trace_content=True)
    r = await rt.generate("billing", "refund ch_1")
    assert r.status == "waiting"
    await rt.close()
    (review,) = [s for s in exporter.get_finished_spans() if s.name == "chat gpt-reviewer"]
    a = review.attributes or {}
    assert "You review one tool call" in str(a["gen_ai.system_instructions"])
    (message,) = json.loads(str(a["gen_ai.input.messages"]))
    assert "Tool: refund_charge" in json.dumps(message)
    assert "caution it is" in str(a["gen_ai.output.messages"])


async def test_a_failed_review_fails_its_span_and_asks_a_person(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    rt = sqlite_runtime(tmp_path, billing(Reviewer(None)), tracer_provider=provider)
    r = await rt.generate("billing", "refund ch_1")
    assert r.status == "waiting" and r.pending[0].auto_verdict == "failed"
    await rt.close()
    (review,) = [s for s in exporter.get_finished_spans() if s.name == "chat gpt-reviewer"]
    assert review.status.status_code == StatusCode.ERROR
    assert (review.attributes or {})["error.type"] == "model_error"
    assert "the reviewer is down" not in str(review.status.description)  # content is off


async def test_a_review_of_an_edit_is_a_child_of_the_span_answering(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    rt = sqlite_runtime(
        tmp_path, billing(Reviewer("caution"), review_edits=True), tracer_provider=provider
    )
    r = await rt.generate("billing", "refund ch_1")
    (ask,) = r.pending
    exporter.clear()
    edited = {**(ask.action.input if ask.action else {}), "amount": 30}
    answer = so.InputResponse(request_id=ask.id, option_id="approve", edited_input=edited)
    with provider.get_tracer("test").start_as_current_span("POST /respond") as request:
        await rt.respond(r.session_id, [answer])
    await rt.close()
    spans = exporter.get_finished_spans()
    (review,) = [s for s in spans if s.name == "chat gpt-reviewer"]
    assert review.parent is not None
    assert review.parent.span_id == request.get_span_context().span_id
    a = review.attributes or {}
    assert a["signoff.review.call_id"] == ask.call_id and a["signoff.turn_id"] == r.turn_id
    assert a["gen_ai.usage.output_tokens"] == 20
    assert trace.get_current_span() is trace.INVALID_SPAN  # each span ended, none left current
