"""Traces of a turn cancelled as its tool body runs, here or in another process: the drive's
span says the turn was cancelled and the body's span is no error; and a drive that goes on to
the message queued behind a cancelled turn names that turn, which had not run before it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime

from ._tracing import _by_name, exporter, provider

__all__ = ["exporter", "provider"]  # the fixtures, used by name


def _waiter(entered: asyncio.Event) -> so.Tool:
    """`slow`: sets `entered`, then returns normally once its abort signal is set (or after
    10 s)."""

    @so.tool
    async def slow(ctx: so.ToolContext, order: str) -> str:
        """Wait for the turn to be cancelled."""
        entered.set()
        try:
            await asyncio.wait_for(ctx.abort_signal.wait(), 10)
        except TimeoutError:
            pass
        return "done"

    return slow


@pytest.mark.parametrize("where", ["here", "elsewhere"])
async def test_a_turn_cancelled_as_its_tool_body_runs_is_a_cancelled_drive_and_no_tool_error(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider, where: str
) -> None:
    """Cancelled by another process, the drive learnt of it at a lease renewal and stopped, but
    its span said the turn `running` (its state was not read again); in both cases the tool's
    span was an error, `TurnStopped`, though the body returned normally."""
    entered = asyncio.Event()
    agent = scripted_agent(
        "support", [call_tools(call("slow", order="A1")), reply("ok")], tools=[_waiter(entered)]
    )
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, lease_ttl=1.5)
    other = sqlite_runtime(tmp_path, agent)
    sid = await rt.create_session("support")
    drive = asyncio.create_task(rt.generate(session_id=sid, prompt="go"))
    await asyncio.wait_for(entered.wait(), 10)
    cancelled = await (rt if where == "here" else other).cancel(sid)
    assert cancelled.status == "cancelled"
    r = await asyncio.wait_for(drive, 20)
    assert r.status == "cancelled"
    spans = _by_name(exporter.get_finished_spans())
    (drive_span,) = spans["invoke_agent support"]
    assert (drive_span.attributes or {})["signoff.turn.status"] == "cancelled"
    assert drive_span.status.status_code != StatusCode.ERROR
    (tool,) = spans["execute_tool slow"]
    attrs = tool.attributes or {}
    assert tool.status.status_code != StatusCode.ERROR, attrs.get("error.type")
    assert "error.type" not in attrs and not tool.events
    assert attrs["signoff.tool.outcome"] == "stopped"
    await other.close()
    await rt.close()


async def test_a_drive_on_to_the_message_queued_behind_a_cancelled_turn_resumed_nothing(
    tmp_path: Path, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """Another process queues a message and cancels the turn: the drive that then starts the
    queued message's turn named that turn with `signoff.drive.resumed` true, reckoned on the
    cancelled turn it began with, though the new one had never run."""
    entered = asyncio.Event()
    agent = scripted_agent(
        "support",
        [call_tools(call("slow", order="A1")), reply("ok"), reply("next")],
        tools=[_waiter(entered)],
    )
    rt = sqlite_runtime(tmp_path, agent, tracer_provider=provider, lease_ttl=1.5)
    other = sqlite_runtime(tmp_path, agent)
    sid = await rt.create_session("support")
    drive = asyncio.create_task(rt.generate(session_id=sid, prompt="go"))
    await asyncio.wait_for(entered.wait(), 10)
    assert (await other.send(sid, "then this", turn_policy="queue")).queued
    first = (await other.cancel(sid)).turn_id
    await asyncio.wait_for(drive, 20)
    state = await rt.state(sid)
    assert state.turn is not None and state.turn.status == "completed"
    queued = state.turn.id
    assert queued != first
    drives = _by_name(exporter.get_finished_spans())["invoke_agent support"]
    seen = [
        (a["signoff.turn_id"], a["signoff.turn.status"], a["signoff.drive.resumed"])
        for a in (span.attributes or {} for span in drives)
    ]
    assert seen == [(first, "cancelled", False), (queued, "completed", False)]
    await other.close()
    await rt.close()
