"""A keyed message sent again is a repeat however many keys came since, while it still waits in
the queue or drives its session's current turn (the state keeps only the last `KEPT` keys), and
once its session's TTL passed: it replays instead of acting a second time."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff._idempotency import KEPT, keyed
from signoff.server import TokenAuth, create_app
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from .test_idempotency import ALICE, BOB, counts
from .test_server_common import TOKENS, auth

CAROL = so.Principal(authenticator="okta", principal_id="carol")


@so.tool(approval=so.always())
async def pay(amount: int) -> str:
    """Pay an amount."""
    return "paid"


def paying_agent() -> so.Agent:
    """Every turn waits on an approval to pay; approved, it says so."""
    return scripted_agent(
        "pay",
        [call_tools(call("pay", amount=3)), reply("done"), call_tools(call("pay", amount=4))],
        tools=[pay],
        repeat_last=True,
    )


async def said(rt: so.Runtime, session_id: str, message: str) -> int:
    """How many times the session's log records `message` sent."""
    events = [e async for e in rt.events(session_id, follow=False)]
    return sum(
        e.type in ("turn.started", "turn.message") and e.data.get("message") == message
        for e in events
    )


async def push_out(rt: so.Runtime, session_id: str, who: so.Principal, count: int = KEPT) -> None:
    """Send `count` keyed messages from `who`, which wait for the turn's end (it serves
    another), pushing older keys out of the session's state."""
    for i in range(count):
        r = await rt.send(session_id, f"note {i}", principal=who, idempotency_key=f"n-{i}")
        assert r.queued


async def test_a_queued_message_pushed_out_of_the_kept_keys_is_queued_once(
    store_url: str,
) -> None:
    async with so.Runtime([paying_agent()], store=store_url) as rt:
        first = await rt.generate("pay", prompt="pay", auth=ALICE)
        sid = first.session_id
        sent = await rt.send(sid, "me too", principal=BOB, idempotency_key="q", turn_policy="queue")
        assert sent.queued and sent.turn_id == first.turn_id
        await push_out(rt, sid, BOB)
        state = await rt.state(sid)
        mark = keyed("q", BOB, "message", "me too", "queue")
        assert mark is not None and mark[0] not in state.keys and len(state.keys) == KEPT
        assert len(state.queued) == KEPT + 1
        before = await counts(rt)
        again = await rt.send(
            sid, "me too", principal=BOB, idempotency_key="q", turn_policy="queue"
        )
        assert again.replayed and again.queued and again.turn_id == first.turn_id
        assert [r.id for r in again.pending] == [r.id for r in first.pending]
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "me too", principal=BOB, idempotency_key="q")  # as `steer`
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "other", principal=BOB, idempotency_key="q", turn_policy="queue")
        assert await counts(rt) == before
        assert len((await rt.state(sid)).queued) == KEPT + 1
        assert await said(rt, sid, "me too") == 1


async def test_a_message_still_driving_its_turn_does_not_steer_it_again(store_url: str) -> None:
    """The message that started the turn waiting on an approval, its key pushed out by
    messages queued behind the turn: sent again, the approval stays open and the call with
    it, instead of being withdrawn (and the call denied) by the same message read twice."""
    async with so.Runtime([paying_agent()], store=store_url) as rt:
        sid = await rt.create_session("pay", auth=ALICE)
        first = await rt.send(sid, "pay my bill", principal=ALICE, idempotency_key="a-1")
        assert first.status == "waiting" and len(first.pending) == 1
        await push_out(rt, sid, BOB)
        before = await counts(rt)
        again = await rt.send(sid, "pay my bill", principal=ALICE, idempotency_key="a-1")
        assert again.replayed and again.turn_id == first.turn_id and not again.queued
        assert [r.id for r in again.pending] == [r.id for r in first.pending]
        same = await rt.generate(
            session_id=sid, prompt="pay my bill", auth=ALICE, idempotency_key="a-1"
        )
        assert same.replayed and same.turn_id == first.turn_id
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "pay twice", principal=ALICE, idempotency_key="a-1")
        assert await counts(rt) == before
        assert await said(rt, sid, "pay my bill") == 1


async def test_a_message_the_queue_gave_its_turn_does_not_steer_it_again(store_url: str) -> None:
    """A message queued behind a turn and taken by the next one, which now waits on an
    approval for its sender: its key pushed out, sent again it is a repeat of that turn (its
    record is the queued message's, before the turn began)."""
    async with so.Runtime([paying_agent()], store=store_url) as rt:
        first = await rt.generate("pay", prompt="pay", auth=ALICE)
        sid = first.session_id
        queued = await rt.send(sid, "bob's bill", principal=BOB, idempotency_key="b-1")
        assert queued.queued
        (request,) = first.pending
        answer = so.InputResponse(request_id=request.id, option_id="approve")
        done = await rt.respond(sid, [answer], principal=ALICE)
        taken = await rt.state(sid)
        assert taken.turn is not None and taken.turn.id != first.turn_id, done
        assert taken.turn.principal is not None and taken.turn.principal.same_as(BOB)
        assert taken.turn.status == "waiting"
        await push_out(rt, sid, CAROL)
        before = await counts(rt)
        again = await rt.send(sid, "bob's bill", principal=BOB, idempotency_key="b-1")
        assert again.replayed and again.turn_id == taken.turn.id and not again.queued
        assert [r.id for r in again.pending] == [r.id for r in taken.pending_requests()]
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "bob's other bill", principal=BOB, idempotency_key="b-1")
        assert await counts(rt) == before
        assert await said(rt, sid, "bob's bill") == 2  # queued, then its turn's start


async def test_a_new_message_after_keys_were_pushed_out_is_delivered(store_url: str) -> None:
    async with so.Runtime([paying_agent()], store=store_url) as rt:
        sid = await rt.create_session("pay", auth=ALICE)
        first = await rt.send(sid, "pay my bill", principal=ALICE, idempotency_key="a-1")
        await push_out(rt, sid, BOB)
        new = await rt.send(sid, "my card", principal=ALICE, idempotency_key="a-2")
        assert not new.replayed  # it steered the turn, which went on to the next
        stored = await rt.store.get_request(first.pending[0].id)
        assert stored is not None and stored.status == "withdrawn"
        assert await said(rt, sid, "my card") == 1


def lasting(ttl: float) -> so.Agent:
    return scripted_agent("chat", [reply("ok")], repeat_last=True, limits=so.Limits(ttl=ttl))


async def test_a_repeat_after_the_ttl_passed_replays(store_url: str) -> None:
    """After the session's TTL passed, a keyed message or prompt sent again replays the turn it
    went to (the last one too: not driven again), as the call that started the session does;
    a new one is `SessionExpired`, recording nothing."""
    clock = ManualClock()
    async with so.Runtime([lasting(100)], store=store_url, clock=clock) as rt:
        start = await rt.generate("chat", prompt="hi", auth=ALICE, idempotency_key="s")
        sid = start.session_id
        sent = await rt.send(sid, "and?", principal=ALICE, idempotency_key="m")
        made = await rt.generate(session_id=sid, prompt="so?", auth=ALICE, idempotency_key="g")
        clock.advance(500)
        with pytest.raises(so.SessionExpired):
            await rt.send(sid, "new", principal=ALICE, idempotency_key="n")
        before = await counts(rt)
        for first, again in (
            (start, await rt.generate("chat", prompt="hi", auth=ALICE, idempotency_key="s")),
            (sent, await rt.send(sid, "and?", principal=ALICE, idempotency_key="m")),
            (made, await rt.send(sid, "so?", principal=ALICE, idempotency_key="g")),
            (
                made,
                await rt.generate(session_id=sid, prompt="so?", auth=ALICE, idempotency_key="g"),
            ),
        ):
            assert again.replayed, again
            assert (again.turn_id, again.status, again.text) == (first.turn_id, "completed", "ok")
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "other", principal=ALICE, idempotency_key="m")
        for call_new in (
            rt.send(sid, "new", principal=ALICE, idempotency_key="n"),
            rt.generate(session_id=sid, prompt="new", auth=ALICE, idempotency_key="n"),
            rt.send(sid, "new", principal=ALICE),
        ):
            with pytest.raises(so.SessionExpired):
                await call_new
        assert await counts(rt) == before


async def test_a_repeat_of_a_started_session_after_the_ttl_passed_replays(
    store_url: str,
) -> None:
    """The session's first turn is still its last: its TTL passed, the call that started it,
    sent again, replays it (it drove the expired session and raised)."""
    clock = ManualClock()
    async with so.Runtime([lasting(100)], store=store_url, clock=clock) as rt:
        start = await rt.generate("chat", prompt="hi", auth=ALICE, idempotency_key="s")
        clock.advance(500)
        again = await rt.generate("chat", prompt="hi", auth=ALICE, idempotency_key="s")
        assert again.replayed and (again.turn_id, again.text) == (start.turn_id, "ok")


async def test_a_repeat_over_http_after_the_ttl_passed_replays(tmp_path: Path) -> None:
    clock = ManualClock()
    runtime = so.Runtime([lasting(100)], store=f"sqlite:///{tmp_path}/s.db", clock=clock)
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=auth("alice-token")
        ) as c,
    ):
        r = await c.post("/v1/sessions", json={"agent": "chat", "message": "hi"})
        sid = r.json()["session_id"]
        calls = [
            (f"/v1/sessions/{sid}/messages", {"text": "more"}, "k-2"),
            (f"/v1/sessions/{sid}/generate", {"message": "again"}, "k-3"),
        ]
        firsts = []
        for path, body, key in calls:
            r = await c.post(path, json=body, headers={"Idempotency-Key": key})
            assert r.status_code == 200, r.text
            firsts.append(r.json())
        clock.advance(500)
        for (path, body, key), first in zip(calls, firsts, strict=True):
            r = await c.post(path, json=body, headers={"Idempotency-Key": key})
            assert r.status_code == 200, r.text
            assert r.json()["replayed"] and r.json()["turn_id"] == first["turn_id"]
            r = await c.post(path, json=body, headers={"Idempotency-Key": key + "-new"})
            assert r.status_code == 410 and r.json()["error"]["code"] == "session_expired"
    await runtime.close()


async def test_a_new_keyed_message_to_an_idle_session_reads_no_log(tmp_path: Path) -> None:
    """With the state's keys full, each new keyed message read the last turn's events (and
    the whole log when the queue had given that turn: 8,004 events at 2,000 messages), though
    that turn had ended: only a turn still running or waiting may hold a dropped key."""
    chat = scripted_agent("chat", [reply("ok")], repeat_last=True)
    async with so.Runtime([chat], store=f"sqlite:///{tmp_path}/s.db") as rt:
        first = await rt.generate("chat", prompt="hi", auth=ALICE)
        for i in range(KEPT + 8):
            await rt.send(first.session_id, f"m{i}", principal=ALICE, idempotency_key=f"k{i}")
        state = await rt.state(first.session_id)
        assert len(state.keys) == KEPT and state.status == "idle", state.status
        reads: list[object] = []
        real = rt.store.read_events

        async def counted(*args: object, **kwargs: object) -> object:
            reads.append(args)
            return await real(*args, **kwargs)  # type: ignore[arg-type]

        rt.store.read_events = counted  # type: ignore[method-assign,assignment]
        r = await rt.send(first.session_id, "new", principal=ALICE, idempotency_key="fresh")
        assert not r.replayed and reads == []
