"""Subagents: `so.delegate()` runs a turn of another agent in a child session; the child's
requests are asked on the parent, answers given there resume the child without calling the
parent's model, and it all survives a restart and a cancel."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff import _subagents
from signoff.testing import (
    Capture,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    timeline,
    tool_results,
)

from ._replaced import assert_only_the_new_turn, replace_turn

ALICE = so.Principal(authenticator="okta", principal_id="alice")
SHIPPING = [
    {"label": "Standard", "description": "Arrives in five working days."},
    {"label": "Express", "description": "Arrives tomorrow."},
]


async def events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


class Counted:
    """A scripted step that counts its calls and remembers what the model was shown."""

    def __init__(self, text: str) -> None:
        self.capture = Capture(reply(text))
        self.calls = 0

    def __call__(self, conversation: list[so.Message]) -> so.ModelResponse:
        self.calls += 1
        return self.capture(conversation)


def refund_agents(ran: list[dict[str, Any]], parent_step: Counted) -> tuple[so.Agent, so.Agent]:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        ran.append({"order_id": order_id, "amount": amount})
        return {"refunded": amount}

    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042", amount=180)),
            lambda conv: reply(f"Refunded: {tool_results(conv)[-1].content}"),
        ],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", id="d1", message="Refund order 1042")), parent_step],
        tools=[so.delegate("billing", description="Billing specialist.")],
    )
    return parent, child


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
        "tool.step billing:subagent.turn",
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
    assert timeline(await events(rt, r.session_id))[6:] == [
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


async def test_cancelling_the_parent_withdraws_the_child_too(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("unused")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    mirror = r.pending[0]
    assert mirror.child is not None
    child_id = mirror.child.session_id
    cancelled = await rt.cancel(r.session_id, "changed my mind")
    assert cancelled.status == "cancelled" and cancelled.pending == []
    assert await rt.pending() == []
    assert timeline(await events(rt, r.session_id))[-3:] == [
        "input.resolved cancelled",
        "turn.cancelled",
        "session.waiting",
    ]
    assert timeline(await events(rt, child_id))[-3:] == [
        "input.resolved cancelled",
        "turn.cancelled",
        "session.waiting",
    ]
    assert (await rt.state(child_id)).status == "cancelled"
    with pytest.raises(so.RequestClosed):
        await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="approve")],
            principal=ALICE,
        )
    with pytest.raises(so.RequestClosed):
        await rt.respond(
            child_id,
            [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
            principal=ALICE,
        )
    assert ran == [] and after.calls == 0
    await rt.close()


async def test_cancelling_the_parent_while_its_child_runs_cancels_the_child(
    tmp_path: Path,
) -> None:
    """The parent is cancelled while the child's turn is still running (no request mirrored
    yet): the child's turn is cancelled too, and the approval it would have asked next never
    reaches the queue, where approving it would run a refund for a cancelled task."""
    entered = asyncio.Event()
    release = asyncio.Event()
    ran: list[str] = []

    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up, slowly."""
        entered.set()
        await release.wait()
        return "found"

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("lookup", order_id="1042")),
            call_tools(call("issue_refund", order_id="1042")),
            reply("Refund done."),
        ],
        tools=[lookup, issue_refund],
    )
    after = Counted("unused")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", id="d1", message="Refund order 1042")), after],
        tools=[so.delegate("billing")],
    )
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="Refund", auth=ALICE))
        await entered.wait()
        cancelled = await rt.cancel(sid, "changed my mind")
        assert cancelled.status == "cancelled"
        release.set()
        assert (await running).status == "cancelled"
        assert await rt.pending() == []
        [child_id] = [s.id for s in await rt.sessions(agent="billing")]
        child_state = await rt.state(child_id)
        assert child_state.turn is not None and child_state.turn.status == "cancelled"
        assert ran == [] and after.calls == 0


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


def test_delegate_rejects_bad_names() -> None:
    with pytest.raises(so.UsageError, match="agent"):
        so.delegate("")
    for bad in ("billing team", "facturación", "b" * 65):  # the model APIs refuse these names
        with pytest.raises(so.UsageError, match="name="):
            so.delegate(bad)
    assert so.delegate("billing team", name="billing").name == "billing"


async def test_delegating_to_an_unknown_agent_is_a_tool_error(tmp_path: Path) -> None:
    after = Counted("sorry")
    parent = scripted_agent(
        "support", [call_tools(call("nobody", message="hi")), after], tools=[so.delegate("nobody")]
    )
    rt = sqlite_runtime(tmp_path, parent)
    r = await rt.generate("support", prompt="hi")
    assert r.status == "completed"
    [result] = tool_results(after.capture.last)
    assert result.is_error and "unknown agent 'nobody'" in result.content["error"]
    await rt.close()


def test_a_runtime_lacking_a_delegate_target_says_so_when_it_is_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its delegate calls can only fail, so the runtime logs it as it is made, once per process,
    instead of leaving it to the model to find. It is not refused: a process may hold only
    some agents (to record answers, or to resume a parent whose child ran elsewhere)."""
    parent = scripted_agent("helpdesk", [reply("hi")], tools=[so.delegate("ledger", name="books")])
    child = scripted_agent("ledger", [reply("done")])
    url = f"sqlite:///{tmp_path}/state.db"
    with caplog.at_level(logging.WARNING, logger="signoff.runtime"):
        for agents in ([parent], [parent, child], [child], [parent]):
            so.Runtime(agents, store=url).close_sync()
    assert [r.getMessage() for r in caplog.records] == [
        "agent 'helpdesk' delegates to 'ledger' (tool 'books'), which this runtime does not "
        "have: the calls it runs fail (it has: helpdesk)"
    ]


async def test_a_blank_task_is_a_tool_error_and_makes_no_child(tmp_path: Path) -> None:
    # the child's turn would refuse the prompt after its session was made, left without a turn
    after = Counted("sorry")
    child = scripted_agent("billing", [reply("never")])
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message=" \n ")), after],
        tools=[so.delegate("billing")],
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="hi")
    assert r.status == "completed"
    [result] = tool_results(after.capture.last)
    assert result.is_error and "whitespace" in str(result.content)
    assert [s.id for s in await rt.sessions()] == [r.session_id]
    await rt.close()


async def test_answering_the_child_directly_lets_the_parent_go_on(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("Handled in the billing session.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    mirror = r.pending[0]
    assert mirror.child is not None
    child_done = await rt.respond(
        mirror.child.session_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
    )
    assert child_done.status == "completed"
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1
    state = await rt.state(r.session_id)
    assert state.status == "idle" and state.turn is not None
    assert state.turn.text == "Handled in the billing session."
    assert state.requests[mirror.id].status == "settled"
    assert state.requests[mirror.id].outcome == "approved"
    assert await rt.pending() == []
    # The mirror is closed now: answering it again changes nothing.
    again = await rt.respond(
        r.session_id, [so.InputResponse(request_id=mirror.id, option_id="approve")], principal=ALICE
    )
    assert again.outcomes[0].applied is False and ran == [ran[0]] and after.calls == 1
    await rt.close()


async def test_an_edited_approval_given_on_the_child_repeats_on_the_mirror(tmp_path: Path) -> None:
    """The child's approval is given directly, with edited input: the mirror closes the same
    way, so the same answer given on the mirror later is a no-op (not a conflicting answer),
    and the mirror's stored resolution names the decision and the edit as the child's does."""
    ran: list[dict[str, Any]] = []
    parent, child = refund_agents(ran, Counted("Refunded less."))
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        edited = {"order_id": "1042", "amount": 90.0}
        await rt.respond(
            mirror.child.session_id,
            [
                so.InputResponse(
                    request_id=mirror.child.request_id, option_id="approve", edited_input=edited
                )
            ],
            principal=ALICE,
        )
        assert ran == [edited]
        again = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="approve", edited_input=edited)],
            principal=ALICE,
        )
        assert again.outcomes == [
            so.Outcome(request_id=mirror.id, outcome="approved", applied=False)
        ]
        assert ran == [edited]
        original = await rt.store.get_request(mirror.child.request_id)
        copy = await rt.store.get_request(mirror.id)
        assert original is not None and copy is not None
        assert original.resolution is not None and copy.resolution is not None
        for field in ("decision", "edited_input", "outcome"):
            assert copy.resolution.get(field) == original.resolution.get(field), field


async def test_cancelling_the_child_directly_closes_the_mirror_and_resumes_the_parent(
    tmp_path: Path,
) -> None:
    # Documented: "a child cancelled on its own gives {"cancelled": true, ...}". The parent must
    # not be left waiting for ever on a mirror of a request the cancel withdrew.
    ran: list[dict[str, Any]] = []
    after = Counted("Billing was stopped.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    cancelled = await rt.cancel(mirror.child.session_id, "not needed")
    assert cancelled.status == "cancelled"
    state = await rt.state(r.session_id)
    assert state.status == "idle" and state.turn is not None
    assert state.turn.text == "Billing was stopped."
    assert state.requests[mirror.id].status == "withdrawn"
    assert await rt.pending() == []
    assert ran == [] and after.calls == 1
    [result] = tool_results(after.capture.last)
    assert result.content == {
        "cancelled": True,
        "agent": "billing",
        "session_id": mirror.child.session_id,
    }
    await rt.close()


async def test_cancelling_the_middle_of_three_resumes_the_top(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    top_after = Counted("The desk was stopped.")
    _, refunds = refund_agents(ran, Counted("unused"))
    middle = scripted_agent(
        "desk",
        [call_tools(call("billing", message="refund 1042")), reply("unused")],
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
    assert mirror.child is not None
    await rt.cancel(mirror.child.session_id)
    assert await rt.pending() == []  # the grandchild's request and both mirrors are closed
    state = await rt.state(r.session_id)
    assert state.status == "idle" and top_after.calls == 1 and ran == []
    assert tool_results(top_after.capture.last)[0].content["cancelled"] is True
    await rt.close()


async def test_a_runtime_without_the_parents_agent_answers_the_child_and_leaves_the_parent(
    tmp_path: Path,
) -> None:
    # Workers and apps can be split by agent: a process that has only the child's agent
    # answers the child directly; the parent is left runnable for a process that has its agent.
    ran: list[dict[str, Any]] = []
    after = Counted("Refunded, says billing.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    billing_only = sqlite_runtime(tmp_path, child)
    done = await billing_only.respond(
        mirror.child.session_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
    )
    assert done.status == "completed" and ran == [{"order_id": "1042", "amount": 180.0}]
    assert after.calls == 0 and await billing_only.pending() == []
    [summary] = await billing_only.sessions(agent="support")
    assert summary.status == "running"
    await billing_only.close()
    finished = await rt.generate(session_id=r.session_id)
    assert (finished.status, finished.text) == ("completed", "Refunded, says billing.")
    assert after.calls == 1 and len(ran) == 1
    await rt.close()


async def test_a_later_turn_of_the_child_is_not_the_delegate_calls_result(tmp_path: Path) -> None:
    """A message sent to the child after its delegated turn completed (here before a process
    with the parent's agent went on) starts another turn of the child: the delegate call's
    result is still the delegated turn's text, not the answer to that later message."""
    ran: list[str] = []

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042")),
            reply("Refund done."),
            reply("Noted, thanks."),
        ],
        tools=[issue_refund],
    )
    after = Counted("unused")
    after.capture.respond = lambda conv: reply(f"parent saw: {tool_results(conv)[-1].content}")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", id="d1", message="Refund order 1042")), after],
        tools=[so.delegate("billing")],
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    billing_only = sqlite_runtime(tmp_path, child)
    child_id = mirror.child.session_id
    await billing_only.respond(
        child_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
    )
    later = await billing_only.send(child_id, "thanks!", principal=ALICE)
    assert (later.status, later.text) == ("completed", "Noted, thanks.")
    await billing_only.close()
    finished = await rt.generate(session_id=r.session_id)
    assert (finished.status, finished.text) == ("completed", "parent saw: Refund done.")
    assert ran == ["1042"] and after.calls == 1
    await rt.close()


async def test_a_message_to_the_parent_after_its_child_finished_keeps_the_childs_text(
    tmp_path: Path,
) -> None:
    """The child's request is answered on the child by a process without the parent's agent,
    and the child's turn completes; a message then steers the parent before it went on. The
    child's turn can no longer be cancelled and its refund ran: the delegate call's result is
    the child's text, not `interrupted`, which told the parent's model nothing was done."""
    ran: list[dict[str, Any]] = []
    after = Counted("Noted.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    billing_only = sqlite_runtime(tmp_path, child)
    await billing_only.respond(
        mirror.child.session_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
    )
    await billing_only.close()
    assert ran == [{"order_id": "1042", "amount": 180.0}]
    done = await rt.send(r.session_id, "is it done?", principal=ALICE)
    assert (done.status, done.text) == ("completed", "Noted.")
    [result] = tool_results(after.capture.last)
    assert result.content == "Refunded: {'refunded': 180.0}"
    child_state = await rt.state(mirror.child.session_id)
    assert child_state.turn is not None and child_state.turn.status == "completed"
    assert after.calls == 1 and len(ran) == 1
    await rt.close()


async def test_a_message_to_a_child_after_its_parent_finished_gets_a_reply(
    tmp_path: Path,
) -> None:
    """The child is an ordinary session: a message sent to it after its delegated turn and its
    parent's turn completed starts a turn that runs, not one cancelled as an orphan of a
    parent turn that ended long ago (only the delegated turn belongs to the parent's)."""
    ran: list[str] = []

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042")),
            reply("Refund done."),
            reply("Noted, thanks."),
        ],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", id="d1", message="Refund order 1042")), reply("Done.")],
        tools=[so.delegate("billing")],
    )
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        done = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="approve")],
            principal=ALICE,
        )
        assert (done.status, done.text) == ("completed", "Done.")
        later = await rt.send(mirror.child.session_id, "thanks!", principal=ALICE)
        assert (later.status, later.text) == ("completed", "Noted, thanks.")
        assert ran == ["1042"]


def expiring_agents(ran: list[dict[str, Any]], after: Counted) -> tuple[so.Agent, so.Agent]:
    """`refund_agents`, with a child whose sessions expire after a minute."""
    parent, child = refund_agents(ran, after)
    child.limits = so.Limits(ttl=60)
    return parent, child


async def test_an_answer_to_an_expired_childs_mirror_fails_and_the_parent_goes_on(
    tmp_path: Path,
) -> None:
    # The child's session expired while the parent waited: the answer is refused, and the
    # parent is not left waiting for ever on a mirror nobody can answer any more.
    ran: list[dict[str, Any]] = []
    after = Counted("Billing timed out.")
    clock = ManualClock()
    rt = sqlite_runtime(tmp_path, *expiring_agents(ran, after), clock=clock)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    clock.advance(120)
    with pytest.raises(so.SessionExpired) as info:
        await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="approve")],
            principal=ALICE,
        )
    assert info.value.session_id == mirror.child.session_id
    state = await rt.state(r.session_id)
    assert state.status == "idle" and state.requests[mirror.id].status == "expired"
    assert ran == [] and after.calls == 1
    [result] = tool_results(after.capture.last)
    assert result.is_error and "expired" in str(result.content)
    assert await rt.pending() == []
    await rt.close()


async def test_resuming_a_parent_whose_child_expired_goes_on(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("Billing timed out.")
    clock = ManualClock()
    rt = sqlite_runtime(tmp_path, *expiring_agents(ran, after), clock=clock)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    clock.advance(120)
    again = sqlite_runtime(tmp_path, *expiring_agents(ran, after), clock=clock)
    done = await again.generate(session_id=r.session_id)
    assert (done.status, done.text, done.pending) == ("completed", "Billing timed out.", [])
    assert ran == [] and after.calls == 1
    await again.close()
    await rt.close()


async def test_resuming_the_parent_picks_up_a_child_answered_without_resuming(
    tmp_path: Path,
) -> None:
    # The child's request was answered with resume=False (or its process died before closing
    # the mirror): resuming the parent closes the mirror and runs the child's turn on.
    ran: list[dict[str, Any]] = []
    after = Counted("The refund went through.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    await rt.respond(
        mirror.child.session_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
        resume=False,
    )
    done = await rt.generate(session_id=r.session_id)
    assert (done.status, done.text) == ("completed", "The refund went through.")
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1
    assert (await rt.state(r.session_id)).requests[mirror.id].outcome == "approved"
    await rt.close()


async def test_a_cancelled_or_expired_child_lets_its_parent_go_on_on_both_stores(
    store_url: str,
) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("Billing stopped.")
    clock = ManualClock()
    async with so.Runtime(list(expiring_agents(ran, after)), store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        await rt.cancel(mirror.child.session_id)
        assert (await rt.state(r.session_id)).status == "idle" and after.calls == 1

        r = await rt.generate("support", prompt="Refund order 1043", auth=ALICE)
        assert r.status == "waiting"
        clock.advance(120)
        done = await rt.generate(session_id=r.session_id)
        assert (done.status, done.pending) == ("completed", []) and after.calls == 2
        assert await rt.pending() == [] and ran == []


async def test_a_deadline_in_the_child_ends_the_mirror_and_resumes_the_parent(
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    @so.tool(approval=so.always(expires_in=60))
    async def payout(amount: float) -> str:
        """Pay out."""
        ran.append(str(amount))
        return "paid"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("payout", amount=5)),
            lambda conv: reply(f"payout: {tool_results(conv)[-1].content}"),
        ],
        tools=[payout],
    )
    after = Counted("It timed out.")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="pay 5")), after],
        tools=[so.delegate("billing")],
    )
    clock = ManualClock()
    rt = sqlite_runtime(tmp_path, parent, child, clock=clock)
    r = await rt.generate("support", prompt="pay 5", auth=ALICE)
    [mirror] = r.pending
    assert mirror.expires_at is None  # the child's own deadline decides
    clock.advance(61)
    assert await rt.expire_due() == 1  # only the child's request has a deadline
    state = await rt.state(r.session_id)
    assert state.status == "idle" and state.requests[mirror.id].outcome == "expired"
    assert ran == [] and after.calls == 1
    [result] = tool_results(after.capture.last)
    assert "timed_out" in result.content
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


async def test_a_failed_child_turn_is_the_delegate_calls_error(tmp_path: Path) -> None:
    child = scripted_agent("billing", [ConnectionError("model unavailable")])
    after = Counted("The billing agent is down.")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 1")), after],
        tools=[so.delegate("billing")],
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="refund 1")
    assert r.status == "completed" and after.calls == 1
    [result] = tool_results(after.capture.last)
    assert result.is_error and result.content["error"].startswith("SubagentFailed: ")
    assert "model unavailable" in result.content["error"]
    await rt.close()


async def test_a_childs_spent_budget_is_asked_on_the_parent_and_raises_only_the_childs(
    tmp_path: Path,
) -> None:
    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    spent = so.Usage(input_tokens=50, output_tokens=0)
    child = scripted_agent(
        "orders",
        [call_tools(call("lookup", order_id="3"), usage=spent), reply("Order 3 shipped.")],
        tools=[lookup],
        limits=so.Limits(max_tokens=40),
    )
    after = Counted("It shipped.")
    parent = scripted_agent(
        "support",
        [call_tools(call("orders", message="where is 3?")), after],
        tools=[so.delegate("orders")],
        limits=so.Limits(max_tokens=1000),
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
    [limit] = r.pending
    assert limit.kind == "session-limit" and limit.source == "child"
    assert [o.id for o in limit.options] == ["continue", "stop"]
    done = await rt.send(r.session_id, "continue", principal=ALICE)
    assert done.status == "completed" and after.calls == 1
    assert tool_results(after.capture.last)[0].content == "Order 3 shipped."
    assert limit.child is not None
    assert (await rt.state(limit.child.session_id)).limit_grants == 1
    assert (await rt.state(r.session_id)).limit_grants == 0
    await rt.close()


async def test_a_bad_answer_through_the_parent_changes_nothing(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("unused")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    child_id = mirror.child.session_id
    before = (
        await store_contents(rt.store, r.session_id),
        await store_contents(rt.store, child_id),
    )
    with pytest.raises(so.InvalidAnswer) as bad:
        await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="maybe")],
            principal=ALICE,
        )
    assert bad.value.request_ids == [mirror.id]
    assert mirror.id in str(bad.value) and "'maybe'" in str(bad.value)
    mallory = so.Principal(authenticator="okta", principal_id="mallory")
    with pytest.raises(so.NotAllowed):
        await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="approve")],
            principal=mallory,
        )
    after_both = (
        await store_contents(rt.store, r.session_id),
        await store_contents(rt.store, child_id),
    )
    assert after_both == before
    assert ran == [] and after.calls == 0
    await rt.close()


@pytest.mark.parametrize(
    "bad",
    [
        so.InputResponse(request_id="req_bogus", option_id="approve"),
        so.InputResponse(request_id="MIRROR", option_id="approve"),  # twice: see below
    ],
    ids=["unknown-id", "same-id-twice"],
)
async def test_a_batch_with_a_mirrored_answer_and_a_bad_one_changes_no_session(
    tmp_path: Path, bad: so.InputResponse
) -> None:
    # The mirrored answer is settled in the child first: a bad answer beside it must be found
    # before that, or the child's call is approved by a batch that was refused.
    ran: list[dict[str, Any]] = []
    after = Counted("unused")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    child_id = mirror.child.session_id
    if bad.request_id == "MIRROR":
        bad = so.InputResponse(request_id=mirror.id, option_id="cancel")
    before = (
        await store_contents(rt.store, r.session_id),
        await store_contents(rt.store, child_id),
    )
    good = so.InputResponse(request_id=mirror.id, option_id="approve")
    with pytest.raises(so.AnswerError if bad.request_id == "req_bogus" else so.InvalidAnswer):
        await rt.respond(r.session_id, [good, bad], principal=ALICE)
    with pytest.raises(so.SignoffError):
        await rt.generate(
            session_id=r.session_id,
            approvals=[
                so.Decision(id=mirror.id, approved=True),
                so.Decision(id=bad.request_id, approved=True),
            ],
            auth=ALICE,
        )
    after_all = (
        await store_contents(rt.store, r.session_id),
        await store_contents(rt.store, child_id),
    )
    assert after_all == before
    assert ran == [] and after.calls == 0
    await rt.close()


@pytest.mark.parametrize("store_kind", ["yielding", "postgres"])
async def test_a_losing_answer_through_the_parent_leaves_the_parent_to_go_on(
    store_kind: str, race_store: str
) -> None:
    """The parent's mirror is answered (approve) while the child's request is answered
    directly (deny) at once, from two runtimes: the child's answer wins, the parent's gets
    `ConflictingAnswer`, and the parent's turn goes on to the end with the child's result. The
    losing answer used to close the mirror after the child's drive had looked for it, so nobody
    drove the parent: its turn stayed running with the delegate call open."""
    from .test_concurrency import YieldingStore

    url = race_store
    ran: list[dict[str, Any]] = []
    after = Counted("The refund was refused.")

    def runtime() -> so.Runtime:
        store = YieldingStore(url, []) if store_kind == "yielding" else url
        return so.Runtime(list(refund_agents(ran, after)), store=store)

    async with runtime() as a, runtime() as b:
        for _ in range(3):  # a few rounds: PostgreSQL's interleaving is not scripted
            r = await a.generate("support", prompt="Refund order 1042", auth=ALICE)
            [mirror] = r.pending
            assert mirror.child is not None
            results = await asyncio.gather(
                a.respond(
                    r.session_id,
                    [so.InputResponse(request_id=mirror.id, option_id="approve")],
                    principal=ALICE,
                ),
                b.respond(
                    mirror.child.session_id,
                    [so.InputResponse(request_id=mirror.child.request_id, option_id="cancel")],
                    principal=ALICE,
                ),
                return_exceptions=True,
            )
            refused = [x for x in results if isinstance(x, BaseException)]
            assert len(refused) == 1 and isinstance(refused[0], so.ConflictingAnswer), results
            parent = await a.state(r.session_id)
            child = await a.state(mirror.child.session_id)
            assert parent.turn is not None and child.turn is not None
            assert (child.turn.status, parent.turn.status) == ("completed", "completed")
            assert await a.pending() == []
            for sid in (r.session_id, mirror.child.session_id):
                seqs = [e.seq for e in await events(a, sid)]
                assert seqs == list(range(1, len(seqs) + 1))
    # Whichever answer won ran the refund at most once, and the parent's model read it once.
    assert len(ran) <= 3 and after.calls == 3


@pytest.fixture
def race_store(request: pytest.FixtureRequest, tmp_path: Path, store_kind: str) -> str:
    """A SQLite file (behind awaits that yield, in the test) or a fresh PostgreSQL database."""
    if store_kind == "postgres":
        return str(request.getfixturevalue("pg_store_url"))
    return f"sqlite:///{tmp_path / 'state.db'}"


def mixed_agents(ran: list[str]) -> tuple[so.Agent, so.Agent]:
    """A parent whose one response delegates a gated refund and asks its own question."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(f"refund {order_id}")
        return "refunded"

    @so.tool
    async def confirm(ctx: so.ToolContext, text: str) -> str:
        """Ask the customer."""
        answer = await ctx.ask(text, options=["yes", "no"])
        ran.append(f"confirm {answer.option_id}")
        return str(answer.option_id)

    child = scripted_agent(
        "billing",
        [call_tools(call("issue_refund", order_id="1042")), reply("Refund done.")],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [
            call_tools(
                call("billing", id="d1", message="Refund order 1042"),
                call("confirm", id="c1", text="Email you?"),
            ),
            lambda conv: reply(" / ".join(str(r.content) for r in tool_results(conv))),
        ],
        tools=[so.delegate("billing"), confirm],
    )
    return parent, child


async def test_answers_for_a_mirror_and_the_parents_own_request_settle_together(
    tmp_path: Path,
) -> None:
    """`generate(approvals=...)` must answer every pending request, the mirrors of the child's
    among them: one that leaves the parent's own request out changes no session; one call that
    answers both settles each where it belongs and the turn completes."""
    ran: list[str] = []
    async with sqlite_runtime(tmp_path, *mixed_agents(ran)) as rt:
        r = await rt.generate("support", prompt="Refund and tell them", auth=ALICE)
        assert r.status == "waiting"
        [mirror] = [p for p in r.pending if p.child is not None]
        [own] = [p for p in r.pending if p.child is None]
        assert mirror.child is not None
        child_id = mirror.child.session_id
        before = (
            await store_contents(rt.store, r.session_id),
            await store_contents(rt.store, child_id),
        )
        with pytest.raises(so.PartialAnswer) as partial:
            await rt.generate(
                session_id=r.session_id,
                approvals=[so.Decision(id=mirror.id, approved=True)],
                auth=ALICE,
            )
        assert partial.value.request_ids == [own.id]
        after_partial = (
            await store_contents(rt.store, r.session_id),
            await store_contents(rt.store, child_id),
        )
        assert after_partial == before and ran == []
        done = await rt.respond(
            r.session_id,
            [
                so.InputResponse(request_id=mirror.id, option_id="approve"),
                so.InputResponse(request_id=own.id, option_id="yes"),
            ],
            principal=ALICE,
        )
        assert done.status == "completed"
        assert sorted(ran) == ["confirm yes", "refund 1042"]
        assert done.text == "Refund done. / yes"
        assert {o.request_id: o.outcome for o in done.outcomes} == {
            mirror.id: "approved",
            own.id: "answered",
        }
        assert await rt.pending() == []


async def test_a_delegate_call_waits_for_a_child_driven_elsewhere(tmp_path: Path) -> None:
    """The child's request is answered directly and its approved tool is still running when
    the same answer comes through the parent: the parent's delegate call must wait for that
    drive (longer than `lease_wait`) and return the child's text, not fail as busy, which told
    the parent's model that a refund that ran had failed."""
    entered = asyncio.Event()
    release = asyncio.Event()
    ran: list[str] = []

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order, slowly."""
        entered.set()
        await release.wait()
        ran.append(order_id)
        return "refunded"

    child = scripted_agent(
        "billing",
        [call_tools(call("issue_refund", order_id="1042")), reply("Refund done.")],
        tools=[issue_refund],
    )
    after = Counted("unused")
    after.capture.respond = lambda conv: reply(f"parent saw: {tool_results(conv)[-1].content}")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", id="d1", message="Refund order 1042")), after],
        tools=[so.delegate("billing")],
    )
    async with sqlite_runtime(tmp_path, parent, child, lease_wait=0.2) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        direct = asyncio.create_task(
            rt.respond(
                mirror.child.session_id,
                [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
                principal=ALICE,
            )
        )
        await entered.wait()
        through_parent = asyncio.create_task(
            rt.respond(
                r.session_id,
                [so.InputResponse(request_id=mirror.id, option_id="approve")],
                principal=ALICE,
            )
        )
        await asyncio.sleep(0.6)  # past lease_wait, the child's tool still running
        release.set()
        done = await through_parent
        assert (await direct).status == "completed"
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        assert state.turn.text == "parent saw: Refund done."
        assert done.outcomes[0].outcome == "approved"
        assert ran == ["1042"] and after.calls == 1


def _cancel_then_start(
    monkeypatch: pytest.MonkeyPatch, rt: so.Runtime, parent_id: list[str], *, check: bool
) -> None:
    """Cancel the parent right before its delegate call starts the child's turn: the cancel's
    sweep of children finds the child without a turn. Without `check` the child's turn is
    started as a process that died at once after it would leave it (no check of the parent)."""
    original = _subagents.RuntimeHost.start_child

    async def start_child(
        host: _subagents.RuntimeHost,
        child: str,
        message: str,
        principal: dict[str, Any] | None,
        source: str,
    ) -> bool:
        cancelled = await rt.cancel(parent_id[0], "changed my mind")
        assert cancelled.status == "cancelled"
        if check:
            return await original(host, child, message, principal, source)
        who = None if principal is None else so.Principal.model_validate(principal)
        await rt._start_turn(child, message, who, source=source)
        return True

    monkeypatch.setattr(_subagents.RuntimeHost, "start_child", start_child)


def _lookup_agents(looked: list[str]) -> tuple[so.Agent, so.Agent]:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    def first(conversation: list[so.Message]) -> so.ModelResponse:
        looked.append("child model")
        return call_tools(call("issue_refund", order_id="1042"))

    child = scripted_agent("billing", [first, reply("Refund done.")], tools=[issue_refund])
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", id="d1", message="Refund order 1042")), reply("unused")],
        tools=[so.delegate("billing")],
    )
    return parent, child


async def test_a_parent_cancelled_as_its_child_starts_leaves_no_live_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent is cancelled after its delegate call created the child but before the child's
    turn started: the cancel finds no turn to cancel, so the child's turn, started next, must
    see its parent's turn ended and cancel itself rather than stay `running` for a worker."""
    looked: list[str] = []
    parent, child = _lookup_agents(looked)
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        _cancel_then_start(monkeypatch, rt, [sid], check=True)
        r = await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        assert r.status == "cancelled"
        [child_id] = [s.id for s in await rt.sessions(agent="billing")]
        child_state = await rt.state(child_id)
        assert child_state.turn is not None and child_state.turn.status == "cancelled"
        assert [s.status for s in await rt.sessions(agent="billing")] == ["cancelled"]
        assert await rt.pending() == [] and looked == []


async def test_a_worker_cancels_a_child_whose_parent_turn_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's turn left running for a cancelled parent (its starter died before checking
    the parent) is cancelled by the worker that claims it: its model never runs and no
    approval for the cancelled task reaches the queue."""
    looked: list[str] = []
    parent, child = _lookup_agents(looked)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([parent, child], store=url) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        _cancel_then_start(monkeypatch, rt, [sid], check=False)
        assert (await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)).status == (
            "cancelled"
        )
        [orphan] = await rt.sessions(agent="billing")
        assert orphan.status == "running"
    monkeypatch.undo()
    async with so.Runtime([parent, child], store=url, inline=False) as worker:
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        try:
            for _ in range(250):
                turn = (await worker.state(orphan.id)).turn
                if turn is not None and turn.status != "running":
                    break
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(working, 10)
        turn = (await worker.state(orphan.id)).turn
        assert turn is not None and turn.status == "cancelled"
        assert await worker.pending() == [] and looked == []


async def test_an_answer_to_a_child_its_parents_cancel_missed_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process cancelling the parent died after recording the parent's cancel and before
    cancelling the child, which still waits on its approval: an answer given to that request
    must not be applied to a task no one waits for; the orphan is cancelled and the answer
    refused as for any withdrawn request."""
    ran: list[dict[str, Any]] = []
    parent, child = refund_agents(ran, Counted("unused"))
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        with monkeypatch.context() as m:  # the cancel reaches no child: as if it died there
            m.setattr(_subagents, "children", lambda requests: [])
            m.setattr(_subagents, "delegated", lambda state: [])
            assert (await rt.cancel(r.session_id, principal=ALICE)).status == "cancelled"
        [orphan] = await rt.pending()
        assert orphan.id == mirror.child.request_id
        with pytest.raises(so.RequestClosed):
            await rt.respond(
                mirror.child.session_id,
                [so.InputResponse(request_id=orphan.id, option_id="approve")],
                principal=ALICE,
            )
        child_state = await rt.state(mirror.child.session_id)
        assert child_state.turn is not None and child_state.turn.status == "cancelled"
        row = await rt.store.get_request(orphan.id)
        assert row is not None and row.status == "withdrawn"
        assert await rt.pending() == [] and ran == []


async def test_the_sweep_cancels_a_child_its_parents_cancel_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but no one answers: the periodic sweep (`expire_due`, run by workers) finds
    the child still waiting for a cancelled parent and cancels it, so its approval leaves the
    queue instead of waiting there for ever."""
    ran: list[dict[str, Any]] = []
    parent, child = refund_agents(ran, Counted("unused"))
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        with monkeypatch.context() as m:
            m.setattr(_subagents, "children", lambda requests: [])
            m.setattr(_subagents, "delegated", lambda state: [])
            await rt.cancel(r.session_id, principal=ALICE)
        assert len(await rt.pending()) == 1
        assert await rt.expire_due() == 1
        child_state = await rt.state(mirror.child.session_id)
        assert child_state.turn is not None and child_state.turn.status == "cancelled"
        assert await rt.pending() == [] and ran == []
        assert await rt.expire_due() == 0


async def test_cancelling_a_cancelled_parent_again_cancels_the_child_it_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first cancel of the parent died before reaching its child: cancelling the parent
    again (the caller never heard back, so it retries) must finish the job, not return at once
    because the parent's turn is cancelled already."""
    ran: list[dict[str, Any]] = []
    parent, child = refund_agents(ran, Counted("unused"))
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        with monkeypatch.context() as m:
            m.setattr(_subagents, "children", lambda requests: [])
            m.setattr(_subagents, "delegated", lambda state: [])
            await rt.cancel(r.session_id, principal=ALICE)
        assert len(await rt.pending()) == 1
        again = await rt.cancel(r.session_id, principal=ALICE)
        assert again.status == "cancelled"
        child_state = await rt.state(mirror.child.session_id)
        assert child_state.turn is not None and child_state.turn.status == "cancelled"
        assert await rt.pending() == [] and ran == []


async def test_cancelling_the_parent_leaves_a_later_turn_of_the_child_alone(
    tmp_path: Path,
) -> None:
    """The child's delegated turn completed (answered on the child) and a message to the child
    started a turn of its own, waiting on an approval, before the parent went on: cancelling
    the parent cancels nothing of the child's, whose later turn is not the parent's task."""
    ran: list[str] = []

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042")),
            reply("Refund done."),
            call_tools(call("issue_refund", id="again", order_id="1043")),
            reply("Second refund done."),
        ],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", id="d1", message="Refund order 1042")), reply("unused")],
        tools=[so.delegate("billing")],
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    child_id = mirror.child.session_id
    billing_only = sqlite_runtime(tmp_path, child)
    await billing_only.respond(
        child_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
    )
    later = await billing_only.send(child_id, "refund 1043 too", principal=ALICE)
    assert later.status == "waiting"
    await billing_only.close()
    assert (await rt.cancel(r.session_id, principal=ALICE)).status == "cancelled"
    child_state = await rt.state(child_id)
    assert child_state.turn is not None and child_state.turn.status == "waiting"
    [own] = await rt.pending(session_id=child_id)
    done = await rt.respond(
        child_id, [so.InputResponse(request_id=own.id, option_id="approve")], principal=ALICE
    )
    assert (done.status, done.text) == ("completed", "Second refund done.")
    assert ran == ["1042", "1043"]
    await rt.close()


async def test_a_parent_cancelled_just_after_its_child_was_created_leaves_it_cancelled(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent is cancelled right after its delegate call created the child session, before
    the call's `subagent.session` step was recorded: the parent's drive stops there, before it
    starts the child's turn. The child must not be left an empty `idle` session that looks like
    one a person opened: it reads as cancelled, with nothing to run or answer."""
    looked: list[str] = []
    parent, child = _lookup_agents(looked)
    async with so.Runtime([parent, child], store=store_url) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        original = _subagents.RuntimeHost.create_child

        async def create_child(
            host: _subagents.RuntimeHost, agent: str, parent_id: str, key: str, **kw: Any
        ) -> str:
            child_id = await original(host, agent, parent_id, key, **kw)
            assert (await rt.cancel(sid, "changed my mind")).status == "cancelled"
            return child_id

        monkeypatch.setattr(_subagents.RuntimeHost, "create_child", create_child)
        r = await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        assert r.status == "cancelled"
        monkeypatch.undo()
        [row] = await rt.sessions(agent="billing")
        assert row.status == "cancelled", row
        child_state = await rt.state(row.id)
        assert child_state.parent == sid and child_state.turn is not None
        assert child_state.turn.status == "cancelled"
        assert timeline(await events(rt, row.id)) == [
            "session.created",
            "turn.started",
            "turn.cancelled",
            "session.waiting",
        ]
        assert (await rt.cancel(sid)).status == "cancelled"
        assert await rt.pending() == [] and looked == []
        assert await rt.expire_due() == 0


async def test_a_delegate_call_whose_parent_turn_was_replaced_records_nothing_into_the_new_one(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a delegate call creates its child, another process cancels the parent's turn and
    starts a new one (left running: this process holds the lease). The call then finds its own
    turn stopped: the child is cancelled, nothing of the old turn lands in the new one (its
    `tool.completed` there made the parent unloadable), and the new turn runs normally."""

    def agents(script: list[Any]) -> list[so.Agent]:
        parent = scripted_agent("support", script, tools=[so.delegate("billing")])
        return [parent, scripted_agent("billing", [reply("Refund done.")])]

    delegate = call_tools(call("billing", id="d1", message="Refund order 1042"))
    async with (
        so.Runtime(agents([delegate, reply("Tried again.")]), store=store_url) as rt,
        so.Runtime(agents([reply("Tried again.")]), store=store_url, lease_wait=0) as other,
    ):
        sid = await rt.create_session("support", auth=ALICE)
        original = _subagents.RuntimeHost.create_child
        new_turn: list[str] = []

        async def create_child(
            host: _subagents.RuntimeHost, agent: str, parent_id: str, key: str, **kw: Any
        ) -> str:
            new_turn.append(await replace_turn(other, sid))
            return await original(host, agent, parent_id, key, **kw)

        monkeypatch.setattr(_subagents.RuntimeHost, "create_child", create_child)
        first = await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        monkeypatch.undo()
        # This process drove the new turn once its own stopped: it is the session's turn now.
        assert (first.status, first.turn_id, first.text) == ("completed", *new_turn, "Tried again.")
        started = await assert_only_the_new_turn(rt, sid, new_turn[0])
        assert started.data["message"] == "Try again"
        [row] = await rt.sessions(agent="billing")
        assert row.status == "cancelled", row
        assert await rt.verify_audit() == []


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
