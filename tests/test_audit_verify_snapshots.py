"""Verifying snapshots against the event log: a session loads from its snapshot plus the events
after it, so a snapshot edited by hand (a `once()` tool granted that no one approved) changed
what the runtime does while every chain checked out. Verification folds the session's events
up to the snapshot and names a snapshot that differs, or that cannot be read or checked.
"""

from typing import Any

import pytest

import signoff as so
from signoff.stores._audit import AUDITED_STORED
from signoff.testing import call, call_tools, reply, scripted_agent

from ._audit import ALICE, alter
from ._procs import query
from .test_journal_snapshots import parked, put_snapshot, stored_snapshot

ran: list[str] = []


@so.tool(approval=so.once())
async def wipe(disk: str) -> str:
    """Wipe a disk."""
    ran.append(disk)
    return "wiped"


@so.tool(approval=so.always())
async def refund(order_id: str) -> str:
    """Refund an order."""
    return "refunded"


def _step(conversation: list[Any]) -> so.ModelResponse:
    last = conversation[-1]
    if isinstance(last, so.UserMessage) and "wipe" in last.text:
        return call_tools(call("wipe", disk="prod"))
    if isinstance(last, so.UserMessage) and "refund" in last.text:
        return call_tools(call("refund", order_id="1"))
    return reply("ok")


def ops() -> so.Agent:
    return scripted_agent("ops", [_step], tools=[wipe, refund], repeat_last=True)


async def _long_session(url: str, prompt: str = "refund order 1") -> tuple[str, int, Any]:
    """A session whose refund was approved (or that only chatted), begun under an idempotency
    key, then long enough for a snapshot: its id, the snapshot's event and the last entry of
    its trail, before the snapshot (None if none)."""
    async with so.Runtime([ops()], store=url) as rt:
        r = await rt.generate("ops", prompt=prompt, auth=ALICE, idempotency_key=prompt)
        if r.pending:
            approve = so.InputResponse(request_id=r.pending[0].id, option_id="approve")
            done = await rt.respond(r.session_id, [approve], principal=ALICE)
            assert done.status == "completed"
        while (await rt.state(r.session_id)).seq < 70:
            await rt.generate(session_id=r.session_id, prompt="hi", auth=ALICE)
        trail = await rt.audit(r.session_id)
        assert await rt.verify_audit() == []
    seq, _ = stored_snapshot(url, r.session_id)
    assert all(e.seq is not None and e.seq < seq for e in trail)
    return r.session_id, seq, trail[-1] if trail else None


async def test_a_snapshot_edited_by_hand_is_named(store_url: str) -> None:
    """A snapshot granting a `once()` tool no one approved lets the tool run unasked (a state
    the log never reached): verification names it, by the session's last entry before it,
    naming the field that differs, and goes on naming it after the run."""
    sid, seq, last = await _long_session(store_url)
    _, snapshot = stored_snapshot(store_url, sid)
    assert snapshot["approved_tools"] == ["refund"]
    snapshot["approved_tools"] = ["refund", "wipe"]
    put_snapshot(store_url, sid, snapshot)
    reason = f"the snapshot at event {seq} differs from the event log: approved_tools"
    async with so.Runtime([ops()], store=store_url) as rt:
        for problems in (await rt.verify_audit(), await rt.verify_audit(sid)):
            assert [(p.id, p.stream, p.n, p.reason) for p in problems] == [
                (last.id, sid, last.n, reason)
            ]
        # what it made possible: the gated tool runs with no approval in the trail
        ran.clear()
        r = await rt.generate(session_id=sid, prompt="wipe it", auth=ALICE)
        assert (r.status, ran) == ("completed", ["prod"])
        assert [p.reason for p in await rt.verify_audit()] == [reason]


async def test_a_snapshot_as_an_earlier_signoff_wrote_it_is_not_named(store_url: str) -> None:
    """An earlier signoff's snapshot holds only the fields it knew of and its idempotency keys
    without the seq of their turn's first event, and the snapshots after one carry on
    `earlier_requests` as it was read (True): none of that is tampering. It records no `fold`
    (fold 1), so no session loads from it and it is not checked; the same fields in a snapshot
    of this fold, which nothing wrote so, are named. Its keys emptied are named, as is
    `earlier_requests` made False where the log says True."""
    sid, seq, _ = await _long_session(store_url, prompt="hello")
    _, snapshot = stored_snapshot(store_url, sid)
    assert snapshot["earlier_requests"] is False
    assert snapshot["keys"] and all(len(v) == 3 for v in snapshot["keys"].values())
    older = {k: v for k, v in snapshot.items() if k not in ("limit_grants", "candidates", "fold")}
    older["keys"] = {k: v[:2] for k, v in snapshot["keys"].items()}
    older["earlier_requests"] = True
    put_snapshot(store_url, sid, older)
    async with so.Runtime([ops()], store=store_url) as rt:
        assert await rt.verify_audit() == []
        put_snapshot(store_url, sid, {**older, "fold": snapshot["fold"]})
        [problem] = await rt.verify_audit()
        assert problem.reason == (
            f"the snapshot at event {seq} differs from the event log: earlier_requests, keys"
        )
        put_snapshot(store_url, sid, {**snapshot, "keys": {}})
        [problem] = await rt.verify_audit()
        assert problem.reason == f"the snapshot at event {seq} differs from the event log: keys"
    put_snapshot(store_url, sid, snapshot)
    other, seq, last = await _long_session(store_url)
    _, snapshot = stored_snapshot(store_url, other)
    assert snapshot["earlier_requests"] is True
    put_snapshot(store_url, other, {**snapshot, "earlier_requests": False})
    async with so.Runtime([ops()], store=store_url) as rt:
        reason = f"the snapshot at event {seq} differs from the event log: earlier_requests"
        assert [(p.id, p.stream, p.n, p.reason) for p in await rt.verify_audit()] == [
            (last.id, other, last.n, reason)
        ]


async def test_a_snapshot_or_log_a_hand_edit_left_unreadable_is_named(store_url: str) -> None:
    """A snapshot that does not unpack, one that is no state, one whose `seq` is no number
    (SQLite keeps text there), and a log that no longer folds up to the snapshot (an event
    before it deleted, of a type the trail does not audit) are each named as such, not
    raised."""
    sid, seq, last = await _long_session(store_url)
    _, snapshot = stored_snapshot(store_url, sid)
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    named = (last.id, sid, last.n)
    async with so.Runtime([ops()], store=store_url) as rt:
        alter(store_url, "UPDATE {t}snapshots SET data={p} WHERE sk={p}", b"\x01garbage", sk)
        [problem] = await rt.verify_audit()
        assert (problem.id, problem.stream, problem.n) == named
        assert problem.reason.startswith(f"the snapshot at event {seq} cannot be read: ")
        put_snapshot(store_url, sid, {**snapshot, "turn": "nothing"})
        [problem] = await rt.verify_audit(sid)
        assert problem.reason.startswith(f"the snapshot at event {seq} cannot be read: ")
        put_snapshot(store_url, sid, snapshot)
        assert await rt.verify_audit() == []
        if store_url.startswith("sqlite"):
            alter(store_url, "UPDATE snapshots SET seq='x' WHERE sk=?", sk)
            [problem] = await rt.verify_audit()
            assert (problem.id, problem.stream, problem.n) == (0, sid, 0)
            assert problem.reason == "the snapshot cannot be read: its seq is 'x'"
            alter(store_url, "UPDATE snapshots SET seq=? WHERE sk=?", seq, sk)
        assert last.seq is not None
        alter(store_url, "DELETE FROM {t}events WHERE sk={p} AND seq={p}", sk, last.seq + 3)
        [problem] = await rt.verify_audit()
        assert (problem.id, problem.stream, problem.n) == named
        assert problem.reason.startswith(
            f"the snapshot at event {seq} cannot be checked: its events do not fold: "
        )


async def test_healthy_snapshots_verify_clean(store_url: str) -> None:
    """No false alarm on the snapshots signoff writes: those taken while a workflow steps
    (its journal left out), the one that parks its turn (the journal whole), one whose journal
    was left out, and an older signoff's (version 1: the journal whole, nothing beside it)."""
    ran_steps: list[int] = []
    sid, _ = await parked(store_url, ran_steps)
    async with so.Runtime([ops()], store=store_url) as rt:
        assert await rt.verify_audit() == []
        seq, snapshot = stored_snapshot(store_url, sid)
        assert any("journal" in c for c in snapshot["turn"]["calls"])
        without = {**snapshot, "turn": {**snapshot["turn"]}}
        without["turn"]["calls"] = [
            {k: v for k, v in c.items() if k != "journal"} for c in snapshot["turn"]["calls"]
        ]
        put_snapshot(store_url, sid, without)
        assert await rt.verify_audit(sid) == []
        older = {**snapshot, "v": 1, "turn": {**snapshot["turn"]}}
        older["turn"]["calls"] = [
            {k: v for k, v in c.items() if k not in ("since", "journaled", "kids")}
            for c in snapshot["turn"]["calls"]
        ]
        put_snapshot(store_url, sid, older)
        assert await rt.verify_audit(sid) == []
        # a step's result changed in the snapshot's journal is named (it would be replayed)
        assert snapshot["turn"]["calls"][0]["journal"][0]["result"] == 0
        changed = {**snapshot, "turn": {**snapshot["turn"]}}
        changed["turn"]["calls"] = [
            {**c, "journal": [{**c["journal"][0], "result": 1000}, *c["journal"][1:]]}
            for c in snapshot["turn"]["calls"]
        ]
        put_snapshot(store_url, sid, changed)
        [problem] = await rt.verify_audit(sid)
        assert problem.reason == (
            f"the snapshot at event {seq} differs from the event log: turn.calls.journal"
        )


async def test_a_field_left_out_at_its_default_and_deleted_by_hand_is_named(
    store_url: str,
) -> None:
    """A field a snapshot leaves out at its default (the last reply's input tokens, a
    subagent's spend) deleted by hand was taken for one an earlier signoff never wrote, and
    passed: deleting `delegated` so would undercount a budget. Only `last`, which earlier
    snapshots lack, passes so, in a snapshot of an earlier signoff (no `fold`: not checked,
    nor loaded from); in one of this fold, which always holds it, it is named."""
    counted = so.Usage(input_tokens=7, output_tokens=1)
    agent = scripted_agent("ops", [reply("ok", usage=counted)], repeat_last=True)
    async with so.Runtime([agent], store=store_url) as rt:
        sid = (await rt.generate("ops", prompt="hi", auth=ALICE)).session_id
        while (await rt.state(sid)).seq < 70:
            await rt.generate(session_id=sid, prompt="hi", auth=ALICE)
    seq, snapshot = stored_snapshot(store_url, sid)
    assert snapshot["last_input_tokens"] == 7 and "last" in snapshot
    put_snapshot(store_url, sid, {k: v for k, v in snapshot.items() if k not in ("last", "fold")})
    async with so.Runtime([agent], store=store_url) as rt:
        assert await rt.verify_audit() == []
    put_snapshot(store_url, sid, {k: v for k, v in snapshot.items() if k != "last"})
    async with so.Runtime([agent], store=store_url) as rt:
        [problem] = await rt.verify_audit()
    assert problem.reason == f"the snapshot at event {seq} differs from the event log: last"
    put_snapshot(store_url, sid, {k: v for k, v in snapshot.items() if k != "last_input_tokens"})
    async with so.Runtime([agent], store=store_url) as rt:
        [problem] = await rt.verify_audit()
    assert problem.reason == (
        f"the snapshot at event {seq} differs from the event log: last_input_tokens"
    )


async def test_an_event_deleted_after_the_snapshot_is_named_as_a_gap(store_url: str) -> None:
    """The events after the snapshot are not folded for it: one deleted there (not the last) is
    a gap in the log, named by the last entry before it. One deleted before the snapshot as
    well is named once, as the snapshot's events not folding."""
    sid, seq, last = await _long_session(store_url)
    async with so.Runtime([ops()], store=store_url) as rt:
        head = (await rt.state(sid)).seq
    assert seq + 1 < head
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    alter(store_url, "DELETE FROM {t}events WHERE sk={p} AND seq={p}", sk, seq + 1)
    async with so.Runtime([ops()], store=store_url) as rt:
        for problems in (await rt.verify_audit(), await rt.verify_audit(sid)):
            assert [(p.id, p.stream, p.n, p.reason) for p in problems] == [
                (last.id, sid, last.n, f"event {seq + 1} is missing from the event log")
            ]
        alter(store_url, "DELETE FROM {t}events WHERE sk={p} AND seq={p}", sk, seq - 20)
        for problems in (await rt.verify_audit(), await rt.verify_audit(sid)):
            [problem] = problems
            assert (problem.id, problem.stream, problem.n) == (last.id, sid, last.n)
            assert problem.reason.startswith(
                f"the snapshot at event {seq} cannot be checked: its events do not fold: "
            )


@pytest.mark.timeout(60)
async def test_the_event_a_snapshot_was_taken_after_deleted_is_named_not_folded_for_ever(
    store_url: str,
) -> None:
    """The event at the snapshot's seq deleted (one the trail does not audit): the fold of the
    log up to it read the event after it, past the snapshot, applied nothing and read the same
    page again for ever (verify_audit hung, on SQLite never yielding). It is named now."""
    sid, seq, last = await _long_session(store_url)
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    ((kind,),) = query(store_url, "SELECT type FROM {t}events WHERE sk={p} AND seq={p}", sk, seq)
    assert kind not in AUDITED_STORED, kind  # else its chain names it first
    alter(store_url, "DELETE FROM {t}events WHERE sk={p} AND seq={p}", sk, seq)
    async with so.Runtime([ops()], store=store_url) as rt:
        for problems in (await rt.verify_audit(), await rt.verify_audit(sid)):
            [problem] = problems
            assert (problem.id, problem.stream, problem.n) == (last.id, sid, last.n)
            assert problem.reason.startswith(f"the snapshot at event {seq} "), problem.reason
