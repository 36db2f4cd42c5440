"""What a call that answers is told once its answers let the turn go on: the turn it answered,
not the next person's turn its drive then ran, however it answered and whatever its drive found
first, or another process's drive (a worker's, one that took the turn over); behind a message
the one who answered queued, that later turn."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime, tool_results

from ._leasing import take_over


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


def pick_plan() -> so.Tool:
    """A tool that asks which plan, options only."""

    @so.tool
    async def pick_plan(ctx: so.ToolContext) -> str:
        """Choose a plan."""
        a = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
        return str(a.value)

    return pick_plan


def plan_agent(*steps: Any) -> so.Agent:
    """A turn that waits on a question until someone picks a plan."""
    return scripted_agent(
        "sales", [call_tools(call("pick_plan", call_id="p1")), *steps], tools=[pick_plan()]
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


@pytest.mark.parametrize("how", ["respond", "send"])
async def test_an_answer_whose_turn_a_worker_ran_on_is_told_the_turn_it_answered(
    store_url: str, how: str
) -> None:
    """Alice answered with `inline=False`, and a worker ran her turn to its end and then Bob's
    before her call read the session: she was told Bob's turn and his answer, as the call
    leaving the turn to a worker never asked which turn it had answered."""
    agent = plan_agent(reply("Alice's answer."), reply("Bob's answer."))
    async with (
        so.Runtime([agent], store=store_url) as worker,
        so.Runtime([agent], store=store_url, inline=False) as client,
    ):
        r = await worker.generate("sales", prompt="upgrade me", auth=ALICE)
        [question] = r.pending
        assert (await worker.send(r.session_id, "bob here", principal=BOB)).queued
        recover = client._recover

        async def ran_meanwhile(state: so.SessionState) -> bool:
            await worker.generate(session_id=r.session_id)  # a worker drives what she answered
            await recover(state)
            return True  # the session is read again

        client._recover = ran_meanwhile  # type: ignore[method-assign]
        if how == "respond":
            pick = so.InputResponse(request_id=question.id, option_id="basic")
            done = await client.respond(r.session_id, [pick], principal=ALICE)
        else:
            done = await client.send(r.session_id, "basic", principal=ALICE)
        assert (done.status, done.turn_id, done.text) == ("completed", r.turn_id, "Alice's answer.")
        state = await client.state(r.session_id)
        assert state.turn is not None and state.turn.principal == BOB
        assert (state.turn.status, state.turn.text) == ("completed", "Bob's answer.")


async def test_an_answer_whose_drive_lost_its_lease_is_told_the_turn_it_answered(
    store_url: str,
) -> None:
    """Alice's answer drove her turn and stalled in the model past its lease; another process
    took the turn over, ended it and ran Bob's: her call, its lease lost, was told Bob's turn."""
    stalled = asyncio.Event()
    asked: list[int] = []

    async def model(conversation: list[Any]) -> Any:
        if [m.text for m in conversation if isinstance(m, so.UserMessage)][-1] == "bob here":
            return reply("Bob's answer.")
        if not tool_results(conversation):
            return call_tools(call("pick_plan", call_id="p1"))
        asked.append(1)
        if len(asked) == 1:  # the answer's own drive stalls here
            stalled.set()
            await asyncio.sleep(600)
        return reply("Alice's answer.")

    agent = scripted_agent("sales", [model], tools=[pick_plan()], repeat_last=True)
    async with (
        so.Runtime([agent], store=store_url) as other,
        so.Runtime([agent], store=store_url, lease_ttl=3.0) as rt,
    ):
        r = await other.generate("sales", prompt="upgrade me", auth=ALICE)
        [question] = r.pending
        assert (await other.send(r.session_id, "bob here", principal=BOB)).queued
        pick = so.InputResponse(request_id=question.id, option_id="basic")
        answering = asyncio.create_task(rt.respond(r.session_id, [pick], principal=ALICE))
        await asyncio.wait_for(stalled.wait(), 10)
        await take_over(rt.store, r.session_id)  # its lease lapsed, and another process took it
        ran = await other.generate(session_id=r.session_id)  # ... ended her turn, ran Bob's
        done = await asyncio.wait_for(answering, 10)
        assert (done.status, done.turn_id, done.text) == ("completed", r.turn_id, "Alice's answer.")
        assert (ran.turn_id, ran.text) == (r.turn_id, done.text)  # the resume is told it too
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.principal == BOB
        assert (state.turn.status, state.turn.text) == ("completed", "Bob's answer.")
