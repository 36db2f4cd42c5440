"""Idempotency keys as older states recorded them, and the turns a key points at: a repeat of
a key kept without its turn's first event, a queue entry without its key, an earlier turn read
from its own events."""

from __future__ import annotations

import pytest

import signoff as so
from signoff._idempotency import turn_of
from signoff._recording import load_turn
from signoff._state import fold
from signoff.stores import Commit

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
