"""What a call that answers is told once its answers let the turn go on: the turn it answered,
not the next person's turn its drive then ran, however it answered and whatever its drive found
first; behind a message the one who answered queued, that later turn."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime, tool_results


def person(name: str, **attributes: str) -> so.Principal:
    return so.Principal(authenticator="okta", principal_id=name, attributes=attributes)


ALICE, BOB, CAROL, DAVE = person("alice"), person("bob"), person("carol"), person("dave")


async def answer(rt: so.Runtime, how: str, sid: str, rid: str, who: so.Principal) -> Any:
    """Approve `rid` as `who`, by request id, by message or as a decision."""
    if how == "respond":
        return await rt.respond(sid, [{"request_id": rid, "option_id": "approve"}], principal=who)
    if how == "send":
        return await rt.send(sid, "approve", principal=who)
    decision = so.Decision(id=rid, approved=True)
    return await rt.generate(session_id=sid, approvals=[decision], auth=who)


@pytest.mark.parametrize("how", ["respond", "send", "approvals"])
async def test_an_answer_through_a_subagents_mirror_is_told_the_turn_it_answered(
    tmp_path: Path, how: str
) -> None:
    """Alice approved a subagent's refund through its mirror on her turn while Bob's message
    waited behind it: her call was told Bob's turn, as the mirror's answer is settled in the
    child and its turn was not known to the call."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042")),
            lambda conv: reply(f"Refunded: {tool_results(conv)[-1].content}"),
        ],
        tools=[issue_refund],
    )
    steps = [
        call_tools(call("billing", call_id="d1", message="Refund order 1042")),
        reply("The refund went through."),
        reply("Hi Bob."),
    ]
    parent = scripted_agent(
        "support", steps, tools=[so.delegate("billing", description="Billing specialist.")]
    )
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        [mirror] = r.pending
        assert (await rt.send(r.session_id, "bob asks", principal=BOB)).queued
        done = await answer(rt, how, r.session_id, mirror.id, ALICE)
        assert (done.status, done.turn_id) == ("completed", r.turn_id)
        assert done.text == "The refund went through."
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.id != r.turn_id
        assert (state.turn.status, state.turn.text) == ("completed", "Hi Bob.")


async def test_votes_given_at_once_are_each_told_the_turn_they_answered(tmp_path: Path) -> None:
    """Bob and Carol voted at once on Alice's two-person approval while Dave's message waited:
    the vote that completed it was told Dave's turn, its drive having found Alice's turn over
    when it began."""

    @so.tool(approval=so.always(approvers=2))
    async def pay_out(order_id: str) -> str:
        """Two people approve."""
        return order_id

    steps = [call_tools(call("pay_out", call_id="c1", order_id="1")), reply("Paid."), reply("Hi.")]
    agent = scripted_agent("support", steps, tools=[pay_out])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="pay", auth=ALICE)
        [req] = r.pending
        assert (await rt.send(r.session_id, "dave asks", principal=DAVE)).queued
        vote = {"request_id": req.id, "option_id": "approve"}
        got = await asyncio.gather(
            rt.respond(r.session_id, [vote], principal=BOB),
            rt.respond(r.session_id, [vote], principal=CAROL),
        )
        assert sorted(o.outcome for g in got for o in g.outcomes) == ["approved", "counted"]
        for each in got:
            assert (each.status, each.turn_id, each.text) == ("completed", r.turn_id, "Paid.")
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.principal == DAVE
        assert (state.turn.status, state.turn.text) == ("completed", "Hi.")


def plan_agent(*steps: Any) -> so.Agent:
    """A turn that waits on a question until someone picks a plan."""

    @so.tool
    async def pick_plan(ctx: so.ToolContext) -> str:
        """Choose a plan."""
        a = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
        return str(a.value)

    return scripted_agent(
        "sales", [call_tools(call("pick_plan", call_id="p1")), *steps], tools=[pick_plan]
    )


async def test_behind_a_message_of_the_one_who_answered_the_call_is_told_that_turn(
    tmp_path: Path,
) -> None:
    """Alice queued a message from another sign-in (other attributes, the same person) behind
    her turn, then answered it: she is told the turn her message started, as `send` takes her
    for the same person; the turns' principals were compared whole, attributes and all."""
    agent = plan_agent(reply("first done"), reply("second done"))
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=person("alice", sign_in="1"))
        [question] = r.pending
        later = person("alice", sign_in="2")
        queued = await rt.send(r.session_id, "and then", principal=later, turn_policy="queue")
        assert queued.queued
        pick = so.InputResponse(request_id=question.id, option_id="pro")
        done = await rt.respond(r.session_id, [pick], principal=person("alice", sign_in="3"))
        assert done.turn_id != r.turn_id
        assert (done.status, done.text) == ("completed", "second done")
