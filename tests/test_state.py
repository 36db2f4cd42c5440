"""`SessionState`: a pure fold of the events, and its snapshot form."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._conversation import MESSAGE_EVENT_TYPES, conversation
from signoff._state import CallState, RequestState, TurnState
from signoff.stores._codec import pack_bytes
from signoff.testing import (
    Capture,
    ExecutionLog,
    Flaky,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
)

from ._audit import alter
from ._procs import query
from ._ttl import ttl_agent

ALICE = so.Principal(authenticator="test", principal_id="alice")


def fold(events: list[so.Event]) -> so.SessionState:
    state = so.SessionState(id=events[0].session_id)
    for e in events:
        state.apply(e)
    return state


async def events_of(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]


async def rich_session(tmp_path: Path, log: ExecutionLog) -> tuple[so.Runtime, str]:
    """A session with approvals, a denial, a tool's own request, a failure and a cancel."""

    @log.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund."""
        return f"refunded {order_id}"

    @log.tool
    async def lookup(order_id: str) -> dict[str, str]:
        """Look up."""
        return {"order_id": order_id}

    @log.tool
    async def wire(ctx: so.ToolContext, amount: float) -> str:
        """Wire money."""
        ctx.request_approval({"amount": amount})

    agent = scripted_agent(
        "a",
        [
            call_tools(call("refund", order_id="1"), call("lookup", order_id="1")),
            call_tools(call("refund", order_id="2"), call("wire", amount=3)),
            Flaky(reply("first turn done")),
            call_tools(call("refund", order_id="3")),
        ],
        tools=[refund, lookup, wire],
    )
    rt = sqlite_runtime(tmp_path, agent)
    r = await rt.generate("a", prompt="start", auth=ALICE)
    sid = r.session_id
    r = await rt.generate(
        session_id=sid, approvals=[so.Decision(id=r.pending[0].id, approved=True)], auth=ALICE
    )
    by_tool = {p.tool_name: p.id for p in r.pending}
    assert set(by_tool) == {"refund", "wire"}
    r = await rt.generate(
        session_id=sid,
        approvals=[
            so.Decision(id=by_tool["refund"], approved=False, reason="no"),
            so.Decision(id=by_tool["wire"], approved=True, value={"ok": 1}),
        ],
        auth=ALICE,
    )
    assert r.status == "failed"
    r = await rt.generate(session_id=sid)
    assert r.status == "completed"
    r = await rt.generate(session_id=sid, prompt="second", auth=ALICE)
    assert r.status == "waiting"
    await rt.cancel(sid)
    return rt, sid


async def test_state_is_the_fold_of_the_events(tmp_path: Path) -> None:
    log = ExecutionLog()
    rt, sid = await rich_session(tmp_path, log)
    async with rt:
        events = await events_of(rt, sid)
        folded = fold(events)
        assert folded.to_snapshot() == (await rt.state(sid)).to_snapshot()
        assert folded.status == "cancelled"
        assert folded.agent == "a"
        assert folded.initiator == ALICE
        assert folded.seq == len(events)
        assert folded.approved_tools == {"refund", "wire"}
        assert folded.pending_requests() == []


async def test_snapshot_round_trips_at_every_point(tmp_path: Path) -> None:
    log = ExecutionLog()
    rt, sid = await rich_session(tmp_path, log)
    async with rt:
        events = await events_of(rt, sid)
    final = fold(events).to_snapshot()
    for n in range(1, len(events) + 1):
        prefix = fold(events[:n])
        snap = prefix.to_snapshot()
        restored = so.SessionState.from_snapshot(snap)
        assert restored.to_snapshot() == snap, f"after event {n} ({events[n - 1].type})"
        assert [r.id for r in restored.pending_requests()] == [
            r.id for r in prefix.pending_requests()
        ]
        assert restored.status == prefix.status
        for e in events[n:]:
            restored.apply(e)
        assert restored.to_snapshot() == final, f"resumed from event {n}"


async def test_copy_is_the_snapshot_round_trip_and_leaves_the_original_alone(
    tmp_path: Path,
) -> None:
    log = ExecutionLog()
    rt, sid = await rich_session(tmp_path, log)
    async with rt:
        events = await events_of(rt, sid)
    final = fold(events).to_snapshot()
    for n in range(1, len(events) + 1):
        prefix = fold(events[:n])
        snap = prefix.to_snapshot()
        copy = prefix.copy()
        assert copy.to_snapshot() == so.SessionState.from_snapshot(snap).to_snapshot() == snap
        assert copy.conversation is None
        assert copy.status == prefix.status
        for e in events[n:]:
            copy.apply(e)
        assert copy.to_snapshot() == final, f"resumed from event {n}"
        assert prefix.to_snapshot() == snap, f"the copy changed the original at event {n}"


async def test_a_whole_copy_keeps_the_conversation_and_leaves_the_original_alone(
    tmp_path: Path,
) -> None:
    """`detached()` (what `rt.state()` hands out) is the whole state, conversation, journals and
    last event too, and folding on, or changing, either leaves the other as it was (but for the
    journals' entries, shared)."""
    log = ExecutionLog()
    rt, sid = await rich_session(tmp_path, log)
    async with rt:
        events = await events_of(rt, sid)
    whole = fold(events)
    for n in range(1, len(events)):
        state = fold(events[:n])
        kept, said = state.to_snapshot(journals=True), list(state.messages or [])
        copy = state.detached()
        assert copy.to_snapshot(journals=True) == kept and copy.messages == said
        assert copy.shown() == state.shown()
        for e in events[n:]:
            copy.apply(e)  # the copy folds on: the original stays
        assert state.to_snapshot(journals=True) == kept and state.messages == said
        assert copy.to_snapshot() == whole.to_snapshot() and copy.messages == whole.messages
        earlier = state.detached()
        for e in events[n:]:
            state.apply(e)  # the original folds on: a copy made before stays
        assert earlier.to_snapshot(journals=True) == kept and earlier.messages == said
        after = state.to_snapshot(journals=True)
        _scribble(earlier)  # and changing a copy, however deep, leaves it
        assert state.to_snapshot(journals=True) == after


def _scribble(state: so.SessionState) -> None:
    """Change every object and array of event data `state` holds, in place."""
    for r in state.requests.values():
        if r.resolution is not None:
            r.resolution["scribbled"] = True
    for c in [] if state.turn is None else state.turn.calls.values():
        for held in (c.input, c.decision, c.held, c.filled):
            if isinstance(held, dict):
                held["scribbled"] = True
        if c.journal is not None:  # its entries are shared, the list is not
            c.journal.append(None)
    for keyed in state.keys.values():
        keyed.append("scribbled")
    for entry in state.queued:
        entry["scribbled"] = True


def test_copy_does_not_share_a_calls_journal() -> None:
    state = so.SessionState(id="ses_1")
    state.turn = TurnState(id="trn_1")
    state.turn.calls["c1"] = CallState(id="c1", tool_name="t", input={})
    copy = state.copy()
    assert copy.turn is not None
    copy.turn.calls["c1"].record(0, {"kind": "step", "name": "s", "result": 1})
    copy.turn.calls["c1"].status = "running"
    copy.turn.steps = 3
    assert state.turn.calls["c1"].journal == []
    assert state.turn.calls["c1"].status == "proposed"
    assert state.turn.steps == 0


PARKED_BY = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _waiting(seq: int, **data: Any) -> so.Event:
    data = {"on": "input", "request_ids": [], **data}
    return so.Event(
        session_id="ses_1", seq=seq, type="turn.waiting", at=1.0, turn_id="trn_1", data=data
    )


def test_the_trace_context_of_the_drive_that_parked_a_turn_is_kept_by_snapshots() -> None:
    state = so.SessionState(id="ses_1")
    state.turn = TurnState(id="trn_1")
    state.apply(_waiting(1))
    assert state.turn.traceparent is None
    assert "traceparent" not in state.to_snapshot()["turn"]  # untraced: the snapshot as before
    state.apply(_waiting(2, traceparent=PARKED_BY))
    state.apply(_waiting(3))  # a re-park by no traced drive (a rejected answer) keeps it
    assert state.turn.traceparent == PARKED_BY
    snap = state.to_snapshot()
    assert snap["turn"]["traceparent"] == PARKED_BY
    for restored in (so.SessionState.from_snapshot(snap), state.copy()):
        assert restored.turn is not None and restored.turn.traceparent == PARKED_BY
    state.apply(_waiting(4, traceparent=42))  # edited by hand: not a context, not kept
    assert state.turn.traceparent == PARKED_BY
    for value in (42, ["x"], None):
        damaged = {**snap, "turn": {**snap["turn"], "traceparent": value}}
        turn = so.SessionState.from_snapshot(damaged).turn
        assert turn is not None and turn.traceparent is None
    older = {**snap, "turn": {k: v for k, v in snap["turn"].items() if k != "traceparent"}}
    turn = so.SessionState.from_snapshot(older).turn
    assert turn is not None and turn.traceparent is None


def _resolved(seq: int, request_id: str) -> so.Event:
    data = {"request_id": request_id, "outcome": "answered", "answer": {"option_id": "x"}}
    return so.Event(
        session_id="ses_1", seq=seq, type="input.resolved", at=1.0, turn_id="trn_1", data=data
    )


def test_a_turn_keeps_the_requests_closed_since_a_drive_last_went_on() -> None:
    """Closed requests of the turn are kept (`answered`, for the next drive's trace) until a
    drive goes on with them (their call starts); a park (a quorum's vote) keeps them. A
    snapshot and a copy keep them; one of an older signoff reads none."""
    state = so.SessionState(id="ses_1")
    state.turn = TurnState(id="trn_1", status="waiting")
    call_state = CallState(id="c1", tool_name="t", input={}, status="requested")
    state.turn.calls["c1"] = call_state
    for rid, action in (("req_1", so.Action.of("c1", "t", {})), ("req_2", None)):
        request = so.InputRequest(
            id=rid,
            kind="question",
            session_id="ses_1",
            turn_id="trn_1",
            agent="a",
            action=action,
            created_at=1.0,
        )
        state.requests[rid] = RequestState(request=request)
    state.apply(_resolved(1, "req_1"))
    call_state.status = "approved"
    state.apply(_waiting(2))  # a vote on another request: the approved call is still to run
    assert state.turn.answered == ["req_1"]
    snap = state.to_snapshot()
    assert snap["turn"]["answered"] == ["req_1"]
    for restored in (so.SessionState.from_snapshot(snap), state.copy()):
        assert restored.turn is not None and restored.turn.answered == ["req_1"]
    state.apply(dataclasses.replace(_waiting(3), type="tool.started", data={"call_id": "c1"}))
    assert state.turn.answered == [] and "answered" not in state.to_snapshot()["turn"]
    state.apply(_resolved(4, "req_2"))
    assert state.turn.answered == ["req_2"]
    older = {**snap, "turn": {k: v for k, v in snap["turn"].items() if k != "answered"}}
    turn = so.SessionState.from_snapshot(older).turn
    assert turn is not None and turn.answered == []
    for value in ("req_1", [1], None):
        with pytest.raises(so.StoreError, match="answered"):
            so.SessionState.from_snapshot({**snap, "turn": {**snap["turn"], "answered": value}})


async def test_status_follows_the_turn(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund."""
        return "ok"

    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), RuntimeError("boom")],
        tools=[refund],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = await rt.create_session("a")
        assert (await rt.state(sid)).status == "idle"
        r = await rt.generate(session_id=sid, prompt="go")
        state = await rt.state(sid)
        assert state.status == "waiting"
        assert state.turn is not None and state.turn.id == r.turn_id
        (call_state,) = state.turn.calls.values()
        assert call_state.status == "requested"
        assert call_state.request_id == r.pending[0].id
        r = await rt.generate(
            session_id=sid, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        state = await rt.state(sid)
        assert state.status == "failed"
        assert state.turn is not None and state.turn.retryable
        assert state.turn.error is not None and "boom" in state.turn.error["message"]


async def test_pending_requests_keep_the_order_they_were_asked_in(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund."""
        return "ok"

    ids = [str(i) for i in range(8)]
    agent = scripted_agent(
        "a", [call_tools(*(call("refund", order_id=i) for i in ids)), reply("x")], tools=[refund]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        state = await rt.state(r.session_id)
        assert [p.input["order_id"] for p in state.pending_requests()] == ids
        assert [p.input["order_id"] for p in r.pending] == ids


def test_events_must_come_in_seq_order() -> None:
    state = so.SessionState(id="s")
    created = so.Event(
        session_id="s", seq=1, type="session.created", at=1.0, data={"agent": "a", "ttl": None}
    )
    state.apply(created)
    assert state.agent == "a"
    skipped = so.Event(session_id="s", seq=3, type="session.waiting", at=2.0)
    with pytest.raises(so.StoreError, match="seq 3"):
        state.apply(skipped)
    with pytest.raises(so.StoreError):
        state.apply(created)  # a replayed event is refused too
    assert state.seq == 1


def test_events_referring_to_no_open_turn_are_refused() -> None:
    state = so.SessionState(id="s")
    state.apply(
        so.Event(session_id="s", seq=1, type="session.created", at=1.0, data={"agent": "a"})
    )
    stray = so.Event(
        session_id="s",
        seq=2,
        type="tool.completed",
        at=2.0,
        turn_id="trn_x",
        data={"call_id": "c", "tool_name": "t", "status": "ok", "result": 1},
    )
    with pytest.raises(so.StoreError):
        state.apply(stray)


async def test_ttl_expiry_is_computed_from_the_last_event(tmp_path: Path) -> None:
    clock = ManualClock(start=1000.0)
    agent = scripted_agent("a", [reply("hi")], limits=so.Limits(ttl=30))
    async with sqlite_runtime(tmp_path, agent, clock=clock) as rt:
        sid = await rt.create_session("a")
        state = await rt.state(sid)
        assert state.ttl == 30
        assert state.expires_at == 1030.0
        assert not state.expired(1029.9)
        assert state.expired(1030.0)
        clock.advance(10)
        await rt.generate(session_id=sid, prompt="hello")
        assert (await rt.state(sid)).expires_at == 1040.0


async def test_snapshot_leaves_the_conversation_out(tmp_path: Path) -> None:
    agent = scripted_agent("a", [reply("x" * 10_000)], repeat_last=True)
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = (await rt.generate("a", prompt="one")).session_id
        small = len(repr((await rt.state(sid)).to_snapshot()))
        for i in range(5):
            await rt.generate(session_id=sid, prompt=f"turn {i}")
        snap: dict[str, Any] = (await rt.state(sid)).to_snapshot()
        # the long answers are in the events, not the snapshot (only the latest turn's text)
        assert len(repr(snap)) < small + 2_000
        restored = so.SessionState.from_snapshot(snap)
        assert dataclasses.replace(restored).seq == snap["seq"]


@pytest.mark.parametrize("max_messages", [None, 3])
async def test_calls_a_cancelled_turn_left_open_get_a_result_in_the_next_turn(
    tmp_path: Path, max_messages: int | None
) -> None:
    # A call with no result makes the OpenAI and Anthropic APIs refuse every later request.
    capture = Capture(reply("hello again"))
    agent = scripted_agent(
        "a",
        [call_tools(call("ask_question", call_id="call_q", question="Which order?")), capture],
        tools=[so.ask_question()],
        limits=so.Limits(max_messages=max_messages),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="refund my order")
        assert r.status == "waiting"
        await rt.cancel(r.session_id)
        r = await rt.generate(session_id=r.session_id, prompt="hello")
        assert r.status == "completed"
    *_, assistant, result, prompt = capture.last
    assert isinstance(assistant, so.AssistantMessage)
    assert [c.id for c in assistant.tool_calls] == ["call_q"]
    assert isinstance(result, so.ToolResultMessage) and result.is_error
    assert (result.call_id, result.tool_name) == ("call_q", "ask_question")
    assert isinstance(result.content, dict) and result.content["cancelled"] is True
    assert prompt == so.UserMessage(text="hello")


def _every_field_set() -> so.SessionState:
    """A state whose every field holds something other than its default."""
    request = so.InputRequest(
        id="req_1", kind="question", session_id="ses_1", turn_id="trn_1", agent="a", created_at=1.0
    )
    turn = TurnState(
        id="trn_1",
        status="waiting",
        principal=ALICE,
        started_at=1.0,
        steps=2,
        text="so far",
        retryable=True,
        error={"code": "x"},
        first_seq=2,
        last_message_seq=4,
        model_seq=3,
        read_seq=2,
        source="schedule",
        traceparent=PARKED_BY,
        paused=({"model": "anthropic:m", "data": {"content": []}, "usage": {}, "read_through": 3},),
        answered=["req_0"],
        share_spent="ses_3",
        # Its journal is read back from the events (`load_journal`): a snapshot leaves it out.
        calls={
            "c1": CallState(
                id="c1",
                tool_name="t",
                input={"a": 1},
                status="asking",
                journal=None,
                keyed=True,
                since=3,
                journaled=True,
                kids={"n0": "ses_2", "n1": None},
                filled={"ref": "ref-1"},
            )
        },
    )
    return so.SessionState(
        id="ses_1",
        agent="a",
        seq=5,
        created_at=1.0,
        updated_at=2.0,
        ttl=60.0,
        initiator=ALICE,
        parent="ses_0",
        turn=turn,
        requests={"req_1": RequestState(request=request)},
        approved_tools={"t"},
        model_responses=2,
        usage=so.Usage(input_tokens=3),
        delegated=so.Usage(output_tokens=7, cost_usd=0.25),
        owed={"ses_2": "trn_0"},
        queued=[{"message": "later", "principal": None}],
        lapsed=True,
        limit_grants=2,
        earlier_requests=True,
        keys={"k1": ["asked", "trn_1", 2]},
        candidates={"cand_1": {"request_id": "req_1", "at": 1.5}},
        conversation=None,
    )


def test_a_snapshot_and_a_copy_keep_every_field() -> None:
    """Nothing is lost through a snapshot or a copy: `continue` grants to session limits and
    responses whose policy verdict is not recorded yet included."""
    state = _every_field_set()
    assert so.SessionState.from_snapshot(state.to_snapshot()) == state
    assert state.copy() == state


def test_a_snapshot_without_delegated_spend_loads_as_none_and_leaves_it_out() -> None:
    """Snapshots of older signoff have no `delegated`: it loads as nothing spent by subagents;
    a session that never delegated writes none (its snapshot is as before)."""
    snap = _every_field_set().to_snapshot()
    assert snap["delegated"] == {"input_tokens": 0, "output_tokens": 7, "cost_usd": 0.25}
    del snap["delegated"]
    restored = so.SessionState.from_snapshot(snap)
    assert restored.delegated == so.Usage()
    assert "delegated" not in restored.to_snapshot()
    assert restored.copy().delegated == so.Usage()


def test_a_snapshot_without_owed_children_loads_as_none_and_leaves_them_out() -> None:
    """Snapshots of older signoff have no `owed`: it loads as no child's spend left to count;
    a session that owes none writes none, and a copy owes its own."""
    state = _every_field_set()
    snap = state.to_snapshot()
    assert snap["owed"] == {"ses_2": "trn_0"}
    del snap["owed"]
    restored = so.SessionState.from_snapshot(snap)
    assert restored.owed == {}
    assert "owed" not in restored.to_snapshot()
    copy = state.copy()
    copy.owed.clear()
    assert state.owed == {"ses_2": "trn_0"}


def test_a_copy_shares_no_key_or_candidate_with_the_original() -> None:
    state = _every_field_set()
    copy = state.copy()
    copy.apply(
        so.Event(
            session_id="ses_1",
            seq=6,
            type="approval.settled",
            at=3.0,
            turn_id="trn_1",
            data={
                "request_id": "req_1",
                "call_id": "c1",
                "decision": "cancel",
                "idem": ["k2", "a"],
            },
        )
    )
    assert copy.keys.keys() == {"k1", "k2"} and not copy.candidates
    assert state == _every_field_set()


def test_a_snapshot_from_before_model_seq_reads_the_turn_as_not_steered() -> None:
    """Older snapshots have no `model_seq`: the last message read is taken as read by the model
    then, so a restored turn does not count as steered by a message it already saw."""
    snap = _every_field_set().to_snapshot()
    del snap["turn"]["model_seq"], snap["turn"]["read_seq"]  # `read_seq` is newer still
    restored = so.SessionState.from_snapshot(snap)
    assert restored.turn is not None and not restored.turn.steered


def test_a_completed_turn_leaves_the_session_idle() -> None:
    state = so.SessionState(id="ses_1", turn=TurnState(id="trn_1", status="completed"))
    assert state.status == "idle" and state.turn_status == "completed"


async def test_a_decision_that_is_a_calls_result_does_not_read_as_an_error(tmp_path: Path) -> None:
    """A tool that asked for approval itself gets the decision as its result: the model reads
    it as a result, not an error."""

    @so.tool
    async def wire(amount: int) -> str:
        """Wire money."""
        raise so.ApprovalRequired({"amount": amount})

    seen = Capture(reply("ok"))
    agent = scripted_agent("a", [call_tools(call("wire", amount=5)), seen], tools=[wire])
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        approve = so.Decision(id=r.pending[0].id, approved=True)
        done = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        assert done.status == "completed"
    (result,) = [m for m in seen.last if isinstance(m, so.ToolResultMessage)]
    assert not result.is_error and result.content["approved"] is True


async def test_a_recorded_lapse_leaves_the_session_expired_at_its_record(store_url: str) -> None:
    """Recording a passed TTL appends events, and `expires_at` was counted from the last one:
    an expired session's state (`GET /v1/sessions/{id}`) said it would expire a whole TTL later,
    while its store row (`GET /v1/sessions`) says when the lapse was recorded. Both say that."""
    clock = ManualClock(start=1000.0)
    async with so.Runtime([ttl_agent()], store=store_url, clock=clock) as rt:
        sid = (await rt.generate("desk", "reset it", auth=ALICE)).session_id
        clock.advance(61)
        state = await rt.state(sid)  # records the lapse
        assert state.lapsed and state.status == "failed"
        assert state.expires_at == 1061.0 and state.expired(clock())
        [row] = await rt.store.sessions()
        assert row.expires_at == state.expires_at
        clock.advance(600)
        assert (await rt.state(sid)).expires_at == 1061.0


def _chat(**corrupt: Any) -> list[so.Event]:
    """A short log whose event `corrupt` names (by type) has that data instead."""
    data: list[tuple[str, dict[str, Any]]] = [
        ("session.created", {"agent": "a"}),
        ("turn.started", {"message": "hi"}),
        ("model.completed", {"text": "", "tool_calls": [{"id": "c", "name": "t", "input": {}}]}),
        ("tool.completed", {"call_id": "c", "tool_name": "t", "status": "ok", "result": 1}),
    ]
    return [
        so.Event(
            session_id="s",
            seq=i + 1,
            type=t,  # type: ignore[arg-type]
            at=1.0,
            turn_id=None if t == "session.created" else "trn_1",
            data=corrupt.get(t.replace(".", "_"), d),
        )
        for i, (t, d) in enumerate(data)
    ]


@pytest.mark.parametrize(
    "corrupt",
    [
        {"turn_started": {"message": 0}},
        {"model_completed": {"text": None, "tool_calls": []}},
        {"model_completed": {"text": "", "tool_calls": [{"id": "c", "name": None}]}},
        {"model_completed": {"text": "", "tool_calls": [None]}},
        {"tool_completed": {"call_id": "c", "status": "ok"}},
    ],
)
def test_a_malformed_message_event_is_a_store_error_for_the_conversation_too(
    corrupt: dict[str, dict[str, Any]],
) -> None:
    # A state loaded from a snapshot reads its conversation from the events only when the model
    # is called: the same damaged event must be named there as the fold from scratch names it.
    events = _chat(**corrupt)
    with pytest.raises(so.StoreError, match="malformed"):
        fold(events)
    with pytest.raises(so.StoreError, match=r"event s:\d \(.*\) is malformed"):
        conversation(e for e in events if e.type in MESSAGE_EVENT_TYPES)


async def test_a_damaged_message_before_a_snapshot_is_named_when_the_model_reads_it(
    store_url: str,
) -> None:
    agent = scripted_agent("a", [reply("ok")], repeat_last=True)
    async with so.Runtime([agent], store=store_url) as rt:
        sid = (await rt.generate("a", prompt="first")).session_id
        while (await rt.state(sid)).seq < 70:  # past the first snapshot, at event 64
            await rt.generate(session_id=sid, prompt="more")
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", sid)
    damage = pack_bytes({"message": 0})  # event 2 starts the first turn
    alter(store_url, "UPDATE {t}events SET data={p} WHERE sk={p} AND seq=2", damage, sk)
    async with so.Runtime([agent], store=store_url) as rt:
        with pytest.raises(so.StoreError, match=rf"event {sid}:2 \(turn.started\) is malformed"):
            await rt.generate(session_id=sid, prompt="again")


@pytest.mark.parametrize(
    "corrupt",
    [
        {"session_created": {"agent": None}},
        {"session_created": {"agent": "a", "ttl": "3600"}},
        {"session_created": {"agent": "a", "ttl": True}},
        {"session_created": {"agent": "a", "ttl": 10**400}},
        {"session_created": {"agent": "a", "parent": 5}},
        {"session_created": {"agent": "a", "headroom": {"max_tokens": "x"}}},
        {"session_created": {"agent": "a", "parent_spent": {"max_cost_usd": None}}},
        {"model_completed": {"text": "", "tool_calls": [{"id": None, "name": "t"}]}},
        {"model_completed": {"text": "", "tool_calls": [{"id": "c", "name": 5}]}},
    ],
)
def test_a_field_of_the_wrong_type_that_later_code_reads_is_refused_as_it_is_folded(
    corrupt: dict[str, dict[str, Any]],
) -> None:
    """A field a hand edit left of the wrong type, which the fold kept and later code failed on
    with a bare exception (a text `ttl` a TypeError in `expires_at`, a null `agent` or call id
    a ValidationError in a request or a listing): the fold names the event, as a state loaded
    from the store folds it (without its conversation, which checks its own fields)."""
    state = so.SessionState(id="s", conversation=None)
    with pytest.raises(so.StoreError, match=r"event s:\d \(.*\) is malformed: TypeError"):
        for event in _chat(**corrupt):
            state.apply(event)


@pytest.mark.parametrize("ttl", [3600, 3600.5, math.inf, math.nan])
def test_a_session_created_as_any_signoff_wrote_it_still_folds(ttl: float) -> None:
    """What a signoff could write still folds as it did: a TTL in seconds, int or float, and an
    infinite one (or NaN), as `Limits(ttl=...)` took before it was checked, which never passes
    and gives no deadline (a store's row keeps no infinity)."""
    created = {"agent": "a", "ttl": ttl, "parent": "p", "headroom": {"max_tokens": 5}}
    state = fold(_chat(session_created=created))
    assert state.agent == "a" and state.parent == "p" and state.headroom == {"max_tokens": 5}
    assert state.ttl is ttl
    assert state.expires_at == (None if not math.isfinite(ttl) else 1.0 + ttl)
    assert state.expired(1e300) is math.isfinite(ttl)


async def test_a_session_of_an_infinite_ttl_writes_no_infinite_deadline(tmp_path: Path) -> None:
    """A session an early signoff created with `Limits(ttl=math.inf)` (before it was checked):
    its commits keep no deadline in its row, where an infinity is a damaged row, but none."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    agent = scripted_agent("a", [reply("ok")])
    created = so.Event(
        session_id="ses_old",
        seq=1,
        type="session.created",
        at=1.0,
        data={"agent": "a", "ttl": math.inf},
    )
    async with so.Runtime([agent], store=url) as rt:
        await rt.open()
        await rt.store.create_session("ses_old", "a", [created], None)
        assert (await rt.generate(session_id="ses_old", prompt="hi")).status == "completed"
        [row] = await rt.store.sessions()
        assert (row.id, row.expires_at) == ("ses_old", None)
        assert (await rt.state("ses_old")).expires_at is None


@pytest.mark.parametrize("error", ["the model is down", ["boom"], 5])
def test_a_failed_turns_error_that_is_no_object_is_refused_as_it_is_folded(error: Any) -> None:
    """A `turn.failed` whose `error` a hand edit left as text: the fold kept it, and every reader
    of the turn's error took it for an object (the dashboard's header a 500, `GET
    /v1/sessions/{id}` a ValidationError, `runnable` an AttributeError). The fold names the
    event, as a snapshot holding such an error is named as it is read; None or an object
    folds as any signoff wrote it."""
    failed = so.Event(
        session_id="s",
        seq=5,
        type="turn.failed",
        at=1.0,
        turn_id="trn_1",
        data={"error": error, "retryable": False},
    )
    state = so.SessionState(id="s", conversation=None)
    with pytest.raises(so.StoreError, match=r"event s:5 \(turn.failed\) is malformed: TypeError"):
        for event in [*_chat(), failed]:
            state.apply(event)
    for written in (None, {"code": "model_error", "message": "boom"}):
        done = fold([*_chat(), dataclasses.replace(failed, data={"error": written})])
        assert done.turn is not None and done.turn.error == written
        snapshot = done.to_snapshot()
        loaded = so.SessionState.from_snapshot(snapshot).turn
        assert loaded is not None and loaded.error == written
        snapshot["turn"]["error"] = error
        with pytest.raises(so.StoreError, match="a snapshot is malformed: TypeError"):
            so.SessionState.from_snapshot(snapshot)
