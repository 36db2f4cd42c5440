"""Idempotency keys as older states recorded them, and the turns a key points at: a repeat of
a key kept without its turn's first event, a queue entry without its key, an earlier turn read
from its own events; what a call asked digested unambiguously, a key digested before still
replaying."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff import _idempotency
from signoff._idempotency import _digest, caller_parts, keyed, turn_of
from signoff._recording import load_turn
from signoff._state import fold
from signoff.stores import Commit

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
