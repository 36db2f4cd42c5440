"""Follow-up messages that steer or queue: a message that answers no approval steers, queued
messages wait for the turn, a message from someone else waits for the turn to end."""

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
    timeline,
    tool_results,
)

from ._steer import ALICE, BOB, PACKS, events, plan_agent, refund_agent, refund_tool, texts


@pytest.mark.parametrize("policy", ["steer", "queue"])
async def test_a_message_that_answers_no_approval_steers_even_when_queued(
    tmp_path: Path, policy: Any
) -> None:
    """A turn held on an approval can't end until someone acts, so even `queue` steers: the
    approval resolves `ignored`, the call never runs and the model reads the message next."""
    log = ExecutionLog()
    seen = Capture(reply("Only the three-pack then."))
    async with sqlite_runtime(tmp_path, refund_agent(log, seen)) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        [req] = r.pending
        r = await rt.send(
            r.session_id, "wait, only refund the three-pack", principal=ALICE, turn_policy=policy
        )
        assert r.status == "completed"
        assert r.text == "Only the three-pack then."
        assert log.count() == 0
        log_events = await events(rt, r.session_id)
        assert timeline(log_events)[3:] == [
            "input.requested tool-approval:issue_refund",
            "turn.waiting",
            "input.resolved ignored",
            "turn.message wait, only refund the three-pack",
            "tool.completed issue_refund denied",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        resolved = next(e.data for e in log_events if e.type == "input.resolved")
        assert (resolved["request_id"], resolved["status"]) == (req.id, "withdrawn")
        message = next(e.data for e in log_events if e.type == "turn.message")
        assert message["policy"] == "steer" and not message.get("queued")
        assert texts(seen.last)[0] == ("user", "refund 1042")
        assert texts(seen.last)[-1] == ("user", "wait, only refund the three-pack")
        [result] = tool_results(seen.last)
        assert result.is_error is True
        assert result.content == {
            "denied": True,
            "reason": resolved["reason"],
            "by": None,
            "outcome": "ignored",
        }
        assert await rt.pending(session_id=r.session_id) == []


async def test_steering_runs_the_calls_already_approved_in_the_batch(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("Refunded the first only."))
    two = call_tools(
        call("issue_refund", call_id="r1", order_id="1", amount=10),
        call("issue_refund", call_id="r2", order_id="2", amount=20),
    )
    agent = scripted_agent("support", [two, seen], tools=[refund_tool(log)])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund both", auth=ALICE)
        first, second = r.pending
        assert (first.call_id, second.call_id) == ("r1", "r2")
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=first.id, option_id="approve")],
            principal=ALICE,
        )
        assert r.status == "waiting"
        assert log.count() == 1  # an approved call runs while its sibling waits
        r = await rt.send(r.session_id, "skip the second one", principal=ALICE)
        assert r.status == "completed"
        assert [e.input["order_id"] for e in log.executions] == ["1"]
        assert timeline(await events(rt, r.session_id))[3:] == [
            "input.requested tool-approval:issue_refund, tool-approval:issue_refund",
            "turn.waiting",
            "approval.settled approve",
            "input.resolved approved",
            "tool.started issue_refund",
            "tool.completed issue_refund ok",
            "turn.waiting",  # still on the second
            "input.resolved ignored",
            "turn.message skip the second one",
            "tool.completed issue_refund denied",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        r1, r2 = tool_results(seen.last)
        assert (r1.call_id, r1.content) == ("r1", {"refunded": 10, "order_id": "1"})
        assert (r2.call_id, r2.is_error) == ("r2", True)
        assert texts(seen.last)[-1] == ("user", "skip the second one")


async def test_queue_keeps_the_message_for_after_the_turn(tmp_path: Path) -> None:
    first = Capture(reply("You're on pro."))
    later = Capture(reply("Sure, here's the invoice."))
    async with sqlite_runtime(tmp_path, plan_agent(first, later)) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        [req] = r.pending
        turn_id = r.turn_id
        q = await rt.send(
            r.session_id, "also send me the invoice", principal=ALICE, turn_policy="queue"
        )
        assert q.status == "waiting"  # the question is still open: nothing was withdrawn
        assert [p.id for p in q.pending] == [req.id]
        r = await rt.send(r.session_id, "pro", principal=ALICE)
        assert r.status == "completed"
        assert r.turn_id != turn_id  # the queued message started the next turn
        assert r.text == "Sure, here's the invoice."
        log = await events(rt, r.session_id)
        assert timeline(log)[3:] == [
            "tool.started pick_plan",
            "input.requested question:Which plan?",
            "turn.waiting",
            "turn.message queued:also send me the invoice",
            "input.resolved answered",
            "tool.completed pick_plan ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
            "turn.started",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        started = [e for e in log if e.type == "turn.started"]
        assert started[1].data["message"] == "also send me the invoice"
        assert started[1].data["principal"]["principal_id"] == "alice"
        # the first turn's model never saw the queued message; the next turn's did, last
        assert ("user", "also send me the invoice") not in texts(first.last)
        assert texts(first.last)[-1] == ("tool", "pro")
        assert texts(later.last)[-1] == ("user", "also send me the invoice")
        assert len([m for m in later.last if m.kind == "user"]) == 2


async def test_steer_withdraws_the_question_and_the_model_reads_the_message(
    tmp_path: Path,
) -> None:
    seen = Capture(reply("What would you like instead?"))
    async with sqlite_runtime(tmp_path, plan_agent(seen)) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        [req] = r.pending
        r = await rt.send(r.session_id, "hmm, what does pro include?", principal=ALICE)
        assert r.status == "completed"
        log = await events(rt, r.session_id)
        resolved = next(e.data for e in log if e.type == "input.resolved")
        assert (resolved["request_id"], resolved["outcome"], resolved["status"]) == (
            req.id,
            "cancelled",
            "withdrawn",
        )
        assert texts(seen.last)[-1] == ("user", "hmm, what does pro include?")
        assert tool_results(seen.last)[0].content["cancelled"] is True


async def test_a_queued_message_during_a_running_tool_waits_and_aborts_nothing(
    tmp_path: Path,
) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()
    aborted: list[bool] = []

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task."""
        entered.set()
        await asyncio.wait_for(release.wait(), timeout=10)
        aborted.append(ctx.abort_signal.is_set())
        return "crawled"

    first = Capture(reply("Crawl done."))
    later = Capture(reply("Here is the summary."))
    agent = scripted_agent("bot", [call_tools(call("crawl")), first, later], tools=[crawl])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        await rt.send(sid, "then summarise it", principal=ALICE, turn_policy="queue")
        release.set()
        r = await running
        assert aborted == [False]
        assert r.status == "completed"
        assert r.text == "Here is the summary."
        assert texts(first.last)[-1] == ("tool", "crawled")
        assert texts(later.last)[-1] == ("user", "then summarise it")
        assert timeline(await events(rt, sid))[1:] == [
            "turn.started",
            "model.completed",
            "tool.started crawl",
            "turn.message queued:then summarise it",
            "tool.completed crawl ok",
            "model.completed",
            "turn.completed",
            "session.waiting",
            "turn.started",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]


@pytest.mark.parametrize("held_on", ["approval", "question"])
async def test_a_message_from_someone_else_waits_for_the_turn_to_end(
    tmp_path: Path, held_on: str
) -> None:
    log = ExecutionLog()
    first = Capture(reply("Done for Alice."))
    later = Capture(reply("Hello Bob."))
    if held_on == "approval":
        agent = refund_agent(log, first, later)
        answer = "approve"
    else:
        agent = plan_agent(first, later)
        answer = "pro"
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate(agent.name, prompt="please", auth=ALICE)
        [req] = r.pending
        # Bob's message names a valid option, but he is not who the turn serves: it waits,
        # answering nothing and steering nothing (not even an approval-held turn).
        b = await rt.send(r.session_id, answer, principal=BOB, turn_policy="steer")
        assert b.status == "waiting"
        assert [p.id for p in b.pending] == [req.id]
        assert log.count() == 0
        # Alice's answer completes her turn, which her call is told; Bob's message starts the
        # next turn, which runs all the same.
        mine = await rt.send(r.session_id, answer, principal=ALICE)
        assert (mine.status, mine.turn_id, mine.text) == ("completed", r.turn_id, "Done for Alice.")
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.id != r.turn_id
        assert (state.turn.status, state.turn.text) == ("completed", "Hello Bob.")
        log_events = await events(rt, r.session_id)
        tl = timeline(log_events)
        queued = tl.index(f"turn.message queued:{answer}")
        assert tl[queued - 1] == "turn.waiting"  # it arrived while the turn waited
        assert tl[queued + 1 : queued + 3] == [
            "approval.settled approve" if held_on == "approval" else "input.resolved answered",
            "input.resolved approved" if held_on == "approval" else "tool.completed pick_plan ok",
        ]
        assert tl.count("turn.started") == 2
        assert tl.index("turn.completed") < tl.index("turn.started", queued)
        started = [e.data for e in log_events if e.type == "turn.started"]
        assert started[1]["principal"]["principal_id"] == "bob"
        assert texts(later.last)[-1] == ("user", answer)
        resolved = next(e.data for e in log_events if e.type == "input.resolved")
        assert resolved["by"]["principal_id"] == "alice"


async def test_a_steering_message_records_who_withdrew_the_request(store_url: str) -> None:
    """A cancel records who withdrew each request (`by`); a steering message withdrew them with
    no one named, so the audit trail did not say who. Now it names the sender, in the event,
    its audit entry and the stored request, on either store."""
    log = ExecutionLog()
    seen = Capture(reply("Only the three-pack then."))
    async with so.Runtime([refund_agent(log, seen)], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        [req] = r.pending
        r = await rt.send(r.session_id, "wait, only the three-pack", principal=ALICE)
        assert r.status == "completed"
        who = ALICE.model_dump()
        resolved = next(
            e.data for e in await events(rt, r.session_id) if e.type == "input.resolved"
        )
        assert (resolved["status"], resolved["by"]) == ("withdrawn", who)
        [entry] = [e for e in await rt.audit(r.session_id) if e.type == "input.resolved"]
        assert entry.data["by"] == who
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["by"] == who
        assert await rt.verify_audit(r.session_id) == []


async def test_a_message_from_a_second_approver_answers_but_never_steers(tmp_path: Path) -> None:
    """The docs said a message from someone the turn does not serve never answers: it answers
    the first open request when they may answer it (four eyes opens Alice's to Bob); any other
    message of theirs waits for the turn's end, steering nothing."""
    log = ExecutionLog()

    @log.tool(approval=so.always(exclude_requester=True))
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    first = call_tools(call("issue_refund", call_id="r1", order_id="1042"))
    agent = scripted_agent("support", [first, reply("done")], tools=[issue_refund])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        [req] = r.pending
        b = await rt.send(r.session_id, "what is this?", principal=BOB)
        assert b.queued and [p.id for p in b.pending] == [req.id] and log.count() == 0
        done = await rt.send(r.session_id, "approve", principal=BOB)
        assert log.count() == 1 and done.outcomes[0].outcome == "approved"


async def test_a_message_racing_one_from_another_process_steers_the_turn_that_started(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Process A read the session idle; before it started its turn, B's message started one
    that waits on an approval. A's `send` raised `PartialAnswer` (the prompt's refusal: "or
    send() the message"), its message lost; it steers that turn now."""

    @so.tool(approval=so.always())
    async def charge(amount: float) -> str:
        """Charge a card."""
        return "charged"

    def step(conversation: list[so.Message]) -> so.ModelResponse:
        last = conversation[-1]
        if isinstance(last, so.UserMessage) and last.text != "from A":
            return call_tools(call("charge", amount=5))
        return reply("Read A's message.")

    def runtime() -> so.Runtime:
        agent = scripted_agent("probe", [step], tools=[charge], repeat_last=True)
        return so.Runtime([agent], store=store_url)

    async with runtime() as a, runtime() as b:
        sid = await a.create_session("probe", auth=ALICE)
        start_turn = a._start_turn

        async def racing(*args: Any, **kwargs: Any) -> Any:
            raced = await b.send(sid, "from B", principal=ALICE)
            assert raced.status == "waiting"
            return await start_turn(*args, **kwargs)

        monkeypatch.setattr(a, "_start_turn", racing)
        r = await a.send(sid, "from A", principal=ALICE)
        assert (r.status, r.text) == ("completed", "Read A's message.")
        lines = timeline(await events(a, sid))
        assert lines.count("turn.started") == 1
        assert "turn.message from A" in lines
        assert "input.resolved ignored" in lines
        assert await a.pending(session_id=sid) == []


async def _while_the_model_answers(
    store_url: str, response: so.ModelResponse, tools: list[so.Tool], message: str, **send: Any
) -> tuple[so.GenerateResult, so.GenerateResult, list[so.Event], Capture]:
    """Alice's `message` sent while the model writes `response` (its call in flight, her
    message recorded before the reply is): the turn's result, her send's, the log, and the
    model's next call."""
    asked, go = asyncio.Event(), asyncio.Event()

    async def thinking(conversation: list[so.Message]) -> so.ModelResponse:
        asked.set()
        await go.wait()
        return response

    after = Capture(reply("Only the three-pack then."))
    agent = scripted_agent("support", [thinking, after], tools=tools)
    async with so.Runtime([agent], store=store_url) as rt:
        turn = asyncio.create_task(rt.generate("support", prompt="refund 1042", auth=ALICE))
        await asyncio.wait_for(asked.wait(), 10)
        [summary] = await rt.sessions(limit=1)
        sent = asyncio.create_task(rt.send(summary.id, message, principal=ALICE, **send))
        while not [e for e in await events(rt, summary.id) if e.type == "turn.message"]:
            await asyncio.sleep(0.01)  # in the log; `send` waits for the turn
        go.set()
        r = await asyncio.wait_for(turn, 10)
        s = await asyncio.wait_for(sent, 10)
        return r, s, await events(rt, summary.id), after


@pytest.mark.parametrize("kind", ["approval", "question"])
async def test_a_message_steering_while_the_model_answers_steers_the_calls_of_its_reply(
    store_url: str, kind: str
) -> None:
    """A message that steered while the model answered, its reply read only up to before it
    (`read_through`), left the reply's gated call asked and `ask_question` asking, the turn
    parked on them as if no one had written. Now the approval is `ignored` and the question
    withdrawn before either is asked, the ungated call beside them runs, and the model reads
    their results and the message next, on either store."""
    log = ExecutionLog()

    @so.tool
    async def look_up(order_id: str) -> str:
        """Read an order."""
        return f"order {order_id}: shipped"

    if kind == "approval":
        gated = call("issue_refund", call_id="r1", order_id="1042", amount=180)
    else:
        gated = call("ask_question", call_id="q1", question="Which size?", options=PACKS)
    response = call_tools(call("look_up", call_id="l1", order_id="1042"), gated)
    tools = [look_up, refund_tool(log), so.ask_question()]
    steer = "wait, only refund the three-pack"
    r, s, log_events, after = await _while_the_model_answers(store_url, response, tools, steer)
    assert (r.status, r.pending, s.status, s.pending) == ("completed", [], "completed", []), (r, s)
    assert r.text == "Only the three-pack then." and log.count() == 0
    lines = timeline(log_events)
    assert not [line for line in lines if line.startswith("input.requested")], lines
    replied = next(e for e in log_events if e.type == "model.completed")
    assert replied.data["read_through"] < lines.index(f"turn.message {steer}") + 1
    results = {m.call_id: m for m in tool_results(after.last)}
    assert results["l1"].content == "order 1042: shipped"
    if kind == "approval":
        assert "tool.completed issue_refund denied" in lines
        assert results["r1"].is_error and results["r1"].content["outcome"] == "ignored"
    else:
        assert "tool.completed ask_question ok" in lines
        assert results["q1"].content == {"interrupted": True}
    assert texts(after.last)[-1] == ("user", steer)


async def test_a_message_queued_while_the_model_answers_steers_nothing(store_url: str) -> None:
    """A `queue` message sent while the model answers is no steer: the reply's gated call is
    asked, the turn waits on it, and the message waits behind the turn."""
    log = ExecutionLog()
    response = call_tools(call("issue_refund", call_id="r1", order_id="1042", amount=180))
    r, s, log_events, after = await _while_the_model_answers(
        store_url, response, [refund_tool(log)], "and the invoice", turn_policy="queue"
    )
    assert (r.status, s.turn_id, s.queued) == ("waiting", r.turn_id, True)
    assert [p.tool_name for p in r.pending] == ["issue_refund"] and after.conversations == []
    assert timeline(log_events)[2:] == [
        "turn.message queued:and the invoice",
        "model.completed",
        "input.requested tool-approval:issue_refund",
        "turn.waiting",
    ]


async def test_a_message_steering_a_subagent_while_its_model_answers_is_read_by_it(
    store_url: str,
) -> None:
    """A message sent to a child session while its model wrote a gated call (the parent's
    delegate call driving it) left that approval asked, mirrored on the parent, both turns
    waiting. Now the child's approval is `ignored`, its model reads the message, and the
    parent's call takes the child's answer."""
    log = ExecutionLog()
    asked, go = asyncio.Event(), asyncio.Event()

    async def thinking(conversation: list[so.Message]) -> so.ModelResponse:
        asked.set()
        await go.wait()
        return call_tools(call("issue_refund", call_id="r1", order_id="1042", amount=180))

    after = Capture(reply("Not refunding, then."))
    child = scripted_agent("billing", [thinking, after], tools=[refund_tool(log)])
    delegating = call_tools(call("billing", call_id="d1", message="refund 1042"))
    parent = scripted_agent("support", [delegating, reply("Done.")], tools=[so.delegate("billing")])
    async with so.Runtime([parent, child], store=store_url) as rt:
        turn = asyncio.create_task(rt.generate("support", prompt="refund 1042", auth=ALICE))
        await asyncio.wait_for(asked.wait(), 10)
        [kid] = [s.id for s in await rt.sessions(agent="billing")]
        sent = asyncio.create_task(rt.send(kid, "wait, do not refund", principal=ALICE))
        while not [e for e in await events(rt, kid) if e.type == "turn.message"]:
            await asyncio.sleep(0.01)  # in the log; `send` waits for the turn
        go.set()
        r = await asyncio.wait_for(turn, 10)
        s = await asyncio.wait_for(sent, 10)
        assert (r.status, r.pending, s.status, s.text) == (
            "completed",
            [],
            "completed",
            "Not refunding, then.",
        ), (r, s)
        assert log.count() == 0 and texts(after.last)[-1] == ("user", "wait, do not refund")
        lines = timeline(await events(rt, kid))
        assert "input.requested tool-approval:issue_refund" not in lines, lines
        assert "tool.completed issue_refund denied" in lines
        assert not [e for e in await events(rt, r.session_id) if e.type == "input.requested"]
