"""What a resumed drive's span says it goes on with (`_tracing`, docs/tracing.md): the answers
no earlier drive went on with (`signoff.turn.resumed`), how long the first of them waited
(`signoff.waited_seconds`), and whether the turn had run before (`signoff.drive.resumed`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import signoff as so
from signoff._state import FOLD_VERSION, TurnState
from signoff._tracing import Tracing, tracing_for
from signoff.testing import Flaky, ManualClock, call, call_tools, reply, scripted_agent

from ._tracing import exporter, provider
from .test_snapshot_fields import write_snapshot

__all__ = ["exporter", "provider"]  # the fixtures, used by name

ALICE = so.Principal(authenticator="web", principal_id="alice")


def _drive(exporter: InMemorySpanExporter) -> ReadableSpan:
    """The one drive span finished since the exporter was last cleared."""
    (drive,) = [s for s in exporter.get_finished_spans() if s.name.startswith("invoke_agent")]
    return drive


def _resumed(drive: ReadableSpan) -> dict[str, Any]:
    """The drive's `signoff.turn.resumed` event's attributes, as lists."""
    (event,) = [e for e in drive.events if e.name == "signoff.turn.resumed"]
    return {k: list(v) for k, v in (event.attributes or {}).items()}  # type: ignore[arg-type]


def _answer(request: so.InputRequest, option: str) -> list[so.InputResponse]:
    return [so.InputResponse(request_id=request.id, option_id=option)]


@so.tool(approval=so.always())
async def interview(ctx: so.ToolContext, topic: str) -> str:
    """Approved first, then asks its question."""
    answer = await ctx.ask(f"Which {topic}?", options=["x", "y"])
    return answer.value or ""


async def test_a_drive_after_a_gated_tools_question_names_that_answer_alone(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """The approval waited an hour and the drive it resumed went on with it; the question that
    drive asked waited 10 s. The drive its answer resumes named both and waited 3,610 s."""
    agent = scripted_agent(
        "desk", [call_tools(call("interview", topic="colour")), reply("done")], tools=[interview]
    )
    clock = ManualClock(1_000.0)
    async with so.Runtime([agent], store=store_url, tracer_provider=provider, clock=clock) as rt:
        r = await rt.generate("desk", "go", auth=ALICE)
        (approval,) = r.pending
        clock.advance(3_600)
        exporter.clear()
        r = await rt.respond(r.session_id, _answer(approval, "approve"), principal=ALICE)
        (question,) = r.pending
        assert question.kind == "question"
        first = _drive(exporter)
        assert _resumed(first)["signoff.request_ids"] == [approval.id]
        assert (first.attributes or {})["signoff.waited_seconds"] == 3_600
        clock.advance(10)
        exporter.clear()
        r = await rt.respond(r.session_id, _answer(question, "x"), principal=ALICE)
        assert r.status == "completed"
    drive = _drive(exporter)
    assert (drive.attributes or {})["signoff.waited_seconds"] == 10
    assert _resumed(drive) == {
        "signoff.request_ids": [question.id],
        "signoff.request_kinds": ["question"],
        "signoff.request_outcomes": ["answered"],
    }


@so.tool
async def lookup(n: int) -> str:
    """Look something up."""
    return "found"


@so.tool(approval=so.always())
async def refund(n: int) -> str:
    """Refund."""
    return "refunded"


async def test_a_budget_prompt_answered_in_an_earlier_drive_is_not_named_again(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """The session-limit prompt waited an hour; the drive its `continue` resumed proposed a
    refund, parked on its approval, answered 10 s later. That answer's drive named the budget
    prompt too, and counted its wait from it."""
    spent = so.Usage(input_tokens=60, output_tokens=40)
    model = so.models.Scripted(
        [
            call_tools(call("lookup", n=1), usage=spent),
            call_tools(call("refund", n=1), usage=so.Usage(input_tokens=5, output_tokens=5)),
            reply("done"),
        ]
    )
    agent = so.Agent(
        name="desk", model=model, tools=[lookup, refund], limits=so.Limits(max_tokens=100)
    )
    clock = ManualClock(1_000.0)
    async with so.Runtime([agent], store=store_url, tracer_provider=provider, clock=clock) as rt:
        r = await rt.generate("desk", "go", auth=ALICE)
        (limit,) = r.pending
        assert limit.kind == "session-limit"
        clock.advance(3_600)
        exporter.clear()
        r = await rt.respond(r.session_id, _answer(limit, "continue"), principal=ALICE)
        (approval,) = r.pending
        assert approval.kind == "tool-approval"
        first = _drive(exporter)
        assert _resumed(first)["signoff.request_ids"] == [limit.id]
        assert (first.attributes or {})["signoff.waited_seconds"] == 3_600
        clock.advance(10)
        exporter.clear()
        r = await rt.respond(r.session_id, _answer(approval, "approve"), principal=ALICE)
        assert r.status == "completed"
    drive = _drive(exporter)
    assert (drive.attributes or {})["signoff.waited_seconds"] == 10
    assert _resumed(drive)["signoff.request_ids"] == [approval.id]
    assert _resumed(drive)["signoff.request_kinds"] == ["tool-approval"]


async def test_answers_given_apart_are_all_named_by_the_drive_that_goes_on_with_them(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """Two refunds asked at once, answered an hour apart in a runtime that leaves its turns to
    workers (so no drive goes on with the first before the second): the one drive that goes on
    names both, with the wait of the first asked."""
    agent = scripted_agent(
        "desk",
        [call_tools(call("refund", n=1), call("refund", n=2)), reply("done")],
        tools=[refund],
    )
    clock = ManualClock(1_000.0)
    kwargs: dict[str, Any] = {"store": store_url, "tracer_provider": provider, "clock": clock}
    async with so.Runtime([agent], **kwargs) as rt:
        r = await rt.generate("desk", "go", auth=ALICE)
        one, two = r.pending
    async with so.Runtime([agent], inline=False, **kwargs) as rt:
        clock.advance(60)
        await rt.respond(r.session_id, _answer(one, "approve"), principal=ALICE)
        clock.advance(3_600)
        await rt.respond(r.session_id, _answer(two, "cancel"), principal=ALICE)
    exporter.clear()
    async with so.Runtime([agent], **kwargs) as rt:
        done = await rt.generate(session_id=r.session_id)
        assert done.status == "completed"
    drive = _drive(exporter)
    assert (drive.attributes or {})["signoff.waited_seconds"] == 3_660
    assert _resumed(drive)["signoff.request_ids"] == [one.id, two.id]
    assert _resumed(drive)["signoff.request_outcomes"] == ["approved", "cancelled"]


@so.tool(approval=so.always(approvers=2))
async def payout(n: int) -> str:
    """Pay out, once two people approve."""
    return "paid"


async def test_an_answer_is_named_though_a_vote_parked_the_turn_again_after_it(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """A refund approved, then a first vote of two on a payout: the vote parks the turn again
    (`turn.waiting`) before any drive went on with the refund, which the drive after the second
    vote still names."""
    agent = scripted_agent(
        "desk",
        [call_tools(call("refund", n=1), call("payout", n=2)), reply("done")],
        tools=[refund, payout],
    )
    clock = ManualClock(1_000.0)
    kwargs: dict[str, Any] = {"store": store_url, "tracer_provider": provider, "clock": clock}
    bob = so.Principal(authenticator="web", principal_id="bob")
    async with so.Runtime([agent], **kwargs) as rt:
        r = await rt.generate("desk", "go", auth=ALICE)
        one, two = r.pending
    async with so.Runtime([agent], inline=False, **kwargs) as rt:
        clock.advance(60)
        await rt.respond(r.session_id, _answer(one, "approve"), principal=ALICE)
        clock.advance(60)
        voted = await rt.respond(r.session_id, _answer(two, "approve"), principal=ALICE)
        assert [o.outcome for o in voted.outcomes] == ["counted"]
        waiting = [e async for e in rt.events(r.session_id, follow=False)][-1]
        assert waiting.type == "turn.waiting"
        clock.advance(60)
        await rt.respond(r.session_id, _answer(two, "approve"), principal=bob)
    exporter.clear()
    async with so.Runtime([agent], **kwargs) as rt:
        done = await rt.generate(session_id=r.session_id)
        assert done.status == "completed"
    drive = _drive(exporter)
    assert (drive.attributes or {})["signoff.waited_seconds"] == 180
    assert _resumed(drive)["signoff.request_ids"] == [one.id, two.id]


@so.tool
async def survey(ctx: so.ToolContext, n: int) -> str:
    """Ask two things at once."""
    colour, size = await asyncio.gather(
        ctx.ask("Colour?", options=["x", "y"]), ctx.ask("Size?", options=["s", "m"])
    )
    return f"{colour.value} {size.value}"


async def test_answers_asked_at_once_are_named_though_a_keyed_vote_parked_the_turn_between(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """One reply delegates to a child whose payout needs two approvers (mirrored here) and asks
    two questions at once (a workflow call). The first is answered; Alice's vote on the mirror,
    sent as a keyed message, parks the turn again (`keep_vote_key`) while the workflow call
    still asks the second; then the second is answered and Bob's vote settles the payout. The
    drive that goes on names both answers: it named the second alone, the first dropped by the
    vote's park."""
    child = scripted_agent(
        "payer", [call_tools(call("payout", n=2)), reply("paid")], tools=[payout]
    )
    parent = scripted_agent(
        "desk",
        [call_tools(call("payer", message="pay"), call("survey", n=1)), reply("done")],
        tools=[so.delegate("payer"), survey],
    )
    clock = ManualClock(1_000.0)
    kwargs: dict[str, Any] = {"store": store_url, "tracer_provider": provider, "clock": clock}
    bob = so.Principal(authenticator="web", principal_id="bob")
    async with so.Runtime([parent, child], **kwargs) as rt:
        r = await rt.generate("desk", "go", auth=ALICE)
        (mirror,) = [p for p in r.pending if p.child is not None]
        colour, size = [p for p in r.pending if p.kind == "question"]
    async with so.Runtime([parent, child], inline=False, **kwargs) as rt:
        clock.advance(60)
        await rt.respond(r.session_id, _answer(colour, "x"), principal=ALICE)
        clock.advance(60)
        voted = await rt.send(r.session_id, "approve", principal=ALICE, idempotency_key="k1")
        assert [(o.request_id, o.outcome) for o in voted.outcomes] == [(mirror.id, "counted")]
        waiting = [e async for e in rt.events(r.session_id, follow=False)][-1]
        assert waiting.type == "turn.waiting" and "idem" in waiting.data
        clock.advance(60)
        await rt.respond(r.session_id, _answer(size, "s"), principal=ALICE)
        await rt.respond(r.session_id, _answer(mirror, "approve"), principal=bob)
    exporter.clear()
    async with so.Runtime([parent, child], **kwargs) as rt:
        done = await rt.generate(session_id=r.session_id)
        assert done.status == "completed"
    (drive,) = [
        s
        for s in exporter.get_finished_spans()
        if s.name.startswith("invoke_agent")
        and (s.attributes or {}).get("signoff.session_id") == r.session_id
    ]
    assert _resumed(drive)["signoff.request_ids"] == [colour.id, size.id]
    assert (drive.attributes or {})["signoff.waited_seconds"] == 180


@so.tool
async def intake(ctx: so.ToolContext, n: int) -> str:
    """Ask one thing, then another."""
    colour = await ctx.ask("Colour?", options=["x", "y"])
    size = await ctx.ask("Size?", options=["s", "m"])
    return f"{colour.value} {size.value}"


async def test_a_workflows_earlier_answer_is_not_named_by_the_drive_after_its_next_question(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """A workflow call asks a question; the drive its answer resumes replays it and asks the
    next, with no `tool.started` (the call is running already). The drive after that answer
    names it alone and waits from when it was asked."""
    agent = scripted_agent("desk", [call_tools(call("intake", n=1)), reply("done")], tools=[intake])
    clock = ManualClock(1_000.0)
    async with so.Runtime([agent], store=store_url, tracer_provider=provider, clock=clock) as rt:
        r = await rt.generate("desk", "go", auth=ALICE)
        (colour,) = r.pending
        clock.advance(3_600)
        r = await rt.respond(r.session_id, _answer(colour, "x"), principal=ALICE)
        (size,) = r.pending
        clock.advance(10)
        exporter.clear()
        r = await rt.respond(r.session_id, _answer(size, "s"), principal=ALICE)
        assert r.status == "completed"
    drive = _drive(exporter)
    assert _resumed(drive)["signoff.request_ids"] == [size.id]
    assert (drive.attributes or {})["signoff.waited_seconds"] == 10


async def test_a_snapshot_of_fold_6_taken_after_an_answer_is_folded_again(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """Fold 6 kept no turn's `answered`: its snapshot taken between an answer and the drive
    that goes on with it would have the drive name nothing. It is folded again instead, and
    verification names nothing; the same snapshot recording this fold is named by the field."""
    agent = scripted_agent("desk", [call_tools(call("refund", n=1)), reply("done")], tools=[refund])
    clock = ManualClock(1_000.0)
    kwargs: dict[str, Any] = {"store": store_url, "tracer_provider": provider, "clock": clock}
    async with so.Runtime([agent], **kwargs) as rt:
        r = await rt.generate("desk", "go", auth=ALICE)
        (request,) = r.pending
    async with so.Runtime([agent], inline=False, **kwargs) as rt:
        clock.advance(60)
        await rt.respond(r.session_id, _answer(request, "approve"), principal=ALICE)
        events = [e async for e in rt.events(r.session_id, follow=False)]
    now = so.SessionState(id=r.session_id)
    for e in events:
        now.apply(e)
    assert now.turn is not None and now.turn.answered == [request.id]
    snapshot = now.to_snapshot()
    older = {**snapshot, "fold": 6, "turn": {**snapshot["turn"]}}
    del older["turn"]["answered"]
    write_snapshot(store_url, r.session_id, older)
    exporter.clear()
    async with so.Runtime([agent], **kwargs) as rt:
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.answered == [request.id]
        assert await rt.verify_audit() == []
        assert (await rt.generate(session_id=r.session_id)).status == "completed"
    drive = _drive(exporter)
    assert (drive.attributes or {})["signoff.waited_seconds"] == 60
    assert _resumed(drive)["signoff.request_ids"] == [request.id]
    write_snapshot(store_url, r.session_id, {**older, "fold": FOLD_VERSION})
    async with so.Runtime([agent], **kwargs) as rt:
        [problem] = await rt.verify_audit()
    assert (problem.stream, problem.reason) == (
        r.session_id,
        f"the snapshot at event {now.seq} differs from the event log: turn.answered",
    )


async def test_a_workers_retry_of_a_failed_turn_is_a_resumed_drive(
    store_url: str, exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """The turn's first model call fails; its retry (`generate(session_id=...)`) is left to a
    worker, whose drive finds the turn running again, with no step or call: it said the turn
    had not run before, where an inline retry, which finds it failed, says it had."""
    flaky = Flaky(reply("done"), failures=1, error=ConnectionError("provider down"))
    agent = so.Agent(name="desk", model=so.models.Scripted([flaky]))
    async with so.Runtime([agent], store=store_url, tracer_provider=provider, inline=False) as rt:
        owner = f"{rt.owner}:worker"

        async def work() -> ReadableSpan:
            exporter.clear()
            [(session_id, token)] = await rt.store.claim(owner, rt.lease_ttl, rt.now(), 1)
            await rt._work_on(session_id, owner, token)
            return _drive(exporter)

        r = await rt.generate("desk", "go")
        first = await work()
        assert (first.attributes or {})["signoff.turn.status"] == "failed"
        assert (first.attributes or {})["signoff.drive.resumed"] is False
        assert (await rt.generate(session_id=r.session_id)).status == "running"
        retry = await work()
    assert (retry.attributes or {})["signoff.turn.status"] == "completed"
    assert (retry.attributes or {})["signoff.drive.resumed"] is True


def _begun(tracing: Tracing, turn: TurnState) -> None:
    """A drive of a session whose turn is `turn`, begun and ended."""
    state = so.SessionState(id="ses_1", agent="desk", turn=turn)
    with tracing.drive("ses_1") as span:
        span.begin(state, 1.0)


def test_a_turn_with_a_paused_reply_journaled_or_a_retry_asked_for_ran_before(
    exporter: InMemorySpanExporter, provider: TracerProvider
) -> None:
    """A drive that finds the turn running with no step or call yet: its first (not resumed),
    one after a drive died mid-reply (a paused part journaled), or one after a retry was asked
    for (the failure's error kept)."""
    tracing = tracing_for(provider, False)
    part = {"model": "anthropic:m", "data": {"content": []}, "usage": {}, "read_through": 3}
    for turn, resumed in (
        (TurnState(id="trn_1"), False),
        (TurnState(id="trn_1", paused=(part,)), True),
        (TurnState(id="trn_1", error={"code": "model_error"}, retryable=True), True),
    ):
        exporter.clear()
        _begun(tracing, turn)
        (drive,) = exporter.get_finished_spans()
        assert (drive.attributes or {})["signoff.drive.resumed"] is resumed, turn
