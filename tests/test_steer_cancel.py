"""Denials with a note and cancelling a turn: the note reaches the model, the turn's requests are
withdrawn for good, and a message that waited on the cancelled turn goes first."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
    timeline,
    tool_results,
)

from ._steer import ALICE, BOB, DENIED_TAIL, events, plan_agent, refund_agent, refund_tool, texts


@pytest.mark.parametrize("asker", [ALICE, None], ids=["user-denies", "someone-else-denies"])
async def test_cancel_with_a_note_reaches_the_model_attributed_to_the_denier(
    tmp_path: Path, asker: so.Principal | None
) -> None:
    log = ExecutionLog()
    seen = Capture(reply("I'll refund only the three-pack."))
    denier = ALICE if asker is not None else BOB
    async with sqlite_runtime(tmp_path, refund_agent(log, seen)) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=asker)
        [req] = r.pending
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="cancel", text="Only the three-pack.")],
            principal=denier,
        )
        assert r.status == "completed"
        assert log.count() == 0
        log_events = await events(rt, r.session_id)
        assert timeline(log_events)[3:] == DENIED_TAIL
        settled = next(e.data for e in log_events if e.type == "approval.settled")
        assert settled["reason"] == "Only the three-pack."
        assert settled["by"]["principal_id"] == denier.principal_id
        resolved = next(e.data for e in log_events if e.type == "input.resolved")
        assert resolved["reason"] == "Only the three-pack."  # readable in the stream
        assert resolved["by"]["principal_id"] == denier.principal_id
        [result] = tool_results(seen.last)
        assert result.is_error is True
        who = denier.principal_id
        assert result.content == {
            "denied": True,
            "reason": "Only the three-pack.",
            "by": who,
            "note": f'Written by {who}, who denied this call: "Only the three-pack."',
        }


@pytest.mark.parametrize("held_on", ["approval", "question"])
async def test_cancelling_the_turn_withdraws_its_requests_for_good(
    tmp_path: Path, held_on: str
) -> None:
    log = ExecutionLog()
    model = Capture(reply("never"))
    if held_on == "approval":
        agent = refund_agent(log, model)
        late = so.InputResponse(request_id="", option_id="approve")
    else:
        agent = plan_agent(model)
        late = so.InputResponse(request_id="", option_id="pro")
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate(agent.name, prompt="please", auth=ALICE)
        [req] = r.pending
        c = await rt.cancel(r.session_id, reason="changed my mind")
        assert c.status == "cancelled"
        assert c.pending == []
        assert await rt.pending(session_id=r.session_id) == []
        log_events = await events(rt, r.session_id)
        assert timeline(log_events)[-3:] == [
            "input.resolved cancelled",
            "turn.cancelled",
            "session.waiting",
        ]
        resolved = next(e.data for e in log_events if e.type == "input.resolved")
        assert (resolved["request_id"], resolved["status"]) == (req.id, "withdrawn")

        before = await store_contents(rt.store, r.session_id)
        assert (req.id, "withdrawn") in before.requests
        with pytest.raises(so.RequestClosed) as closed:
            await rt.respond(
                r.session_id, [late.model_copy(update={"request_id": req.id})], principal=ALICE
            )
        assert req.id in str(closed.value)
        if held_on == "approval":
            with pytest.raises(so.AnswerError):
                await rt.generate(
                    session_id=r.session_id,
                    approvals=[so.Decision(id=req.id, approved=True)],
                    auth=ALICE,
                )
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0
        assert model.conversations == []  # the model was never called again


async def test_a_question_asked_after_a_steering_message_is_withdrawn_at_once(
    tmp_path: Path,
) -> None:
    """The message arrives while the workflow call is still busy (in a step); the question it
    asks afterwards must not park the turn on a stale question: it is withdrawn, the call
    settles and the model reads the message."""
    entered = asyncio.Event()
    release = asyncio.Event()
    outcomes: list[str] = []

    async def slow_quote() -> float:
        entered.set()
        await asyncio.wait_for(release.wait(), timeout=10)
        return 2.5

    @so.tool
    async def transfer(ctx: so.ToolContext) -> str:
        """Quote, then confirm."""
        fee = await ctx.step("quote", slow_quote)
        try:
            a = await ctx.ask(f"Fee {fee}. Proceed?", options=["yes", "no"], allow_text=False)
        except so.QuestionWithdrawn as exc:
            outcomes.append(exc.outcome)
            raise
        return a.value

    seen = Capture(reply("Okay, not transferring."))
    agent = scripted_agent("bank", [call_tools(call("transfer")), seen], tools=[transfer])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("bank", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="transfer", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        steering = asyncio.create_task(rt.send(sid, "stop, wrong account", principal=ALICE))
        for _ in range(1000):  # until the message is recorded (10 s, however busy the machine)
            if "turn.message stop, wrong account" in timeline(await events(rt, sid)):
                break
            await asyncio.sleep(0.01)
        assert "turn.message stop, wrong account" in timeline(await events(rt, sid))
        release.set()
        r = await asyncio.wait_for(running, timeout=10)
        await asyncio.wait_for(steering, timeout=10)
        assert r.status == "completed"
        assert r.pending == []
        assert outcomes == ["cancelled"]
        assert timeline(await events(rt, sid))[1:] == [
            "turn.started",
            "model.completed",
            "tool.started transfer",
            "turn.message stop, wrong account",
            "tool.step transfer:quote",
            "tool.completed transfer cancelled",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        assert texts(seen.last)[-1] == ("user", "stop, wrong account")
        assert await rt.pending(session_id=sid) == []


async def test_an_approval_a_tool_asks_for_after_a_steering_message_is_ignored_at_once(
    tmp_path: Path,
) -> None:
    """As a question is withdrawn: the message came while the body ran, so the approval its
    body then asks for (`ctx.request_approval`) is never opened; the model reads the message
    at once rather than after someone approves what the user just called off."""
    entered = asyncio.Event()
    release = asyncio.Event()

    @so.tool
    async def wire(ctx: so.ToolContext, to: str) -> str:
        """Wire money, once approved."""
        entered.set()
        await asyncio.wait_for(release.wait(), timeout=10)
        ctx.request_approval({"to": to})

    seen = Capture(reply("Okay, not wiring."))
    agent = scripted_agent("bank", [call_tools(call("wire", to="acme")), seen], tools=[wire])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("bank", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="wire", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        steering = asyncio.create_task(
            rt.send(sid, "no wait, don't wire anything", principal=ALICE)
        )
        for _ in range(1000):  # until the message is recorded (10 s, however busy the machine)
            if "turn.message no wait, don't wire anything" in timeline(await events(rt, sid)):
                break
            await asyncio.sleep(0.01)
        release.set()
        r = await asyncio.wait_for(running, timeout=10)
        await asyncio.wait_for(steering, timeout=10)
        assert (r.status, r.pending, r.text) == ("completed", [], "Okay, not wiring.")
        assert timeline(await events(rt, sid))[1:] == [
            "turn.started",
            "model.completed",
            "tool.started wire",
            "turn.message no wait, don't wire anything",
            "tool.completed wire denied",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        [result] = [m.content for m in tool_results(seen.last)]
        assert isinstance(result, dict) and result["outcome"] == "ignored"
        assert texts(seen.last)[-1] == ("user", "no wait, don't wire anything")
        assert await rt.pending(session_id=sid) == []


async def test_steering_a_workflow_call_also_ignores_the_approval_waiting_behind_it(
    tmp_path: Path,
) -> None:
    """The approval beside a workflow call was not asked yet when the message came; it is not
    asked afterwards either: the call never runs and the model reads the message next."""
    log = ExecutionLog()

    @so.tool
    async def pick_pack(ctx: so.ToolContext) -> str:
        """Choose a pack (options only)."""
        a = await ctx.ask("Which pack?", options=["three", "six"], allow_text=False)
        return a.value

    seen = Capture(reply("Okay, nothing refunded."))
    agent = scripted_agent(
        "support",
        [
            call_tools(
                call("pick_pack", call_id="p1"),
                call("issue_refund", call_id="r1", order_id="1042", amount=30),
            ),
            seen,
        ],
        tools=[pick_pack, refund_tool(log)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund a pack", auth=ALICE)
        assert [p.kind for p in r.pending] == ["question"]
        r = await rt.send(r.session_id, "forget the refund", principal=ALICE)
        assert r.status == "completed"
        assert r.pending == []
        assert log.count() == 0
        assert timeline(await events(rt, r.session_id))[3:] == [
            "tool.started pick_pack",
            "input.requested question:Which pack?",
            "turn.waiting",
            "input.resolved cancelled",
            "turn.message forget the refund",
            "tool.completed pick_pack cancelled",
            "tool.completed issue_refund denied",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        p1, r1 = tool_results(seen.last)
        assert p1.content["cancelled"] is True
        assert r1.content["denied"] is True and r1.content["outcome"] == "ignored"
        assert texts(seen.last)[-1] == ("user", "forget the refund")
        assert await rt.pending(session_id=r.session_id) == []


async def test_a_message_waiting_on_a_cancelled_turn_goes_before_later_ones(
    tmp_path: Path,
) -> None:
    """Bob's message waited for Alice's turn to end; Alice cancels it (which starts Bob's
    message, as the turn's end would) and writes again: Bob's message is handled first, then
    hers, each in a turn of its own."""
    bob_turn = Capture(reply("Hi Bob."))
    alice_turn = Capture(reply("Hi again, Alice."))
    async with sqlite_runtime(tmp_path, plan_agent(bob_turn, alice_turn)) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        sid = r.session_id
        b = await rt.send(sid, "bob here", principal=BOB)
        assert b.status == "waiting"
        c = await rt.cancel(sid)
        assert c.status == "cancelled"
        r = await rt.send(sid, "hello again", principal=ALICE)
        assert r.status == "completed"
        assert r.text == "Hi again, Alice."
        log = await events(rt, sid)
        assert timeline(log)[6:] == [
            "turn.message queued:bob here",
            "input.resolved cancelled",
            "turn.cancelled",
            "session.waiting",
            "turn.started",  # the cancel starts Bob's message, as the turn's end would
            "model.completed",
            "turn.completed",
            "session.waiting",
            "turn.started",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        started = [e.data for e in log if e.type == "turn.started"]
        assert [(d["message"], d["principal"]["principal_id"]) for d in started] == [
            ("upgrade me", "alice"),
            ("bob here", "bob"),
            ("hello again", "alice"),
        ]
        assert texts(bob_turn.last)[-1] == ("user", "bob here")
        assert ("user", "hello again") not in texts(bob_turn.last)
        assert texts(alice_turn.last)[-1] == ("user", "hello again")
        assert (await rt.state(sid)).queued == []


async def test_resuming_a_cancelled_turn_starts_the_message_that_waited(tmp_path: Path) -> None:
    bob_turn = Capture(reply("Hi Bob."))
    async with sqlite_runtime(tmp_path, plan_agent(bob_turn)) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        await rt.send(r.session_id, "bob here", principal=BOB)
        # Cancelled by a runtime that leaves turns to workers: an inline one starts Bob's turn.
        async with sqlite_runtime(tmp_path, plan_agent(bob_turn), inline=False) as workers:
            await workers.cancel(r.session_id)
        assert bob_turn.conversations == []
        r = await rt.generate(session_id=r.session_id)
        assert r.status == "completed"
        assert r.text == "Hi Bob."
        assert texts(bob_turn.last)[-1] == ("user", "bob here")


async def test_a_worker_starts_the_message_that_waited_on_a_cancelled_turn(
    tmp_path: Path,
) -> None:
    bob_turn = Capture(reply("Hi Bob."))
    url = f"sqlite:///{tmp_path / 'state.db'}"
    agent = plan_agent(bob_turn)
    async with so.Runtime([agent], store=url) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        sid = r.session_id
        await rt.send(sid, "bob here", principal=BOB)
    async with so.Runtime([agent], store=url, inline=False) as worker:
        await worker.cancel(sid)  # an inline runtime's cancel would start Bob's turn itself
        assert bob_turn.conversations == []
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        try:
            for _ in range(200):
                if bob_turn.conversations:
                    break
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(working, timeout=10)
        assert texts(bob_turn.last)[-1] == ("user", "bob here")
        state = await worker.state(sid)
        assert state.turn is not None and state.turn.status == "completed"
        assert state.queued == []


async def test_a_message_sent_while_the_model_thinks_comes_after_the_reply_it_missed(
    tmp_path: Path,
) -> None:
    # The reply that did not read the message came before it in the conversation sent next, so
    # the request ended with the assistant's own reply: Anthropic takes that as a prefill to go
    # on with, not as a message to answer.
    seen: list[list[tuple[str, Any]]] = []
    sent: list[asyncio.Task[so.GenerateResult]] = []

    async def first(conversation: list[so.Message]) -> so.ModelResponse:
        sent.append(asyncio.create_task(rt.send(sid, "also, in euros")))
        while not (await events(rt, sid))[-1].type == "turn.message":
            await asyncio.sleep(0.01)
        return so.ModelResponse(text="It costs 180 dollars.")

    def second(conversation: list[so.Message]) -> so.ModelResponse:
        seen.append(texts(conversation))
        return so.ModelResponse(text="160 euros.")

    agent = so.Agent(name="a", model=so.models.Scripted([first, second]))
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db") as rt:
        sid = await rt.create_session("a")
        r = await rt.generate(session_id=sid, prompt="price?")
        await sent[0]
        assert (r.status, r.text.endswith("160 euros.")) == ("completed", True)
    assert seen == [
        [("user", "price?"), ("assistant", "It costs 180 dollars."), ("user", "also, in euros")]
    ]
