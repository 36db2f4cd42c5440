"""The engine's rules through the public API: which calls run, wait or fail, and what the model
sees; the refund agent and helpers the other runtime tests share."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

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
                call("issue_refund", order_id="1", amount=5, call_id="c_refund"),
                call("lookup_order", order_id="1", call_id="c_lookup"),
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
                call("lookup_order", order_id="9", call_id="c1"),
                call("explode", x=3, call_id="c2"),
                call("issue_refund", order_id="9", amount=1, call_id="c3"),
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


async def test_input_with_many_errors_is_a_tool_error_of_bounded_size(tmp_path: Path) -> None:
    # Every error was listed: 60,000 bad keys (a response of 770 KB, under max_response_bytes)
    # made a tool error of 5 MB, past max_result_bytes, that the model read on every later call.
    log = ExecutionLog()
    seen = Capture(reply("let me fix that"))
    many: dict[str, Any] = {f"k{i}": 0 for i in range(60_000)}
    long_key = {"x" * 200_000: 0}
    agent = scripted_agent(
        "a",
        [
            call_tools(
                so.ToolCall(name="issue_refund", input=many, id="many"),
                so.ToolCall(name="issue_refund", input=long_key, id="long"),
            ),
            seen,
        ],
        tools=tools(log),
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert (r.status, log.count()) == ("completed", 0)
        results = {m.call_id: m.content for m in tool_results(seen.last)}
        sizes = [
            len(json.dumps(e.data))
            async for e in rt.events(r.session_id, follow=False)
            if e.type == "tool.completed"
        ]
    shown = results["many"]
    assert shown["error"] == "invalid input"
    # 60,000 extra keys, and the two required ones missing
    assert len(shown["details"]) == 20 and shown["more_errors"] == 60_002 - 20
    assert ["k0"] in [d["loc"] for d in shown["details"]]
    [key] = [d["loc"][0] for d in results["long"]["details"] if d["type"] == "extra_forbidden"]
    assert key == "x" * 100 + " [cut]"
    assert len(sizes) == 2 and max(sizes) < 4096


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
                call("lookup_order", order_id="1", call_id="same"),
                call("lookup_order", order_id="2", call_id="same"),
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
                call("lookup_order", order_id="1", call_id="call_3_2"),
                call("lookup_order", order_id="2", call_id="same"),
                call("lookup_order", order_id="3", call_id="same"),
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
            call_tools(call("charge", amount=1, call_id="call_0")),
            call_tools(call("charge", amount=2, call_id="call_0")),
            reply("charged twice"),
            call_tools(call("charge", amount=3, call_id="call_0")),
            reply("charged again"),
        ],
        tools=[charge],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="charge 1 then 2")
        await rt.generate(session_id=r.session_id, prompt="and 3")
        assert [e.input["amount"] for e in log.executions] == [1.0, 2.0, 3.0]
        assert len(set(log.keys())) == 3


async def test_a_turn_for_another_agents_session_is_refused_and_changes_nothing(
    store_url: str,
) -> None:
    """`generate` and `schedule` with an agent and a `session_id` of another agent's session (a
    job configured with the wrong agent, say) raise `UsageError` naming the session's agent and
    record nothing: `schedule` ran the turn in that session as its own agent, unsaid."""
    ops = scripted_agent("ops", [reply("ran")])
    billing = scripted_agent("billing", [reply("billed")])
    async with so.Runtime([ops, billing], store=store_url) as rt:
        sid = await rt.create_session("ops")
        before = [e.seq async for e in rt.events(sid, follow=False)]
        with pytest.raises(so.UsageError, match="belongs to agent 'ops'"):
            await rt.generate("billing", "bill it", session_id=sid)
        with pytest.raises(so.UsageError, match="belongs to agent 'ops'"):
            await rt.schedule("billing", "bill it", session_id=sid)
        assert [e.seq async for e in rt.events(sid, follow=False)] == before
        assert (await rt.state(sid)).turn is None
        assert (await rt.schedule("ops", "run it", session_id=sid)).text == "ran"


@pytest.mark.parametrize(
    ("agent", "error"),
    [
        ("billing", "belongs to agent 'a'"),
        ("nobody", "belongs to agent 'a'"),
        (5, "agent must be text"),
    ],
    ids=["another", "unknown", "int"],
)
async def test_approvals_naming_another_agent_are_refused_and_settle_nothing(
    store_url: str, agent: Any, error: str
) -> None:
    """`generate(agent, session_id=..., approvals=...)` ignored `agent`: decisions sent with
    another agent's name (or an unknown one, or a number) approved the call and ran it, where the
    same call with a prompt, or with neither, is refused. Now refused alike, settling nothing,
    from the async call and its sync twin."""
    log = ExecutionLog()
    billing = scripted_agent("billing", [reply("billed")])
    async with so.Runtime([refund_agent(log), billing], store=store_url) as rt:
        r = await waiting_session(rt)
        before = await types_of(rt, r.session_id)
        yes = [so.Decision(id=r.pending[0].id, approved=True)]
        with pytest.raises(so.UsageError, match=error):
            await rt.generate(agent, session_id=r.session_id, approvals=yes)
        with pytest.raises(so.UsageError, match=error):
            await asyncio.to_thread(rt.generate_sync, agent, session_id=r.session_id, approvals=yes)
        assert await types_of(rt, r.session_id) == before
        assert [q.id for q in await rt.pending(session_id=r.session_id)] == [r.pending[0].id]
        assert log.count() == 0
        done = await rt.generate("a", session_id=r.session_id, approvals=yes)
        assert done.status == "completed"
        assert log.count() == 1
        # A repeat of what was settled is refused so too, not a no-op under the wrong agent.
        with pytest.raises(so.UsageError, match=error):
            await rt.generate(agent, session_id=r.session_id, approvals=yes)


async def test_a_cancel_the_store_refuses_stops_nothing(store_url: str) -> None:
    """The store refuses the cancel's commit (full, unreachable): `cancel` raises `StoreError`,
    and the tool body running in this process is not told to stop, since the turn goes on. The
    abort signal used to be set before the commit, so the body stopped early and the turn went
    on with its cut-short result, though the cancel had failed."""
    entered = asyncio.Event()
    release = asyncio.Event()
    aborted: list[bool] = []

    @so.tool
    async def crawl(ctx: so.ToolContext) -> str:
        """A long task that stops when the turn is cancelled."""
        entered.set()
        stop = asyncio.create_task(ctx.abort_signal.wait())
        done = asyncio.create_task(release.wait())
        await asyncio.wait({stop, done}, timeout=10, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        done.cancel()
        aborted.append(ctx.abort_signal.is_set())
        return "stopped early" if aborted[-1] else "crawled"

    agent = scripted_agent("bot", [call_tools(call("crawl")), reply("All crawled.")], tools=[crawl])
    async with so.Runtime([agent], store=store_url) as rt:
        sid = await rt.create_session("bot", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="crawl", auth=ALICE))
        await asyncio.wait_for(entered.wait(), timeout=10)
        commit = rt.store.commit

        async def refused(c: Any) -> None:
            if any(e.type == "turn.cancelled" for e in c.events):
                raise so.StoreError("disk full")
            await commit(c)

        rt.store.commit = refused  # type: ignore[method-assign,assignment]
        with pytest.raises(so.StoreError):
            await rt.cancel(sid, reason="user left")
        rt.store.commit = commit  # type: ignore[method-assign]
        await asyncio.sleep(0.05)  # a body told to stop would have stopped by now
        release.set()
        r = await asyncio.wait_for(running, timeout=10)
        assert aborted == [False]
        assert (r.status, r.text) == ("completed", "All crawled.")
        log = [e async for e in rt.events(sid, follow=False)]
        assert "turn.cancelled" not in [e.type for e in log]
        [done] = [e.data for e in log if e.type == "tool.completed"]
        assert done["result"] == "crawled"
