"""Subagents: `so.delegate()` runs a turn of another agent in a child session; the child's
requests are asked on the parent, answers given there resume the child without calling the
parent's model, through a restart, a grandchild and workers.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff import _subagents
from signoff._tool_context import ToolContext
from signoff.testing import (
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    timeline,
    tool_results,
)

from ._subagents import (
    ALICE,
    Counted,
    approve_refund_through_parent,
    events,
    refund_agents,
    two_step_children,
)

SHIPPING = [
    {"label": "Standard", "description": "Arrives in five working days."},
    {"label": "Express", "description": "Arrives tomorrow."},
]


async def test_child_approval_is_asked_and_answered_through_the_parent(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("The refund went through.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    assert r.status == "waiting"
    [mirror] = r.pending
    assert mirror.kind == "tool-approval" and mirror.source == "child"
    assert mirror.session_id == r.session_id and mirror.agent == "support"
    assert mirror.child is not None and mirror.child.agent == "billing"
    assert mirror.child.call_id == "d1"
    child_id = mirror.child.session_id
    [original] = await rt.pending(session_id=child_id)
    assert original.id == mirror.child.request_id != mirror.id
    # The same request: same kind, options, action (hash included) and requester.
    assert original.action == mirror.action and original.options == mirror.options
    assert mirror.action is not None and mirror.action.tool_name == "issue_refund"
    assert original.requested_by == mirror.requested_by == ALICE
    assert (await rt.state(child_id)).parent == r.session_id
    assert ran == [] and after.calls == 0

    done = await rt.respond(
        r.session_id,
        [so.InputResponse(request_id=mirror.id, option_id="approve")],
        principal=ALICE,
    )
    assert done.status == "completed" and done.text == "The refund went through."
    assert done.outcomes == [so.Outcome(request_id=mirror.id, outcome="approved", applied=True)]
    assert ran == [{"order_id": "1042", "amount": 180.0}]
    assert after.calls == 1  # the parent's model ran once, after the child's turn finished
    [result] = tool_results(after.capture.last)
    assert result.tool_name == "billing" and not result.is_error
    assert result.content == "Refunded: {'refunded': 180.0}"
    assert await rt.pending() == []

    assert timeline(await events(rt, r.session_id)) == [
        "session.created",
        "turn.started",
        "model.completed",
        "tool.started billing",
        "tool.step billing:subagent.session",
        "input.requested tool-approval:issue_refund",
        "turn.waiting",
        "input.resolved approved",
        "tool.completed billing ok",
        "model.completed",
        "turn.completed",
        "session.waiting",
    ]
    assert timeline(await events(rt, child_id)) == [
        "session.created",
        "turn.started",
        "model.completed",
        "input.requested tool-approval:issue_refund",
        "turn.waiting",
        "approval.settled approve",
        "input.resolved approved",
        "tool.started issue_refund",
        "tool.completed issue_refund ok",
        "model.completed",
        "turn.completed",
        "session.waiting",
    ]
    created = (await events(rt, child_id))[0]
    assert created.data["parent"] == r.session_id and created.data["agent"] == "billing"
    settled = [e for e in await events(rt, child_id) if e.type == "approval.settled"]
    assert settled[0].data["by"]["principal_id"] == "alice"
    await rt.close()


async def test_a_denial_through_the_parent_reaches_the_child_model(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("Not refunded.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    done = await rt.generate(
        session_id=r.session_id,
        approvals=[so.Decision(id=r.pending[0].id, approved=False, reason="over the limit")],
        auth=ALICE,
    )
    assert done.status == "completed" and ran == [] and after.calls == 1
    [result] = tool_results(after.capture.last)
    assert "over the limit" in result.content and "alice" in result.content
    await rt.close()


async def test_child_questions_answered_by_message_to_the_parent(tmp_path: Path) -> None:
    def answer(conv: list[so.Message]) -> str:
        content = tool_results(conv)[-1].content
        assert content["status"] == "answered"
        return str(content["answer"])

    child = scripted_agent(
        "shipping",
        [
            call_tools(call("ask_question", question="How to ship?", options=SHIPPING)),
            lambda conv: call_tools(call("ask_question", question=f"{answer(conv)} to where?")),
            lambda conv: reply(f"Shipping to {answer(conv)}."),
        ],
        tools=[so.ask_question()],
    )
    after = Counted("Booked.")
    parent = scripted_agent(
        "front",
        [call_tools(call("ship", message="Ship order 7")), after],
        tools=[so.delegate("shipping", name="ship")],
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("front", prompt="Ship order 7", auth=ALICE)
    [first] = r.pending
    assert first.kind == "question" and first.question == "How to ship?"
    assert [o.label for o in first.options] == ["Standard", "Express"]
    assert first.allow_text and first.source == "child"

    r = await rt.send(r.session_id, "2", principal=ALICE)  # picks "Express" in the child
    assert r.status == "waiting" and after.calls == 0
    [second] = r.pending
    assert second.question == "Express to where?" and second.id != first.id
    assert second.child is not None and first.child is not None
    assert second.child.session_id == first.child.session_id

    r = await rt.send(r.session_id, "Lisbon", principal=ALICE)
    assert r.status == "completed" and r.text == "Booked." and after.calls == 1
    assert tool_results(after.capture.last)[0].content == "Shipping to Lisbon."
    assert timeline(await events(rt, r.session_id))[5:] == [
        "input.requested question:How to ship?",
        "turn.waiting",
        "input.resolved answered",
        "input.requested question:Express to where?",
        "turn.waiting",
        "input.resolved answered",
        "tool.completed ship ok",
        "model.completed",
        "turn.completed",
        "session.waiting",
    ]
    assert timeline(await events(rt, first.child.session_id)) == [
        "session.created",
        "turn.started",
        "model.completed",
        "tool.started ask_question",
        "input.requested question:How to ship?",
        "turn.waiting",
        "input.resolved answered",
        "tool.completed ask_question ok",
        "model.completed",
        "tool.started ask_question",
        "input.requested question:Express to where?",
        "turn.waiting",
        "input.resolved answered",
        "tool.completed ask_question ok",
        "model.completed",
        "turn.completed",
        "session.waiting",
    ]
    await rt.close()


async def test_a_restart_between_the_request_and_the_answer(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    first_after = Counted("unused")
    parent, child = refund_agents(ran, first_after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    mirror = r.pending[0]
    await rt.close()

    after = Counted("Refunded after the restart.")
    parent2, child2 = refund_agents(ran, after)
    rt2 = sqlite_runtime(tmp_path, parent2, child2)
    assert [p.id for p in await rt2.pending(session_id=r.session_id)] == [mirror.id]
    done = await rt2.respond(
        r.session_id, [{"request_id": mirror.id, "option_id": "approve"}], principal=ALICE
    )
    assert done.status == "completed" and done.text == "Refunded after the restart."
    assert ran == [{"order_id": "1042", "amount": 180.0}]
    assert first_after.calls == 0 and after.calls == 1
    assert mirror.child is not None
    child_events = await events(rt2, mirror.child.session_id)
    assert [e.type for e in child_events].count("session.created") == 1
    assert [e.type for e in child_events].count("turn.started") == 1
    await rt2.close()


async def test_a_message_that_answers_nothing_stops_the_child(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("Okay, dropped it.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    mirror = r.pending[0]
    assert mirror.child is not None
    done = await rt.send(r.session_id, "actually, forget the refund", principal=ALICE)
    assert done.status == "completed" and done.text == "Okay, dropped it."
    assert ran == [] and after.calls == 1
    [result] = tool_results(after.capture.last)
    assert result.content == {"interrupted": True, "session_id": mirror.child.session_id}
    assert (await rt.state(mirror.child.session_id)).status == "cancelled"
    assert await rt.pending() == []
    await rt.close()


async def test_a_message_while_the_child_runs_stops_the_child(store_url: str) -> None:
    """Steering the parent while its child's turn runs (a slow tool, not a request) cancels
    the child's turn too, its tool seeing its abort signal: the child ran on to its end, its
    model called again, and the parent's model read the message only after."""
    ran: list[str] = []

    @so.tool
    async def reconcile(ctx: so.ToolContext, account: str) -> str:
        """Reconcile an account, a slow job."""
        ran.append("start")
        for _ in range(200):
            if ctx.abort_signal.is_set():
                ran.append("aborted")
                return "stopped"
            await asyncio.sleep(0.05)
        ran.append("end")
        return "reconciled"

    child_after = Counted("Reconciled.")
    child = scripted_agent(
        "billing",
        [call_tools(call("reconcile", account="acme")), child_after],
        tools=[reconcile],
    )
    after = Counted("Okay, stopped.")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Reconcile acme")), after],
        tools=[so.delegate("billing")],
    )
    async with so.Runtime([parent, child], store=store_url) as rt:
        sid = await rt.create_session("support")
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="go", auth=ALICE))
        async with asyncio.timeout(10):  # two full drives on PostgreSQL, however busy the machine
            while not ran:
                await asyncio.sleep(0.01)
            done = await rt.send(sid, "actually, leave it", principal=ALICE)
            first = await running
        assert first.status == "completed" and done.text == "Okay, stopped."
        assert ran == ["start", "aborted"] and child_after.calls == 0
        [kid] = [s.id for s in await rt.sessions() if s.agent == "billing"]
        [result] = tool_results(after.capture.last)
        assert result.content == {"interrupted": True, "session_id": kid}
        assert (await rt.state(kid)).status == "cancelled"


async def test_the_childs_response_policy_decides_answers_given_through_the_parent(
    tmp_path: Path,
) -> None:
    def only_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        who = ctx.response.principal
        if who is not None and who.principal_id == "bob":
            return so.Allowed()
        return so.Rejected("only bob approves refunds")

    ran: list[str] = []

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=only_bob))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "ok"

    child = scripted_agent(
        "billing", [call_tools(call("refund", order_id="9")), reply("refunded")], tools=[refund]
    )
    after = Counted("done")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 9")), after],
        tools=[so.delegate("billing")],
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="refund 9", auth=ALICE)
    rid = r.pending[0].id
    refused = await rt.respond(
        r.session_id, [so.InputResponse(request_id=rid, option_id="approve")], principal=ALICE
    )
    assert refused.status == "waiting" and [p.id for p in refused.pending] == [rid]
    assert refused.outcomes[0].request_id == rid and not refused.outcomes[0].applied
    assert ran == [] and after.calls == 0
    bob = so.Principal(authenticator="okta", principal_id="bob")
    done = await rt.respond(
        r.session_id, [so.InputResponse(request_id=rid, option_id="approve")], principal=bob
    )
    assert done.status == "completed" and ran == ["9"] and after.calls == 1
    await rt.close()


async def test_a_grandchild_request_routes_hop_by_hop(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    middle_after = Counted("billing says it is refunded")
    top_after = Counted("All sorted.")
    _, refunds = refund_agents(ran, Counted("unused"))  # its "billing" agent, two levels down
    middle = scripted_agent(
        "desk",
        [call_tools(call("billing", message="refund 1042")), middle_after],
        tools=[so.delegate("billing")],
    )
    top = scripted_agent(
        "front",
        [call_tools(call("desk", message="sort out 1042")), top_after],
        tools=[so.delegate("desk")],
    )
    rt = sqlite_runtime(tmp_path, top, middle, refunds)
    r = await rt.generate("front", prompt="sort out 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None and mirror.child.agent == "desk"
    [middle_mirror] = await rt.pending(session_id=mirror.child.session_id)
    assert middle_mirror.id == mirror.child.request_id and middle_mirror.child is not None
    [original] = await rt.pending(session_id=middle_mirror.child.session_id)
    assert original.action == middle_mirror.action == mirror.action
    assert len(await rt.pending()) == 3
    done = await rt.send(r.session_id, "approve", principal=ALICE)
    assert done.status == "completed" and done.text == "All sorted."
    assert ran == [{"order_id": "1042", "amount": 180.0}]
    assert middle_after.calls == 1 and top_after.calls == 1
    assert tool_results(top_after.capture.last)[0].content == "billing says it is refunded"
    assert await rt.pending() == []
    await rt.close()


async def test_workers_run_the_parent_and_its_child(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("Done by the workers.")
    parent, child = refund_agents(ran, after)
    url = f"sqlite:///{tmp_path / 'state.db'}"

    async def turn_status(rt: so.Runtime, session_id: str) -> str:
        turn = (await rt.state(session_id)).turn
        return "none" if turn is None else turn.status

    async def until(rt: so.Runtime, session_id: str, wanted: str) -> None:
        for _ in range(500):
            if await turn_status(rt, session_id) == wanted:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{session_id} never became {wanted}")

    async with (
        so.Runtime([parent, child], store=url, inline=False) as front,
        so.Runtime([parent, child], store=url, inline=False, lease_ttl=2.0) as worker,
    ):
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05, concurrency=2))
        try:
            r = await front.generate("support", prompt="Refund order 1042", auth=ALICE)
            assert r.status == "running"
            await until(front, r.session_id, "waiting")
            [mirror] = await front.pending(session_id=r.session_id)
            assert mirror.child is not None and ran == []
            await front.respond(
                r.session_id,
                [so.InputResponse(request_id=mirror.id, option_id="approve")],
                principal=ALICE,
            )
            await until(front, r.session_id, "completed")
        finally:
            stop.set()
            await asyncio.wait_for(working, 10)
        assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1
        assert (await front.state(mirror.child.session_id)).status == "idle"


async def test_an_agent_delegating_to_itself_stops_at_the_depth_limit(store_url: str) -> None:
    # Each session's model delegates once, then answers with what its call returned: without a
    # bound on nesting, every child delegates again and sessions are created for ever.
    def answer(conversation: list[so.Message]) -> so.ModelResponse:
        result = tool_results(conversation)[-1]
        return reply(f"{'error' if result.is_error else 'ok'}: {result.content}")

    agent = scripted_agent(
        "loop", [call_tools(call("loop", message="go deeper")), answer], tools=[so.delegate("loop")]
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await asyncio.wait_for(rt.generate("loop", prompt="start"), 10)
        assert r.status == "completed"
        sessions = await rt.sessions(limit=100)
        # The root and MAX_DEPTH children below it, each ended; no child of the deepest one.
        assert len(sessions) == 1 + _subagents.MAX_DEPTH
        assert {s.status for s in sessions} == {"idle"}
        assert r.text.count("ok: ") == _subagents.MAX_DEPTH
        assert f"would nest subagents {_subagents.MAX_DEPTH + 1} deep" in r.text


async def test_a_call_journaled_in_two_steps_by_an_older_signoff_replays_both(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delegate call an older signoff journaled as two steps (`subagent.session`, then
    `subagent.turn`), parked on its child's approval, replays both when answered after the
    upgrade, which makes one: the child's turn is not started again, the refund runs once, and
    the call's result is the child's text."""
    ran: list[dict[str, Any]] = []
    after = Counted("The refund went through.")
    parent, child = refund_agents(ran, after)
    two_step_children(monkeypatch)
    step = ToolContext._step

    async def older(ctx: ToolContext, name: str, fn: Any, *args: Any, child: bool = False) -> Any:
        result = await step(ctx, name, fn, *args)  # unmarked (`child`), as it journaled it
        if name == "subagent.session":  # its second step, journaled (the turn starts after)
            await step(ctx, "subagent.turn", _started, (), {})
        return result

    monkeypatch.setattr(ToolContext, "_step", older)
    async with so.Runtime([parent, child], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
    monkeypatch.undo()
    async with so.Runtime([parent, child], store=store_url) as rt:
        await approve_refund_through_parent(rt, r.session_id, mirror, ran, after)
        steps = [e.data["name"] for e in await events(rt, r.session_id) if e.type == "tool.step"]
        assert steps == ["subagent.session", "subagent.turn"]
        assert mirror.child is not None
        kid = [e.type for e in await events(rt, mirror.child.session_id)]
        assert kid.count("turn.started") == 1 and kid[-2:] == ["turn.completed", "session.waiting"]


async def _started() -> bool:
    return True


@pytest.mark.parametrize(
    ("started", "source"),
    [("schedule", "schedule"), ("app", "message"), ("alice", "message"), ("nobody", "message")],
)
async def test_a_subagents_turn_takes_its_parent_turns_source(
    store_url: str, started: str, source: str
) -> None:
    """A parent turn the app started with `generate(auth=so.APP_PRINCIPAL)` is a message's, yet
    its child's turn recorded `source: "schedule"` (taken from whether the parent could ask, not
    from its turn): the child's turn takes the parent turn's, as docs/events.md says."""
    child = scripted_agent("billing", [reply("billed")], repeat_last=True)
    script = [call_tools(call("billing", message="bill it")), reply("ok")]
    parent = scripted_agent("support", script, tools=[so.delegate("billing")])
    async with so.Runtime([parent, child], store=store_url) as rt:
        if started == "schedule":
            r = await rt.schedule("support", "go")
        else:
            auth = {"app": so.APP_PRINCIPAL, "alice": ALICE, "nobody": None}[started]
            r = await rt.generate("support", prompt="go", auth=auth)
        assert (r.status, r.text) == ("completed", "ok")
        (kid,) = [s.id for s in await rt.sessions() if s.id != r.session_id]
        sources = []
        for session_id in (r.session_id, kid):
            started_events = [e for e in await events(rt, session_id) if e.type == "turn.started"]
            sources.append([e.data["source"] for e in started_events])
        assert sources == [[source], [source]]
