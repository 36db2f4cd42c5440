"""What a `send` is told: the turn its message went to (the one it started, steered or was
taken from the queue by), never a turn its drive went on to past it (another person's, queued
behind it) or began with (one left undriven, which may end cancelled or failed), and `queued`
only while the message still waits; its repeat with the same key is told the same turn. So is
a `generate` or `schedule` whose prompt queued behind another's message. Run on both stores."""

from __future__ import annotations

import asyncio

import httpx
import pytest

import signoff as so
import signoff._message_places as places
import signoff._message_results as results
from signoff.models import ModelRequest
from signoff.server import TokenAuth, create_app
from signoff.testing import ManualClock, call, call_tools

from .test_server_common import ALICE, BOB, TOKENS, auth

CAROL = so.Principal(authenticator="token", principal_id="carol")


class Model:
    """Answers `re: <the last user message>`; `refund 1042` calls `refund`, and `hello` calls
    `lookup` where the agent has it. Its first call hangs (`hang`: the test cancels the drive,
    leaving the turn running with no drive holding it), or waits for `gate` (`hold` 1); the
    call numbered `hold` waits for `gate`."""

    def __init__(self, *, hang: bool = True, hold: int = 2, lookup: bool = False) -> None:
        self.calls = 0
        self.hang, self.hold, self.lookup = hang, hold, lookup
        self.entered, self.held, self.gate = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        self.calls += 1
        n = self.calls
        last = [m for m in request.messages if m.kind == "user"][-1].text
        self.entered.set()
        if n == 1 and self.hang:
            await asyncio.sleep(3600)
        if n == self.hold:
            self.held.set()
            await self.gate.wait()
        if last == "refund 1042":
            return call_tools(call("refund", call_id=f"c{n}", order_id="1042"))
        if last == "hello" and self.lookup:
            return call_tools(call("lookup", call_id=f"c{n}", q="x"))
        return so.ModelResponse(text=f"re: {last}", usage=so.Usage())


@so.tool(approval=so.always())
async def refund(order_id: str) -> str:
    """Refund an order."""
    return "refunded " + order_id


@so.tool
async def lookup(q: str) -> str:
    """Look something up."""
    return "found " + q


def desk(model: Model, limits: so.Limits | None = None) -> so.Agent:
    tools = [refund, lookup]
    if limits is None:
        return so.Agent(name="desk", model=model, tools=tools)
    return so.Agent(name="desk", model=model, tools=tools, limits=limits)


async def left_undriven(rt: so.Runtime, model: Model) -> str:
    """A session whose turn (Alice's `hello`) runs with no drive holding it: its caller gave up
    on it while the model answered."""
    sid = await rt.create_session("desk", auth=ALICE)
    drive = asyncio.create_task(rt.generate(session_id=sid, prompt="hello", auth=ALICE))
    await asyncio.wait_for(model.entered.wait(), 10)
    drive.cancel()
    await asyncio.wait({drive})
    assert (await rt.state(sid)).status == "running"
    return sid


async def turns(rt: so.Runtime, session_id: str) -> dict[str, str]:
    """The message that started each turn of the session, by turn id."""
    return {
        e.turn_id or "": e.data["message"]
        async for e in rt.events(session_id, follow=False)
        if e.type == "turn.started"
    }


async def steered(rt: so.Runtime, session_id: str, message: str) -> bool:
    """Whether `message` was recorded steering the session's turn."""
    async for e in rt.events(session_id, follow=False):
        if e.type == "turn.message" and e.data["message"] == message:
            return not e.data.get("queued")
    return False


@pytest.mark.parametrize("key", [None, "kb"])
async def test_a_send_driving_a_turn_left_undriven_is_told_its_own_turn(
    store_url: str, key: str | None
) -> None:
    """Bob's `queue` message drives Alice's turn left undriven; Carol's waits behind his
    meanwhile. His call was told Carol's answer (and its keyed repeat his own): it is told his
    own turn, and so is the repeat."""
    model = Model()
    async with so.Runtime([desk(model)], store=store_url) as rt:
        sid = await left_undriven(rt, model)
        bob = asyncio.create_task(
            rt.send(sid, "bob here", principal=BOB, turn_policy="queue", idempotency_key=key)
        )
        await asyncio.wait_for(model.held.wait(), 10)
        carol = await rt.send(sid, "carol here", principal=CAROL, turn_policy="queue")
        assert carol.queued
        model.gate.set()
        b = await asyncio.wait_for(bob, 10)
        by_turn = await turns(rt, sid)
        assert (b.status, b.text, b.queued) == ("completed", "re: bob here", False)
        assert by_turn[b.turn_id or ""] == "bob here"
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.text == "re: carol here"
        if key is not None:
            again = await rt.send(
                sid, "bob here", principal=BOB, turn_policy="queue", idempotency_key=key
            )
            assert (again.turn_id, again.text, again.replayed) == (b.turn_id, b.text, True)


@pytest.mark.parametrize("how", ["failed", "cancelled"])
async def test_a_send_is_not_told_the_undriven_turn_it_drove_first(
    store_url: str, how: str
) -> None:
    """Alice's turn left undriven fails for good under the drive of Bob's `queue` message (its
    step limit), or she cancels it meanwhile; his own turn then completes. His call was told
    her turn, `failed` or `cancelled`: it is told his own."""
    model = Model(lookup=how == "failed")
    agent = desk(model, limits=so.Limits(max_steps=1)) if how == "failed" else desk(model)
    async with so.Runtime([agent], store=store_url) as rt:
        sid = await left_undriven(rt, model)
        bob = asyncio.create_task(rt.send(sid, "bob here", principal=BOB, turn_policy="queue"))
        await asyncio.wait_for(model.held.wait(), 10)
        if how == "cancelled":
            assert (await rt.cancel(sid, "never mind", principal=ALICE)).cancelled
        model.gate.set()
        b = await asyncio.wait_for(bob, 10)
        assert (b.status, b.text, b.queued) == ("completed", "re: bob here", False)
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.id == b.turn_id
        assert (await turns(rt, sid))[b.turn_id or ""] == "bob here"


async def test_a_send_whose_message_left_the_queue_is_not_said_to_wait(store_url: str) -> None:
    """Bob's `queue` message drives Alice's turn left undriven; the same words of his wait
    behind it meanwhile. His first message's turn then waits on an approval, the second still
    queued: the first call was said to wait in the queue too (an equal message does); it is
    told its turn, waiting, and the second's call that it waits."""
    model = Model()
    async with so.Runtime([desk(model)], store=store_url) as rt:
        sid = await left_undriven(rt, model)
        first = asyncio.create_task(rt.send(sid, "refund 1042", principal=BOB, turn_policy="queue"))
        await asyncio.wait_for(model.held.wait(), 10)
        second = await rt.send(sid, "refund 1042", principal=BOB, turn_policy="queue")
        assert second.queued
        model.gate.set()
        b = await asyncio.wait_for(first, 10)
        assert (b.status, b.queued) == ("waiting", False)
        assert [r.tool_name for r in b.pending] == ["refund"]
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.id == b.turn_id
        assert [q["message"] for q in state.queued] == ["refund 1042"]


@pytest.mark.parametrize("how", ["python", "keyed", "http"])
async def test_a_steer_is_told_the_turn_it_steered_not_the_next_persons(
    store_url: str, how: str
) -> None:
    """Alice steers her running turn while Bob's message waits behind it, and his turn then
    waits on a refund's approval. Her steer was told his turn, with his approval pending (and
    her keyed repeat her own): it is told the turn it steered, over HTTP too, and so is the
    repeat."""
    model = Model(hang=False, hold=1)
    runtime = so.Runtime([desk(model)], store=store_url)
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=auth("alice-token")
        ) as c,
    ):
        gen = asyncio.create_task(runtime.generate("desk", "hello", auth=ALICE))
        await asyncio.wait_for(model.held.wait(), 10)
        [session] = await runtime.sessions()
        sid = session.id
        b = await runtime.send(sid, "refund 1042", principal=BOB, turn_policy="queue")
        assert b.queued
        key = "ka" if how == "keyed" else None
        said = "also, my address changed"

        async def steer() -> tuple[str | None, str, list[str]]:
            if how == "http":
                r = await c.post(f"/v1/sessions/{sid}/messages", json={"text": said})
                assert r.status_code == 200, r.text
                got = r.json()
                return got["turn_id"], got["text"], [p["id"] for p in got["pending"]]
            a = await runtime.send(sid, said, principal=ALICE, idempotency_key=key)
            return a.turn_id, a.text, [p.id for p in a.pending]

        steering = asyncio.create_task(steer())
        while not await steered(runtime, sid, said):
            await asyncio.sleep(0.01)
        model.gate.set()
        g = await asyncio.wait_for(gen, 10)
        told = await asyncio.wait_for(steering, 10)
        assert g.text == "re: hello\n\nre: also, my address changed"
        assert told == (g.turn_id, g.text, [])
        state = await runtime.state(sid)
        assert state.turn is not None and state.turn.id != g.turn_id
        assert [r.tool_name for r in state.pending_requests()] == ["refund"]
        if key is not None:
            again = await runtime.send(sid, said, principal=ALICE, idempotency_key=key)
            assert (again.turn_id, again.text, again.replayed) == (g.turn_id, g.text, True)
    await runtime.close()


async def bob_waiting(
    rt: so.Runtime, model: Model, other: so.Runtime, message: str = "bob here"
) -> str:
    """A session whose last turn (Alice's, left undriven) she cancelled while Bob's `queue`
    `message` waited behind it; `other` (not inline) started nothing after the cancel, so his
    message still waits."""
    sid = await left_undriven(rt, model)
    assert (await other.send(sid, message, principal=BOB, turn_policy="queue")).queued
    assert (await other.cancel(sid, "never mind", principal=ALICE)).cancelled
    assert [q["message"] for q in (await rt.state(sid)).queued] == [message]
    return sid


@pytest.mark.parametrize("how", ["generate", "keyed", "schedule"])
async def test_a_prompt_queued_behind_anothers_message_is_told_its_own_turn(
    store_url: str, how: str
) -> None:
    """Alice's `generate` (or a `schedule`d job's) prompt starts Bob's waiting message's turn and
    queues behind it; Carol's message queues behind it meanwhile. The call was told Carol's
    answer (and its keyed repeat Alice's own): it is told the turn its prompt started, and so
    is the repeat."""
    model = Model()
    async with (
        so.Runtime([desk(model)], store=store_url) as rt,
        so.Runtime([desk(model)], store=store_url, inline=False) as other,
    ):
        sid = await bob_waiting(rt, model, other)
        key = "ka" if how == "keyed" else None
        prompt = "the nightly job" if how == "schedule" else "alice again"

        async def call() -> so.GenerateResult:
            if how == "schedule":
                return await rt.schedule("desk", prompt, session_id=sid)
            return await rt.generate(session_id=sid, prompt=prompt, auth=ALICE, idempotency_key=key)

        gen = asyncio.create_task(call())
        await asyncio.wait_for(model.held.wait(), 10)  # Bob's turn, which it started
        assert (await rt.send(sid, "carol here", principal=CAROL, turn_policy="queue")).queued
        model.gate.set()
        g = await asyncio.wait_for(gen, 10)
        assert (g.status, g.text, g.queued) == ("completed", f"re: {prompt}", False)
        assert (await turns(rt, sid))[g.turn_id or ""] == prompt
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.text == "re: carol here"
        if key is not None:
            again = await rt.generate(
                session_id=sid, prompt=prompt, auth=ALICE, idempotency_key=key
            )
            assert (again.turn_id, again.text, again.replayed) == (g.turn_id, g.text, True)


async def test_a_prompt_queued_behind_anothers_message_is_told_its_senders_next_turn(
    store_url: str,
) -> None:
    """As above, but the message queued behind Alice's prompt is her own: her `generate` is
    told that later turn, as a `generate` whose own turn completed is (README)."""
    model = Model()
    async with (
        so.Runtime([desk(model)], store=store_url) as rt,
        so.Runtime([desk(model)], store=store_url, inline=False) as other,
    ):
        sid = await bob_waiting(rt, model, other)
        gen = asyncio.create_task(rt.generate(session_id=sid, prompt="alice again", auth=ALICE))
        await asyncio.wait_for(model.held.wait(), 10)
        assert (await rt.send(sid, "alice more", principal=ALICE, turn_policy="queue")).queued
        model.gate.set()
        g = await asyncio.wait_for(gen, 10)
        assert (g.status, g.text, g.queued) == ("completed", "re: alice more", False)
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.id == g.turn_id


@pytest.mark.parametrize("how", ["generate", "schedule"])
async def test_a_prompt_still_queued_behind_anothers_message_is_said_to_wait(
    store_url: str, how: str
) -> None:
    """Alice's `generate` (or a job's) prompt starts Bob's waiting message's turn, which then
    waits on his refund's approval, and queues behind it. The call was told his turn as if it
    were its own: it is told the turn its prompt waits behind, with `queued`."""
    model = Model(hold=99)
    async with (
        so.Runtime([desk(model)], store=store_url) as rt,
        so.Runtime([desk(model)], store=store_url, inline=False) as other,
    ):
        sid = await bob_waiting(rt, model, other, "refund 1042")
        if how == "schedule":
            g = await rt.schedule("desk", "alice again", session_id=sid)
        else:
            g = await rt.generate(session_id=sid, prompt="alice again", auth=ALICE)
        assert (g.status, g.queued) == ("waiting", True)
        assert [r.tool_name for r in g.pending] == ["refund"]
        assert (await turns(rt, sid))[g.turn_id or ""] == "refund 1042"
        assert [q["message"] for q in (await rt.state(sid)).queued] == ["alice again"]


async def test_a_send_whose_queued_message_another_process_starts_is_not_said_to_wait(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob's `queue` message waits behind Carol's; his call (not inline) finds no turn took it,
    and then another process drives both turns before the call reads the session. It was told
    his turn with `queued` (the message gone from the queue): it is told his turn, not
    waiting."""
    model = Model(hold=99)
    async with (
        so.Runtime([desk(model)], store=store_url) as rt,
        so.Runtime([desk(model)], store=store_url, inline=False) as other,
    ):
        sid = await left_undriven(rt, model)
        assert (await other.send(sid, "carol here", principal=CAROL, turn_policy="queue")).queued
        assert (await other.cancel(sid, "never mind", principal=ALICE)).cancelled
        looked: list[places.InTurn | None] = []

        async def then_a_worker(*args: object) -> places.InTurn | None:
            at = await places.turn_taking(*args)  # type: ignore[arg-type]
            if at is None and not looked:
                await rt.generate(session_id=sid)  # another process drives the queue now
            looked.append(at)
            return at

        monkeypatch.setattr(results, "turn_taking", then_a_worker)
        b = await other.send(sid, "bob here", principal=BOB, turn_policy="queue")
        assert looked[0] is None
        assert (b.status, b.text, b.queued) == ("completed", "re: bob here", False)
        assert (await turns(rt, sid))[b.turn_id or ""] == "bob here"
        assert (await rt.state(sid)).queued == []


async def carols_32(other: so.Runtime, session_id: str) -> None:
    """32 keyed messages from Carol queued (by `other`, not inline: nothing driven), pushing
    every older key out of the session's state."""
    for i in range(1, 33):
        sent = await other.send(session_id, f"carol {i}", principal=CAROL, idempotency_key=f"c{i}")
        assert sent.queued


async def test_a_repeat_whose_key_was_pushed_out_is_told_the_turn_it_started(
    store_url: str,
) -> None:
    """Alice's keyed prompt starts a turn left undriven; 32 newer keys from Carol's queued
    messages push hers out of the state. Her repeat, found in the log, drove the session and
    was told Carol's last answer: it is told her own turn."""
    model = Model(hold=99)
    async with (
        so.Runtime([desk(model)], store=store_url) as rt,
        so.Runtime([desk(model)], store=store_url, inline=False) as other,
    ):
        sid = await rt.create_session("desk", auth=ALICE)
        first = asyncio.create_task(
            rt.generate(session_id=sid, prompt="hello", auth=ALICE, idempotency_key="ka")
        )
        await asyncio.wait_for(model.entered.wait(), 10)
        first.cancel()
        await asyncio.wait({first})
        await carols_32(other, sid)
        again = await rt.generate(session_id=sid, prompt="hello", auth=ALICE, idempotency_key="ka")
        assert (again.status, again.text, again.replayed, again.queued) == (
            "completed",
            "re: hello",
            True,
            False,
        )
        assert (await turns(rt, sid))[again.turn_id or ""] == "hello"
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.text == "re: carol 32"


async def test_a_queued_repeat_whose_key_was_pushed_out_is_told_the_turn_that_took_it(
    store_url: str,
) -> None:
    """Bob's keyed message waits behind Alice's turn, which she cancels (a process not inline:
    nothing started); 32 newer keys from Carol's messages queued behind his push his out of the
    state. His repeat drove the queue and was told Carol's last answer: it is told his turn."""
    model = Model(hold=99)
    async with (
        so.Runtime([desk(model)], store=store_url) as rt,
        so.Runtime([desk(model)], store=store_url, inline=False) as other,
    ):
        sid = await left_undriven(rt, model)
        bob = await other.send(sid, "bob here", principal=BOB, idempotency_key="kb")
        assert bob.queued
        await carols_32(other, sid)
        assert (await other.cancel(sid, "never mind", principal=ALICE)).cancelled
        again = await rt.send(sid, "bob here", principal=BOB, idempotency_key="kb")
        assert (again.status, again.text, again.replayed, again.queued) == (
            "completed",
            "re: bob here",
            True,
            False,
        )
        assert (await turns(rt, sid))[again.turn_id or ""] == "bob here"
        assert (await rt.state(sid)).queued == []


async def test_a_repeat_of_a_message_queued_when_the_ttl_passed_is_not_said_to_wait(
    store_url: str,
) -> None:
    """Bob's keyed message waits behind Alice's turn held on an approval, and the session's TTL
    passes. His repeat was told `queued`, waiting for a turn that never comes: it is told the
    failed turn, not waiting."""
    model = Model(hang=False, hold=99)
    clock = ManualClock()
    limits = so.Limits(ttl=60)
    async with so.Runtime([desk(model, limits)], store=store_url, clock=clock) as rt:
        sid = await rt.create_session("desk", auth=ALICE)
        alice = await rt.generate(session_id=sid, prompt="refund 1042", auth=ALICE)
        bob = await rt.send(sid, "bob here", principal=BOB, idempotency_key="kb")
        assert (bob.turn_id, bob.queued) == (alice.turn_id, True)
        clock.advance(120)
        again = await rt.send(sid, "bob here", principal=BOB, idempotency_key="kb")
        assert (again.turn_id, again.status) == (alice.turn_id, "failed")
        assert (again.replayed, again.queued) == (True, False)


@pytest.mark.parametrize("new", [False, True])
async def test_a_keyed_prompt_and_its_repeat_are_told_its_turn_not_its_senders_next(
    store_url: str, new: bool
) -> None:
    """Alice's keyed `generate` (continuing a session, or starting one) runs while she queues
    another message. The call was told that later turn and its repeat her prompt's: both are
    told her prompt's turn (README: a keyed call, as its repeat)."""
    model = Model(hang=False, hold=1)
    async with so.Runtime([desk(model)], store=store_url) as rt:
        if new:
            gen = rt.generate(agent="desk", prompt="first", auth=ALICE, idempotency_key="ka")
        else:
            sid = await rt.create_session("desk", auth=ALICE)
            gen = rt.generate(session_id=sid, prompt="first", auth=ALICE, idempotency_key="ka")
        task = asyncio.create_task(gen)
        await asyncio.wait_for(model.held.wait(), 10)
        sid = (await rt.sessions())[0].id
        assert (await rt.send(sid, "more", principal=ALICE, turn_policy="queue")).queued
        model.gate.set()
        g = await asyncio.wait_for(task, 10)
        assert (g.status, g.text, g.queued) == ("completed", "re: first", False)
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.text == "re: more"
        if new:
            again = await rt.generate(
                agent="desk", prompt="first", auth=ALICE, idempotency_key="ka"
            )
        else:
            again = await rt.generate(
                session_id=sid, prompt="first", auth=ALICE, idempotency_key="ka"
            )
        assert (again.turn_id, again.text, again.replayed) == (g.turn_id, g.text, True)


class Failing:
    """Fails (a connection error: retryable) on a message with `fail` in it, else answers."""

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        last = [m for m in request.messages if m.kind == "user"][-1].text
        if "fail" in last:
            raise ConnectionError("model down")
        return so.ModelResponse(text=f"re: {last}", usage=so.Usage())


@pytest.mark.parametrize("how", ["send", "generate", "http-send", "http-generate"])
async def test_a_repeat_of_a_failed_turn_passed_by_the_next_is_not_retryable(
    store_url: str, how: str
) -> None:
    """Alice's keyed message fails its turn (retryable), then her next message starts the turn
    past it. The repeat was told `retryable`, and a retry as told ran her next turn: it is told
    the failed turn not retryable, over HTTP too (README: only the session's turn is retried)."""
    runtime = so.Runtime([so.Agent(name="desk", model=Failing())], store=store_url)
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=auth("alice-token")
        ) as c,
    ):
        sid = await runtime.create_session("desk", auth=ALICE)

        async def keyed() -> tuple[str | None, str, bool, bool]:
            if how.startswith("http"):
                path, body = ("messages", {"text": "fail"})
                if how == "http-generate":
                    path, body = ("generate", {"message": "fail"})
                head = {"Idempotency-Key": "kf"}
                r = await c.post(f"/v1/sessions/{sid}/{path}", json=body, headers=head)
                assert r.status_code == 200, r.text
                got = r.json()
                return got["turn_id"], got["status"], got["retryable"], got["replayed"]
            if how == "send":
                a = await runtime.send(sid, "fail", principal=ALICE, idempotency_key="kf")
            else:
                a = await runtime.generate(
                    session_id=sid, prompt="fail", auth=ALICE, idempotency_key="kf"
                )
            return a.turn_id, a.status, a.retryable, a.replayed

        failed = await keyed()
        assert failed[1:] == ("failed", True, False)
        nxt = await runtime.send(sid, "next", principal=ALICE)
        assert (nxt.status, nxt.text) == ("completed", "re: next")
        assert await keyed() == (failed[0], "failed", False, True)
    await runtime.close()
