"""A keyed vote through a subagent's mirror whose process is SIGKILLed between the subagent's
commit of the vote and the parent's record of its key: the key is only in the subagent's
session. The mirror then closes (the quorum made through the parent or in the subagent's
session), or the parent's turn is cancelled or steered, and the parent moves on to a next turn.
The vote sent again with its key is a repeat answered with the turn it went to, not a new
message: that turn's end had dropped the mirror, and with it the parent's only way to the key,
so the retry started a turn with "approve" as its prompt and ran the model again."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

import signoff as so
from signoff.testing import store_contents

from . import _proof
from ._forks import Forks
from ._mirror_vote_crash import BOB, CAROL, KEY, agents
from ._procs import lapse_leases
from ._subagents import ALICE, Counted


@pytest.fixture
def children(tmp_path: Path) -> Iterator[Forks]:
    forks = Forks("tests._mirror_vote_crash", tmp_path)
    try:
        yield forks
    finally:
        forks.close()


async def _messages(rt: so.Runtime, session_id: str) -> list[str]:
    return [
        e.data["message"]
        async for e in rt.events(session_id, follow=False)
        if e.type in ("turn.started", "turn.message")
    ]


@pytest.mark.parametrize("end", ["quorum", "child", "cancel", "steer"])
async def test_a_keyed_vote_killed_before_the_parent_kept_its_key_is_a_repeat_on_a_later_turn(
    store_url: str, children: Forks, end: str
) -> None:
    ran: list[str] = []
    after = Counted("Done.")
    async with so.Runtime(agents(ran, after), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
    sid = first.session_id
    rc, _ = children.run(store_url, sid)
    assert rc == -signal.SIGKILL, children.stderr()
    _proof.record("crash-outside:kills")
    lapse_leases(store_url)  # as its TTL passing would
    async with so.Runtime(agents(ran, after), store=store_url) as rt:
        state = await rt.state(sid)
        (mirror,) = state.pending_requests()
        assert mirror.child is not None
        # The parent kept no key: it only held it for the vote going down (`held_idem`).
        assert [v[1:] for v in state.keys.values()] == [[None]]
        child = mirror.child.session_id
        assert (await rt.state(child)).keys != {}  # the subagent's session counted the vote
        messages = ["refund 1042"]
        if end == "quorum":
            done = await rt.send(sid, "approve", principal=CAROL)
            assert (done.status, ran) == ("completed", ["1042"])
        elif end == "child":  # answered in the subagent's session, not through the mirror
            await rt.send(child, "approve", principal=CAROL)
            assert ran == ["1042"]
        elif end == "cancel":
            await rt.cancel(sid, principal=ALICE)
        else:
            steered = await rt.send(sid, "never mind", principal=ALICE)
            assert steered.status == "completed" and ran == []
            messages.append("never mind")
        status = "cancelled" if end == "cancel" else "completed"
        turn = (await rt.state(sid)).turn
        assert turn is not None and (turn.id, turn.status) == (first.turn_id, status)
        nxt = await rt.send(sid, "thanks", principal=ALICE)
        assert nxt.turn_id != first.turn_id and nxt.status == "completed"
        messages.append("thanks")
        before = [await store_contents(rt.store, s) for s in (sid, child)]
        calls = after.calls
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key=KEY)
        assert again.replayed and (again.turn_id, again.status) == (first.turn_id, status)
        assert after.calls == calls and await _messages(rt, sid) == messages
        with pytest.raises(so.IdempotencyKeyReused):
            await rt.send(sid, "deny", principal=BOB, idempotency_key=KEY)
        assert [await store_contents(rt.store, s) for s in (sid, child)] == before
        assert await rt.verify_audit() == []
