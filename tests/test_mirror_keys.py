"""The keys of keyed messages answered through a subagent's mirror, which the parent's commit
closing or withdrawing the mirror keeps (`kept`, `_mirror_keys`) when the process that cast the
vote died before the parent's own record of it: only those of messages sent through the mirror
(marked `via` in the subagent's session), never pushing a newer key out of the parent, kept
too when the vote is counted while a cancel or a steering message is recorded, and not read
back from a snapshot of the fold before them. Both stores. (The crash itself:
test_idempotency_mirror_crash.py; the mirror closed or withdrawn: test_idempotency_mirror_keys.py.)
"""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff import _cancel_batch, _engine, _messages, _mirror_keys, _mirrors
from signoff._state import FOLD_VERSION
from signoff.server._trace_summary import summary
from signoff.stores._codec import pack_bytes
from signoff.testing import call, call_tools, reply, scripted_agent, store_contents

from ._audit import alter
from ._mirror_vote_crash import BOB, CAROL, KEY, agents
from ._procs import query
from ._subagents import ALICE, Counted
from .test_journal_snapshots import put_snapshot, stored_snapshot

DAVE = so.Principal(authenticator="okta", principal_id="dave")


def _snapshot_at(url: str, session_id: str) -> int:
    """The event the session's stored snapshot was taken after; 0 if none is."""
    sql = "SELECT n.seq FROM {t}snapshots n JOIN {t}sessions s ON s.sk = n.sk WHERE s.id = {p}"
    found = query(url, sql, session_id)
    return int(found[0][0]) if found else 0


def _refunds(ran: list[str], *, together: bool = False) -> list[so.Agent]:
    """support delegates each refund it is asked for to billing, whose refund one person
    approves: "refund 1042", then "refund 1043 too" in a later turn, each behind a mirror (or
    both at once, `together`: two mirrors of one turn)."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    def asked(conversation: list[so.Message]) -> so.ModelResponse:
        said = next(m.text for m in conversation if isinstance(m, so.UserMessage))
        return call_tools(call("refund", call_id="c1", order_id=said.split()[-1]))

    billing = scripted_agent("billing", [asked, reply("done")], tools=[refund])
    if together:
        both = [call("billing", call_id=f"d{n}", message=f"Refund {n}") for n in (1042, 1043)]
        steps = [call_tools(*both), reply("Done.")]
        return [scripted_agent("support", steps, tools=[so.delegate("billing")]), billing]
    support = scripted_agent(
        "support",
        [
            call_tools(call("billing", call_id="d1", message="Refund 1042")),
            reply("Done."),
            call_tools(call("billing", call_id="d2", message="Refund 1043")),
            reply("Done again."),
        ],
        tools=[so.delegate("billing", description="Billing specialist.")],
    )
    return [support, billing]


async def test_a_key_sent_to_the_subagents_session_itself_is_another_call_in_the_parent(
    store_url: str,
) -> None:
    """Alice approves the subagent's refund in its own session with her key "k1": the parent's
    mirror closes with it, keeping no key. In a later turn she sends "approve" with "k1" to the
    parent, where another refund waits: another call there (README), which approves it. The
    close kept every key the subagent's session recorded in that turn, so the parent took it
    for a repeat, and the second refund never ran."""
    ran: list[str] = []
    async with so.Runtime(_refunds(ran), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid, (mirror,) = first.session_id, first.pending
        assert mirror.child is not None
        direct = await rt.send(
            mirror.child.session_id, "approve", principal=ALICE, idempotency_key="k1"
        )
        assert direct.status == "completed" and ran == ["1042"]
        state = await rt.state(sid)
        assert state.turn is not None and (state.turn.id, state.turn.status) == (
            first.turn_id,
            "completed",
        )
        assert state.keys == {}  # the parent holds no key of that call
        nxt = await rt.send(sid, "refund 1043 too", principal=ALICE)
        assert nxt.status == "waiting" and len(nxt.pending) == 1
        again = await rt.send(sid, "approve", principal=ALICE, idempotency_key="k1")
        assert not again.replayed
        assert (again.turn_id, again.status, ran) == (nxt.turn_id, "completed", ["1042", "1043"])
        assert [e async for e in rt.events(sid, follow=False) if e.data.get("kept")] == []
        assert await rt.verify_audit() == []


async def test_a_key_sent_to_one_subagents_session_is_another_call_on_the_parents_other_mirror(
    store_url: str,
) -> None:
    """Both refunds wait behind mirrors of one turn. Alice approves one in its subagent's
    session itself with "k1", then sends "approve" with "k1" to the parent, where the other
    waits: another call there, which approves it, and records no key of the first. The parent
    took the key in the first subagent's session for a vote through its mirror, closed by
    then: a repeat, and the other refund waited on."""
    ran: list[str] = []
    async with so.Runtime(_refunds(ran, together=True), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund both", auth=ALICE)
        sid, (one, _) = first.session_id, first.pending
        assert one.child is not None
        direct = await rt.send(
            one.child.session_id, "approve", principal=ALICE, idempotency_key="k1"
        )
        assert direct.status == "completed" and len(ran) == 1
        assert (await rt.state(sid)).keys == {}
        again = await rt.send(sid, "approve", principal=ALICE, idempotency_key="k1")
        assert not again.replayed
        assert (again.turn_id, again.status) == (first.turn_id, "completed")
        assert sorted(ran) == ["1042", "1043"]
        repeated = [e async for e in rt.events(sid, follow=False) if e.type == "input.repeated"]
        # Only the hold of its own answer going down the other mirror (`held_idem`).
        assert [e.data.get("idem") for e in repeated] == [None] and await rt.verify_audit() == []


async def test_a_kept_key_pushes_no_newer_key_out_of_the_parent(store_url: str) -> None:
    """Bob's keyed vote is kept in the parent too; 32 notes Dave sends with keys s1 to s32 wait
    in its queue and push Bob's key out of the 32 the parent remembers. Carol's vote makes the
    quorum, and the close (which cannot tell Bob's key was kept here once) names it in `kept`:
    as older than every key the turn recorded or queued, it pushes none of them out. It came
    back as the newest and pushed s1 out, so Dave's note sent again was queued a second time."""
    ran: list[str] = []
    after = Counted("Done.")
    async with so.Runtime(agents(ran, after), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid = first.session_id
        bobs = await rt.send(sid, "approve", principal=BOB, idempotency_key=KEY)
        (bob_key,) = (await rt.state(sid)).keys
        assert bobs.status == "waiting"
        for i in range(1, 33):
            note = await rt.send(sid, f"note {i}", principal=DAVE, idempotency_key=f"s{i}")
            assert note.queued
        assert bob_key not in (await rt.state(sid)).keys
        done = await rt.send(sid, "approve", principal=CAROL)
        assert (done.status, ran) == ("completed", ["1042"])
        closed = [e async for e in rt.events(sid, follow=False) if e.data.get("kept")]
        assert [[k for k, _ in e.data["kept"]] for e in closed] == [[bob_key]]
        state = await rt.state(sid)
        assert state.queued == [] and bob_key not in state.keys and len(state.keys) == 32
        before = await store_contents(rt.store, sid)
        again = await rt.send(sid, "note 1", principal=DAVE, idempotency_key="s1")
        assert again.replayed and not again.queued
        assert await store_contents(rt.store, sid) == before
        assert await rt.verify_audit() == []


@pytest.mark.parametrize("voter", ["late", "killed"])
@pytest.mark.parametrize("end", ["cancel", "steer"])
async def test_a_keyed_vote_counted_while_a_cancel_or_steer_is_recorded_keeps_its_key(
    store_url: str, monkeypatch: pytest.MonkeyPatch, end: str, voter: str
) -> None:
    """Bob's keyed vote (another process) is counted in the subagent's session after Alice's
    cancel or steering message read the mirror's keys and before its commit, which withdraws
    the mirror without it. His own commit in the parent comes after (`late`: the one looking
    again after the commit is left out, as if Alice's process died), and records the key on
    the withdrawn mirror's turn; or never (`killed`), and Alice's call, looking again once
    committed, records it. After the parent's next turn the vote sent again is a repeat. Each
    found the mirror withdrawn and recorded nothing: the vote started a turn of its own."""
    ran: list[str] = []
    after = Counted("Done.")
    async with (
        so.Runtime(agents(ran, after), store=store_url) as rt,
        so.Runtime(agents(ran, after), store=store_url) as other,
    ):
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid = first.session_id
        held: list[tuple[Any, ...]] = []
        keep = _mirror_keys.keep_vote_key
        owner = _cancel_batch if end == "cancel" else _messages
        read = _mirror_keys.mirrored_keys

        async def hold(*args: Any) -> None:
            held.append(args)  # Bob's process: made late, or never

        async def bob_between(*args: Any) -> dict[str, list[list[str]]]:
            out = await read(*args)
            if not held:
                monkeypatch.setattr(_mirrors, "keep_vote_key", hold)
                bobs = await other.send(sid, "approve", principal=BOB, idempotency_key=KEY)
                monkeypatch.setattr(_mirrors, "keep_vote_key", keep)
                assert bobs.status == "waiting" and bobs.pending[0].approved_by == ["bob"]
            return out

        async def nothing(*args: Any) -> None:
            return None

        monkeypatch.setattr(owner, "mirrored_keys", bob_between)
        if voter == "late":
            if end == "cancel":
                monkeypatch.setattr(_cancel_batch.CancelBatch, "keep_late", nothing)
            else:
                monkeypatch.setattr(_messages, "keep_late", nothing)
        if end == "cancel":
            assert (await rt.cancel(sid, principal=ALICE)).status == "cancelled"
        else:
            assert (await rt.send(sid, "never mind", principal=ALICE)).status == "completed"
        monkeypatch.undo()
        assert len(held) == 1
        if voter == "late":
            await keep(*held[0])
        assert len((await rt.state(sid)).keys) == 1
        nxt = await rt.send(sid, "thanks", principal=ALICE)
        assert nxt.turn_id != first.turn_id and nxt.status == "completed"
        before, calls = await store_contents(rt.store, sid), after.calls
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key=KEY)
        status = "cancelled" if end == "cancel" else "completed"
        assert again.replayed and (again.turn_id, again.status) == (first.turn_id, status)
        assert after.calls == calls and await store_contents(rt.store, sid) == before
        assert ran == [] and await rt.verify_audit() == []


async def test_a_snapshot_of_the_fold_before_kept_keys_is_folded_again(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot taken after a mirror's close kept Bob's key, by a process of the fold before
    (which reads no `kept`): the session loads from its events, so Bob's vote sent again after
    later turns is a repeat, and verification names nothing. That fold's snapshot was loaded as
    this fold's: the key was lost, and verification named the snapshot (`keys`)."""
    ran: list[str] = []
    after = Counted("Done.")
    async with so.Runtime(agents(ran, after), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid = first.session_id
        with monkeypatch.context() as m:

            async def killed(*args: Any) -> None:
                return None  # the process died before the parent's commit

            m.setattr(_mirrors, "keep_vote_key", killed)
            await rt.send(sid, "approve", principal=BOB, idempotency_key=KEY)
        assert (await rt.send(sid, "approve", principal=CAROL)).status == "completed"
        (close,) = [e async for e in rt.events(sid, follow=False) if e.data.get("kept")]
        (bob_key, _), *_ = close.data["kept"]
        for _ in range(40):  # till a snapshot is taken after the close
            await rt.send(sid, "thanks", principal=ALICE)
            if _snapshot_at(store_url, sid) > close.seq:
                break
    at, snapshot = stored_snapshot(store_url, sid)
    assert at > close.seq and bob_key in snapshot["keys"]
    older = {
        **snapshot,
        "fold": FOLD_VERSION - 1,
        "keys": {k: v for k, v in snapshot["keys"].items() if k != bob_key},
    }
    put_snapshot(store_url, sid, older)
    async with so.Runtime(agents(ran, after), store=store_url) as rt:
        calls = after.calls
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key=KEY)
        assert again.replayed and (again.turn_id, again.status) == (first.turn_id, "completed")
        assert after.calls == calls and await rt.verify_audit() == []


@pytest.mark.parametrize("end", ["cancel", "steer"])
async def test_a_subagents_session_the_store_cannot_read_holds_back_no_cancel_or_steer(
    store_url: str, end: str
) -> None:
    """The subagent's last event damaged (it does not decode): the parent's cancel or steering
    message, which reads the mirror's keys first, withdraws the mirror all the same, keeping
    none from there, and fails on that session afterwards, as it did before it read them. The
    read raised `StoreDamaged` before the commit: the parent's turn stayed waiting on it."""
    async with so.Runtime(_refunds([]), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
    sid, (mirror,) = first.session_id, first.pending
    assert mirror.child is not None
    alter(
        store_url,
        "UPDATE {t}events SET data = {p} WHERE sk = (SELECT sk FROM {t}sessions WHERE id = {p}) "
        "AND seq = (SELECT max(seq) FROM {t}events e WHERE e.sk = {t}events.sk)",
        b"\x00\xff\x00",
        mirror.child.session_id,
    )
    async with so.Runtime(_refunds([]), store=store_url) as rt:
        with pytest.raises(so.StoreDamaged):
            if end == "cancel":
                await rt.cancel(sid, principal=ALICE)
            else:
                await rt.send(sid, "never mind", principal=ALICE)
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.id == first.turn_id
        assert state.pending_requests() == []
        assert state.turn.status == ("cancelled" if end == "cancel" else "running")


@pytest.mark.parametrize("end", ["cancel", "steer"])
async def test_a_subagents_session_with_an_event_that_does_not_fold_holds_back_no_cancel_or_steer(
    store_url: str, end: str
) -> None:
    """The subagent's last event decodes but does not fold (its `idem` is no key): the parent's
    cancel or steering message withdraws the mirror all the same, keeping no key from there,
    and fails on that session afterwards, as it did before it read the mirror's keys. The read
    raised that `StoreError` before the commit: nothing was recorded in the parent."""
    async with so.Runtime(_refunds([]), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid, (mirror,) = first.session_id, first.pending
        assert mirror.child is not None
        child = mirror.child.session_id
        (last,) = [e async for e in rt.events(child, follow=False)][-1:]
        first_seq = (await rt.state(sid)).seq
    assert last.type == "turn.waiting"
    malformed = {**last.data, "idem": "x"}
    where = "sk = (SELECT sk FROM {t}sessions WHERE id = {p})"
    alter(
        store_url,
        f"UPDATE {{t}}events SET data = {{p}} WHERE {where} AND seq = {{p}}",
        pack_bytes(malformed),
        child,
        last.seq,
    )
    alter(store_url, f"DELETE FROM {{t}}snapshots WHERE {where}", child)
    async with so.Runtime(_refunds([]), store=store_url) as rt:
        with pytest.raises(so.StoreError, match="is malformed"):
            if end == "cancel":
                await rt.cancel(sid, principal=ALICE)
            else:
                await rt.send(sid, "never mind", principal=ALICE)
        events = [e async for e in rt.events(sid, follow=False) if e.seq > first_seq]
        withdrawn = "turn.cancelled" if end == "cancel" else "turn.message"
        assert [e.type for e in events][:2] == ["input.resolved", withdrawn]
        assert not any(e.data.get("kept") for e in events)
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.id == first.turn_id
        assert state.pending_requests() == [] and state.keys == {}
        assert state.turn.status == ("cancelled" if end == "cancel" else "running")


async def test_a_keyed_vote_a_signoff_before_fold_9_counted_through_a_mirror_is_a_repeat(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Bob's keyed vote through the mirror, counted by a process of the signoff before fold 9
    (its key in the subagent's session has no `via`), which died before the parent's commit;
    Carol's vote makes the quorum and the parent's turn completes. Bob's vote sent again, in
    that turn still, is a repeat, as that signoff took it. The key, not marked as given through
    the mirror, was taken for a call sent to the subagent's session: the vote started a turn."""
    ran: list[str] = []
    after = Counted("Done.")
    async with so.Runtime(agents(ran, after), store=store_url) as rt:
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid, (mirror,) = first.session_id, first.pending
        assert mirror.child is not None
        with monkeypatch.context() as m:  # as the signoff before fold 9 records it

            async def killed(*args: Any) -> None:
                return None  # the process died before the parent's commit

            m.setattr(_mirrors, "through", lambda mark: mark)
            m.setattr(_engine, "sent_here", lambda specs: list(specs), raising=False)
            m.setattr(_mirrors, "keep_vote_key", killed)
            m.setattr(_mirrors, "hold_key", killed)  # nor held its key in the parent first
            bobs = await rt.send(sid, "approve", principal=BOB, idempotency_key=KEY)
        assert bobs.status == "waiting" and (await rt.state(sid)).keys == {}
        (bob_key, held), *_ = (await rt.state(mirror.child.session_id)).keys.items()
        assert len(held) < 4  # no `via`
        done = await rt.send(sid, "approve", principal=CAROL)
        assert (done.turn_id, done.status, ran) == (first.turn_id, "completed", ["1042"])
        calls = after.calls
        again = await rt.send(sid, "approve", principal=BOB, idempotency_key=KEY)
        assert again.replayed and (again.turn_id, again.status) == (first.turn_id, "completed")
        assert after.calls == calls and ran == ["1042"]
        assert bob_key in (await rt.state(sid)).keys and await rt.verify_audit() == []


@pytest.mark.parametrize("end", ["cancel", "steer"])
async def test_a_key_kept_after_a_cancel_or_steer_names_who_voted(
    store_url: str, monkeypatch: pytest.MonkeyPatch, end: str
) -> None:
    """Bob's keyed vote is counted in the subagent's session while Alice's cancel or steering
    message is recorded, and his process dies before its own commit in the parent: Alice's call,
    looking again once committed, keeps the key on an `input.repeated` by Bob, as the subagent's
    session recorded his vote, and the session's trace says so. It named no one: the
    application answered again."""
    async with (
        so.Runtime(agents([], Counted("Done.")), store=store_url) as rt,
        so.Runtime(agents([], Counted("Done.")), store=store_url) as other,
    ):
        first = await rt.generate("support", prompt="refund 1042", auth=ALICE)
        sid = first.session_id
        owner = _cancel_batch if end == "cancel" else _messages
        read = _mirror_keys.mirrored_keys
        voted: list[so.GenerateResult] = []

        async def killed(*args: Any) -> None:
            return None  # Bob's process died before its commit in the parent

        async def bob_between(*args: Any) -> dict[str, list[list[Any]]]:
            out = await read(*args)
            if not voted:
                with monkeypatch.context() as m:
                    m.setattr(_mirrors, "keep_vote_key", killed)
                    voted.append(
                        await other.send(sid, "approve", principal=BOB, idempotency_key=KEY)
                    )
            return out

        monkeypatch.setattr(owner, "mirrored_keys", bob_between)
        if end == "cancel":
            await rt.cancel(sid, principal=ALICE)
        else:
            await rt.send(sid, "never mind", principal=ALICE)
        monkeypatch.undo()
        assert [r.status for r in voted] == ["waiting"]
        state = await rt.state(sid)
        (repeated,) = [
            e
            async for e in rt.events(sid, follow=False)
            if e.type == "input.repeated" and e.data.get("idem")  # not Bob's hold (`held_idem`)
        ]
        assert repeated.data["by"] == BOB.model_dump()
        line = "".join(text for text, _ in summary(repeated, state.requests))
        assert line.endswith("answered again by bob (nothing changed)")
