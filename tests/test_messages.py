"""Queued follow-up messages (`send` while a turn runs): they are answered in the order they were
sent, before any prompt that arrives after them, however the next turn is started; a keyed one
sent twice at once is delivered once."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Literal

import pytest

import signoff as so
from signoff import _message_places, _message_results
from signoff._engine import Driver
from signoff.testing import (
    Capture,
    Flaky,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    store_contents,
)

from ._steer import answered_first

ALICE = so.Principal(authenticator="okta", principal_id="alice")
BOB = so.Principal(authenticator="okta", principal_id="bob")
CAROL = so.Principal(authenticator="okta", principal_id="carol")


def plan_agent(*steps: Any) -> so.Agent:
    """A turn that waits on a question (options only) until someone picks a plan."""

    @so.tool
    async def pick_plan(ctx: so.ToolContext) -> str:
        """Choose a plan (options only)."""
        a = await ctx.ask("Which plan?", options=["basic", "pro"], allow_text=False)
        return a.value

    return scripted_agent(
        "sales", [call_tools(call("pick_plan", call_id="p1")), *steps], tools=[pick_plan]
    )


async def started(rt: so.Runtime, session_id: str) -> list[tuple[Any, Any, Any]]:
    """(message, principal id, source) of each turn the session started, in order."""
    out = []
    async for e in rt.events(session_id, follow=False):
        if e.type == "turn.started":
            who = e.data.get("principal") or {}
            out.append((e.data["message"], who.get("principal_id"), e.data.get("source")))
    return out


async def parked_with_bob_queued(rt: so.Runtime) -> str:
    """Alice's turn waits on a question; Bob's message waits for its end."""
    r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
    assert r.status == "waiting"
    b = await rt.send(r.session_id, "bob here", principal=BOB)
    assert b.status == "waiting"
    return r.session_id


async def test_a_prompt_after_a_cancelled_turn_goes_after_the_queued_message(
    tmp_path: Path,
) -> None:
    async with sqlite_runtime(tmp_path, plan_agent(reply("Hi Bob."), reply("Hi Alice."))) as rt:
        sid = await parked_with_bob_queued(rt)
        await rt.cancel(sid)
        r = await rt.generate(session_id=sid, prompt="hello again", auth=ALICE)
        assert r.status == "completed" and r.text == "Hi Alice."
        assert await started(rt, sid) == [
            ("upgrade me", "alice", "message"),
            ("bob here", "bob", "message"),
            ("hello again", "alice", "message"),
        ]
        assert (await rt.state(sid)).queued == []


async def test_a_prompt_after_a_crash_between_a_turn_end_and_its_queued_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process died after the turn completed and before the queued message's turn started:
    a new prompt still waits for it."""
    bob = Capture(reply("Hi Bob."))
    alice = Capture(reply("Hi Alice."))
    async with sqlite_runtime(tmp_path, plan_agent(reply("Pro it is."), bob, alice)) as rt:
        sid = await parked_with_bob_queued(rt)
        original = Driver.start_queued

        async def crash(self: Driver) -> None:
            raise KeyboardInterrupt  # a dead process records nothing more

        monkeypatch.setattr(Driver, "start_queued", crash)
        with pytest.raises(KeyboardInterrupt):
            await rt.send(sid, "pro", principal=ALICE)
        monkeypatch.setattr(Driver, "start_queued", original)
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.status == "completed"
        assert len(state.queued) == 1
        r = await rt.generate(session_id=sid, prompt="hello again", auth=ALICE)
        assert r.status == "completed" and r.text == "Hi Alice."
        assert [m for m, _, _ in await started(rt, sid)] == [
            "upgrade me",
            "bob here",
            "hello again",
        ]
        users = [m.text for m in bob.last if isinstance(m, so.UserMessage)]
        assert users[-1] == "bob here" and "hello again" not in users


async def test_a_scheduled_turn_waits_for_the_queued_messages_and_stays_scheduled(
    tmp_path: Path,
) -> None:
    agent = plan_agent(reply("Hi Bob."), reply("Hi Carol."), reply("Report sent."))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await parked_with_bob_queued(rt)
        await rt.send(sid, "carol here", principal=CAROL)
        await rt.cancel(sid)
        r = await rt.schedule("sales", "nightly report", session_id=sid)
        assert r.status == "completed" and r.text == "Report sent."
        assert await started(rt, sid) == [
            ("upgrade me", "alice", "message"),
            ("bob here", "bob", "message"),
            ("carol here", "carol", "message"),
            ("nightly report", so.APP_PRINCIPAL.principal_id, "schedule"),
        ]


async def test_a_message_after_a_failed_turn_goes_after_the_queued_one(tmp_path: Path) -> None:
    """A turn that failed with a message waiting: the next message does not jump the queue."""
    flaky = Flaky(reply("Hi Bob."), error=ValueError("the model broke"))
    agent = plan_agent(flaky, reply("Hi Alice."))
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await parked_with_bob_queued(rt)
        r = await rt.send(sid, "pro", principal=ALICE)
        assert r.status == "failed"
        assert len((await rt.state(sid)).queued) == 1
        r = await rt.send(sid, "hello again", principal=ALICE)
        assert r.status == "completed" and r.text == "Hi Alice."
        assert [m for m, _, _ in await started(rt, sid)] == [
            "upgrade me",
            "bob here",
            "hello again",
        ]


async def test_a_worker_runs_queued_messages_before_a_later_prompt(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    agent = plan_agent(reply("Hi Bob."), reply("Hi Alice."))
    async with so.Runtime([agent], store=url) as rt:
        sid = await parked_with_bob_queued(rt)
    async with so.Runtime([agent], store=url, inline=False) as client:
        await client.cancel(sid)  # an inline runtime's cancel would start Bob's message itself
        r = await client.generate(session_id=sid, prompt="hello again", auth=ALICE)
        assert r.status == "running"
        stop = asyncio.Event()
        working = asyncio.create_task(client.work(stop=stop, idle_wait=0.05))
        try:
            for _ in range(200):
                state = await client.state(sid)
                if state.turn is not None and state.turn.status == "completed" and not state.queued:
                    break
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(working, timeout=10)
        assert [m for m, _, _ in await started(client, sid)] == [
            "upgrade me",
            "bob here",
            "hello again",
        ]


async def expired_sessions_claimed(url: str, agent: so.Agent, clock: ManualClock, sid: str) -> int:
    """How many claims workers make on `sid` once its TTL has passed."""
    clock.advance(120)
    async with so.Runtime([agent], store=url, clock=clock, inline=False) as worker:
        with pytest.raises(so.SessionExpired):
            await worker.send(sid, "still there?", principal=ALICE)
        claims = await worker._claim("w1", 10)
        for claimed, token in claims:
            await worker.store.release_lease(claimed, "w1", token)
        return sum(1 for claimed, _ in claims if claimed == sid)


async def test_workers_leave_a_session_that_expired_with_a_message_queued(store_url: str) -> None:
    """A cancelled turn with a message waiting is work for the workers, until the session's TTL
    passes: then nobody can run it, and a claim would only fail (and be retried) forever."""
    clock = ManualClock(1000.0)
    agent = plan_agent(reply("Hi Bob."))
    agent.limits = so.Limits(ttl=60)
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        sid = await parked_with_bob_queued(rt)
        await rt.cancel(sid)
    assert await expired_sessions_claimed(store_url, agent, clock, sid) == 0


async def test_workers_leave_a_session_that_expired_waiting_with_a_message_queued(
    store_url: str,
) -> None:
    """Its question is expired with the session; that commit must not make it claimable."""
    clock = ManualClock(1000.0)
    agent = plan_agent(reply("Hi Bob."))
    agent.limits = so.Limits(ttl=60)
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        sid = await parked_with_bob_queued(rt)
    assert await expired_sessions_claimed(store_url, agent, clock, sid) == 0


async def _second_send_loses_the_race(
    first: so.Runtime, second: so.Runtime, sid: str, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, str]]:
    """`second` sends "second" to `sid`, but just before its turn starts `first` sends "first" and
    a worker claims that turn; the send must still deliver. The messages the log then holds."""
    start_turn = so.Runtime._start_turn

    async def racing(rt: so.Runtime, session_id: str, prompt: str, auth: Any, **kw: Any) -> None:
        if rt is second:  # the other message lands first, and a worker claims its turn
            await first.send(sid, "first", principal=ALICE)
            assert await first.store.acquire_lease(sid, "worker", 30.0, first.now()) is not None
        await start_turn(rt, session_id, prompt, auth, **kw)

    monkeypatch.setattr(so.Runtime, "_start_turn", racing)
    r = await second.send(sid, "second", principal=ALICE)
    assert r.status == "running"
    return [
        (e.type, e.data["message"])
        async for e in second.events(sid, follow=False)
        if e.type in ("turn.started", "turn.message")
    ]


async def test_a_message_that_loses_the_race_to_start_a_turn_steers_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two messages reach an idle session at once: the first starts a turn that a worker
    claims at once; the second, whose own start lost the race, is delivered to that turn (as
    a message to a running turn is) instead of being refused as `SessionBusy`."""
    agent = scripted_agent("sales", [reply("one"), reply("two")])
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with (
        so.Runtime([agent], store=url, inline=False) as first,
        so.Runtime([agent], store=url, inline=False) as second,
    ):
        sid = await first.create_session("sales", auth=ALICE)
        said = await _second_send_loses_the_race(first, second, sid, monkeypatch)
        assert said == [("turn.started", "first"), ("turn.message", "second")]


async def test_a_message_that_loses_the_race_after_an_earlier_turn_steers_the_new_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, on a session whose last turn completed: the turn started first is another than
    the one the message saw end, so the message is delivered to it, not refused."""
    agent = scripted_agent("sales", [reply("zero"), reply("one"), reply("two")])
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([agent], store=url) as rt:
        sid = (await rt.generate("sales", prompt="zero", auth=ALICE)).session_id
    async with (
        so.Runtime([agent], store=url, inline=False) as first,
        so.Runtime([agent], store=url, inline=False) as second,
    ):
        said = await _second_send_loses_the_race(first, second, sid, monkeypatch)
        assert said == [
            ("turn.started", "zero"),
            ("turn.started", "first"),
            ("turn.message", "second"),
        ]


async def test_a_message_for_a_question_answered_meanwhile_is_delivered(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message that would answer the open question, but someone else answers it first with
    another option: the message is still delivered to the turn (as any message is), not lost
    with `ConflictingAnswer` for an answer its sender never gave."""
    async with sqlite_runtime(tmp_path, plan_agent(reply("ok"), reply("noted"))) as rt:
        r = await rt.generate("sales", prompt="Sign me up", auth=ALICE)
        [question] = r.pending
        answered_first(monkeypatch, rt, question.id, "basic", ALICE)
        done = await rt.send(r.session_id, "pro", principal=ALICE)
        assert done.status == "completed"
        said = [
            e.data["message"]
            async for e in rt.events(r.session_id, follow=False)
            if e.type in ("turn.message", "turn.started")
        ]
        assert said == ["Sign me up", "pro"]


async def test_send_says_when_the_message_waits_in_the_queue(tmp_path: Path) -> None:
    """A message that waits for the turn's end (from someone the turn does not serve, or with
    `queue` while the turn is not held on an approval) reads `queued`, and so does its repeat
    while it waits; a message the turn reads, or one that answers, does not."""
    asks_again = call_tools(call("pick_plan", call_id="p2"))
    agent = plan_agent(reply("Hi Bob."), asks_again, asks_again, reply("ok"), reply("Hi Carol."))
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        assert r.status == "waiting" and not r.queued
        b = await rt.send(r.session_id, "bob here", principal=BOB, idempotency_key="b-1")
        assert b.queued and b.status == "waiting" and b.turn_id == r.turn_id
        again = await rt.send(r.session_id, "bob here", principal=BOB, idempotency_key="b-1")
        assert again.replayed and again.queued
        q = await rt.send(r.session_id, "later, please", principal=ALICE, turn_policy="queue")
        assert q.queued and q.turn_id == r.turn_id
        # Alice's answer ends her turn (her call is told it); Bob's message starts the next,
        # which asks again.
        done = await rt.send(r.session_id, "pro", principal=ALICE)
        assert not done.queued and done.status == "completed" and done.turn_id == r.turn_id
        bobs = await rt.state(r.session_id)
        assert bobs.turn is not None and bobs.turn.status == "waiting"
        assert bobs.turn.id != r.turn_id
        replay = await rt.send(r.session_id, "bob here", principal=BOB, idempotency_key="b-1")
        assert replay.replayed and not replay.queued and replay.turn_id == bobs.turn.id
        # Bob's turn is cancelled with Alice's message still queued: Carol's message waits
        # behind it, and the turn it starts asks again.
        await rt.cancel(r.session_id)
        carol = await rt.send(r.session_id, "carol here", principal=CAROL)
        assert carol.queued and carol.status == "waiting"
        assert carol.turn_id not in (r.turn_id, bobs.turn.id)
        [question] = carol.pending
        answer = so.InputResponse(request_id=question.id, option_id="basic")
        # Alice's answer completes her turn, which she is told; Carol's runs next.
        last = await rt.respond(r.session_id, [answer], principal=ALICE)
        assert last.status == "completed" and last.text == "ok" and not last.queued
        assert last.turn_id == carol.turn_id
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.id != carol.turn_id
        assert (state.turn.status, state.turn.text) == ("completed", "Hi Carol.")
        assert [m for m, _, _ in await started(rt, r.session_id)] == [
            "upgrade me",
            "bob here",
            "later, please",
            "carol here",
        ]


async def test_a_message_behind_a_failed_turns_queue_says_it_waits(tmp_path: Path) -> None:
    """After a failed turn, a new message starts the one that waited and queues behind it: when
    that turn asks again, the new message is still waiting, and says so."""
    flaky = Flaky(call_tools(call("pick_plan", call_id="p2")), error=ValueError("the model broke"))
    async with sqlite_runtime(tmp_path, plan_agent(flaky, reply("ok"), reply("Hi."))) as rt:
        sid = await parked_with_bob_queued(rt)
        assert (await rt.send(sid, "pro", principal=ALICE)).status == "failed"
        r = await rt.send(sid, "hello again", principal=ALICE)
        assert r.queued and r.status == "waiting"
        [question] = r.pending
        answer = so.InputResponse(request_id=question.id, option_id="basic")
        # Bob's answer completes his turn (his call is told it); Alice's message runs next.
        done = await rt.respond(sid, [answer], principal=BOB)
        assert done.status == "completed" and done.text == "ok" and not done.queued
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.id != done.turn_id
        assert (state.turn.status, state.turn.text) == ("completed", "Hi.")
        said = [m for m, _, _ in await started(rt, sid)]
        assert said == ["upgrade me", "bob here", "hello again"]


async def test_a_message_behind_an_equal_one_says_it_waits(tmp_path: Path) -> None:
    """The same words sent again while the first still waits, by its sender with another key
    or by someone else: the second waits in the queue too, and says so."""
    asks_again = call_tools(call("pick_plan", call_id="p2"))
    async with sqlite_runtime(tmp_path, plan_agent(asks_again, reply("ok"))) as rt:
        sid = await parked_with_bob_queued(rt)
        await rt.send(sid, "same", principal=CAROL)
        await rt.send(sid, "same", principal=BOB, idempotency_key="b-1")
        async with sqlite_runtime(tmp_path, plan_agent(reply("ok")), inline=False) as workers:
            await workers.cancel(sid)  # leaves "bob here" to start with the next call
        r = await rt.send(sid, "same", principal=BOB, idempotency_key="b-2")
        assert r.status == "waiting" and r.queued  # behind the turn "bob here" started
        assert [m for m, _, _ in await started(rt, sid)] == ["upgrade me", "bob here"]
        state = await rt._state(sid)
        assert [(q["message"], q.get("idem") is not None) for q in state.queued] == [
            ("same", False),
            ("same", True),
            ("same", True),
        ]


@pytest.mark.parametrize("allow_text", [True, False], ids=["text", "options only"])
async def test_a_message_naming_two_options_answers_nothing_and_says_how_to_choose(
    store_url: str, allow_text: bool
) -> None:
    """`2` is one option's id and the other's number: taken as free text (or as a steer that
    withdraws the question) the person would think they chose an option, so it is refused
    (`InvalidAnswer`) saying how to name each alone, as the text channels say, and nothing is
    recorded; the question stays open."""

    @so.tool
    async def how_many(ctx: so.ToolContext) -> str:
        """Ask how many to reorder."""
        a = await ctx.ask("How many?", options=["2", "x"], allow_text=allow_text)
        return a.value

    agent = scripted_agent(
        "shop", [call_tools(call("how_many", call_id="h1")), reply("ok")], tools=[how_many]
    )
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("shop", prompt="reorder", auth=ALICE)
        (q,) = r.pending
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer, match="more than one option") as caught:
            await rt.send(r.session_id, " 2 ", principal=ALICE)
        assert caught.value.request_ids == [q.id]
        assert "to choose 2, reply" in str(caught.value)
        assert await store_contents(rt.store, r.session_id) == before
        done = await rt.send(r.session_id, "x", principal=ALICE)
        assert done.status == "completed"
        stored = await rt.store.get_request(q.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["option_id"] == "x"


# -- one keyed message sent twice at once ------------------------------------------------------


class Overlap:
    """Calls (`run`) made to read the session before either records: the first to reach
    `Driver.record` waits there for the other, records, and records nothing more (its drive)
    until the other has recorded on the state it read before, as when a double click or a
    client's retry overlaps a first call whose commit stalls."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tasks: list[asyncio.Task[so.GenerateResult]] = []
        self.arrived: list[asyncio.Task[Any] | None] = []
        self.both, self.first, self.second = asyncio.Event(), asyncio.Event(), asyncio.Event()
        record = Driver.record

        async def overlapping(driver: Driver, *args: Any, **kwargs: Any) -> Any:
            task = asyncio.current_task()
            if task not in self.tasks or self.second.is_set():
                return await record(driver, *args, **kwargs)
            if task in self.arrived:  # the first call's drive: after the other's record
                await self.second.wait()
                return await record(driver, *args, **kwargs)
            self.arrived.append(task)
            if len(self.arrived) == 2:
                self.both.set()
            await self.both.wait()
            first = task is self.arrived[0]
            if not first:
                await self.first.wait()
            try:
                return await record(driver, *args, **kwargs)
            finally:
                (self.first if first else self.second).set()

        monkeypatch.setattr(Driver, "record", overlapping)

    async def run(self, *calls: Any) -> tuple[so.GenerateResult, so.GenerateResult]:
        """The results of the two calls: the one that delivered, then the other."""
        self.tasks = [asyncio.create_task(c) for c in calls]
        results = await asyncio.wait_for(asyncio.gather(*self.tasks), 30)
        assert self.second.is_set()  # both recorded (or tried to) on the state they read first
        delivered, replayed = sorted(results, key=lambda r: r.replayed)
        return delivered, replayed


def seen_as(result: so.GenerateResult) -> tuple[Any, ...]:
    """What a call's result says of the turn it reports, but for `replayed`."""
    pending = [r.id for r in result.pending]
    return result.turn_id, result.status, result.text, pending, result.queued, result.error


async def said(rt: so.Runtime, session_id: str) -> list[tuple[str, str]]:
    return [
        (e.type, e.data["message"])
        async for e in rt.events(session_id, follow=False)
        if e.type in ("turn.started", "turn.message")
    ]


@pytest.mark.parametrize("policy", ["queue", "steer"])
@pytest.mark.parametrize("runtimes", [1, 2], ids=["one runtime", "two runtimes"])
async def test_a_keyed_message_sent_twice_at_once_to_a_running_turn_is_delivered_once(
    store_url: str,
    policy: Literal["queue", "steer"],
    runtimes: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Both calls read the running turn before either records the message: the second, finding
    the key recorded when it appends, answers as a repeat (what the first call returned), not
    with the message delivered again (and, with `queue`, run as a second turn)."""
    gate, running = asyncio.Event(), asyncio.Event()

    @so.tool
    async def slow() -> str:
        """Run until the test lets it finish."""
        running.set()
        await gate.wait()
        return "ok"

    agent = scripted_agent(
        "sales",
        [call_tools(call("slow", call_id="s1")), reply("done")],
        tools=[slow],
        repeat_last=True,
    )
    async with (
        so.Runtime([agent], store=store_url) as rt,
        # they answer with the turn `rt` runs, not waiting out `lease_wait` for it
        so.Runtime([agent], store=store_url, lease_wait=0) as one,
        so.Runtime([agent], store=store_url, lease_wait=0) as two,
    ):
        sid = await rt.create_session("sales", auth=ALICE)
        drive = asyncio.create_task(rt.generate(session_id=sid, prompt="go", auth=ALICE))
        await running.wait()
        delivered, again = await Overlap(monkeypatch).run(
            *(
                r.send(sid, "also this", principal=ALICE, turn_policy=policy, idempotency_key="k")
                for r in ((one, two) if runtimes == 2 else (one, one))
            )
        )
        assert [m for t, m in await said(rt, sid) if t == "turn.message"] == ["also this"]
        assert not delivered.replayed and again.replayed
        assert seen_as(again) == seen_as(delivered)
        assert delivered.queued == (policy == "queue") and delivered.status == "running"
        gate.set()
        await drive
        assert (await rt.state(sid)).queued == []
        assert await said(rt, sid) == [
            ("turn.started", "go"),
            ("turn.message", "also this"),
            *([("turn.started", "also this")] if policy == "queue" else []),
        ]


async def test_a_keyed_message_sent_twice_at_once_behind_a_finished_turn_is_delivered_once(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn ended with Bob's message still waiting (a worker has yet to start it): both
    calls read that, and the message joins the queue once, behind Bob's; the second call
    answers with the turn the first one's message ran as."""
    agent = plan_agent(reply("Hi Bob."), reply("Hi Alice."))
    async with (
        so.Runtime([agent], store=store_url) as one,
        so.Runtime([agent], store=store_url) as two,
    ):
        sid = await parked_with_bob_queued(one)
        async with so.Runtime([agent], store=store_url, inline=False) as client:
            await client.cancel(sid)  # leaves Bob's message waiting behind the cancelled turn
        delivered, again = await Overlap(monkeypatch).run(
            *(r.send(sid, "also this", principal=ALICE, idempotency_key="k") for r in (one, two))
        )
        assert [m for t, m in await said(one, sid) if t == "turn.message"] == [
            "bob here",
            "also this",
        ]
        assert not delivered.replayed and again.replayed
        assert seen_as(again) == seen_as(delivered)
        assert (delivered.status, delivered.text, delivered.queued) == (
            "completed",
            "Hi Alice.",
            False,
        )
        assert [m for m, _, _ in await started(one, sid)] == ["upgrade me", "bob here", "also this"]


async def test_a_keyed_repeat_finding_its_message_taken_by_a_turn_still_running_waits_for_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repeat read the session with its message still queued, then found that another
    process's turn had taken it and still ran: it is told that turn once it ends, as the first
    call would be, not `running` as if it were a turn before the one it read."""
    running, go = asyncio.Event(), asyncio.Event()

    async def alice(conversation: list[so.Message]) -> so.ModelResponse:
        running.set()
        await go.wait()
        return reply("Hi Alice.")

    agent = plan_agent(reply("Hi Bob."), alice)
    async with (
        so.Runtime([agent], store=store_url) as one,
        so.Runtime([agent], store=store_url) as two,
    ):
        sid = await parked_with_bob_queued(one)
        async with so.Runtime([agent], store=store_url, inline=False) as client:
            await client.cancel(sid)  # leaves Bob's message waiting behind the cancelled turn
            first = await client.send(sid, "also this", principal=ALICE, idempotency_key="k")
        assert first.queued
        taking = _message_places.turn_taking
        drives: list[asyncio.Task[so.GenerateResult]] = []

        async def taken_meanwhile(store: Any, session_id: str, went: Any) -> Any:
            if not drives:  # Bob's turn, then the one taking the message, still running
                drives.append(asyncio.create_task(one.generate(session_id=sid)))
                await asyncio.wait_for(running.wait(), 10)
            return await taking(store, session_id, went)

        acquire = two._acquire

        async def acquiring(*args: Any, **kwargs: Any) -> Any:
            go.set()  # the repeat waits for the lease of the turn that took its message
            return await acquire(*args, **kwargs)

        monkeypatch.setattr(_message_results, "turn_taking", taken_meanwhile)
        monkeypatch.setattr(two, "_acquire", acquiring)
        try:
            again = await two.send(sid, "also this", principal=ALICE, idempotency_key="k")
        finally:
            go.set()
        driven = await drives[0]
        assert again.replayed and (again.status, again.text, again.queued) == (
            "completed",
            "Hi Alice.",
            False,
        )
        assert driven.turn_id == again.turn_id
        assert [m for m, _, _ in await started(one, sid)] == ["upgrade me", "bob here", "also this"]


@pytest.mark.parametrize("keyed", [False, True], ids=["no key", "keyed"])
async def test_an_answering_message_behind_its_senders_queued_one_is_told_as_its_repeat(
    tmp_path: Path, keyed: bool
) -> None:
    """Alice answers the question while a message of hers waits behind it: without a key she is
    told her own next turn (README); with one, the turn she answered, which is what a repeat
    of the call is told."""
    agent = plan_agent(reply("Pro it is."), reply("Hello."))
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        queued = await rt.send(r.session_id, "also this", principal=ALICE, turn_policy="queue")
        assert queued.queued
        key = "k" if keyed else None
        first = await rt.send(r.session_id, "pro", principal=ALICE, idempotency_key=key)
        assert [m for m, _, _ in await started(rt, r.session_id)] == ["upgrade me", "also this"]
        if not keyed:
            assert (first.status, first.text) == ("completed", "Hello.")
            return
        assert (first.turn_id, first.status, first.text) == (r.turn_id, "completed", "Pro it is.")
        again = await rt.send(r.session_id, "pro", principal=ALICE, idempotency_key=key)
        assert again.replayed and seen_as(again) == seen_as(first)


@pytest.mark.parametrize("case", ["answer", "new turn"])
async def test_a_keyed_answer_or_first_message_sent_twice_at_once_acts_once(
    store_url: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, for a message that answers the open question (its request is settled once)
    or starts the session's next turn (it starts once)."""
    agent = plan_agent(reply("Pro it is."), reply("Hello."))
    text = "pro" if case == "answer" else "hello"
    async with (
        so.Runtime([agent], store=store_url) as one,
        so.Runtime([agent], store=store_url) as two,
    ):
        r = await one.generate("sales", prompt="upgrade me", auth=ALICE)
        if case == "new turn":
            r = await one.send(r.session_id, "pro", principal=ALICE)
        assert r.status == ("waiting" if case == "answer" else "completed")
        delivered, again = await Overlap(monkeypatch).run(
            *(
                rt.send(r.session_id, text, principal=ALICE, idempotency_key="k")
                for rt in (one, two)
            )
        )
        events = [e async for e in one.events(r.session_id, follow=False)]
        assert sum("idem" in e.data for e in events) == 1
        assert not delivered.replayed and again.replayed
        assert seen_as(again) == seen_as(delivered)
        if case == "answer":
            assert (delivered.turn_id, delivered.text) == (r.turn_id, "Pro it is.")
            assert sum(e.type == "input.resolved" for e in events) == 1
        else:
            assert delivered.text == "Hello." and delivered.turn_id != r.turn_id
            assert [m for m, _, _ in await started(one, r.session_id)] == ["upgrade me", "hello"]


@pytest.mark.parametrize("key", [None, "k1"])
async def test_a_call_whose_turn_completes_is_not_told_the_next_persons_turn(
    tmp_path: Path, key: str | None
) -> None:
    """Alice's turn completed while Bob's message waited behind it; her call's drive went on to
    Bob's turn and returned it: Alice was told Bob's answer (and, keyed, her repeat then told
    her own). Her call returns her own turn; Bob's runs all the same."""
    gate, entered = asyncio.Event(), asyncio.Event()

    @so.tool
    async def slow() -> str:
        """Take a while."""
        entered.set()
        await gate.wait()
        return "slow"

    steps = [call_tools(call("slow")), reply("answer to alice"), reply("answer to bob")]
    agent = scripted_agent("s", steps, tools=[slow])
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("s", auth=ALICE)
        first = asyncio.create_task(
            rt.generate(session_id=sid, prompt="alice asks", auth=ALICE, idempotency_key=key)
        )
        await entered.wait()
        queued = await rt.send(sid, "bob asks", principal=BOB)
        assert queued.queued
        gate.set()
        r = await first
        assert (r.turn_id, r.text) == (queued.turn_id, "answer to alice")
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.id != r.turn_id
        assert state.turn.text == "answer to bob"
        if key is not None:
            again = await rt.generate(
                session_id=sid, prompt="alice asks", auth=ALICE, idempotency_key=key
            )
            assert (again.turn_id, again.text, again.replayed) == (r.turn_id, r.text, True)


@pytest.mark.parametrize("how", ["respond", "send", "keyed send", "approvals"])
async def test_an_answer_whose_turn_completes_is_not_told_the_next_persons_turn(
    tmp_path: Path, how: str
) -> None:
    """Alice's answer completed her turn while Bob's message waited behind it; her call's drive
    went on to Bob's turn and returned it, so she was told Bob's answer, as a prompt's call was
    until it returned its own turn. An answer's call returns the turn it answered (a keyed
    repeat too); Bob's runs all the same."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    steps = [
        call_tools(call("issue_refund", call_id="r1", order_id="1042")),
        reply("answer to alice"),
        reply("answer to bob"),
    ]
    agent = scripted_agent("support", steps, tools=[issue_refund])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        [req] = r.pending
        queued = await rt.send(r.session_id, "bob asks", principal=BOB)
        assert queued.queued and queued.turn_id == r.turn_id

        async def answer() -> so.GenerateResult:
            if how == "respond":
                approve = {"request_id": req.id, "option_id": "approve"}
                return await rt.respond(r.session_id, [approve], principal=ALICE)
            if how.endswith("send"):
                key = "k1" if how == "keyed send" else None
                return await rt.send(r.session_id, "approve", principal=ALICE, idempotency_key=key)
            decision = so.Decision(id=req.id, approved=True)
            return await rt.generate(session_id=r.session_id, approvals=[decision], auth=ALICE)

        done = await answer()
        assert (done.status, done.turn_id, done.text) == ("completed", r.turn_id, "answer to alice")
        assert [o.outcome for o in done.outcomes] == ["approved"]
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.id != r.turn_id
        assert (state.turn.status, state.turn.text) == ("completed", "answer to bob")
        if how == "keyed send":
            again = await answer()
            assert (again.turn_id, again.text, again.replayed) == (r.turn_id, done.text, True)
