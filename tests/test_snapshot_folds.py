"""Snapshots record the version of the fold that made them (`FOLD_VERSION`): a session loads from
one of this signoff's fold only, and folds its events otherwise, and `verify_audit` compares
only those. Without it, a change to how an event folds left every older snapshot trusted by the
runtime though the fold now says otherwise, and named by verification as tampering: a failed
turn cancelled after folds with `retryable` False now, where the fold before kept the failure's
True. Run on both stores."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
import signoff._recording as recording
from signoff._events import EventType
from signoff._state import FOLD_VERSION, of_this_fold
from signoff.stores._codec import pack_bytes
from signoff.testing import ExecutionLog, reply, scripted_agent

from ._audit import ALICE, alter
from ._delegation import refund_desk
from ._procs import query
from .test_audit_verify_snapshots import _long_session, ops, ran
from .test_journal_snapshots import put_snapshot, stored_snapshot
from .test_quorum import BOB, CAROL, asked, deploy_agent, vote
from .test_session_limits import _pasted
from .test_snapshot_fields import write_snapshot


def _event(seq: int, type: EventType, **data: Any) -> so.Event:
    turn = None if type == "session.created" else "trn_1"
    return so.Event(session_id="ses_1", seq=seq, type=type, at=float(seq), turn_id=turn, data=data)


def test_a_failed_turn_cancelled_after_folds_as_not_retryable() -> None:
    """The fold said `retryable` True of a turn that failed retryably and was then cancelled,
    though no retry resumes a cancelled turn (its result and the HTTP view said false only
    from 3e2c8d58 on, at view level); its snapshot records the fold that made it."""
    state = so.SessionState(id="ses_1")
    state.apply(_event(1, "session.created", agent="a"))
    state.apply(_event(2, "turn.started", message="go"))
    error = {"code": "model_error", "message": "model unavailable"}
    state.apply(_event(3, "turn.failed", error=error, retryable=True))
    assert state.turn is not None and state.turn.retryable
    state.apply(_event(4, "turn.cancelled", reason=None, by=None))
    assert (state.turn.status, state.turn.retryable, state.turn.error) == (
        "cancelled",
        False,
        error,
    )
    snapshot = state.to_snapshot()
    assert snapshot["fold"] == FOLD_VERSION >= 2 and snapshot["turn"]["retryable"] is False
    assert of_this_fold(snapshot)
    assert not of_this_fold({k: v for k, v in snapshot.items() if k != "fold"})  # fold 1
    assert not of_this_fold({**snapshot, "fold": FOLD_VERSION + 1})  # a newer signoff's
    assert of_this_fold("damaged")  # read as it is, and refused (not passed over)


def _failing(conversation: list[Any]) -> so.ModelResponse:
    last = conversation[-1]
    if isinstance(last, so.UserMessage) and last.text == "fail":
        raise ConnectionError("model unavailable")
    return reply("ok")


def _agent() -> so.Agent:
    return scripted_agent("bot", [_failing], repeat_last=True)


def _set_snapshot(url: str, session_id: str, seq: int, snapshot: dict[str, Any]) -> None:
    """Write `snapshot` over the session's stored one, taken after event `seq`."""
    alter(
        url,
        "UPDATE {t}snapshots SET seq={p}, data={p} "
        "WHERE sk=(SELECT sk FROM {t}sessions WHERE id={p})",
        seq,
        pack_bytes(snapshot),
        session_id,
    )


async def test_a_snapshot_of_the_fold_before_is_folded_again_and_not_named(
    store_url: str,
) -> None:
    """A session whose snapshot, taken after its failed turn was cancelled, was written by the
    fold before (no `fold`, `retryable` True) loads from its events: its turn reads
    `retryable` False, and verification, which does not compare such a snapshot, names
    nothing. The same snapshot recording this fold is named by the field that differs."""
    agent = _agent()
    async with so.Runtime([agent], store=store_url) as rt:
        sid = (await rt.generate("bot", prompt="hi", auth=ALICE)).session_id
        while (await rt.state(sid)).seq < 70:  # long enough for a snapshot
            await rt.generate(session_id=sid, prompt="hi", auth=ALICE)
        failed = await rt.generate(session_id=sid, prompt="fail", auth=ALICE)
        assert (failed.status, failed.retryable) == ("failed", True)
        assert (await rt.cancel(sid, "never mind")).status == "cancelled"
        events = [e async for e in rt.events(sid, follow=False)]
    head = events[-1].seq
    assert stored_snapshot(store_url, sid)[0] < head  # no snapshot since the failure
    now = so.SessionState(id=sid)
    for e in events:
        now.apply(e)
    assert now.turn is not None and (now.turn.status, now.turn.retryable) == ("cancelled", False)
    before = {k: v for k, v in now.to_snapshot().items() if k != "fold"}
    before["turn"] = {**before["turn"], "retryable": True}  # what the fold before said
    _set_snapshot(store_url, sid, head, before)
    async with so.Runtime([agent], store=store_url) as rt:
        state = await rt.state(sid)
        assert state.turn is not None and state.seq == head
        assert (state.turn.status, state.turn.retryable) == ("cancelled", False)
        assert state.approved_tools == now.approved_tools and state.usage == now.usage
        assert await rt.verify_audit() == []
        again = await rt.generate(session_id=sid, prompt="hi", auth=ALICE)
        assert again.status == "completed"
        assert await rt.verify_audit() == []
    edited = {**before, "fold": FOLD_VERSION}
    _set_snapshot(store_url, sid, head, edited)
    async with so.Runtime([agent], store=store_url) as rt:
        [problem] = await rt.verify_audit()
        assert problem.stream == sid and problem.reason == (
            f"the snapshot at event {head} differs from the event log: turn.retryable"
        )


async def test_a_snapshot_of_another_fold_is_not_loaded_from(store_url: str) -> None:
    """A snapshot of an older fold (none recorded) or a newer one granting a `once()` tool no
    one approved is not loaded from: the session folds its events, so the tool asks for its
    approval, and verification leaves the snapshot out, as the runtime does. Recording this
    fold, the same snapshot lets the tool run unasked (`test_audit_verify_snapshots`)."""
    sid, seq, _ = await _long_session(store_url)
    _, snapshot = stored_snapshot(store_url, sid)
    assert snapshot["fold"] == FOLD_VERSION and snapshot["approved_tools"] == ["refund"]
    granted = {**snapshot, "approved_tools": ["refund", "wipe"]}
    older = {k: v for k, v in granted.items() if k != "fold"}
    for other in (older, {**granted, "fold": FOLD_VERSION + 1}):
        put_snapshot(store_url, sid, other)
        ran.clear()
        async with so.Runtime([ops()], store=store_url) as rt:
            assert "wipe" not in (await rt.state(sid)).approved_tools
            r = await rt.generate(session_id=sid, prompt="wipe it", auth=ALICE)
            assert (r.status, ran) == ("waiting", [])
            assert r.pending[0].action is not None and r.pending[0].action.tool_name == "wipe"
            assert (await rt.cancel(sid, "not now")).status == "cancelled"
            assert await rt.verify_audit() == []
        at, now = stored_snapshot(store_url, sid)
        # the first commit wrote one of this fold in its stead: the grant is not carried on
        assert at > seq and now["fold"] == FOLD_VERSION and now["approved_tools"] == ["refund"]


async def test_the_events_under_a_snapshot_of_another_fold_are_read_a_page_at_a_time(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events a snapshot of another fold stood for are read a page at a time and folded,
    then those after it: the state the whole log folds to. One of them deleted by hand (a gap)
    is the session's damage named, not a state folded past it, and nothing is recorded."""
    monkeypatch.setattr(recording, "_TURN_PAGE", 8)
    sid, seq, _ = await _long_session(store_url, prompt="hello")
    _, snapshot = stored_snapshot(store_url, sid)
    put_snapshot(store_url, sid, {k: v for k, v in snapshot.items() if k != "fold"})
    async with so.Runtime([ops()], store=store_url) as rt:
        events = [e async for e in rt.events(sid, follow=False)]
        state = await rt.state(sid)
    whole = so.SessionState(id=sid)
    for e in events:
        whole.apply(e)
    assert state.seq == whole.seq > seq + 1
    assert state.to_snapshot(journals=True) == whole.to_snapshot(journals=True)
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    alter(store_url, "DELETE FROM {t}events WHERE sk={p} AND seq={p}", sk, seq - 20)
    async with so.Runtime([ops()], store=store_url) as rt:
        gap = f"damaged: event seq {seq - 19} does not follow {seq - 21}"
        with pytest.raises(so.StoreError, match=gap):
            await rt.generate(session_id=sid, prompt="hi", auth=ALICE)
        assert await rt.store.head(sid) == whole.seq


async def test_the_events_under_a_snapshot_of_another_fold_must_fold_up_to_it(
    store_url: str,
) -> None:
    """A snapshot of another fold is not compared with the fold, but the runtime folds the
    events it was taken after instead: one of them deleted by hand (no audited one) leaves the
    session unloadable, and verification names the snapshot, as it did before folds were
    recorded, rather than return `[]`; so it does one past the end of the log."""
    sid, seq, last = await _long_session(store_url, prompt="hello")
    other, at, _ = await _long_session(store_url, prompt="hello again")
    assert last is None  # nothing audited: only the snapshot can tell
    older = {}
    for session_id in (sid, other):
        _, snapshot = stored_snapshot(store_url, session_id)
        older[session_id] = {k: v for k, v in snapshot.items() if k != "fold"}
        put_snapshot(store_url, session_id, older[session_id])
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    alter(store_url, "DELETE FROM {t}events WHERE sk={p} AND seq={p}", sk, seq - 20)
    gap = f"session {sid} is damaged: event seq {seq - 19} does not follow {seq - 21}"
    reason = f"the snapshot at event {seq} cannot be checked: its events do not fold: {gap}"
    async with so.Runtime([ops()], store=store_url) as rt:
        head = (await rt.state(other)).seq
        _set_snapshot(store_url, other, head + 5, {**older[other], "seq": head + 5})
        past = f"the snapshot at event {head + 5} is past the end of the event log, at event {head}"
        found = {(p.id, p.stream, p.n, p.reason) for p in await rt.verify_audit()}
        assert found == {(0, sid, 0, reason), (0, other, 0, past)}
        assert [p.reason for p in await rt.verify_audit(sid)] == [reason]
        with pytest.raises(so.StoreError, match=gap):
            await rt.state(sid)


@pytest.mark.parametrize("answer", [False, True], ids=["message", "answer"])
async def test_the_first_commit_past_a_snapshot_of_another_fold_writes_one_of_this_fold(
    store_url: str, monkeypatch: pytest.MonkeyPatch, answer: bool
) -> None:
    """A session loaded past a snapshot of another fold was folded from its first event on
    every load until a commit crossed the next 64 events (an idle or waiting one, for ever):
    its next commit, a message's or an answer's, writes a snapshot of this fold, the later ones
    only as often as before, and the session then loads from it."""
    sid, _, _ = await _long_session(store_url, prompt="hello")
    if answer:
        async with so.Runtime([ops()], store=store_url) as rt:
            parked = await rt.generate(session_id=sid, prompt="wipe it", auth=ALICE)
            assert parked.status == "waiting"
    _, snapshot = stored_snapshot(store_url, sid)
    put_snapshot(store_url, sid, {k: v for k, v in snapshot.items() if k != "fold"})
    commits: list[tuple[int, dict[str, Any] | None]] = []
    async with so.Runtime([ops()], store=store_url) as rt:
        state = await rt.state(sid)
        original = rt.store.commit

        async def seen(commit: Any) -> None:
            await original(commit)
            commits.append((commit.events[-1].seq, commit.snapshot))

        monkeypatch.setattr(rt.store, "commit", seen)
        if answer:
            [request] = state.pending_requests()
            approve = so.InputResponse(request_id=request.id, option_id="approve")
            r = await rt.respond(sid, [approve], principal=ALICE)
        else:
            r = await rt.generate(session_id=sid, prompt="hi", auth=ALICE)
        assert r.status == "completed" and len(commits) > 1
        (first, written), *later = commits
        assert written is not None and written["fold"] == FOLD_VERSION
        assert written["seq"] == first and "stale_snapshot" not in written
        assert [s for _, s in later if s is not None] == []  # none due 64 events on
        assert stored_snapshot(store_url, sid) == (first, written)
        assert await rt.verify_audit(sid) == []  # compared, as this fold's

    async def not_again(*_: Any) -> Any:
        raise AssertionError("folded from the first event again")

    monkeypatch.setattr(recording, "_folded_before", not_again)
    async with so.Runtime([ops()], store=store_url) as rt:
        assert (await rt.state(sid)).seq == commits[-1][0]


async def test_the_mark_of_a_stale_snapshot_is_the_loaded_states_alone(store_url: str) -> None:
    """The state loaded past a snapshot of another fold is marked for its next commit to write
    one (`stale_snapshot`); no snapshot records the mark, and no copy holds it: the one a caller
    is given (`rt.state`), nor the one a commit's snapshot is made of (`shadow`)."""
    sid, _, _ = await _long_session(store_url, prompt="hello")
    _, snapshot = stored_snapshot(store_url, sid)
    put_snapshot(store_url, sid, {k: v for k, v in snapshot.items() if k != "fold"})
    async with so.Runtime([ops()], store=store_url) as rt:
        assert not (await rt.state(sid)).stale_snapshot
        loaded = await recording.load_state(rt.store, sid)
    assert loaded.stale_snapshot and not loaded.copy().stale_snapshot
    assert not loaded.detached().stale_snapshot
    assert "stale_snapshot" not in loaded.to_snapshot(journals=True)
    assert not so.SessionState.from_snapshot(loaded.to_snapshot()).stale_snapshot
    spent = {"usage": {"input_tokens": 1, "output_tokens": 1}}  # no status it changes
    event = so.Event(session_id=sid, seq=loaded.seq + 1, type="model.spent", at=1.0, data=spent)
    assert recording.shadow(loaded.copy(), [event], loaded.seq) is None  # none due
    after = recording.shadow(loaded, [event], loaded.seq)
    assert after is not None and not after.stale_snapshot
    written = recording.snapshot_after(loaded, [event], loaded.seq, after)
    assert written is not None and written["fold"] == FOLD_VERSION
    assert written["seq"] == event.seq and "stale_snapshot" not in written
    put_snapshot(store_url, sid, snapshot)
    async with so.Runtime([ops()], store=store_url) as rt:
        assert not (await recording.load_state(rt.store, sid)).stale_snapshot


async def test_the_events_under_a_snapshot_of_another_fold_are_read_no_further(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Folding the events a snapshot of another fold stood for, the last page is asked for only
    up to the snapshot's event, not a whole page past it that is then left unread."""
    monkeypatch.setattr(recording, "_TURN_PAGE", 8)
    sid, seq, _ = await _long_session(store_url, prompt="hello")
    _, snapshot = stored_snapshot(store_url, sid)
    put_snapshot(store_url, sid, {k: v for k, v in snapshot.items() if k != "fold"})
    async with so.Runtime([ops()], store=store_url) as rt:
        asked: list[tuple[int, int | None, int]] = []
        original = rt.store.read_events

        async def counted(session_id: str, **kw: Any) -> list[so.Event]:
            got = await original(session_id, **kw)
            asked.append((kw["after"], kw.get("limit"), len(got)))
            return got

        monkeypatch.setattr(rt.store, "read_events", counted)
        state = await recording.load_state(rt.store, sid)
    assert state.seq > seq
    pages = [(after, limit) for after, limit, _ in asked if after < seq]
    assert pages == [(after, min(8, seq - after)) for after in range(0, seq, 8)]


async def test_a_settled_quorums_snapshot_of_fold_13_is_folded_again_with_every_vote(
    store_url: str,
) -> None:
    """Fold 13 left a quorum's approval settled with the votes `approval.candidate` counted,
    Bob's alone ("1 of 2"), though Carol's settled it (as its row and resolution say): a session
    whose snapshot is of that fold loads from its events, with both votes, and verification
    names nothing; the same snapshot recording this fold is what loads, and is named."""
    log = ExecutionLog()
    agents = [deploy_agent(log, so.always(approvers=2, exclude_requester=True))]
    async with so.Runtime(agents, store=store_url) as rt:
        sid, req, _ = await asked(rt)
        await rt.respond(sid, vote(req.id), principal=BOB)
        await rt.respond(sid, vote(req.id), principal=CAROL)
        events = await rt.store.read_events(sid)
    folded = so.SessionState(id=sid)
    for event in events:
        folded.apply(event)
    snapshot = folded.to_snapshot()
    (entry,) = snapshot["requests"]
    assert entry["request"]["approved_by"] == ["bob", "carol"] and FOLD_VERSION >= 14
    shown = {**entry, "request": {**entry["request"], "approved_by": ["bob"]}}
    older = {**snapshot, "fold": 13, "requests": [shown]}
    write_snapshot(store_url, sid, older)
    async with so.Runtime(agents, store=store_url) as rt:
        state = await rt.state(sid)
        assert (state.seq, state.requests[req.id].request.progress) == (folded.seq, "2 of 2")
        assert state.requests[req.id].request.approved_by == ["bob", "carol"]
        assert await rt.verify_audit() == []
    write_snapshot(store_url, sid, {**older, "fold": FOLD_VERSION})
    async with so.Runtime(agents, store=store_url) as rt:
        assert (await rt.state(sid)).requests[req.id].request.approved_by == ["bob"]
        [problem] = await rt.verify_audit()
        assert (problem.stream, problem.reason) == (
            sid,
            f"the snapshot at event {folded.seq} differs from the event log: requests",
        )


async def test_a_denied_mirrors_snapshot_of_fold_14_is_folded_again_with_its_votes(
    store_url: str,
) -> None:
    """Fold 14 left a mirror closed unapproved with its own copy's `[]`, though its close now
    records the votes its subagent's request counted, Bob's (as its row holds them): a session
    whose snapshot is of that fold loads from its events, with Bob's vote; the same snapshot
    recording this fold is what loads."""
    ran: list[str] = []
    desk = refund_desk(so.always(approvers=2, exclude_requester=True), ran)
    async with so.Runtime(desk, store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        await rt.respond(r.session_id, vote(mirror.id), principal=BOB)
        await rt.respond(r.session_id, vote(mirror.id, "cancel"), principal=CAROL)
        events = await rt.store.read_events(r.session_id)
    folded = so.SessionState(id=r.session_id)
    for event in events:
        folded.apply(event)
    snapshot = folded.to_snapshot()
    entries = {e["request"]["id"]: e for e in snapshot["requests"]}
    entry = entries[mirror.id]
    assert entry["request"]["approved_by"] == ["bob"] and FOLD_VERSION >= 15
    shown = {**entry, "request": {**entry["request"], "approved_by": []}}
    requests = [shown if rid == mirror.id else e for rid, e in entries.items()]
    older = {**snapshot, "fold": 14, "requests": requests}
    write_snapshot(store_url, r.session_id, older)
    async with so.Runtime(desk, store=store_url) as rt:
        state = await rt.state(r.session_id)
        assert state.seq == folded.seq and state.requests[mirror.id].request.progress == "1 of 2"
        assert await rt.verify_audit() == []
    write_snapshot(store_url, r.session_id, {**older, "fold": FOLD_VERSION})
    async with so.Runtime(desk, store=store_url) as rt:  # this fold's: loaded as it is
        assert (await rt.state(r.session_id)).requests[mirror.id].request.approved_by == []
    assert ran == []


async def test_a_continues_snapshot_of_fold_16_is_folded_again_with_its_raise(
    store_url: str,
) -> None:
    """Fold 16 raised the budgets by one size a `continue`, though its request now records what
    it raises them to (`raise_to`, 11000 tokens here): a session whose snapshot is of that fold
    loads from its events, with the budget raised so; the same snapshot recording this fold is
    what loads."""
    async with so.Runtime([_pasted(5000, 5100)], store=store_url) as rt:
        r = await rt.generate("a", prompt="a long pasted document ...", auth=ALICE)
        [asked] = r.pending
        answer = so.InputResponse(request_id=asked.id, option_id="continue")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        events = await rt.store.read_events(r.session_id)
    folded = so.SessionState(id=r.session_id)
    for event in events:
        folded.apply(event)
    snapshot = folded.to_snapshot()
    [entry] = snapshot["requests"]
    raised = {"max_tokens": 11000}
    assert (snapshot["limit_grants"], snapshot["raised"], FOLD_VERSION) == (0, raised, 17)
    assert entry["raise_to"] == raised
    plain = {k: v for k, v in entry.items() if k != "raise_to"}
    older = {k: v for k, v in snapshot.items() if k != "raised"}
    older = {**older, "fold": 16, "limit_grants": 1, "requests": [plain]}
    write_snapshot(store_url, r.session_id, older)
    async with so.Runtime([_pasted(5000, 5100)], store=store_url) as rt:
        state = await rt.state(r.session_id)
        assert (state.seq, state.limit_grants, state.raised) == (folded.seq, 0, raised)
        assert state.requests[asked.id].raise_to == raised
        assert await rt.verify_audit() == []
    write_snapshot(store_url, r.session_id, {**older, "fold": FOLD_VERSION})
    async with so.Runtime([_pasted(5000, 5100)], store=store_url) as rt:  # this fold's: as is
        state = await rt.state(r.session_id)
        assert (state.limit_grants, state.raised, state.requests[asked.id].raise_to) == (
            1,
            {},
            None,
        )
