"""A message queued behind a turn that fails: a turn that failed for good (`max_steps`, a budget
nobody can raise) has ended, as a completed or cancelled one has, so the message starts its turn
then (at once inline, else by a worker); a turn a retry can resume keeps the message waiting
until it is retried, and the retry is told that turn; a message sent while the retry runs
steers it. Run on both stores."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest

import signoff as so
from signoff._engine import Driver
from signoff.models import ModelRequest
from signoff.testing import (
    Capture,
    ExecutionLog,
    Flaky,
    call,
    call_tools,
    reply,
    scripted_agent,
    timeline,
)

from ._steer import ALICE, BOB, events, plan_agent, refund_tool, texts

ENDED_THEN_BOB = [
    "turn.failed",
    "session.waiting",
    "turn.started",
    "model.completed",
    "turn.completed",
    "session.waiting",
]


def one_step_agent(*steps: Any) -> so.Agent:
    """Alice's turn asks which plan (its one model step); answered, it reaches `max_steps`."""
    agent = plan_agent(*steps)
    agent.limits = so.Limits(max_steps=1)
    return agent


async def parked_with_bob_queued(rt: so.Runtime) -> tuple[str, str]:
    """Alice's turn waits on a question, Bob's message waits for its end: the session, her turn."""
    r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
    assert r.status == "waiting"
    b = await rt.send(r.session_id, "bob here", principal=BOB)
    assert b.queued and b.status == "waiting"
    assert r.turn_id is not None
    return r.session_id, r.turn_id


async def settled(rt: so.Runtime, session_id: str) -> so.SessionState:
    """The session once its queue is empty and its turn completed, or as it stands after 10 s."""
    for _ in range(500):
        state = await rt.state(session_id)
        if not state.queued and state.turn is not None and state.turn.status == "completed":
            break
        await asyncio.sleep(0.02)
    return state


async def test_a_turn_that_fails_for_good_starts_the_message_queued_behind_it(
    store_url: str,
) -> None:
    """Alice's answer takes her turn to `max_steps`: it fails for good, and Bob's message starts
    its turn at once, as at the end of a completed turn. Her call reports her turn failed (as
    a cancel reports the cancelled turn), and the failure counts. It used to sit in the queue
    until the next message, the session `failed` with nothing to run it."""
    bob = Capture(reply("Hi Bob."))
    async with so.Runtime([one_step_agent(bob)], store=store_url) as rt:
        sid, alice = await parked_with_bob_queued(rt)
        failed_before = rt._counts.failed_drives
        r = await rt.send(sid, "pro", principal=ALICE)
        assert (r.status, r.turn_id, r.retryable) == ("failed", alice, False)
        assert (r.error or {}).get("code") == "session_limit_reached"
        assert rt._counts.failed_drives == failed_before + 1
        assert texts(bob.last)[-1] == ("user", "bob here")
        state = await rt.state(sid)
        assert state.queued == [] and state.turn is not None and state.turn.id != alice
        assert state.turn.status == "completed" and state.status == "idle"
        assert timeline(await events(rt, sid))[-6:] == ENDED_THEN_BOB


async def test_a_worker_starts_the_message_queued_behind_a_turn_that_failed_for_good(
    store_url: str,
) -> None:
    """As above with `inline=False`: the worker whose drive failed Alice's turn goes on to
    Bob's message."""
    bob = Capture(reply("Hi Bob."))
    agent = one_step_agent(bob)
    async with so.Runtime([agent], store=store_url, inline=False) as rt:
        stop = asyncio.Event()
        working = asyncio.create_task(rt.work(stop=stop, idle_wait=0.05))
        try:
            r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
            sid = r.session_id
            for _ in range(500):
                if (await rt.state(sid)).status == "waiting":
                    break
                await asyncio.sleep(0.02)
            assert (await rt.send(sid, "bob here", principal=BOB)).queued
            assert (await rt.send(sid, "pro", principal=ALICE)).status == "running"
            state = await settled(rt, sid)
        finally:
            stop.set()
            await asyncio.wait_for(working, timeout=10)
        assert state.queued == [] and state.turn is not None
        assert (state.turn.status, state.turn.text) == ("completed", "Hi Bob.")
        assert texts(bob.last)[-1] == ("user", "bob here")
        assert timeline(await events(rt, sid))[-6:] == ENDED_THEN_BOB


async def test_a_crash_after_a_turn_failed_for_good_leaves_the_queued_message_to_a_worker(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process dies between the commit that fails Alice's turn and the one that starts Bob's
    message: that commit left the session `running` in the store, so a worker runs Bob's turn."""
    bob = Capture(reply("Hi Bob."))
    agent = one_step_agent(bob)
    async with so.Runtime([agent], store=store_url) as rt:
        sid, _ = await parked_with_bob_queued(rt)

        async def crash(self: Driver) -> None:
            raise KeyboardInterrupt  # a dead process records nothing more

        monkeypatch.setattr(Driver, "start_queued", crash)
        with pytest.raises(KeyboardInterrupt):
            await rt.send(sid, "pro", principal=ALICE)
        monkeypatch.undo()
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.status == "failed"
        assert len(state.queued) == 1
        assert [s.status for s in await rt.store.sessions()] == ["running"]
    async with so.Runtime([agent], store=store_url, inline=False) as workers:
        stop = asyncio.Event()
        working = asyncio.create_task(workers.work(stop=stop, idle_wait=0.05))
        try:
            state = await settled(workers, sid)
        finally:
            stop.set()
            await asyncio.wait_for(working, timeout=10)
        assert state.queued == [] and state.turn is not None
        assert (state.turn.status, state.turn.text) == ("completed", "Hi Bob.")
        assert timeline(await events(workers, sid))[-6:] == ENDED_THEN_BOB


async def test_a_turn_a_retry_can_resume_keeps_the_queued_message_until_it_is_retried(
    store_url: str,
) -> None:
    """Alice's turn fails on a model error a retry can resume: Bob's message keeps waiting
    (the session reads `failed`, no worker's to claim), as the turn has not ended; the retry
    finishes her turn, and Bob's starts then. Her retry is told her turn, not Bob's answer
    (it returned his turn, with any approval of his pending)."""
    bob = Capture(reply("Hi Bob."))
    broken = Capture(Flaky(reply("Pro it is."), error=ValueError("the model broke")))
    agent = plan_agent(broken, bob)
    async with so.Runtime([agent], store=store_url) as rt:
        sid, alice = await parked_with_bob_queued(rt)
        r = await rt.send(sid, "pro", principal=ALICE)
        assert (r.status, r.turn_id, r.retryable) == ("failed", alice, True)
        state = await rt.state(sid)
        assert len(state.queued) == 1 and state.status == "failed"
        assert [s.status for s in await rt.store.sessions()] == ["failed"]
        assert bob.conversations == []
        again = await rt.generate(session_id=sid)
        assert (again.status, again.turn_id, again.text) == ("completed", alice, "Pro it is.")
        assert texts(bob.last)[-1] == ("user", "bob here")
        state = await rt.state(sid)
        assert state.queued == [] and state.turn is not None and state.turn.id != alice
        assert (state.turn.status, state.turn.text) == ("completed", "Hi Bob.")


async def test_cancelling_a_turn_a_retry_could_resume_starts_the_queued_message(
    store_url: str,
) -> None:
    """Alice gives up on her failed turn instead of retrying it: the cancel ends it for good and
    Bob's message starts, as after the cancel of a turn that waits. The cancel used to find the
    turn ended and do nothing, leaving Bob's message waiting on a retry nobody would make."""
    # The failed call took no step of the script: Bob's turn gets the step's second call.
    step = Capture(Flaky(reply("Hi Bob."), error=ValueError("the model broke")))
    async with so.Runtime([plan_agent(step)], store=store_url) as rt:
        sid, alice = await parked_with_bob_queued(rt)
        assert (await rt.send(sid, "pro", principal=ALICE)).status == "failed"
        c = await rt.cancel(sid, "never mind", principal=ALICE)
        assert (c.status, c.turn_id) == ("cancelled", alice)
        assert len(step.conversations) == 2  # her turn's failed call, then Bob's turn
        assert texts(step.last)[-1] == ("user", "bob here")
        state = await rt.state(sid)
        assert state.queued == [] and state.turn is not None and state.turn.id != alice
        assert (state.turn.status, state.turn.text) == ("completed", "Hi Bob.")
        log = timeline(await events(rt, sid))
        assert log[-8:] == ["turn.failed", "session.waiting", "turn.cancelled", *ENDED_THEN_BOB[1:]]


async def test_a_cancelled_turn_a_retry_could_resume_is_not_resumed(store_url: str) -> None:
    """With nothing queued, the cancel ends the failed turn: a retry then finds nothing to do."""
    broken = Capture(Flaky(reply("Pro it is."), error=ValueError("the model broke")))
    async with so.Runtime([plan_agent(broken)], store=store_url) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        [question] = r.pending
        answer = so.InputResponse(request_id=question.id, option_id="pro")
        assert (await rt.respond(r.session_id, [answer], principal=ALICE)).status == "failed"
        c = await rt.cancel(r.session_id)
        assert (c.status, c.turn_id) == ("cancelled", r.turn_id)
        again = await rt.generate(session_id=r.session_id)
        assert (again.status, again.turn_id) == ("cancelled", r.turn_id)
        assert len(broken.conversations) == 1
        assert (await rt.state(r.session_id)).status == "cancelled"


@pytest.mark.parametrize("ends", ["fails for good", "completes"])
async def test_a_queued_message_another_call_starts_first_is_not_started_twice(
    store_url: str, monkeypatch: pytest.MonkeyPatch, ends: str
) -> None:
    """Alice's turn ends; just before its drive starts Bob's message, a prompt from Carol
    (through a runtime leaving turns to workers) starts Bob's turn itself, Carol's prompt queued
    behind it. The drive's start then conflicts: it must not start Bob's message again from the
    state it read first, taking Carol's place in the queue (her prompt was lost)."""
    carol = so.Principal(authenticator="okta", principal_id="carol")
    if ends == "completes":
        agent = plan_agent(Capture(reply("Pro it is.")), reply("Hi Bob."), reply("Hi Carol."))
    else:
        agent = one_step_agent(reply("Hi Bob."), reply("Hi Carol."))
    async with (
        so.Runtime([agent], store=store_url) as rt,
        so.Runtime([agent], store=store_url, inline=False) as other,
    ):
        sid, _ = await parked_with_bob_queued(rt)
        start_queued = Driver.start_queued

        async def raced(self: Driver) -> None:
            monkeypatch.setattr(Driver, "start_queued", start_queued)
            r = await other.generate(session_id=sid, prompt="carol here", auth=carol)
            # Bob's turn, for a worker to run: her prompt waits behind it
            assert r.status == "running" and r.queued is True
            await start_queued(self)

        monkeypatch.setattr(Driver, "start_queued", raced)
        await rt.send(sid, "pro", principal=ALICE)
        for _ in range(3):  # each call drives the session as far as it goes
            await rt.generate(session_id=sid)
        started = [e.data["message"] for e in await events(rt, sid) if e.type == "turn.started"]
        assert started == ["upgrade me", "bob here", "carol here"]
        assert (await rt.state(sid)).queued == []


async def failed_retryably(rt: so.Runtime) -> tuple[str, str]:
    """Alice's turn, her question answered, fails on a model error a retry can resume: the
    session and her turn."""
    r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
    failed = await rt.send(r.session_id, "pro", principal=ALICE)
    assert (failed.status, failed.turn_id, failed.retryable) == ("failed", r.turn_id, True)
    assert r.turn_id is not None
    return r.session_id, r.turn_id


@pytest.mark.parametrize(("sender", "policy"), [(BOB, "steer"), (BOB, "queue"), (ALICE, "queue")])
async def test_a_message_sent_after_a_turn_failed_retryably_waits_for_the_retry(
    store_url: str, sender: so.Principal, policy: Literal["steer", "queue"]
) -> None:
    """Once Alice's turn failed in a way a retry can resume, Bob's message (or her own `queue`
    one) started a new turn at once in the sender's name: her retry then found her turn gone
    and reported that one. The turn has not ended: the message waits, as one sent before the
    failure does; the retry finishes her turn, and the message's turn starts then. The retry
    is told her turn, as the call whose turn it is (it was told Bob's)."""
    broken = Capture(Flaky(reply("Pro it is."), error=ValueError("the model broke")))
    later = Capture(reply("Hi later."))
    async with so.Runtime([plan_agent(broken, later)], store=store_url) as rt:
        sid, alice = await failed_retryably(rt)
        b = await rt.send(sid, "later here", principal=sender, turn_policy=policy)
        assert (b.status, b.turn_id, b.queued) == ("failed", alice, True)
        state = await rt.state(sid)
        assert state.status == "failed" and len(state.queued) == 1
        assert state.turn is not None and state.turn.id == alice
        assert later.conversations == []
        again = await rt.generate(session_id=sid)
        assert len(broken.conversations) == 2  # her turn resumed
        assert texts(broken.last)[-1] == ("tool", "pro")
        if sender is BOB:  # her retry is told her turn, not his answer
            assert (again.status, again.turn_id, again.text) == ("completed", alice, "Pro it is.")
        else:  # behind her own message, that later turn
            assert again.status == "completed" and again.text == "Hi later."
        assert (await rt.state(sid)).turn.text == "Hi later."  # type: ignore[union-attr]
        assert texts(later.last)[-2:] == [("assistant", "Pro it is."), ("user", "later here")]
        started = [e for e in await events(rt, sid) if e.type == "turn.started"]
        assert [e.data["message"] for e in started] == ["upgrade me", "later here"]
        assert started[-1].data["principal"] == sender.model_dump()
        assert (await rt.state(sid)).queued == []


async def test_someone_elses_prompt_past_a_turn_a_retry_can_resume_is_refused(
    store_url: str,
) -> None:
    """`generate` with Bob's prompt on Alice's turn that failed retryably started his turn
    past hers. It is refused as while a turn runs (`SessionBusy`), storing nothing; her own
    prompt still starts the next turn past it."""
    broken = Capture(Flaky(reply("Pro it is."), error=ValueError("the model broke")))
    async with so.Runtime([plan_agent(broken)], store=store_url) as rt:
        sid, alice = await failed_retryably(rt)
        before = len(await events(rt, sid))
        with pytest.raises(so.SessionBusy) as caught:
            await rt.generate(session_id=sid, prompt="bob here", auth=BOB)
        assert caught.value.session_id == sid
        assert len(await events(rt, sid)) == before
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.id == alice
        mine = await rt.generate(session_id=sid, prompt="new plan", auth=ALICE)
        assert mine.status == "completed" and mine.turn_id != alice


async def test_a_retry_is_told_its_own_turn_not_the_next_persons_waiting_on_their_approval(
    store_url: str,
) -> None:
    """Alice's turn fails on a model error with Bob's message queued behind it; her retry
    finishes her turn and drives on into his, which asks for the approval of a refund. The
    retry is told her turn, as the call whose turn it is: it was told Bob's, with his approval
    pending, which a chat as Alice then asked her for and refused."""
    refund = call_tools(call("issue_refund", call_id="r1", order_id="1042", amount=180))
    flaky = Flaky(reply("Hi Alice."), error=so.ModelError("provider 503"))
    agent = scripted_agent("support", [flaky, refund], tools=[refund_tool(ExecutionLog())])
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("support", "hello", auth=ALICE)
        assert (r.status, r.retryable) == ("failed", True)
        assert (await rt.send(r.session_id, "refund 1042", principal=BOB)).queued
        again = await rt.generate(session_id=r.session_id)
        assert (again.status, again.turn_id, again.text) == ("completed", r.turn_id, "Hi Alice.")
        assert again.pending == []
        state = await rt.state(r.session_id)
        assert state.status == "waiting" and state.turn is not None
        assert (state.turn.id != r.turn_id, state.turn.principal) == (True, BOB)
        [asked] = state.pending_requests()
        assert asked.requested_by == BOB


class _HeldRetry:
    """Fails its first call; the second (the retry's) answers once `go` is set, the rest at once;
    records what each call was sent."""

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.asked = asyncio.Event()
        self.conversations: list[list[so.Message]] = []

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        self.conversations.append(list(request.messages))
        n = len(self.conversations)
        if n == 1:
            raise so.ModelError("provider 503")
        if n == 2:
            self.asked.set()
            await self.go.wait()
            return reply("Your balance is 40.", usage=so.Usage(input_tokens=1000, output_tokens=5))
        return reply("Last month it was 30.")


async def test_a_message_sent_while_an_inline_retry_asks_the_model_steers_it(
    store_url: str,
) -> None:
    """While an inline retry waits on its model, the session read `failed` (only a worker's
    retry recorded `turn.resumed` first): Alice's follow-up then started a new turn past it, and
    the retry's billed reply was thrown away (`model.spent`), its call told the new turn. The
    retry records the resume as its first commit: the session reads `running`, the follow-up
    steers the turn, and both replies are kept in it."""
    model = _HeldRetry()
    async with so.Runtime([so.Agent(name="desk", model=model)], store=store_url) as rt:
        r = await rt.generate("desk", "my balance?", auth=ALICE)
        assert (r.status, r.retryable) == ("failed", True)
        retry = asyncio.create_task(rt.generate(session_id=r.session_id))
        try:
            await asyncio.wait_for(model.asked.wait(), timeout=10)
            status = (await rt.state(r.session_id)).status
            sent = await rt.send(r.session_id, "and last month?", principal=ALICE)
        finally:
            model.go.set()
            again = await asyncio.wait_for(retry, timeout=10)
        assert status == "running"
        assert (sent.turn_id, sent.queued) == (r.turn_id, False)
        assert (again.status, again.turn_id) == ("completed", r.turn_id)
        assert again.text == "Your balance is 40.\n\nLast month it was 30."
        assert texts(model.conversations[-1])[-2:] == [
            ("assistant", "Your balance is 40."),
            ("user", "and last month?"),
        ]
        types = [e.type for e in await events(rt, r.session_id)]
        assert types[2:] == [
            "turn.failed",
            "session.waiting",
            "turn.resumed",
            "turn.message",
            "model.completed",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]


@pytest.mark.parametrize(
    ("sender", "policy"),
    [(ALICE, "queue"), (BOB, "steer")],
    ids=["queue", "someone else's"],
)
async def test_a_message_after_a_cancelled_inline_retry_drives_the_turn_it_left(
    store_url: str, sender: so.Principal, policy: Literal["steer", "queue"]
) -> None:
    """An inline retry cancelled midway leaves the turn `running` for the next call to drive: a
    `queue` message (or someone else's) only queued behind it, and the session stayed
    `running` with nothing driving it. The send drives the turn, then the message's own."""
    model = _HeldRetry()
    async with so.Runtime([so.Agent(name="desk", model=model)], store=store_url) as rt:
        r = await rt.generate("desk", "my balance?", auth=ALICE)
        retry = asyncio.create_task(rt.generate(session_id=r.session_id))
        await asyncio.wait_for(model.asked.wait(), timeout=10)
        retry.cancel()
        with pytest.raises(asyncio.CancelledError):
            await retry
        assert (await rt.state(r.session_id)).status == "running"
        sent = await asyncio.wait_for(
            rt.send(r.session_id, "and last month?", principal=sender, turn_policy=policy), 10
        )
        assert (sent.status, sent.queued) == ("completed", False)
        assert sent.turn_id != r.turn_id
        state = await rt.state(r.session_id)
        assert (state.status, state.queued) == ("idle", [])
        assert len(model.conversations) == 4  # the failed call, the cancelled one, two turns
        assert texts(model.conversations[-1])[-1] == ("user", "and last month?")


async def test_two_retries_at_once_are_each_told_the_turn_they_retried(store_url: str) -> None:
    """Alice's turn failed with Bob's message queued behind it, and two processes retried it at
    once (a double click from two surfaces): the second waited for the first's lease, which ran
    her turn to its end and then Bob's, and was told Bob's turn and his answer."""
    model = _HeldRetry()
    agent = so.Agent(name="desk", model=model)
    async with (
        so.Runtime([agent], store=store_url) as one,
        so.Runtime([agent], store=store_url) as two,
    ):
        r = await one.generate("desk", "my balance?", auth=ALICE)
        assert (r.status, r.retryable) == ("failed", True)
        assert (await one.send(r.session_id, "bob here", principal=BOB)).queued
        first = asyncio.create_task(one.generate(session_id=r.session_id, auth=ALICE))
        await asyncio.wait_for(model.asked.wait(), timeout=10)
        waiting = asyncio.Event()
        acquire = two._acquire

        async def acquiring(*args: Any, **kwargs: Any) -> int | None:
            waiting.set()  # asks for the lease the first retry holds
            return await acquire(*args, **kwargs)

        two._acquire = acquiring  # type: ignore[method-assign]
        second = asyncio.create_task(two.generate(session_id=r.session_id, auth=ALICE))
        await asyncio.wait_for(waiting.wait(), timeout=10)
        model.go.set()
        for each in await asyncio.wait_for(asyncio.gather(first, second), timeout=10):
            assert (each.status, each.turn_id) == ("completed", r.turn_id)
            assert each.text == "Your balance is 40."
        state = await one.state(r.session_id)
        assert state.turn is not None and state.turn.principal == BOB
        assert (state.turn.status, state.turn.text) == ("completed", "Last month it was 30.")
