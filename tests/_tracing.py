"""The tracing tests' in-memory exporter and tracer provider fixtures, their refund agent, and
reading spans back by name, parent and text (shared by the tests/test_tracing*.py files).
"""

from __future__ import annotations

import json

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

__all__ = [
    "SECRET",
    "_agent",
    "_by_name",
    "_id",
    "_parent",
    "_text_of",
    "broken",
    "exporter",
    "lookup",
    "provider",
    "refund",
]


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
