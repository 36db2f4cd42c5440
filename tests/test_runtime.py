"""The engine's rules and the runtime's guarantees, through the public API."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pydantic
import pytest

import signoff as so
from signoff.stores import SQLiteStore
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
    store_contents,
    tool_results,
)

from ._ttl import ttl_agent

ALICE = so.Principal(authenticator="test", principal_id="alice")
BOB = so.Principal(authenticator="test", principal_id="bob")


def tools(log: ExecutionLog) -> list[so.Tool]:
    @log.tool
    async def lookup_order(order_id: str) -> dict[str, str]:
        """Look up an order."""
        return {"order_id": order_id, "status": "delivered"}

    @log.tool(approval=so.always())
    async def issue_refund(order_id: str, amount: float) -> dict[str, float]:
        """Issue a refund."""
        return {"refunded": amount}

    return [lookup_order, issue_refund]


async def types_of(rt: so.Runtime, session_id: str, after: int = 0) -> list[str]:
    return [e.type async for e in rt.events(session_id, after, follow=False)]


async def waiting_session(
    rt: so.Runtime, agent: str = "a", *, auth: so.Principal | None = None
) -> so.GenerateResult:
    r = await rt.generate(agent, prompt="refund order 1", auth=auth)
    assert r.status == "waiting"
    return r


def refund_agent(log: ExecutionLog, *more: Any, name: str = "a", **kwargs: Any) -> so.Agent:
    steps = [call_tools(call("issue_refund", order_id="1", amount=5)), *more]
    if not more:
        steps.append(reply("done"))
    return scripted_agent(name, steps, tools=tools(log), **kwargs)


# -- engine rules -------------------------------------------------------------------------------


async def test_ungated_calls_run_while_gated_ones_wait_and_model_waits_for_all(
    tmp_path: Path,
) -> None:
    log = ExecutionLog()
    seen = Capture(reply("All done."))
    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("issue_refund", order_id="1", amount=5, id="c_refund"),
                call("lookup_order", order_id="1", id="c_lookup"),
            ),
            seen,
        ],
        tools=tools(log),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="refund order 1")
        assert r.status == "waiting"
        assert [e.tool_name for e in log.executions] == ["lookup_order"]
        assert seen.conversations == []  # not called while a call of the response is open
        assert await types_of(rt, r.session_id) == [
            "session.created",
            "turn.started",
            "model.completed",
            "input.requested",
            "tool.started",
            "tool.completed",
            "turn.waiting",
        ]
        head = (await rt.state(r.session_id)).seq
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert r.status == "completed"
        assert await types_of(rt, r.session_id, head) == [
            "approval.settled",
            "input.resolved",
            "tool.started",
            "tool.completed",
            "model.completed",
            "turn.completed",
            "session.waiting",
        ]
        assert len(seen.conversations) == 1
        user, assistant, *results = seen.last
        assert user == so.UserMessage(text="refund order 1")
        assert isinstance(assistant, so.AssistantMessage)
        assert [c.id for c in assistant.tool_calls] == ["c_refund", "c_lookup"]
        assert {(m.call_id, m.is_error) for m in tool_results(results)} == {
            ("c_refund", False),
            ("c_lookup", False),
        }
        assert len(results) == 2


async def test_denied_call_never_runs_and_model_gets_the_reason(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("I could not refund it."))
    agent = refund_agent(log, seen)
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await waiting_session(rt)
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=r.pending[0].id, option_id="cancel", text="no refunds")],
        )
        assert r.status == "completed"
        assert log.count() == 0
        types = await types_of(rt, r.session_id)
        assert "tool.started" not in types
        (result,) = tool_results(seen.last)
        assert result.is_error
        assert result.tool_name == "issue_refund"
        assert result.content["denied"] is True
        assert result.content["reason"] == "no refunds"


async def test_model_visible_tool_results(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool
    async def explode(x: int) -> int:
        """Always fails."""
        raise ValueError(f"bad x {x}")

    seen = Capture(reply("ok"))
    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("lookup_order", order_id="9", id="c1"),
                call("explode", x=3, id="c2"),
                call("issue_refund", order_id="9", amount=1, id="c3"),
            ),
            seen,
        ],
        tools=[*tools(log), explode],
        guardrails=[so.tool_policy(deny=["issue_refund"])],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
        results = {m.call_id: m for m in tool_results(seen.last)}
        assert results["c1"].content == {"order_id": "9", "status": "delivered"}
        assert not results["c1"].is_error
        assert results["c2"].is_error
        assert results["c2"].content == {"error": "ValueError: bad x 3"}
        assert results["c3"].is_error
        assert results["c3"].content["denied"] is True


async def test_message_window_never_cuts_the_turn_holding_the_request(tmp_path: Path) -> None:
    log = ExecutionLog()
    history = [reply(f"answer {i}") for i in range(6)]
    seen = Capture(reply("refunded"))
    agent = scripted_agent(
        "a",
        [
            *history,
            call_tools(call("lookup_order", order_id="1")),
            call_tools(call("lookup_order", order_id="2")),
            call_tools(call("issue_refund", order_id="2", amount=5)),
            seen,
        ],
        tools=tools(log),
        limits=so.Limits(max_messages=2),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = (await rt.generate("a", prompt="question 0")).session_id
        for i in range(1, 6):
            await rt.generate(session_id=sid, prompt=f"question {i}")
        r = await rt.generate(session_id=sid, prompt="refund order 2")
        assert r.status == "waiting"
        r = await rt.generate(
            session_id=sid, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert r.status == "completed"
        window = seen.last
        # the whole turn, from its user message, though it is longer than max_messages
        assert window[0] == so.UserMessage(text="refund order 2")
        assert len(window) == 7
        assert [type(m).__name__ for m in window] == [
            "UserMessage",
            "AssistantMessage",
            "ToolResultMessage",
            "AssistantMessage",
            "ToolResultMessage",
            "AssistantMessage",
            "ToolResultMessage",
        ]
        assert tool_results(window)[-1].content == {"refunded": 5.0}


async def test_message_window_does_cut_earlier_turns(tmp_path: Path) -> None:
    seen = Capture(reply("last"))
    agent = scripted_agent(
        "a", [reply("one"), reply("two"), seen], limits=so.Limits(max_messages=3)
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        sid = (await rt.generate("a", prompt="q1")).session_id
        await rt.generate(session_id=sid, prompt="q2")
        await rt.generate(session_id=sid, prompt="q3")
        # the full conversation is q1, one, q2, two, q3: the window keeps the last three
        assert [getattr(m, "text", None) for m in seen.last] == ["q2", "two", "q3"]
        assert seen.last[-1] == so.UserMessage(text="q3")


@pytest.mark.parametrize(
    ("raw_input", "expected_loc"),
    [
        ({"order_id": "1", "amount": "lots"}, ["amount"]),
        ({"order_id": "1"}, ["amount"]),
        ({"order_id": 1, "amount": 5}, ["order_id"]),
        ({"order_id": "1", "amount": 5, "extra": True}, ["extra"]),
        ([1, 2], []),
        ("refund please", []),
        (None, []),
    ],
    ids=["wrong-type", "missing", "int-for-str", "extra-field", "list", "string", "null"],
)
async def test_invalid_model_input_becomes_a_tool_error(
    tmp_path: Path, raw_input: Any, expected_loc: list[str]
) -> None:
    log = ExecutionLog()
    seen = Capture(reply("let me fix that"))
    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(name="issue_refund", input=raw_input, id="bad")), seen],
        tools=tools(log),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        # the gated tool is not even asked about: invalid input never reaches a person
        assert r.status == "completed"
        assert r.pending == []
        assert log.count() == 0
        (result,) = tool_results(seen.last)
        assert result.is_error
        assert result.call_id == "bad"
        assert result.content["error"] == "invalid input"
        assert expected_loc in [d["loc"] for d in result.content["details"]]


async def test_unknown_tool_becomes_a_tool_error(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(reply("sorry"))
    agent = scripted_agent(
        "a", [call_tools(call("launch_missiles", target="moon")), seen], tools=tools(log)
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
        (result,) = tool_results(seen.last)
        assert result.is_error
        assert "unknown tool 'launch_missiles'" in result.content["error"]
        assert "lookup_order" in result.content["error"]


async def test_an_approved_call_whose_tool_left_the_agent_becomes_a_tool_error(
    tmp_path: Path,
) -> None:
    # A new deploy dropped the tool while its approval waited: the call cannot run, and the
    # turn must go on (with the model told why) instead of failing on every resume.
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
    seen = Capture(reply("sorry"))
    steps: list[Any] = [call_tools(call("issue_refund", order_id="1", amount=5)), seen]
    redeployed = scripted_agent("a", steps, tools=tools(log)[:1])
    async with sqlite_runtime(tmp_path, redeployed) as rt:
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert r.status == "completed"
        assert log.count() == 0
        (result,) = tool_results(seen.last)
        assert result.is_error
        assert "unknown tool 'issue_refund'" in result.content["error"]


async def test_duplicate_call_ids_from_the_model_are_made_unique(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture()
    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("lookup_order", order_id="1", id="same"),
                call("lookup_order", order_id="2", id="same"),
            ),
            seen,
        ],
        tools=tools(log),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        await rt.generate("a", prompt="go")
        ids = [m.call_id for m in tool_results(seen.last)]
        assert len(set(ids)) == 2
        assert len(set(log.keys())) == 2


async def test_a_replacement_call_id_never_takes_an_id_the_model_gave(tmp_path: Path) -> None:
    # The replacement for the second "same" is made from the event's seq and the call's index
    # (call_3_2): the model may already have used exactly that id for another call.
    log = ExecutionLog()
    seen = Capture()
    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("lookup_order", order_id="1", id="call_3_2"),
                call("lookup_order", order_id="2", id="same"),
                call("lookup_order", order_id="3", id="same"),
            ),
            seen,
        ],
        tools=tools(log),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        await rt.generate("a", prompt="go")
        results = tool_results(seen.last)
        assert len({m.call_id for m in results}) == 3
        assert sorted(m.content["order_id"] for m in results) == ["1", "2", "3"]
        assert log.count() == 3


async def test_idempotency_key_is_recorded_and_names_the_call(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = refund_agent(log)
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await waiting_session(rt)
        call_id = r.pending[0].call_id
        assert call_id is not None
        await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        (key,) = log.keys()
        assert key.startswith(f"{r.session_id}:") and key.endswith(f":{call_id}")
        started = [
            e async for e in rt.events(r.session_id, follow=False) if e.type == "tool.started"
        ]
        assert [e.data["idempotency_key"] for e in started] == [key]


async def test_reused_call_ids_across_responses_get_distinct_keys(tmp_path: Path) -> None:
    """Some models number calls call_0, call_1... in every response; two charges stay two."""
    log = ExecutionLog()

    @log.tool
    async def charge(amount: float) -> str:
        """Charge a card."""
        return "charged"

    agent = scripted_agent(
        "a",
        [
            call_tools(call("charge", amount=1, id="call_0")),
            call_tools(call("charge", amount=2, id="call_0")),
            reply("charged twice"),
            call_tools(call("charge", amount=3, id="call_0")),
            reply("charged again"),
        ],
        tools=[charge],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="charge 1 then 2")
        await rt.generate(session_id=r.session_id, prompt="and 3")
        assert [e.input["amount"] for e in log.executions] == [1.0, 2.0, 3.0]
        assert len(set(log.keys())) == 3


# -- guarantees ---------------------------------------------------------------------------------


async def test_resolve_once_same_answer_is_a_noop(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        first = await rt.respond(
            r.session_id, [so.InputResponse(request_id=rid, option_id="approve")]
        )
        assert first.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=True)]
        assert first.status == "completed"
        before = await store_contents(rt.store, r.session_id)
        again = await rt.respond(
            r.session_id, [so.InputResponse(request_id=rid, option_id="approve")]
        )
        assert again.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=False)]
        same = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
        )
        assert same.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=False)]
        assert same.status == "completed"
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 1


async def test_a_retried_approval_is_a_no_op_after_the_model_asked_again(tmp_path: Path) -> None:
    """helix: the same id sent twice (a retry, a double click) is a no-op the second time, even
    when the resumed turn has since asked for another approval; it is not a partial answer."""
    log = ExecutionLog()
    again = call_tools(call("issue_refund", order_id="2", amount=6))
    async with sqlite_runtime(tmp_path, refund_agent(log, again, reply("done"))) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        first = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
        )
        assert first.status == "waiting"
        [second] = first.pending
        before = await store_contents(rt.store, r.session_id)
        retry = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
        )
        assert retry.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=False)]
        assert retry.status == "waiting"
        assert [p.id for p in retry.pending] == [second.id]
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 1
        done = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=second.id, approved=True)]
        )
        assert done.status == "completed"
        assert log.count() == 2


async def test_resolve_once_different_answer_conflicts(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        await rt.generate(session_id=r.session_id, approvals=[so.Decision(id=rid, approved=False)])
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.ConflictingAnswer) as info:
            await rt.generate(
                session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
            )
        assert info.value.request_ids == [rid]
        assert rid in str(info.value)
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(r.session_id, [so.InputResponse(request_id=rid, option_id="approve")])
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0


async def test_unknown_and_foreign_ids_are_rejected_by_name(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [call_tools(call("issue_refund", order_id="1", amount=5)), reply("done")],
        tools=tools(log),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        mine = await waiting_session(rt)
        other = await waiting_session(rt)
        mine_before = await store_contents(rt.store, mine.session_id)
        other_before = await store_contents(rt.store, other.session_id)
        queue_before = await rt.pending()
        foreign = other.pending[0].id
        cases: list[list[str]] = [
            ["req_typo"],
            [foreign],
            [mine.pending[0].id, "req_typo"],
            [mine.pending[0].id, foreign],
        ]
        for ids in cases:
            bad = [i for i in ids if i != mine.pending[0].id]
            with pytest.raises(so.UnknownRequest) as info:
                await rt.generate(
                    session_id=mine.session_id,
                    approvals=[so.Decision(id=i, approved=True) for i in ids],
                )
            assert info.value.request_ids == bad
            for i in bad:
                assert i in str(info.value)
            with pytest.raises(so.UnknownRequest) as info:
                await rt.respond(
                    mine.session_id,
                    [so.InputResponse(request_id=i, option_id="approve") for i in ids],
                )
            assert info.value.request_ids == bad
        assert await store_contents(rt.store, mine.session_id) == mine_before
        assert await store_contents(rt.store, other.session_id) == other_before
        assert await rt.pending() == queue_before
        assert log.count() == 0


async def test_partial_answer_is_rejected_naming_the_unanswered(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("issue_refund", order_id="1", amount=5),
                call("issue_refund", order_id="2", amount=6),
                call("issue_refund", order_id="3", amount=7),
            ),
            reply("done"),
        ],
        tools=tools(log),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await waiting_session(rt)
        a, b, c = (p.id for p in r.pending)
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.PartialAnswer) as info:
            await rt.generate(session_id=r.session_id, approvals=[so.Decision(id=b, approved=True)])
        assert info.value.request_ids == [a, c]
        assert a in str(info.value) and c in str(info.value)
        assert await store_contents(rt.store, r.session_id) == before
        # a prompt while requests are pending is refused too
        with pytest.raises(so.PartialAnswer):
            await rt.generate(session_id=r.session_id, prompt="hello?")
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0


async def test_approvals_with_a_prompt_are_rejected(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer, match="prompt"):
            await rt.generate(
                session_id=r.session_id,
                prompt="also, hi",
                approvals=[so.Decision(id=r.pending[0].id, approved=True)],
            )
        with pytest.raises(so.InvalidAnswer):
            await rt.generate(session_id=r.session_id, approvals=[])
        assert await store_contents(rt.store, r.session_id) == before


@pytest.mark.parametrize(
    "prompt",
    [123, b"refund", "\ud800", "", " \n\t"],
    ids=["int", "bytes", "surrogate", "empty", "whitespace"],
)
@pytest.mark.parametrize("entry", ["generate", "schedule"])
async def test_a_bad_prompt_is_refused_before_a_session_is_created(
    tmp_path: Path, entry: str, prompt: Any
) -> None:
    async with sqlite_runtime(tmp_path, refund_agent(ExecutionLog())) as rt:
        with pytest.raises(so.UsageError, match="prompt"):
            if entry == "generate":
                await rt.generate("a", prompt=prompt)
            else:
                await rt.schedule("a", prompt)
        assert await rt.sessions() == []


@pytest.mark.parametrize("retry_with", ["session_id", "same_approvals"])
async def test_failed_resume_is_retryable_without_losing_answers(
    tmp_path: Path, retry_with: str
) -> None:
    log = ExecutionLog()
    flaky = Flaky(reply("Refunded."), error=ConnectionError("model down"))
    async with sqlite_runtime(tmp_path, refund_agent(log, flaky)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        failed = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True, reason="ok")]
        )
        assert failed.status == "failed"
        assert failed.retryable
        assert failed.error is not None and "model down" in failed.error["message"]
        assert failed.outcomes == [so.Outcome(request_id=rid, outcome="approved", applied=True)]
        assert log.count() == 1  # the approved tool ran before the model failed
        # the answer was kept: nothing is pending again
        assert await rt.pending() == []
        assert failed.pending == []
        if retry_with == "session_id":
            retried = await rt.generate(session_id=r.session_id)
        else:
            retried = await rt.generate(
                session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
            )
            assert retried.outcomes == [
                so.Outcome(request_id=rid, outcome="approved", applied=False)
            ]
        assert retried.status == "completed"
        assert retried.text == "Refunded."
        assert log.count() == 1  # the recorded tool result was not produced again
        assert flaky.calls == 2
        types = await types_of(rt, r.session_id)
        assert types.count("tool.started") == 1
        assert types.count("turn.failed") == 1


async def test_failed_resume_survives_a_new_runtime(tmp_path: Path) -> None:
    log = ExecutionLog()
    script: list[Any] = [
        call_tools(call("issue_refund", order_id="1", amount=5)),
        RuntimeError("provider 500"),
    ]
    async with sqlite_runtime(tmp_path, scripted_agent("a", script, tools=tools(log))) as rt:
        r = await waiting_session(rt)
        failed = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert failed.status == "failed" and failed.retryable
    fixed = scripted_agent("a", [script[0], reply("recovered")], tools=tools(log))
    async with sqlite_runtime(tmp_path, fixed) as rt2:
        retried = await rt2.generate(session_id=r.session_id)
        assert retried.status == "completed"
        assert retried.text == "recovered"
        assert log.count() == 1


async def test_session_ttl_expired_with_pending_requests(tmp_path: Path) -> None:
    log = ExecutionLog()
    clock = ManualClock()
    agent = refund_agent(log, limits=so.Limits(ttl=60))
    async with sqlite_runtime(tmp_path, agent, clock=clock) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        clock.advance(59)
        assert (await rt.state(r.session_id)).pending_requests()[0].id == rid
        clock.advance(2)
    # reopened from another runtime (a new process) after the TTL passed
    async with sqlite_runtime(
        tmp_path, refund_agent(log, limits=so.Limits(ttl=60)), clock=clock
    ) as rt2:
        with pytest.raises(so.SessionExpired) as info:
            await rt2.generate(
                session_id=r.session_id, approvals=[so.Decision(id=rid, approved=True)]
            )
        assert info.value.session_id == r.session_id
        assert info.value.pending == [rid]
        assert rid in str(info.value)
        assert log.count() == 0
        assert await rt2.pending() == []  # the request is closed, not left dangling
        # still expired when reopened again: it does not silently start over
        with pytest.raises(so.SessionExpired):
            await rt2.generate(session_id=r.session_id, prompt="hello again")
        with pytest.raises((so.SessionExpired, so.RequestClosed)):
            await rt2.respond(r.session_id, [so.InputResponse(request_id=rid, option_id="approve")])
        assert log.count() == 0


async def test_cancel_of_a_session_past_its_ttl_is_session_expired(store_url: str) -> None:
    """A cancel after the TTL passed does not withdraw the parked turn's requests as if the
    session were live: it raises `SessionExpired`, and what is recorded is the expiry."""
    log = ExecutionLog()
    clock = ManualClock()
    agent = refund_agent(log, limits=so.Limits(ttl=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        clock.advance(61)
        with pytest.raises(so.SessionExpired) as info:
            await rt.cancel(r.session_id, "too late")
        assert (info.value.session_id, info.value.pending) == (r.session_id, [rid])
        types = await types_of(rt, r.session_id)
        assert "turn.cancelled" not in types and types[-1] == "turn.failed"
        stored = await rt.store.get_request(rid)
        assert stored is not None and stored.status == "expired"
        with pytest.raises(so.SessionExpired):
            await rt.cancel(r.session_id)
        assert await types_of(rt, r.session_id) == types
        assert log.count() == 0


async def test_session_ttl_timedelta_and_activity_keeps_it_alive(tmp_path: Path) -> None:
    from datetime import timedelta

    log = ExecutionLog()
    clock = ManualClock()
    agent = scripted_agent(
        "a",
        [reply("one"), reply("two")],
        tools=tools(log),
        limits=so.Limits(ttl=timedelta(minutes=1)),
    )
    async with sqlite_runtime(tmp_path, agent, clock=clock) as rt:
        sid = (await rt.generate("a", prompt="hi")).session_id
        clock.advance(50)
        assert (await rt.generate(session_id=sid, prompt="still there?")).text == "two"
        clock.advance(50)  # 100 s after creation, 50 s after the last activity
        assert (await rt.state(sid)).expired(clock()) is False


@pytest.mark.parametrize(
    "bad",
    [
        {"id": "REQ", "approved": "maybe"},
        {"id": 5, "approved": True},
        {"id": "REQ"},
        {"approved": True},
        {"id": "REQ", "approved": True, "reason": 7},
        {"id": "REQ", "approved": True, "unexpected": 1},
        "REQ",
    ],
    ids=["approved-maybe", "int-id", "no-approved", "no-id", "int-reason", "extra", "string"],
)
async def test_wrong_typed_decisions_are_invalid_answers(tmp_path: Path, bad: Any) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        if isinstance(bad, dict) and bad.get("id") == "REQ":
            bad = {**bad, "id": rid}
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer):
            await rt.generate(session_id=r.session_id, approvals=[bad])
        assert await store_contents(rt.store, r.session_id) == before


async def test_malformed_approvals_container_and_responses(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.InvalidAnswer):
            await rt.generate(session_id=r.session_id, approvals={"id": rid, "approved": True})  # type: ignore[arg-type]
        with pytest.raises(so.InvalidAnswer):
            await rt.generate(
                session_id=r.session_id,
                approvals=[so.Decision(id=rid, approved=True), so.Decision(id=rid, approved=True)],
            )
        with pytest.raises(so.InvalidAnswer):
            await rt.respond(r.session_id, [{"request_id": rid, "option_id": "maybe"}])
        with pytest.raises(so.InvalidAnswer):
            await rt.respond(r.session_id, [{"request_id": 5, "option_id": "approve"}])
        with pytest.raises(so.InvalidAnswer):
            await rt.respond(r.session_id, [])
        # Not a list at all: a named error too, never a TypeError.
        single = so.InputResponse(request_id=rid, option_id="approve")
        for not_a_list in (None, 5, single, {"request_id": rid, "option_id": "approve"}):
            with pytest.raises(so.InvalidAnswer, match="list"):
                await rt.respond(r.session_id, not_a_list)  # type: ignore[arg-type]
        for not_decisions in (5, so.Decision(id=rid, approved=True)):
            with pytest.raises(so.InvalidAnswer, match="list"):
                await rt.generate(session_id=r.session_id, approvals=not_decisions)  # type: ignore[arg-type]
        with pytest.raises(pydantic.ValidationError):
            so.Decision(id=rid, approved="yes")
        assert await store_contents(rt.store, r.session_id) == before


async def test_unknown_session_ids(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        await waiting_session(rt)
        sid = "ses_does_not_exist"
        with pytest.raises(so.UnknownSession) as info:
            await rt.generate(session_id=sid, prompt="hi")
        assert info.value.session_id == sid
        assert sid in str(info.value)
        with pytest.raises(so.UnknownSession):
            await rt.generate(session_id=sid)
        with pytest.raises(so.UnknownSession):
            await rt.generate(session_id=sid, approvals=[so.Decision(id="req_x", approved=True)])
        with pytest.raises(so.UnknownSession):
            await rt.respond(sid, [so.InputResponse(request_id="req_x", option_id="approve")])
        with pytest.raises(so.UnknownSession):
            await rt.cancel(sid)
        with pytest.raises(so.UnknownSession):
            await rt.state(sid)
        with pytest.raises(so.UnknownSession):
            async for _ in rt.events(sid, follow=False):
                pass


async def test_answers_to_closed_requests_after_cancel(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        rid = r.pending[0].id
        cancelled = await rt.cancel(r.session_id, reason="customer left")
        assert cancelled.status == "cancelled"
        assert cancelled.pending == []
        assert await rt.pending() == []
        before = await store_contents(rt.store, r.session_id)
        assert before.requests == [(rid, "withdrawn")]
        for approve in (True, False):
            with pytest.raises(so.RequestClosed) as info:
                await rt.generate(
                    session_id=r.session_id, approvals=[so.Decision(id=rid, approved=approve)]
                )
            assert info.value.request_ids == [rid]
        with pytest.raises(so.RequestClosed):
            await rt.respond(r.session_id, [so.InputResponse(request_id=rid, option_id="approve")])
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0
        # cancelling again is a no-op, and the session takes a new prompt
        again = await rt.cancel(r.session_id)
        assert again.status == "cancelled"
        fresh = await rt.generate(session_id=r.session_id, prompt="start over")
        assert fresh.status == "completed"
        assert fresh.turn_id != r.turn_id
        assert log.count() == 0


async def test_who_cancelled_is_recorded_with_the_cancellation(tmp_path: Path) -> None:
    async with sqlite_runtime(tmp_path, refund_agent(ExecutionLog())) as rt:
        r = await waiting_session(rt, auth=ALICE)
        rid = r.pending[0].id
        for bad in ({"reason": 5}, {"principal": "alice"}):
            with pytest.raises(so.UsageError):
                await rt.cancel(r.session_id, **bad)
        assert (await rt.state(r.session_id)).turn.status == "waiting"  # type: ignore[union-attr]
        await rt.cancel(r.session_id, "customer left", principal=ALICE)
        events = [e async for e in rt.events(r.session_id, follow=False)]
        (cancelled,) = [e for e in events if e.type == "turn.cancelled"]
        assert cancelled.data == {"reason": "customer left", "by": ALICE.model_dump()}
        (withdrawn,) = [e for e in events if e.type == "input.resolved"]
        assert withdrawn.data["by"] == ALICE.model_dump()
        stored = await rt.store.get_request(rid)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["by"] == ALICE.model_dump()
        audited = [e for e in await rt.audit(r.session_id) if e.type == "turn.cancelled"]
        assert audited[0].data["by"] == ALICE.model_dump()


async def test_only_the_principal_whose_turn_asked_may_answer(tmp_path: Path) -> None:
    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt, auth=ALICE)
        rid = r.pending[0].id
        before = await store_contents(rt.store, r.session_id)
        impostor = so.Principal(authenticator="other-idp", principal_id="alice")
        for who in (BOB, None, impostor):
            with pytest.raises(so.NotAllowed) as info:
                await rt.respond(
                    r.session_id,
                    [so.InputResponse(request_id=rid, option_id="approve")],
                    principal=who,
                )
            assert info.value.request_ids == [rid]
            with pytest.raises(so.NotAllowed):
                await rt.generate(
                    session_id=r.session_id,
                    approvals=[so.Decision(id=rid, approved=False)],
                    auth=who,
                )
        # the request stays pending for the right person
        assert await store_contents(rt.store, r.session_id) == before
        done = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=rid, option_id="approve")],
            principal=ALICE.model_copy(update={"attributes": {"team": "support"}}),
        )
        assert done.status == "completed"
        assert log.count() == 1


async def test_respond_one_request_at_a_time(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("issue_refund", order_id="1", amount=5),
                call("issue_refund", order_id="2", amount=6),
            ),
            reply("done"),
        ],
        tools=tools(log),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await waiting_session(rt)
        a, b = (p.id for p in r.pending)
        r1 = await rt.respond(
            r.session_id, [so.InputResponse(request_id=b, option_id="approve")], resume=False
        )
        assert r1.status == "running"  # the approved call has work to do now
        assert [p.id for p in r1.pending] == [a]
        assert log.count() == 0  # resume=False: only the answer was recorded
        assert [p.id for p in await rt.pending(session_id=r.session_id)] == [a]
        r2 = await rt.respond(r.session_id, [so.InputResponse(request_id=a, option_id="approve")])
        assert r2.status == "completed"
        assert sorted(e.input["order_id"] for e in log.executions) == ["1", "2"]


async def test_pending_queue_across_sessions(tmp_path: Path) -> None:
    log = ExecutionLog()
    clock = ManualClock()
    agents = [refund_agent(log, name="a"), refund_agent(log, name="b")]
    async with sqlite_runtime(tmp_path, *agents, clock=clock) as rt:
        ra = await waiting_session(rt, "a")
        clock.advance(100)
        rb = await waiting_session(rt, "b")
        queue = await rt.pending()
        assert [p.session_id for p in queue] == [ra.session_id, rb.session_id]
        assert [p.id for p in await rt.pending(agent="b")] == [rb.pending[0].id]
        assert [p.id for p in await rt.pending(session_id=ra.session_id)] == [ra.pending[0].id]
        assert await rt.pending(tool_name="lookup_order") == []
        assert len(await rt.pending(tool_name="issue_refund", kind="tool-approval")) == 2
        assert [p.id for p in await rt.pending(older_than=50)] == [ra.pending[0].id]
        assert [p.id for p in await rt.pending(limit=1, offset=1)] == [rb.pending[0].id]
        # An age older than any time a store holds is no request, not a refused filter.
        assert await rt.pending(older_than=1.29e308) == []


async def test_events_follow_live(tmp_path: Path) -> None:
    import asyncio

    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log), poll_interval=0.01) as rt:
        r = await waiting_session(rt)
        head = (await rt.state(r.session_id)).seq
        seen: list[so.Event] = []

        async def follow() -> None:
            async for event in rt.events(r.session_id, after=head - 1):
                seen.append(event)
                if event.type == "session.waiting":
                    return

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.05)
        assert [e.type for e in seen] == ["turn.waiting"]
        await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        await asyncio.wait_for(task, timeout=5)
        assert [e.seq for e in seen] == list(range(head, head + len(seen)))
        assert seen[-1].type == "session.waiting"


@pytest.mark.parametrize("after", [-1, 2**63, None, float("nan"), "3", True, 1.5])
async def test_events_refuse_a_start_that_is_not_a_seq(tmp_path: Path, after: Any) -> None:
    """A bad `after` was a bare OverflowError from SQLite (2**63), or matched nothing, so a
    followed stream (None, NaN, "3") waited for ever without a word."""
    import asyncio

    log = ExecutionLog()
    async with sqlite_runtime(tmp_path, refund_agent(log)) as rt:
        r = await waiting_session(rt)
        for follow in (False, True):
            with pytest.raises(so.UsageError, match="after"):
                async with asyncio.timeout(5):
                    async for _ in rt.events(r.session_id, after, follow=follow):
                        pass


# -- sync twins -----------------------------------------------------------------------------------


def test_sync_twins_from_plain_code(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("issue_refund", order_id="1", amount=5),
                call("issue_refund", order_id="2", amount=6),
            ),
            reply("done"),
            call_tools(call("issue_refund", order_id="3", amount=7)),
            reply("second done"),
        ],
        tools=tools(log),
    )
    rt = sqlite_runtime(tmp_path, agent)
    try:
        r = rt.generate_sync("a", prompt="refund", auth=ALICE)
        assert r.status == "waiting"
        queue = rt.pending_sync()
        assert [p.id for p in queue] == [p.id for p in r.pending]
        assert rt.pending_sync(session_id="ses_nope") == []
        r = rt.respond_sync(
            r.session_id,
            [so.InputResponse(request_id=queue[0].id, option_id="approve")],
            principal=ALICE,
        )
        assert r.status == "waiting"
        r = rt.generate_sync(
            session_id=r.session_id,
            approvals=[
                so.Decision(id=queue[0].id, approved=True),
                so.Decision(id=queue[1].id, approved=False),
            ],
            auth=ALICE,
        )
        assert r.status == "completed"
        assert r.outcomes == [
            so.Outcome(request_id=queue[0].id, outcome="approved", applied=False),
            so.Outcome(request_id=queue[1].id, outcome="cancelled", applied=True),
        ]
        assert log.count() == 1
        r = rt.generate_sync(session_id=r.session_id, prompt="again", auth=ALICE)
        assert r.status == "waiting"
        cancelled = rt.cancel_sync(r.session_id)
        assert cancelled.status == "cancelled"
        assert rt.state_sync(r.session_id).status == "cancelled"
        events = rt.events_sync(r.session_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        with pytest.raises(so.UnknownSession):
            rt.generate_sync(session_id="ses_nope", prompt="x")
    finally:
        rt.close_sync()


async def test_approvals_as_plain_dicts(tmp_path: Path) -> None:
    """The helix JSON shape: [{id, approved, reason}] straight from a request body."""
    log = ExecutionLog()
    seen = Capture(reply("ok"))
    async with sqlite_runtime(tmp_path, refund_agent(log, seen)) as rt:
        r = await waiting_session(rt)
        body: list[dict[str, Any]] = [{"id": r.pending[0].id, "approved": False, "reason": "no"}]
        done = await rt.generate(session_id=r.session_id, approvals=body)
        assert done.status == "completed"
        assert done.outcomes == [
            so.Outcome(request_id=r.pending[0].id, outcome="cancelled", applied=True)
        ]
        assert tool_results(seen.last)[0].content["reason"] == "no"
        assert log.count() == 0


async def test_sync_twins_inside_a_running_loop(tmp_path: Path) -> None:
    """Notebooks run an event loop already: the sync twins must not need the caller's loop."""
    log = ExecutionLog()
    rt = sqlite_runtime(tmp_path, refund_agent(log))
    try:
        r = rt.generate_sync("a", prompt="refund order 1")
        assert r.status == "waiting"
        (req,) = rt.pending_sync()
        done = rt.respond_sync(
            r.session_id, [so.InputResponse(request_id=req.id, option_id="approve")]
        )
        assert done.status == "completed"
        assert log.count() == 1
    finally:
        rt.close_sync()


class CountingStore(SQLiteStore):
    """Counts the events read, to show what loading a conversation costs."""

    read = 0

    async def read_events(self, *args: Any, **kwargs: Any) -> list[so.Event]:
        events = await super().read_events(*args, **kwargs)
        self.read += len(events)
        return events


@pytest.mark.parametrize("long_turn", [False, True])
async def test_a_new_runtime_reads_only_the_window_and_sends_the_same_messages(
    tmp_path: Path, long_turn: bool
) -> None:
    """With `max_messages`, a runtime that did not run the session reads the newest message
    events, not the whole history, and the model sees exactly what a warm runtime shows it."""
    turns = 60
    lookups = [call_tools(call("lookup_order", order_id=str(i))) for i in range(12)]
    script: list[Any] = [reply(f"answer {i}") for i in range(turns)]
    script += [
        *(lookups if long_turn else lookups[:1]),
        call_tools(call("issue_refund", order_id="2", amount=5)),
    ]
    warm_seen, cold_seen = Capture(reply("refunded")), Capture(reply("refunded"))
    log = ExecutionLog()
    url = f"sqlite:///{tmp_path / 'state.db'}"

    def agent(seen: Capture) -> so.Agent:
        return scripted_agent(
            "a", [*script, seen], tools=tools(log), limits=so.Limits(max_messages=6)
        )

    async def park(rt: so.Runtime) -> tuple[str, str]:
        sid = (await rt.generate("a", prompt="turn 0")).session_id
        for i in range(1, turns):
            await rt.generate(session_id=sid, prompt=f"turn {i}")
        r = await rt.generate(session_id=sid, prompt="refund order 2")
        assert r.status == "waiting"
        return sid, r.pending[0].id

    async with so.Runtime([agent(warm_seen)], store=url) as rt:
        sid, rid = await park(rt)
        done = await rt.generate(session_id=sid, approvals=[so.Decision(id=rid, approved=True)])
        assert done.text == "refunded"
    url2 = f"sqlite:///{tmp_path / 'cold.db'}"
    async with so.Runtime([agent(Capture(reply("unused")))], store=url2) as rt:
        sid, rid = await park(rt)
    store = CountingStore(url2)
    async with so.Runtime([agent(cold_seen)], store=store) as cold:
        done = await cold.generate(session_id=sid, approvals=[so.Decision(id=rid, approved=True)])
        assert done.text == "refunded"
        # loaded in part, so not offered as the conversation; in full when the turn is long
        messages = (await cold.state(sid)).messages
        assert (messages is not None) == long_turn
    assert cold_seen.last == warm_seen.last
    assert so.UserMessage(text="refund order 2") in cold_seen.last
    assert len(cold_seen.last) == (27 if long_turn else 6)  # the whole turn, or the window
    history = turns * 2 + (28 if long_turn else 6)
    if long_turn:  # the turn is longer than the tail read: everything is read, as before
        assert store.read > history
    else:
        assert store.read < 40 < history


class ReleaseCountingStore(SQLiteStore):
    """Counts the separate lease releases (a drive's last commit can release it instead)."""

    releases = 0

    async def release_lease(self, session_id: str, owner: str, token: int) -> None:
        self.releases += 1
        await super().release_lease(session_id, owner, token)


async def test_the_commit_that_parks_or_ends_a_turn_gives_the_lease_back(tmp_path: Path) -> None:
    log = ExecutionLog()
    store = ReleaseCountingStore(f"sqlite:///{tmp_path / 'state.db'}")
    async with so.Runtime([refund_agent(log)], store=store) as rt:
        parked = await rt.generate("a", prompt="refund order 1")
        assert parked.status == "waiting"
        # free at once: another owner takes it without waiting for the lease to expire
        token = await store.acquire_lease(parked.session_id, "someone", 30, rt.clock())
        assert token is not None
        await store.release_lease(parked.session_id, "someone", token)
        store.releases = 0
        done = await rt.generate(
            session_id=parked.session_id,
            approvals=[so.Decision(id=parked.pending[0].id, approved=True)],
        )
        assert done.status == "completed"
        assert store.releases == 0  # the completing commit released it
        assert await store.acquire_lease(parked.session_id, "someone", 30, rt.clock()) is not None


async def test_activity_in_another_process_keeps_the_session_alive_for_this_one(
    tmp_path: Path,
) -> None:
    """A runtime whose cached state of a session is older than the TTL must not expire it
    when another process has used the session since."""
    clock = ManualClock()

    def agent() -> so.Agent:
        return scripted_agent(
            "a", [reply("one"), reply("two"), reply("three")], tools=[], limits=so.Limits(ttl=60)
        )

    async with sqlite_runtime(tmp_path, agent(), clock=clock) as here:
        sid = (await here.generate("a", prompt="hi")).session_id
        clock.advance(50)
        async with sqlite_runtime(tmp_path, agent(), clock=clock) as elsewhere:
            assert (await elsewhere.generate(session_id=sid, prompt="again")).text == "two"
        clock.advance(50)  # 100 s after this runtime last saw it, 50 s after the last activity
        done = await here.generate(session_id=sid, prompt="still there?")
        assert done.status == "completed"


@pytest.mark.parametrize(
    "page",
    [{"limit": -1}, {"offset": -3}, {"limit": "5"}, {"limit": 2**64}, {"offset": 1.5}],
    ids=["limit-negative", "offset-negative", "limit-str", "limit-huge", "offset-float"],
)
async def test_listing_pages_are_checked(tmp_path: Path, page: dict[str, Any]) -> None:
    # SQLite reads LIMIT -1 as "no limit" and PostgreSQL refuses it with its own error: the
    # runtime refuses a bad page the same way for both, as a usage error.
    async with sqlite_runtime(tmp_path, refund_agent(ExecutionLog())) as rt:
        await waiting_session(rt)
        with pytest.raises(so.UsageError):
            await rt.pending(**page)
        with pytest.raises(so.UsageError):
            await rt.sessions(**page)


async def test_with_store_keeps_every_setting_but_the_store(tmp_path: Path) -> None:
    """`--store` (CLI and server) goes through `with_store`: the same agents and settings,
    including the state cache's size, on another store; the original runtime is unchanged."""
    agent = so.Agent(name="a", model=so.models.Scripted([so.ModelResponse(text="hi")]))
    clock = lambda: 1_000.0  # noqa: E731
    first = so.Runtime(
        [agent],
        f"sqlite:///{tmp_path}/one.db",
        clock=clock,
        lease_ttl=7.0,
        lease_wait=3.0,
        cache_size=5,
        poll_interval=0.5,
        inline=False,
    )
    other = first.with_store(f"sqlite:///{tmp_path}/two.db")
    assert other.agents == first.agents and other.store is not first.store
    assert other.store.url.endswith("two.db") and first.store.url.endswith("one.db")
    settings = ("clock", "lease_ttl", "lease_wait", "_cache_size", "poll_interval", "inline")
    assert [getattr(other, s) for s in settings] == [getattr(first, s) for s in settings]
    assert (other.lease_ttl, other._cache_size, other.inline) == (7.0, 5, False)
    r = await other.generate("a", prompt="hello")
    assert r.status == "running"  # inline=False: left to workers, on the other store
    assert [s.id for s in await other.sessions()] == [r.session_id]
    assert await first.sessions() == []
    await first.close()
    await other.close()


@pytest.mark.parametrize(
    "setting",
    [
        {"lease_wait": float("nan")},
        {"lease_wait": -1},
        {"lease_wait": "10"},
        {"cache_size": -1},
        {"cache_size": 2.5},
        {"cache_size": True},
    ],
)
def test_runtime_refuses_a_lease_wait_or_cache_size_it_cannot_use(
    tmp_path: Path, setting: dict[str, Any]
) -> None:
    """`lease_wait=nan` waited for a busy session for ever (never `SessionBusy`), and
    `cache_size=-1` made the first call a bare KeyError; both are refused when constructed."""
    with pytest.raises(so.UsageError, match=next(iter(setting))):
        so.Runtime([], store=f"sqlite:///{tmp_path}/s.db", **setting)


@pytest.mark.parametrize(
    ("listing", "message"),
    [
        (lambda rt: rt.sessions_sync(status="wait"), "status must be one of idle, running"),
        (lambda rt: rt.pending_sync(kind="approval"), "kind must be one of tool-approval"),
        (lambda rt: rt.pending_sync(older_than=float("nan")), "older_than must be seconds"),
        (lambda rt: rt.pending_sync(older_than=-5), "older_than must be seconds"),
        (lambda rt: rt.pending_sync(older_than=10**400), "older_than must be seconds"),
        # limit=0 lists nothing, as for sessions and pending (tests/test_audit_trail.py)
        (lambda rt: rt.audit_sync(limit=-1), "limit must be a whole number from 0"),
        (lambda rt: rt.audit_sync(limit="5"), "limit must be a whole number from 0"),
    ],
)
def test_a_listing_refuses_a_filter_that_can_match_nothing(
    tmp_path: Path, listing: Any, message: str
) -> None:
    """A misspelt status or kind, or a NaN age, listed nothing, as if the queue were empty (the
    CLI refused them; Python did not), and `audit(limit=-1)` returned an entry."""
    agent = scripted_agent("a", [call_tools(call_of_refund()), reply("done")], tools=[refund()])
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db")
    try:
        assert rt.generate_sync("a", prompt="go").status == "waiting"
        with pytest.raises(so.UsageError, match=message):
            listing(rt)
        assert len(rt.pending_sync(kind="tool-approval", older_than=0)) == 1
        assert [s.status for s in rt.sessions_sync(status="waiting")] == ["waiting"]
        assert len(rt.audit_sync(limit=1)) == 1
    finally:
        rt.close_sync()


def call_of_refund() -> so.ToolCall:
    return call("refund", amount=5)


def refund() -> so.Tool:
    @so.tool(approval=so.always())
    async def refund(amount: int) -> int:
        """Refund."""
        return amount

    return refund


def test_runtime_takes_a_lease_wait_of_0_and_a_cache_of_0(tmp_path: Path) -> None:
    agent = scripted_agent("a", [reply("hi")], repeat_last=True)
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db", lease_wait=0, cache_size=0)
    try:
        assert rt.generate_sync("a", prompt="hello").text == "hi"
    finally:
        rt.close_sync()


async def test_a_follower_reads_the_expiry_it_meets_before_it_raises(tmp_path: Path) -> None:
    """README: a followed session raises `SessionExpired` after its last event, and an expiry
    that caught the turn unfinished is in the log. The follower that meets the expiry records
    it and yields it (the request expired, the turn failed for good) before raising, instead of
    raising on a log that still shows the turn waiting."""
    import asyncio

    now = [1_000_000.0]
    async with so.Runtime(
        [ttl_agent()], store=f"sqlite:///{tmp_path}/s.db", clock=lambda: now[0], poll_interval=0.01
    ) as rt:
        r = await rt.generate("desk", prompt="reset")
        seen: list[so.Event] = []

        async def follow() -> None:
            async for event in rt.events(r.session_id):
                seen.append(event)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.1)
        now[0] += 120
        with pytest.raises(so.SessionExpired) as info:
            await asyncio.wait_for(task, 5)
        assert info.value.pending == [r.pending[0].id]
        assert [(e.type, e.data.get("status")) for e in seen[-2:]] == [
            ("input.resolved", "expired"),
            ("turn.failed", None),
        ]
        assert seen[-1].data["error"]["code"] == "session_expired"


async def test_a_follower_waits_one_tick_before_the_expiry_and_raises_at_it(
    tmp_path: Path,
) -> None:
    """The boundary of a followed session's expiry, on the runtime's clock: one tick before
    its `expires_at` the follower keeps waiting for events; at it, it raises `SessionExpired`."""
    import asyncio
    import math

    now = [1_000_000.0]
    async with so.Runtime(
        [ttl_agent()], store=f"sqlite:///{tmp_path}/s.db", clock=lambda: now[0], poll_interval=0.01
    ) as rt:
        r = await rt.generate("desk", prompt="reset")
        state = await rt.state(r.session_id)
        expires = state.expires_at
        assert expires == now[0] + 60
        now[0] = math.nextafter(expires, -math.inf)
        seen: list[int] = []

        async def follow() -> None:
            async for event in rt.events(r.session_id):
                seen.append(event.seq)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.1)  # ten polls, each finding the session live
        assert not task.done() and seen == list(range(1, state.seq + 1))
        now[0] = expires
        with pytest.raises(so.SessionExpired) as info:
            await asyncio.wait_for(task, 5)
        assert info.value.pending == [r.pending[0].id]


async def test_following_a_session_ends_when_it_expires_or_is_deleted(tmp_path: Path) -> None:
    """A followed session that can have no more events (its TTL passed, or its rows were
    deleted) used to be waited on for ever: `rt.events(follow=True)` now yields every event,
    then raises `SessionExpired` (naming the requests the expiry closes) or `UnknownSession`."""
    import asyncio
    import sqlite3

    import signoff._runtime as runtime_module

    now = [1_000_000.0]

    agent = ttl_agent(repeat_last=True)
    path = tmp_path / "ttl.db"
    async with so.Runtime(
        [agent], store=f"sqlite:///{path}", clock=lambda: now[0], poll_interval=0.01
    ) as rt:
        r = await rt.generate("desk", prompt="reset")

        first: list[int] = []

        async def follow() -> None:
            async for event in rt.events(r.session_id):
                first.append(event.seq)

        task = asyncio.create_task(follow())
        await asyncio.sleep(0.1)
        assert not task.done()  # live: waiting for events
        now[0] += 120
        with pytest.raises(so.SessionExpired) as info:
            await asyncio.wait_for(task, 5)
        assert info.value.pending == [r.pending[0].id]
        assert first == list(range(1, (await rt.state(r.session_id)).seq + 1))

        other = await rt.generate("desk", prompt="reset again")
        seen: list[int] = []

        async def collect() -> None:
            async for event in rt.events(other.session_id):
                seen.append(event.seq)

        runtime_module._RECHECK_FOLLOWED, before = 0.05, runtime_module._RECHECK_FOLLOWED
        try:
            task = asyncio.create_task(collect())
            await asyncio.sleep(0.1)
            with sqlite3.connect(path) as db:  # an operator removes the session
                sk = db.execute(
                    "SELECT sk FROM sessions WHERE id=?", (other.session_id,)
                ).fetchone()[0]
                for table in ("events", "snapshots", "requests", "leases", "audit"):
                    db.execute(f"DELETE FROM {table} WHERE sk=?", (sk,))
                db.execute("DELETE FROM sessions WHERE sk=?", (sk,))
            with pytest.raises(so.UnknownSession):
                await asyncio.wait_for(task, 5)
        finally:
            runtime_module._RECHECK_FOLLOWED = before
        assert seen and seen == list(range(1, len(seen) + 1))


class BatchStore(SQLiteStore):
    """Records how many events each bounded read returned."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.batches: list[int] = []

    async def read_events(self, *args: Any, **kwargs: Any) -> list[so.Event]:
        events = await super().read_events(*args, **kwargs)
        if kwargs.get("limit") is not None:
            self.batches.append(len(events))
        return events


async def test_following_events_holds_a_bounded_number_of_bytes_per_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`events()` reads at most `stores.READ_BYTES` of event JSON at once (500 events of
    megabytes each were held per read), and still yields every event, in order."""
    agent = scripted_agent("a", [reply("hello " * 50)] * 4, repeat_last=True)
    store = BatchStore(f"sqlite:///{tmp_path}/s.db")
    async with so.Runtime([agent], store=store) as rt:
        r = await rt.generate("a", prompt="one")
        for prompt in ("two", "three"):
            await rt.generate(session_id=r.session_id, prompt=prompt)
        head = await store.head(r.session_id)
        monkeypatch.setattr(so.stores, "READ_BYTES", 1)
        seqs = [e.seq async for e in rt.events(r.session_id, follow=False)]
    assert head is not None and seqs == list(range(1, head + 1))
    assert max(store.batches) == 1


def test_a_replaced_runtime_keeps_every_setting_it_is_not_given(tmp_path: Path) -> None:
    """`signoff worker` and `--store` rebuild the runtime a module made: a setting left out of
    the copy (the worker once dropped `cache_size`) would silently change how it runs."""
    import inspect

    from opentelemetry.sdk.trace import TracerProvider

    from signoff._sessions import SessionRunner

    clock = so.testing.ManualClock(1_000.0)
    original = so.Runtime(
        [so.Agent(name="a", model=so.models.Scripted([]))],
        f"sqlite:///{tmp_path / 'a.db'}",
        clock=clock,
        lease_ttl=11.0,
        lease_wait=3.0,
        cache_size=7,
        poll_interval=0.5,
        inline=True,
        tracer_provider=TracerProvider(),
        trace_content=True,
    )
    copy = original._replaced(lease_ttl=2.0, inline=False)
    settings = {
        "clock": "clock",
        "lease_wait": "lease_wait",
        "cache_size": "_cache_size",
        "poll_interval": "poll_interval",
        "tracer_provider": "tracer_provider",
        "trace_content": "trace_content",
    }
    given = {"agents", "store", "lease_ttl", "inline"}
    params = set(inspect.signature(SessionRunner.__init__).parameters) - {"self"}
    assert params == given | set(settings), "a new setting: carry it in Runtime._replaced"
    for attribute in settings.values():
        assert getattr(copy, attribute) == getattr(original, attribute), attribute
    assert (copy.lease_ttl, copy.inline, copy.store) == (2.0, False, original.store)
    assert list(copy.agents) == ["a"]
    moved = original.with_store(f"sqlite:///{tmp_path / 'b.db'}")
    assert (moved.lease_ttl, moved.inline, moved._cache_size) == (11.0, True, 7)
