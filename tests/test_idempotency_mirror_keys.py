"""A keyed vote through a subagent's mirror is recorded in the subagent's session, and its key in
the parent by a commit after it (`keep_vote_key`), which was made only while the mirror was
open. Another answer that closes the mirror in between (the last vote of the quorum, from
another process) left the key in the subagent's session alone: once the parent moved on to a
next turn, the vote sent again with its key started that turn anew with "approve" as its
prompt. The commit closing the mirror keeps the key (`kept`), on both stores. (A process killed
in between: test_idempotency_mirror_crash.py; what `kept` holds: test_mirror_keys.py.)"""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff import _mirror_keys, _mirrors
from signoff.testing import call, call_tools, reply, scripted_agent, store_contents
from tests._mirror_vote_crash import BOB, CAROL, KEY, agents
from tests._subagents import ALICE, Counted
from tests.test_docs_events import rows


async def test_a_keyed_vote_whose_mirror_closed_before_the_parent_kept_its_key_is_a_repeat(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[str] = []
    after = Counted("Done.")
    async with (
        so.Runtime(agents(ran, after), store=store_url) as rt,
        so.Runtime(agents(ran, after), store=store_url) as other,
    ):
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid = first.session_id
        keep = _mirror_keys.keep_vote_key
        closed: list[so.GenerateResult] = []

        async def carol_first(*args: Any) -> None:
            # Bob's vote is counted in the subagent's session; Carol's, from another process,
            # makes the quorum and closes the mirror before Bob's call keeps his key here.
            closed.append(await other.send(sid, "approve", principal=CAROL))
            await keep(*args)

        monkeypatch.setattr(_mirrors, "keep_vote_key", carol_first)
        bobs = await rt.send(sid, "approve", principal=BOB, idempotency_key=KEY)
        monkeypatch.undo()
        assert [r.status for r in closed] == ["completed"] and ran == ["1042"]
        assert (bobs.turn_id, bobs.status) == (first.turn_id, "completed")
        nxt = await rt.send(sid, "thanks", principal=ALICE)
        assert nxt.turn_id != first.turn_id and nxt.status == "completed"
        before, calls = await store_contents(rt.store, sid), after.calls
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key=KEY)
        assert again.replayed and (again.turn_id, again.status) == (first.turn_id, "completed")
        assert after.calls == calls and await store_contents(rt.store, sid) == before
        assert ran == ["1042"] and await rt.verify_audit() == []
        events = [e async for e in rt.events(sid, follow=False)]
        (kept,) = [e for e in events if e.data.get("kept")]
        assert (kept.type, kept.turn_id, kept.data["request_id"]) == (
            "input.resolved",
            first.turn_id,
            first.pending[0].id,
        )
        assert "`kept`" in rows()["input.resolved"]


def _chain(ran: list[str], after: Counted) -> list[so.Agent]:
    """support delegates to ops, which delegates the refund to billing: support's mirror
    stands for ops's, which stands for billing's request."""
    billing = agents(ran, after)[1]
    ops = scripted_agent(
        "ops",
        [call_tools(call("billing", call_id="d2", message="Refund 1042")), reply("ops done")],
        tools=[so.delegate("billing", description="Billing specialist.")],
        repeat_last=True,
    )
    support = scripted_agent(
        "support",
        [call_tools(call("ops", call_id="d1", message="Refund 1042")), after],
        tools=[so.delegate("ops", description="Operations.")],
        repeat_last=True,
    )
    return [support, ops, billing]


@pytest.mark.parametrize("end", ["quorum", "cancel", "steer"])
async def test_a_keyed_vote_through_a_chain_of_mirrors_kept_nowhere_but_at_its_end_is_a_repeat(
    store_url: str, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    """Bob's keyed vote through support's mirror of ops's mirror of billing's request, its
    process killed once billing counted it: only billing holds the key. Support's turn ends
    (the quorum made, a cancel, a steering message) and a next turn starts: the vote sent again
    is a repeat. A cancel or a steer withdrew support's mirror before ops's (which its cancel of
    ops withdraws after), so it keeps the keys of every session down the chain."""
    ran: list[str] = []
    after = Counted("Done.")
    async with so.Runtime(_chain(ran, after), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid = first.session_id
        with monkeypatch.context() as m:

            async def killed(*args: Any) -> None:
                return None  # the process died before ops's commit, and support's

            m.setattr(_mirrors, "keep_vote_key", killed)
            bobs = await rt.send(sid, "approve", principal=BOB, idempotency_key=KEY)
        assert bobs.status == "waiting"
        # Support kept no key: it only held it for the vote going down (`held_idem`).
        assert [v[1:] for v in (await rt.state(sid)).keys.values()] == [[None]]
        status = "cancelled" if end == "cancel" else "completed"
        if end == "quorum":
            done = await rt.send(sid, "approve", principal=CAROL)
            assert (done.status, ran) == ("completed", ["1042"])
        elif end == "cancel":
            await rt.cancel(sid, principal=ALICE)
        else:
            steered = await rt.send(sid, "never mind", principal=ALICE)
            assert steered.status == "completed" and ran == []
        nxt = await rt.send(sid, "thanks", principal=ALICE)
        assert nxt.turn_id != first.turn_id and nxt.status == "completed"
        before, calls = await store_contents(rt.store, sid), after.calls
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key=KEY)
        assert again.replayed and (again.turn_id, again.status) == (first.turn_id, status)
        assert after.calls == calls and await store_contents(rt.store, sid) == before
        assert await rt.verify_audit() == []
