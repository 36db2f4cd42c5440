"""How each event moves a session's state (`_event_handlers`), seen through the log a turn
writes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._events import EventType
from signoff._idempotency import KEPT
from signoff.testing import call, call_tools, reply, scripted_agent, sqlite_runtime

ALICE = so.Principal(authenticator="test", principal_id="alice")


async def test_an_approved_call_that_asks_parks_its_turn_again(tmp_path: Path) -> None:
    """Starting an approved call moves its waiting turn back to running, so a question the call
    then asks parks the turn again with a `turn.waiting` of its own."""

    @so.tool(approval=so.always())
    async def deploy(ctx: so.ToolContext, service: str) -> str:
        """Deploy a service."""
        answer = await ctx.ask("Which region?", options=["eu", "us"])
        return f"{service} in {answer.value}"

    agent = scripted_agent(
        "ops", [call_tools(call("deploy", service="api")), reply("ok")], tools=[deploy]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("ops", prompt="deploy", auth=ALICE)
        approve = so.Decision(id=r.pending[0].id, approved=True)
        asked = await rt.generate(session_id=r.session_id, approvals=[approve], auth=ALICE)
        assert asked.status == "waiting" and asked.pending[0].question == "Which region?"
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
    started = types.index("tool.started")
    assert types[started:] == ["tool.started", "input.requested", "turn.waiting"]
    assert types.count("turn.waiting") == 2


async def test_only_continue_raises_the_session_budget(tmp_path: Path) -> None:
    """Answering a session-limit prompt with `stop` grants nothing: the next turn meets the
    same budget at once, where `continue` would have doubled it."""

    @so.tool
    async def lookup(n: int) -> int:
        """Look something up."""
        return n

    step = call_tools(call("lookup", n=1))
    costly = so.ModelResponse(tool_calls=step.tool_calls, usage=so.Usage(output_tokens=60))
    agent = scripted_agent(
        "a", [costly] * 4 + [reply("done")], tools=[lookup], limits=so.Limits(max_tokens=100)
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        stop = so.InputResponse(request_id=r.pending[0].id, option_id="stop")
        assert (await rt.respond(r.session_id, [stop], principal=ALICE)).status == "failed"
        again = await rt.generate(session_id=r.session_id, prompt="again", auth=ALICE)
        assert again.status == "waiting" and again.pending[0].kind == "session-limit"
        assert "120 of max_tokens=100" in (again.pending[0].question or "")


async def test_a_turns_text_is_all_the_model_said_in_it(tmp_path: Path) -> None:
    """The text of a turn that took several model steps joins what each step said, in order."""

    @so.tool
    async def lookup(n: int) -> int:
        """Look something up."""
        return n

    first = call_tools(call("lookup", n=1), text="Let me look.")
    agent = scripted_agent(
        "a", [first, call_tools(call("lookup", n=2)), reply("Found it.")], tools=[lookup]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
    assert r.status == "completed" and r.text == "Let me look.\n\nFound it."


def test_the_newest_keys_are_kept_a_key_recorded_again_counting_as_new() -> None:
    """A session remembers its `KEPT` newest idempotency keys: one recorded again (the message
    of a keyed creation, say) counts as new, so the oldest other key goes first."""

    def event(seq: int, type: EventType, **data: Any) -> so.Event:
        return so.Event(session_id="ses_1", seq=seq, type=type, at=1.0, data=data)

    state = so.SessionState(id="ses_1")
    state.apply(event(1, "session.created", agent="a", idem=["k0", "asked"]))
    for n in range(1, KEPT):
        state.apply(event(n + 1, "turn.message", message="m", queued=True, idem=[f"k{n}", "m"]))
    assert len(state.keys) == KEPT
    state.apply(event(KEPT + 1, "turn.message", message="m", queued=True, idem=["k0", "asked"]))
    state.apply(event(KEPT + 2, "turn.message", message="m", queued=True, idem=["new", "m"]))
    assert len(state.keys) == KEPT
    assert "k0" in state.keys and "new" in state.keys and "k1" not in state.keys


def test_a_delegate_calls_end_adds_its_childs_spend_apart_from_the_sessions_own() -> None:
    """`tool.completed` with `delegated` (what a delegate call's child spent) adds to the
    session's `delegated`, not its `usage`; one without it (an older log, any other call)
    leaves both as they were."""

    def event(seq: int, type: EventType, **data: Any) -> so.Event:
        return so.Event(session_id="ses_1", seq=seq, type=type, at=1.0, turn_id="trn_1", data=data)

    calls = [{"id": "c1", "name": "orders", "input": {}}, {"id": "c2", "name": "x", "input": {}}]
    state = so.SessionState(id="ses_1")
    state.apply(event(1, "session.created", agent="a"))
    state.apply(event(2, "turn.started", message="go"))
    state.apply(event(3, "model.completed", tool_calls=calls, usage={"input_tokens": 5}))
    ended = {"tool_name": "orders", "status": "ok", "result": "done"}
    spent = {"input_tokens": 100, "output_tokens": 20, "cost_usd": 0.5}
    state.apply(event(4, "tool.completed", call_id="c1", **ended, delegated=spent))
    state.apply(event(5, "tool.completed", call_id="c2", **ended))  # as older logs have it
    assert state.usage == so.Usage(input_tokens=5)
    assert state.delegated == so.Usage(**spent)


def _delegating() -> tuple[so.SessionState, Any]:
    """A session whose turn trn_1 runs a delegate call (c1) that created child ses_c."""

    def event(seq: int, type: EventType, turn: str | None = "trn_1", **data: Any) -> so.Event:
        return so.Event(
            session_id="ses_1", seq=seq, type=type, at=float(seq), turn_id=turn, data=data
        )

    calls = [{"id": "c1", "name": "orders", "input": {}}]
    state = so.SessionState(id="ses_1")
    state.apply(event(1, "session.created", turn=None, agent="a"))
    state.apply(event(2, "turn.started", message="go"))
    state.apply(event(3, "model.completed", tool_calls=calls, usage={"input_tokens": 5}))
    state.apply(event(4, "tool.started", call_id="c1", tool_name="orders"))
    step: dict[str, Any] = {"call_id": "c1", "tool_name": "orders", "index": 0, "kind": "step"}
    state.apply(event(5, "tool.step", **step, name="subagent.session", result="ses_c", child=True))
    return state, event


def test_a_turn_cancelled_under_a_delegate_call_owes_its_childs_spend_counted_once() -> None:
    """Cancelling the turn leaves the call without a result: its child is owed, and the first
    `subagent.spent` for it adds to `delegated` (not `usage`); a repeated one adds nothing, a
    later turn owes it no more, and neither does the call's end in an older log."""
    state, event = _delegating()
    state.apply(event(6, "turn.cancelled", reason=None, by=None))
    assert state.owed == {"ses_c": "trn_1"} and state.delegated == so.Usage()
    spent = {"input_tokens": 40, "output_tokens": 0, "cost_usd": 0.1}
    state.apply(event(7, "subagent.spent", session_id="ses_c", delegated=spent))
    state.apply(event(8, "subagent.spent", session_id="ses_c", delegated=spent))
    assert state.owed == {} and state.delegated == so.Usage(**spent)
    assert state.usage == so.Usage(input_tokens=5)
    assert state.updated_at == 6.0  # bookkeeping: its TTL runs from the cancel on
    state.apply(event(9, "turn.started", turn="trn_2", message="again"))
    assert state.owed == {} and state.delegated == so.Usage(**spent)


def test_a_turn_failed_for_good_or_replaced_owes_its_open_calls_children() -> None:
    """The TTL fails the turn for good under the call: owed. A retryable failure is not (a
    retry takes the result), until a new turn replaces that turn. A call that ended is not."""
    state, event = _delegating()
    failed = {"error": {"code": "x", "message": "x"}}
    state.apply(event(6, "turn.failed", **failed, retryable=False, reason="session expired"))
    assert state.owed == {"ses_c": "trn_1"}
    state, event = _delegating()
    state.apply(event(6, "turn.failed", **failed, retryable=True))
    assert state.owed == {}
    state.apply(event(7, "turn.started", turn="trn_2", message="again"))
    assert state.owed == {"ses_c": "trn_1"}
    state, event = _delegating()
    ended = {"tool_name": "orders", "status": "ok", "result": "done"}
    state.apply(event(6, "tool.completed", call_id="c1", **ended))
    state.apply(event(7, "turn.cancelled", reason=None, by=None))
    assert state.owed == {}


def test_an_answer_leaves_the_turns_answered_when_a_drive_goes_on_with_it() -> None:
    """`answered` (what the next drive's trace names) loses an answer when its call moves: it
    starts, ends, or asks again (a workflow's body ran past it), or when the model is called
    (its reply, or a budget prompt asked before it). A park keeps it: a vote's, made while a
    workflow call still asks another question it asked at once (it used to clear it)."""

    def event(seq: int, type: EventType, **data: Any) -> so.Event:
        return so.Event(session_id="ses_1", seq=seq, type=type, at=1.0, turn_id="trn_1", data=data)

    def asked(seq: int, call_id: str | None, *ids: str, kind: str = "question") -> so.Event:
        requests = [
            so.InputRequest(
                id=rid,
                kind=kind,
                session_id="ses_1",
                turn_id="trn_1",
                agent="a",
                action=None if call_id is None else so.Action.of(call_id, "survey", {}),
                source="ask",
                created_at=1.0,
            ).model_dump(mode="json")
            for rid in ids
        ]
        return event(seq, "input.requested", requests=requests)

    def answered(seq: int, rid: str) -> so.Event:
        return event(seq, "input.resolved", request_id=rid, outcome="answered", answer={})

    calls = [{"id": "c1", "name": "survey", "input": {}}]
    state = so.SessionState(id="ses_1")
    state.apply(event(1, "session.created", agent="a"))
    state.apply(event(2, "turn.started", message="go"))
    state.apply(event(3, "model.completed", tool_calls=calls))
    state.apply(event(4, "tool.started", call_id="c1", tool_name="survey"))
    state.apply(asked(5, "c1", "q1", "q2"))
    state.apply(answered(6, "q1"))
    state.apply(event(7, "turn.waiting", on="input", request_ids=["q2"]))  # a vote's
    assert state.turn is not None and state.turn.answered == ["q1"]
    state.apply(answered(8, "q2"))
    assert state.turn.answered == ["q1", "q2"]
    state.apply(asked(9, "c1", "q3"))  # the body replayed them and asked again
    assert state.turn.answered == []
    state.apply(answered(10, "q3"))
    assert state.turn.answered == ["q3"]
    state.apply(event(11, "tool.completed", call_id="c1", tool_name="survey", status="ok"))
    assert state.turn.answered == []
    state.apply(asked(12, None, "l1", kind="session-limit"))
    state.apply(answered(13, "l1"))
    assert state.turn.answered == ["l1"]
    state.apply(asked(14, None, "l2", kind="session-limit"))  # the next model call's budget
    assert state.turn.answered == []
    state.apply(answered(15, "l2"))
    assert state.turn.answered == ["l2"]
    state.apply(event(16, "model.completed", text="done"))
    assert state.turn.answered == []


def test_a_child_stopped_on_the_share_is_kept_until_the_question_is_answered() -> None:
    """A delegate call's end naming a child stopped on the session's share (`share_spent`) marks
    the turn, through a snapshot and a copy, for its model steps to ask; the session's own
    session-limit question answered clears it (asked, or withdrawn by a steering message, or a
    subagent's mirrored one answered, it stays), as does a model reply. A snapshot naming
    something else than a session there is a `StoreError`."""
    state, event = _delegating()
    ended = {"tool_name": "orders", "status": "error", "result": "failed"}
    state.apply(event(6, "tool.completed", call_id="c1", **ended, share_spent="ses_c"))
    assert state.turn is not None and state.turn.share_spent == "ses_c"
    snap = state.to_snapshot()
    for kept in (so.SessionState.from_snapshot(snap), state.copy()):
        assert kept.turn is not None and kept.turn.share_spent == "ses_c"
    with pytest.raises(so.StoreError, match="share_spent"):
        so.SessionState.from_snapshot({**snap, "turn": {**snap["turn"], "share_spent": 1}})

    def ask(seq: int, child: so.ChildRef | None) -> Any:
        request = so.InputRequest(
            id=f"req_{seq}",
            kind="session-limit",
            session_id="ses_1",
            turn_id="trn_1",
            agent="a",
            created_at=1.0,
            child=child,
        )
        return event(seq, "input.requested", requests=[request.model_dump(mode="json")])

    def resolve(seq: int, request_id: str, outcome: str) -> Any:
        how: dict[str, Any]
        if outcome == "answered":
            how = {"answer": {"option_id": "continue"}}
        else:  # a steering message withdrew it
            how = {"status": "withdrawn"}
        return event(seq, "input.resolved", request_id=request_id, outcome=outcome, **how)

    mirrored = so.ChildRef(session_id="ses_c", request_id="req_0", agent="b", call_id="c1")
    state.apply(ask(7, mirrored))
    state.apply(resolve(8, "req_7", "answered"))
    state.apply(ask(9, None))
    assert state.turn.share_spent == "ses_c"
    state.apply(resolve(10, "req_9", "cancelled"))
    state.apply(ask(11, None))
    assert state.turn.share_spent == "ses_c"
    state.apply(resolve(12, "req_11", "answered"))
    assert state.turn.share_spent is None and state.limit_grants == 1
    state, event = _delegating()
    state.apply(event(6, "tool.completed", call_id="c1", **ended, share_spent="ses_c"))
    state.apply(event(7, "model.completed", tool_calls=[], usage={}))
    assert state.turn is not None and state.turn.share_spent is None


def test_a_reply_that_did_not_read_a_message_leaves_the_turn_steered() -> None:
    """A message that came while the model answered, after what its reply read (`read_through`),
    steers the turn once the reply is folded (its position was taken as read, so its gated call
    was asked as if no one had written), through a snapshot and a copy, until a reply reads it;
    a queued message steers nothing. A snapshot holding no position there is a `StoreError`."""

    def event(seq: int, type: EventType, **data: Any) -> so.Event:
        return so.Event(session_id="ses_1", seq=seq, type=type, at=1.0, turn_id="trn_1", data=data)

    calls = [{"id": "c1", "name": "refund", "input": {}}]
    state = so.SessionState(id="ses_1")
    state.apply(event(1, "session.created", agent="a"))
    state.apply(event(2, "turn.started", message="refund it"))
    state.apply(event(3, "turn.message", message="later", queued=True))
    state.apply(event(4, "model.completed", tool_calls=calls, usage={}))
    assert state.turn is not None and not state.turn.steered  # a queued message steers nothing
    state.apply(event(5, "turn.message", message="only half", policy="steer"))
    state.apply(event(6, "model.completed", tool_calls=calls, usage={}, read_through=4))
    assert state.turn is not None and state.turn.steered
    assert (state.turn.model_seq, state.turn.read_seq) == (6, 4)
    snap = state.to_snapshot()
    for kept in (so.SessionState.from_snapshot(snap), state.copy()):
        assert kept.turn is not None and kept.turn.read_seq == 4 and kept.turn.steered
    for bad in (-1, "4", None):
        with pytest.raises(so.StoreError, match="read_seq"):
            so.SessionState.from_snapshot({**snap, "turn": {**snap["turn"], "read_seq": bad}})
    state.apply(event(7, "model.completed", text="half then", usage={}))
    assert state.turn is not None and not state.turn.steered and state.turn.read_seq == 7
    assert "read_seq" not in state.to_snapshot()["turn"]  # as its reply's own: left out


def test_a_continue_raises_the_budgets_to_its_requests_raise_to() -> None:
    """A session-limit request records what its `continue` raises the budgets to (`raise_to`),
    which its answer folds into `raised`, the least each budget is from then on whatever size
    a redeploy gives it (a later, lower `raise_to` lowers none); one recorded without it (an
    older signoff's) raises them by a size; one that would raise them to less than nothing, to
    text or another budget is a malformed event."""
    state, event = _delegating()

    def ask(seq: int, **data: Any) -> Any:
        request = so.InputRequest(
            id=f"req_{seq}",
            kind="session-limit",
            session_id="ses_1",
            turn_id="trn_1",
            agent="a",
            created_at=1.0,
        )
        return event(seq, "input.requested", requests=[request.model_dump(mode="json")], **data)

    def go_on(seq: int, request_id: str) -> Any:
        answered = {"answer": {"option_id": "continue"}}
        return event(seq, "input.resolved", request_id=request_id, outcome="answered", **answered)

    state.apply(ask(6, raise_to={"max_tokens": 11000, "max_cost_usd": 0.011}))
    state.apply(go_on(7, "req_6"))
    assert (state.limit_grants, state.raised) == (0, {"max_tokens": 11000, "max_cost_usd": 0.011})
    state.apply(ask(8))
    state.apply(go_on(9, "req_8"))
    state.apply(ask(10, raise_to={"max_tokens": 5000, "max_cost_usd": 0.02}))
    state.apply(go_on(11, "req_10"))
    assert (state.limit_grants, state.raised) == (1, {"max_tokens": 11000, "max_cost_usd": 0.02})
    assert so.SessionState.from_snapshot(state.to_snapshot()).raised == state.raised
    assert state.copy().raised == state.raised
    bad_ones: list[Any] = [
        {"max_tokens": -3},
        {"max_tokens": "10"},
        {"max_tokens": 2.5},
        {"max_tokens": True},
        {"max_cost_usd": math.inf},
        {"ttl": 5},
        [11000],
        11000,
    ]
    for bad in bad_ones:
        with pytest.raises(so.StoreError, match="raise_to"):
            state.copy().apply(ask(12, raise_to=bad))
