"""How each event moves a session's state (`_event_handlers`), seen through the log a turn
writes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
    costly = so.ModelResponse(tool_calls=step.tool_calls, usage=so.Usage(input_tokens=60))
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
