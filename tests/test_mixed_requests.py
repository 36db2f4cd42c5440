"""One turn waiting on an approval and a question at once, answered in every order and from
every surface, on both stores: from Python here, over HTTP, the CLI and the dashboard in
`test_mixed_requests_surfaces`.

Three ways a step opens both kinds: a gated tool that takes a context (a workflow tool, asked at
once) beside `ask_question`; a workflow tool's `ctx.request_approval` beside another's
`ctx.ask`; and an ordinary gated tool beside `ask_question`, whose approval the seed asks only
once the question's call has finished. Each run must end as an uninterrupted one does, run each
approved tool once, close each request exactly once and keep `seq` and the audit chain whole.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from typing import Any

import pytest

import signoff as so
from signoff.stores import PendingFilter
from signoff.testing import (
    ExecutionLog,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    store_contents,
    timeline,
)

ALICE = so.Principal(authenticator="test", principal_id="alice")
LOG = ExecutionLog()
"""Every body of the gated tools that ran, in this process (the CLI and servers run in it too)."""

SHIPPING = [
    {"label": "Standard", "description": "Five working days."},
    {"label": "Express", "description": "Tomorrow."},
]
QUESTION = "How should we ship the replacement?"


@LOG.tool(approval=so.always())
async def refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
    """Refund an order (it takes a context, so it is a workflow tool)."""
    return {"refunded": amount, "order_id": order_id}


@LOG.tool(approval=so.always())
async def refund_plain(order_id: str, amount: float) -> dict[str, Any]:
    """Refund an order (an ordinary tool)."""
    return {"refunded": amount, "order_id": order_id}


@LOG.tool
async def reship(ctx: so.ToolContext, order_id: str) -> str:
    """Ship a replacement once a reviewer signs off (the decision is the call's result)."""
    ctx.request_approval({"action": "reship", "order_id": order_id})
    return "unreachable"


@so.tool
async def pick(ctx: so.ToolContext) -> str:
    """Ask how to ship, in a workflow tool of our own."""
    answer = await ctx.ask(QUESTION, options=["Standard", "Express"])
    return f"ship {answer.value}"


def finish(conversation: list[so.Message]) -> so.ModelResponse:
    """The final answer reads every tool result, so it shows what each request settled to."""
    results = sorted(
        json.dumps(_plain(m.content), sort_keys=True)
        for m in conversation
        if isinstance(m, so.ToolResultMessage)
    )
    last = conversation[-1]
    said = f" (you said: {last.text})" if isinstance(last, so.UserMessage) else ""
    return so.ModelResponse(text="done: " + " | ".join(results) + said)


def _plain(content: Any) -> Any:
    """A decision without who made it (a principal's dump) or when: the same in every run."""
    if isinstance(content, dict):
        return {k: _plain(v) for k, v in content.items() if k not in ("by", "at")}
    return content


def _agent(name: str, *calls: so.ToolCall) -> so.Agent:
    tools: list[Any] = [refund, refund_plain, reship, pick, so.ask_question()]
    return so.Agent(name=name, model=so.models.Scripted([call_tools(*calls), finish]), tools=tools)


gated = _agent(
    "gated",
    call("refund", call_id="c1", order_id="7", amount=30),
    call("ask_question", call_id="c2", question=QUESTION, options=SHIPPING),
)
"""A gated workflow tool beside `ask_question`: both requests open in one step."""

anvil = _agent("anvil", call("reship", call_id="c1", order_id="7"), call("pick", call_id="c2"))
"""`ctx.request_approval` in one workflow tool beside `ctx.ask` in another."""

deferred = _agent(
    "deferred",
    call("refund_plain", call_id="c1", order_id="7", amount=30),
    call("ask_question", call_id="c2", question=QUESTION, options=SHIPPING),
)
"""An ordinary gated tool beside `ask_question`: its approval waits for the question."""

AGENTS = [gated, anvil, deferred]
AT_ONCE = ["gated", "anvil"]
GATED_TOOL = {"gated": "refund", "anvil": "reship", "deferred": "refund_plain"}
PARKED_RUNS = {"gated": 0, "anvil": 1, "deferred": 0}
"""How often the gated tool's body ran by the time its approval is asked: `reship`'s body
runs once to ask (`ctx.request_approval`), and its decision is its result, never a re-run."""

EXPECTED = {
    "gated": 'done: {"answer": "Express", "status": "answered"} | '
    '{"order_id": "7", "refunded": 30.0}',
    "anvil": 'done: "ship Express" | {"approved": true, "outcome": "approved", "reason": null}',
    "deferred": 'done: {"answer": "Express", "status": "answered"} | '
    '{"order_id": "7", "refunded": 30.0}',
}
"""The final answer of an uninterrupted run: both requests answered in one call (checked by
`test_the_reference_run_answers_both_in_one_call`)."""


def answer(request: so.InputRequest) -> so.InputResponse:
    """Approve an approval, pick Express for a question."""
    if request.kind == "tool-approval":
        return so.InputResponse(request_id=request.id, option_id="approve")
    express = next(o.id for o in request.options if o.label == "Express")
    return so.InputResponse(request_id=request.id, option_id=express)


def runs(session_id: str, tool: str) -> int:
    return sum(1 for e in LOG.of(tool) if e.session_id == session_id)


async def events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


async def assert_whole(
    rt: so.Runtime, session_id: str, *, ran: dict[str, int], open_ok: bool = False
) -> list[so.Event]:
    """The invariants of every run: `seq` gap-free, each request asked once and closed once (none
    lost, none left open unless `open_ok`), each approval settled at most once, the store's
    request rows agreeing, the audit chain intact, and each gated tool run `ran` times."""
    log = await events(rt, session_id)
    assert [e.seq for e in log] == list(range(1, len(log) + 1))
    asked = [r["id"] for e in log if e.type == "input.requested" for r in e.data["requests"]]
    assert len(asked) == len(set(asked)), asked
    closed = [e.data["request_id"] for e in log if e.type == "input.resolved"]
    assert len(closed) == len(set(closed)), closed
    assert set(closed) <= set(asked)
    if not open_ok:
        assert sorted(closed) == sorted(asked)
    settled = [e.data["request_id"] for e in log if e.type == "approval.settled"]
    assert len(settled) == len(set(settled)), settled
    rows = await rt.store.pending(PendingFilter(session_id=session_id, status=None, limit=100))
    assert sorted(r.id for r in rows) == sorted(asked)
    assert sorted(r.id for r in rows if r.status != "pending") == sorted(closed)
    assert await rt.verify_audit(session_id) == []
    for tool, count in ran.items():
        assert runs(session_id, tool) == count, tool
    return log


async def park(rt: so.Runtime, agent: str) -> tuple[str, list[so.InputRequest]]:
    r = await rt.generate(agent, prompt="order 7 arrived broken", auth=ALICE)
    assert r.status == "waiting"
    return r.session_id, r.pending


# -- Python ----------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", AT_ONCE)
async def test_both_requests_open_at_once_in_the_order_asked(store_url: str, agent: str) -> None:
    async with so.Runtime(AGENTS, store=store_url) as rt:
        sid, pending = await park(rt, agent)
        assert [p.kind for p in pending] == ["tool-approval", "question"]
        approval, question = pending
        assert approval.tool_name == GATED_TOOL[agent] and question.question == QUESTION
        if agent == "anvil":
            assert approval.payload == {"action": "reship", "order_id": "7"}
        listed = await rt.pending(session_id=sid)
        assert [p.id for p in listed] == [approval.id, question.id]
        state = await rt.state(sid)
        assert [p.id for p in state.pending_requests()] == [approval.id, question.id]
        log = await assert_whole(rt, sid, ran={GATED_TOOL[agent]: PARKED_RUNS[agent]}, open_ok=True)
        waiting = [e for e in log if e.type == "turn.waiting"]
        assert waiting[-1].data["request_ids"] == [approval.id, question.id]
        assert log[-1].type == "turn.waiting"


@pytest.mark.parametrize("agent", [*AT_ONCE, "deferred"])
async def test_the_reference_run_answers_both_in_one_call(store_url: str, agent: str) -> None:
    """Both answers in one `respond` call (for `deferred`, each as it is asked)."""
    async with so.Runtime(AGENTS, store=store_url) as rt:
        sid, pending = await park(rt, agent)
        r = await rt.respond(sid, [answer(p) for p in pending], principal=ALICE)
        if agent == "deferred":
            assert r.status == "waiting"
            r = await rt.respond(sid, [answer(p) for p in r.pending], principal=ALICE)
        assert (r.status, r.text, r.pending) == ("completed", EXPECTED[agent], [])
        tool = GATED_TOOL[agent]
        await assert_whole(rt, sid, ran={tool: 1})
        # the same answers again are no-ops returning the first outcome
        again = await rt.respond(sid, [answer(p) for p in pending], principal=ALICE)
        assert all(not o.applied for o in again.outcomes)
        await assert_whole(rt, sid, ran={tool: 1})


@pytest.mark.parametrize("agent", AT_ONCE)
@pytest.mark.parametrize("first", ["tool-approval", "question"])
async def test_one_at_a_time_in_either_order(store_url: str, agent: str, first: str) -> None:
    tool = GATED_TOOL[agent]
    async with so.Runtime(AGENTS, store=store_url) as rt:
        sid, pending = await park(rt, agent)
        one = next(p for p in pending if p.kind == first)
        other = next(p for p in pending if p.kind != first)
        r = await rt.respond(sid, [answer(one)], principal=ALICE)
        assert r.status == "waiting"
        assert [p.id for p in r.pending] == [other.id]
        # an approved gated workflow call runs while the question waits; the decision of
        # `ctx.request_approval` is its call's result, nothing runs again
        ran = 1 if first == "tool-approval" else PARKED_RUNS[agent]
        await assert_whole(rt, sid, ran={tool: ran}, open_ok=True)
        r = await rt.respond(sid, [answer(other)], principal=ALICE)
        assert (r.status, r.text) == ("completed", EXPECTED[agent])
        log = await assert_whole(rt, sid, ran={tool: 1})
        kinds = {p.id: p.kind for p in pending}
        closing = [kinds[e.data["request_id"]] for e in log if e.type == "input.resolved"]
        assert closing == [first, other.kind]


@pytest.mark.parametrize("agent", AT_ONCE)
async def test_approvals_alone_while_a_question_is_open_are_refused(
    store_url: str, agent: str
) -> None:
    """`generate(approvals=...)` must settle every pending request: with a question open it
    raises `PartialAnswer` naming the question, and a decision cannot answer a question
    (`InvalidAnswer`); either way nothing is stored."""
    async with so.Runtime(AGENTS, store=store_url) as rt:
        sid, (approval, question) = await park(rt, agent)
        before = await store_contents(rt.store, sid)
        ok = so.Decision(id=approval.id, approved=True)
        with pytest.raises(so.PartialAnswer) as partial:
            await rt.generate(session_id=sid, approvals=[ok], auth=ALICE)
        assert question.id in str(partial.value) and approval.id not in str(partial.value)
        assert f"{question.id} is a question" in str(partial.value)  # answered by respond()
        as_decision = so.Decision(id=question.id, approved=True)
        with pytest.raises(so.InvalidAnswer, match=question.id):
            await rt.generate(session_id=sid, approvals=[ok, as_decision], auth=ALICE)
        assert await store_contents(rt.store, sid) == before
        assert runs(sid, GATED_TOOL[agent]) == PARKED_RUNS[agent]
        # once the question is answered, the approvals alone settle the turn
        r = await rt.respond(sid, [answer(question)], principal=ALICE)
        assert [p.id for p in r.pending] == [approval.id]
        r = await rt.generate(session_id=sid, approvals=[ok], auth=ALICE)
        assert (r.status, r.text) == ("completed", EXPECTED[agent])
        await assert_whole(rt, sid, ran={GATED_TOOL[agent]: 1})


@pytest.mark.parametrize("agent", AT_ONCE)
async def test_a_message_answers_the_first_open_request_in_asked_order(
    store_url: str, agent: str
) -> None:
    """The approval was asked first: "Express" is no option of it, so that message is not an
    answer (it would steer); "approve" answers it, then "Express" answers the question."""
    async with so.Runtime(AGENTS, store=store_url) as rt:
        sid, (approval, question) = await park(rt, agent)
        r = await rt.send(sid, "approve", principal=ALICE)
        assert r.status == "waiting" and [p.id for p in r.pending] == [question.id]
        assert runs(sid, GATED_TOOL[agent]) == 1  # the approved call ran, or asked and is done
        r = await rt.send(sid, "Express", principal=ALICE)
        assert (r.status, r.text) == ("completed", EXPECTED[agent])
        log = await assert_whole(rt, sid, ran={GATED_TOOL[agent]: 1})
        closed = [e.data["request_id"] for e in log if e.type == "input.resolved"]
        assert closed == [approval.id, question.id]
        assert not any(e.type == "turn.message" for e in log)  # both were answers


@pytest.mark.parametrize("agent", AT_ONCE)
async def test_a_message_that_fits_only_the_second_request_steers(
    store_url: str, agent: str
) -> None:
    """A message answers only the first open request: "Express" fits the question, asked second,
    not the approval, so it steers: the approval is ignored, the question withdrawn, the gated
    call never runs and the model reads the message."""
    async with so.Runtime(AGENTS, store=store_url) as rt:
        sid, (approval, question) = await park(rt, agent)
        r = await rt.send(sid, "Express", principal=ALICE)
        assert r.status == "completed" and r.pending == []
        assert r.text is not None and r.text.endswith("(you said: Express)")
        log = await assert_whole(rt, sid, ran={GATED_TOOL[agent]: PARKED_RUNS[agent]})
        resolved = {e.data["request_id"]: e.data for e in log if e.type == "input.resolved"}
        assert resolved[approval.id]["outcome"] == "ignored"
        assert resolved[question.id]["status"] == "withdrawn"
        with pytest.raises(so.RequestClosed):
            await rt.respond(sid, [answer(approval)], principal=ALICE)


@pytest.mark.parametrize("agent", AT_ONCE)
@pytest.mark.parametrize("first", ["tool-approval", "question"])
async def test_a_cancel_between_the_two_answers(store_url: str, agent: str, first: str) -> None:
    tool = GATED_TOOL[agent]
    async with so.Runtime(AGENTS, store=store_url) as rt:
        sid, pending = await park(rt, agent)
        one = next(p for p in pending if p.kind == first)
        other = next(p for p in pending if p.kind != first)
        await rt.respond(sid, [answer(one)], principal=ALICE)
        ran = runs(sid, tool)
        await rt.cancel(sid, reason="changed my mind", principal=ALICE)
        assert await rt.pending(session_id=sid) == []
        before = await store_contents(rt.store, sid)
        with pytest.raises(so.RequestClosed, match=other.id):
            await rt.respond(sid, [answer(other)], principal=ALICE)
        assert await store_contents(rt.store, sid) == before
        log = await assert_whole(rt, sid, ran={tool: ran})
        approved_first = (agent, first) == ("gated", "tool-approval")
        assert ran == (1 if approved_first else PARKED_RUNS[agent])
        assert [e.type for e in log][-2:] == ["turn.cancelled", "session.waiting"]
        resolved = {e.data["request_id"]: e.data for e in log if e.type == "input.resolved"}
        assert resolved[other.id]["status"] == "withdrawn"
        assert resolved[one.id]["status"] == "settled"
        # the session goes on: a new message starts a new turn
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.status == "cancelled"


@pytest.mark.parametrize("agent", [*AT_ONCE, "deferred"])
async def test_answers_recorded_without_resuming_then_a_worker_finishes(
    store_url: str, agent: str
) -> None:
    """`respond(resume=False)` records each answer and leaves the turn `running` for a worker,
    which finishes it as an uninterrupted run does."""
    async with (
        so.Runtime(AGENTS, store=store_url) as front,
        so.Runtime(AGENTS, store=store_url, inline=False) as worker,
    ):
        sid, pending = await park(front, agent)
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.02))
        try:
            while pending:  # the request asked last first
                r = await front.respond(sid, [answer(pending[-1])], principal=ALICE, resume=False)
                assert r.status == "running"
                pending = await _parked(front, sid)
        finally:
            stop.set()
            await asyncio.wait_for(working, timeout=10)
        state = await front.state(sid)
        assert state.turn is not None and state.turn.status == "completed"
        log = await assert_whole(front, sid, ran={GATED_TOOL[agent]: 1})
        done = next(e for e in reversed(log) if e.type == "model.completed")
        assert done.data["text"] == EXPECTED[agent]


async def _parked(rt: so.Runtime, sid: str) -> list[so.InputRequest]:
    """Wait until a worker has parked the turn again or finished it; what is pending then."""
    for _ in range(500):
        state = await rt.state(sid)
        if state.status in ("waiting", "idle"):
            return state.pending_requests()
        await asyncio.sleep(0.02)
    raise AssertionError("no worker parked or finished the turn")


async def test_an_approval_beside_a_workflow_call_is_asked_once_it_finishes(
    store_url: str,
) -> None:
    """The seed: "An approval for a tool call made in the same step as a workflow tool call,
    such as ask_question, is not requested until the workflow tool call finishes ... The person
    answers the question first, then sees the approval"."""
    async with so.Runtime(AGENTS, store=store_url) as rt:
        sid, pending = await park(rt, "deferred")
        [question] = pending
        assert question.kind == "question"
        assert [p.id for p in await rt.pending(session_id=sid)] == [question.id]
        r = await rt.respond(sid, [answer(question)], principal=ALICE)
        [approval] = r.pending
        assert approval.kind == "tool-approval" and approval.tool_name == "refund_plain"
        assert runs(sid, "refund_plain") == 0
        r = await rt.respond(sid, [answer(approval)], principal=ALICE)
        assert (r.status, r.text) == ("completed", EXPECTED["deferred"])
        log = await assert_whole(rt, sid, ran={"refund_plain": 1})
        assert timeline(log)[3:] == [
            "tool.started ask_question",
            f"input.requested question:{QUESTION}",
            "turn.waiting",
            "input.resolved answered",
            "tool.completed ask_question ok",
            "input.requested tool-approval:refund_plain",
            "turn.waiting",
            "approval.settled approve",
            "input.resolved approved",
            "tool.started refund_plain",
            "tool.completed refund_plain ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]


async def test_a_gated_workflow_tool_is_asked_beside_the_question(store_url: str) -> None:
    """A gated tool that takes a context is a workflow tool: its approval is asked at once,
    before `ask_question` starts, and once approved it runs while the question waits."""
    async with so.Runtime(AGENTS, store=store_url) as rt:
        sid, (approval, question) = await park(rt, "gated")
        r = await rt.respond(sid, [answer(approval)], principal=ALICE)
        r = await rt.respond(sid, [answer(question)], principal=ALICE)
        assert r.text == EXPECTED["gated"]
        log = await assert_whole(rt, sid, ran={"refund": 1})
        assert timeline(log)[3:] == [
            "input.requested tool-approval:refund",
            "tool.started ask_question",
            f"input.requested question:{QUESTION}",
            "turn.waiting",
            "approval.settled approve",
            "input.resolved approved",
            "tool.started refund",
            "tool.completed refund ok",
            "turn.waiting",
            "input.resolved answered",
            "tool.completed ask_question ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]


async def test_a_message_answers_a_subagents_limit_prompt_before_an_earlier_question(
    store_url: str,
) -> None:
    """The seed: a message answers "a runtime limit continuation prompt if one is open", even
    one asked after a question that would take the message as free text."""

    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    spent = so.Usage(input_tokens=0, output_tokens=50)
    orders = so.Agent(
        name="orders",
        model=so.models.Scripted([call_tools(call("lookup", order_id="3"), usage=spent), finish]),
        tools=[lookup],
        limits=so.Limits(max_tokens=40),
    )
    support = so.Agent(
        name="support",
        model=so.models.Scripted(
            [
                call_tools(
                    call("ask_question", call_id="c1", question=QUESTION, options=SHIPPING),
                    call("orders", call_id="c2", message="where is 3?"),
                ),
                finish,
            ]
        ),
        tools=[so.ask_question(), so.delegate("orders")],
    )
    async with so.Runtime([support, orders], store=store_url) as rt:
        sid, pending = await park(rt, "support")
        assert [p.kind for p in pending] == ["question", "session-limit"]
        question, limit = pending
        r = await rt.send(sid, "continue", principal=ALICE)
        assert r.status == "waiting" and [p.id for p in r.pending] == [question.id]
        r = await rt.send(sid, "Express", principal=ALICE)
        assert r.status == "completed"
        assert r.text == 'done: "done: \\"shipped\\"" | {"answer": "Express", "status": "answered"}'
        log = await assert_whole(rt, sid, ran={})
        resolved = [
            (e.data["request_id"], e.data["outcome"]) for e in log if e.type == "input.resolved"
        ]
        assert resolved == [(limit.id, "answered"), (question.id, "answered")]
        assert not any(e.type == "turn.message" for e in log)


async def test_questions_of_one_moment_are_listed_and_answered_in_the_order_asked(
    store_url: str,
) -> None:
    """Six questions of one response on a clock that stands still share their `created_at`:
    the queue lists them (whole, and page by page) in the order asked, as `r.pending` does,
    so the top of the listing is the request a message answers."""
    calls = [call("ask_question", call_id=f"q{i}", question=f"Question {i}?") for i in range(6)]
    agent = scripted_agent("asker", [call_tools(*calls), reply("ok")], tools=[so.ask_question()])
    async with so.Runtime([agent], store=store_url, clock=ManualClock()) as rt:
        r = await rt.generate("asker", prompt="go", auth=ALICE)
        asked = [p.id for p in r.pending]
        assert [p.question for p in r.pending] == [f"Question {i}?" for i in range(6)]
        assert [p.id for p in await rt.pending(session_id=r.session_id)] == asked
        paged: list[str] = []
        flt = PendingFilter(session_id=r.session_id, limit=4)
        while True:
            page, more = await rt.pending_page(flt)
            paged += [p.id for p in page]
            if not more:
                break
            flt = replace(flt, after=(page[-1].created_at, page[-1].id))
        assert paged == asked
        top = (await rt.pending(session_id=r.session_id, limit=1))[0]
        await rt.send(r.session_id, "my answer", principal=ALICE)
        log = await events(rt, r.session_id)
        assert [e.data["request_id"] for e in log if e.type == "input.resolved"] == [top.id]
