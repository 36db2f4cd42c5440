"""Idempotency keys as older states recorded them, and the turns a key points at: a repeat of
a key kept without its turn's first event, a queue entry without its key, an earlier turn read
from its own events; what a call asked digested unambiguously, a key digested before still
replaying; a key scoped before an issuer of "" was told from none, and a `queue` message's key
from before its policy was part of it, found again."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff import _idempotency
from signoff._idempotency import _digest, caller_parts, keyed, turn_of
from signoff._recording import load_turn
from signoff._state import fold
from signoff.stores import Commit
from signoff.testing import call, call_tools, reply, scripted_agent

from ._server_api import in_process
from .test_idempotency import ALICE, counts, two_answers


async def test_keys_recorded_before_turns_were_kept_repeat_the_session(store_url: str) -> None:
    """A state written before keys kept their turn's first event ([asked, turn id]) and queue
    entries without a key: its repeats answer with the session as it stands, as they did."""
    async with so.Runtime([two_answers()], store=store_url) as rt:
        a = await rt.generate("chat", prompt="A", auth=ALICE, idempotency_key="a")
        b = await rt.send(a.session_id, "B", principal=ALICE, idempotency_key="b")
        state = await rt.state(a.session_id)
        mark = so.Event(
            session_id=a.session_id, seq=state.seq + 1, type="session.waiting", at=state.updated_at
        )
        old = fold([mark], state.copy()).to_snapshot()
        old["keys"] = {k: v[:2] for k, v in old["keys"].items()}
        assert old["keys"] and all(len(v) == 2 and v[1] for v in old["keys"].values())
        await rt.store.commit(
            Commit(session_id=a.session_id, expected_seq=state.seq, events=[mark], snapshot=old)
        )
    async with so.Runtime([two_answers()], store=store_url) as rt:
        before = await counts(rt)
        again = await rt.generate("chat", prompt="A", auth=ALICE, idempotency_key="a")
        assert again.replayed and (again.turn_id, again.text) == (b.turn_id, "answer B")
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(a.session_id, "not B", principal=ALICE, idempotency_key="b")
        assert await counts(rt) == before
        c = await rt.send(a.session_id, "C", principal=ALICE, idempotency_key="c")
        await rt.send(a.session_id, "D", principal=ALICE)
        c_again = await rt.send(a.session_id, "C", principal=ALICE, idempotency_key="c")
        assert c_again.replayed and (c_again.turn_id, c_again.text) == (c.turn_id, "answer C")


def test_a_queue_entry_without_its_key_leaves_the_key_as_recorded() -> None:
    """An old snapshot's queued message (no key on its entry): the turn that takes it does not
    claim the key, whose repeat then answers with the session as it stands."""
    state = so.SessionState(id="ses_x", seq=3)
    state.queued = [{"message": "later", "principal": None}]
    state.keys = {"k": ["asked", "trn_1"]}
    started = so.Event(
        session_id="ses_x",
        seq=4,
        type="turn.started",
        at=1.0,
        turn_id="trn_2",
        data={"message": "later", "principal": None, "dequeued": True},
    )
    after = fold([started], state)
    assert after.keys == {"k": ["asked", "trn_1"]} and after.queued == []
    assert turn_of(after.keys, ("k", "asked")) is None


async def test_an_earlier_turn_is_folded_from_its_own_events_or_refused(store_url: str) -> None:
    """`load_turn` reads one turn's events up to the next turn; a seq that does not start the
    named turn is a damaged log, a `StoreError`."""
    async with so.Runtime([two_answers()], store=store_url) as rt:
        a = await rt.generate("chat", prompt="A", auth=ALICE)
        b = await rt.send(a.session_id, "B", principal=ALICE)
        assert a.turn_id is not None and b.turn_id is not None
        turn = await load_turn(rt.store, a.session_id, a.turn_id, 2)
        assert turn.turn is not None and (turn.turn.status, turn.turn.text) == (
            "completed",
            "answer A",
        )
        assert turn.seq < (await rt.state(a.session_id)).seq  # it stopped at turn B
        for turn_id, seq in ((a.turn_id, 3), (b.turn_id, 2), (a.turn_id, 999)):
            with pytest.raises(so.StoreError, match="damaged"):
                await load_turn(rt.store, a.session_id, turn_id, seq)


def _joined(*asked: str) -> str:
    """What a call asked, as signoff digested it before: its parts joined with NUL."""
    return _digest("signoff-asked", *asked)


@pytest.mark.parametrize("first", ["nul", "policy"])
async def test_a_message_holding_a_nul_is_not_another_message_and_policy(
    store_url: str, first: str
) -> None:
    """What a call asked was digested with its parts joined by NUL, so "stop\\0queue" sent as
    a `steer` and "stop" sent as `queue` digested alike: the second call with the key replayed
    the first instead of raising `IdempotencyKeyReused`. Such an ask is digested unambiguously
    now, in either order, and over HTTP (409); an ask without a NUL as before."""
    nul = {"message": "stop\0queue"}
    policy: dict[str, Any] = {"message": "stop", "turn_policy": "queue"}
    calls = [nul, policy] if first == "nul" else [policy, nul]
    assert keyed("k", ALICE, "message", "stop", "queue") == (
        _digest("signoff-key", *caller_parts(ALICE), "k"),
        _joined("message", "stop", "queue"),
    )
    async with so.Runtime([two_answers()], store=store_url) as rt:
        a = await rt.generate("chat", prompt="A", auth=ALICE)
        sent = await rt.send(a.session_id, principal=ALICE, idempotency_key="k", **calls[0])
        assert not sent.replayed
        again = await rt.send(a.session_id, principal=ALICE, idempotency_key="k", **calls[0])
        assert again.replayed and again.turn_id == sent.turn_id
        before = await counts(rt)
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(a.session_id, principal=ALICE, idempotency_key="k", **calls[1])
        assert await counts(rt) == before
    async with so.Runtime([two_answers()], store=store_url) as rt, in_process(rt) as alice:
        opened = await alice.post("/v1/sessions", json={"agent": "chat"})
        url, key = f"/v1/sessions/{opened.json()['session_id']}/messages", {"Idempotency-Key": "h"}
        bodies = [
            {"text": c["message"], **({"turnPolicy": "queue"} if "turn_policy" in c else {})}
            for c in calls
        ]
        sent_over_http = await alice.post(url, json=bodies[0], headers=key)
        assert sent_over_http.status_code == 200, sent_over_http.text
        before = await counts(rt)
        other = await alice.post(url, json=bodies[1], headers=key)
        assert other.status_code == 409, other.text
        assert other.json()["error"]["code"] == "idempotency_key_reused"
        assert await counts(rt) == before


async def test_a_key_recorded_before_for_a_message_holding_a_nul_still_replays(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key signoff recorded before for a message holding a NUL (its parts joined with NUL)
    still replays its own call, and another message is still `IdempotencyKeyReused`. One whose
    joined form is that of a message without a NUL sent as `queue` ("stop\0queue", "stop"),
    which is recorded so still, is read as that one, as it was before: its own call is refused
    (nothing is sent)."""
    async with so.Runtime([two_answers()], store=store_url) as rt:
        a = await rt.generate("chat", prompt="A", auth=ALICE)
        with monkeypatch.context() as m:
            m.setattr(_idempotency, "_asked", lambda asked: _joined(*asked))
            sent = await rt.send(a.session_id, "stop\0now", principal=ALICE, idempotency_key="k")
            await rt.send(a.session_id, "stop\0queue", principal=ALICE, idempotency_key="q")
        (asked, *_), _ = (await rt.state(a.session_id)).keys.values()
        assert asked == _joined("message", "stop\0now")  # as signoff recorded it before
        before = await counts(rt)
        again = await rt.send(a.session_id, "stop\0now", principal=ALICE, idempotency_key="k")
        assert again.replayed and (again.turn_id, again.text) == (sent.turn_id, "answer B")
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(a.session_id, "stop\0later", principal=ALICE, idempotency_key="k")
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(a.session_id, "stop\0queue", principal=ALICE, idempotency_key="q")
        queued = await rt.send(
            a.session_id, "stop", principal=ALICE, turn_policy="queue", idempotency_key="q"
        )
        assert queued.replayed  # as that key was read before: it holds no more than that
        assert await counts(rt) == before


DANA = so.Principal(authenticator="okta", issuer="", principal_id="dana")
DANA_NONE = so.Principal(authenticator="okta", principal_id="dana")  # another person (`same_as`)
CAROL = so.Principal(authenticator="okta", principal_id="carol")


def _scoped_before(principal: so.Principal | None) -> tuple[str, ...]:
    """Who gave a key, as signoff scoped it before it told an issuer of "" from none."""
    if principal is None:
        return ()
    p = principal
    return (p.authenticator, p.issuer or "", p.principal_type, p.principal_id)


def _refunding(refunds: list[int]) -> so.Agent:
    """A first turn that parks on an approved refund (counted when it runs), then answers."""

    @so.tool(approval=so.always())
    async def refund(amount: int) -> str:
        """Refund an amount."""
        refunds.append(amount)
        return "refunded"

    return scripted_agent(
        "shop",
        [call_tools(call("refund", amount=5)), reply("done")],
        tools=[refund],
        repeat_last=True,
    )


async def test_a_key_given_with_an_issuer_of_empty_before_it_was_scoped_exactly_replays(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A principal with an issuer of "" had its keys scoped as one with none until signoff
    told them apart: its call repeated after the upgrade found no key, so it started a second
    session (the refund approved twice) and sent its messages again. Its keys recorded so are
    found again, as its own (the principal its record names); another person's, scoped alike
    (an issuer of None), stays another call."""
    refunds: list[int] = []
    async with so.Runtime([_refunding(refunds)], store=store_url) as rt:
        with monkeypatch.context() as m:
            m.setattr(_idempotency, "caller_parts", _scoped_before)
            first = await rt.generate("shop", prompt="refund", auth=DANA, idempotency_key="s")
            sid = first.session_id
            approved = await rt.send(sid, "approve", principal=DANA, idempotency_key="a")
            more = await rt.send(sid, "more", principal=DANA, idempotency_key="m")
            later = await rt.generate(
                session_id=sid, prompt="later", auth=DANA, idempotency_key="g"
            )
            opened = await rt.create_session("shop", auth=DANA, idempotency_key="o")
        assert refunds == [5] and approved.text == "done" and more.turn_id != first.turn_id
    async with so.Runtime([_refunding(refunds)], store=store_url) as rt:
        before = await counts(rt)
        again = await rt.generate("shop", prompt="refund", auth=DANA, idempotency_key="s")
        assert again.replayed and (again.session_id, again.turn_id) == (sid, first.turn_id)
        approved_again = await rt.send(sid, "approve", principal=DANA, idempotency_key="a")
        assert approved_again.replayed and approved_again.turn_id == first.turn_id
        more_again = await rt.send(sid, "more", principal=DANA, idempotency_key="m")
        assert more_again.replayed and more_again.turn_id == more.turn_id
        later_again = await rt.generate(
            session_id=sid, prompt="later", auth=DANA, idempotency_key="g"
        )
        assert later_again.replayed and later_again.turn_id == later.turn_id != more.turn_id
        assert await rt.create_session("shop", auth=DANA, idempotency_key="o") == opened
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "other", principal=DANA, idempotency_key="m")
        assert await counts(rt) == before and refunds == [5]
        # A key of another person scoped alike then: DANA's call with it is her own.
        theirs = await rt.send(sid, "hi", principal=DANA_NONE, idempotency_key="x")
        mine = await rt.send(sid, "hi", principal=DANA, idempotency_key="x")
        assert not mine.replayed and mine.turn_id != theirs.turn_id
        # Recorded naming no sender, nor a mirror whose subagent names one: not told apart, refused.
        state = await rt.state(sid)
        assert state.turn is not None
        idem = [_digest("signoff-key", *_scoped_before(DANA), "v"), _joined("message", "v")]
        repeated = so.Event(
            session_id=sid,
            seq=state.seq + 1,
            type="input.repeated",
            at=state.updated_at,
            turn_id=state.turn.id,
            data={"request_id": "req_gone", "by": None, "idem": idem},
        )
        await rt.store.commit(Commit(session_id=sid, expected_seq=state.seq, events=[repeated]))
        before = await counts(rt)
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "v", principal=DANA, idempotency_key="v")
        assert await counts(rt) == before


async def test_a_queue_message_keyed_before_its_policy_was_part_of_the_key_replays(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `queue` message's key was recorded with the message alone before the policy was part
    of what it asked: sent again after the upgrade, it was refused as a key reused. Recorded
    waiting in the queue with that policy, it replays, in the queue and once a turn took it;
    a `steer` message's key (recorded so still) is no `queue` one, nor one an older signoff
    recorded for a `queue` message that started its turn itself (README)."""
    joined = _idempotency._asked

    def asked_before(asked: tuple[str, ...]) -> str:
        queued = len(asked) == 3 and asked[::2] == ("message", "queue")
        return _joined(*asked[:2]) if queued else joined(asked)

    refunds: list[int] = []
    async with so.Runtime([_refunding(refunds)], store=store_url) as rt:
        sid = (await rt.generate("shop", prompt="refund", auth=ALICE)).session_id
        idle = (await rt.generate("shop", prompt="refund", auth=ALICE)).session_id
        await rt.send(idle, "approve", principal=ALICE)
        with monkeypatch.context() as m:
            m.setattr(_idempotency, "_asked", asked_before)
            queued = await rt.send(
                sid, "also 2", principal=CAROL, turn_policy="queue", idempotency_key="q"
            )
            started = await rt.send(
                idle, "go on", principal=ALICE, turn_policy="queue", idempotency_key="i"
            )
        steered = await rt.send(sid, "also 3", principal=CAROL, idempotency_key="s")
        assert queued.queued and steered.queued and not started.queued
    async with so.Runtime([_refunding(refunds)], store=store_url) as rt:
        before = await counts(rt)
        again = await rt.send(
            sid, "also 2", principal=CAROL, turn_policy="queue", idempotency_key="q"
        )
        assert again.replayed and again.queued and again.turn_id == queued.turn_id
        with pytest.raises(so.IdempotencyKeyReused):  # a steer message's key
            await rt.send(sid, "also 3", principal=CAROL, turn_policy="queue", idempotency_key="s")
        with pytest.raises(so.IdempotencyKeyReused):  # not told from a steer message's
            await rt.send(idle, "go on", principal=ALICE, turn_policy="queue", idempotency_key="i")
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "also 4", principal=CAROL, turn_policy="queue", idempotency_key="q")
        assert await counts(rt) == before
        await rt.send(sid, "approve", principal=ALICE)
        taken = await rt.send(
            sid, "also 2", principal=CAROL, turn_policy="queue", idempotency_key="q"
        )
        assert taken.replayed and not taken.queued and taken.turn_id != queued.turn_id
        started_on = [
            e.data["message"]
            async for e in rt.events(sid, follow=False)
            if e.type == "turn.started"
        ]
        assert started_on == ["refund", "also 2", "also 3"]
