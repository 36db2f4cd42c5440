"""Every approval policy form: helpers, predicates, policy functions and what they may return."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._approval import as_policy
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

from ._approval import ALICE, gate_tool, refund_tool


async def test_never_is_the_default_and_runs_without_asking(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool
    async def plain(x: int) -> int:
        """Plain tool."""
        return x * 2

    explicit = refund_tool(log, so.never())
    assert "Never" in repr(plain) and "Never" in repr(explicit)
    agent = scripted_agent(
        "a",
        [call_tools(call("plain", x=2), call("refund", order_id="1")), reply("ok")],
        tools=[plain, explicit],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "completed"
        assert [e.tool_name for e in log.executions] == ["plain", "refund"]


async def test_always_asks_before_every_call(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [
            call_tools(call("refund", order_id="1")),
            call_tools(call("refund", order_id="2")),
            reply("ok"),
        ],
        tools=[refund_tool(log, so.always())],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "waiting"
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        # approved once, asked again for the next call
        assert r.status == "waiting"
        assert r.pending[0].input["order_id"] == "2"
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert r.status == "completed"
        assert log.count() == 2


async def test_approval_true_and_false_shorthands(tmp_path: Path) -> None:
    log = ExecutionLog()

    @log.tool(approval=True)
    async def gated(x: int) -> int:
        """Gated."""
        return x

    @log.tool(approval=False)
    async def free(x: int) -> int:
        """Free."""
        return x

    agent = scripted_agent(
        "a", [call_tools(call("gated", x=1), call("free", x=2)), reply("ok")], tools=[gated, free]
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert [p.tool_name for p in r.pending] == ["gated"]
        assert [e.tool_name for e in log.executions] == ["free"]


# -- once() ---------------------------------------------------------------------------------------


async def test_once_asks_first_then_later_calls_run_without_asking(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [
            call_tools(call("refund", order_id="1")),
            call_tools(call("refund", order_id="2"), call("refund", order_id="3")),
            reply("first turn done"),
            call_tools(call("refund", order_id="4")),
            reply("second turn done"),
        ],
        tools=[refund_tool(log, so.once())],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert r.status == "waiting"
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=True)]
        )
        assert r.status == "completed"
        r = await rt.generate(session_id=r.session_id, prompt="one more")
        assert r.status == "completed"
        assert [e.input["order_id"] for e in log.executions] == ["1", "2", "3", "4"]
        requested = [
            e async for e in rt.events(r.session_id, follow=False) if e.type == "input.requested"
        ]
        assert len(requested) == 1


async def test_once_two_calls_in_one_step_each_get_their_own_prompt(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen = Capture(call_tools(call("refund", order_id="3")))
    agent = scripted_agent(
        "a",
        [
            call_tools(call("refund", order_id="1"), call("refund", order_id="2")),
            seen,
            reply("done"),
        ],
        tools=[refund_tool(log, so.once())],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        assert r.status == "waiting"
        first, second = r.pending
        assert first.id != second.id
        # approving one does not authorize the other: each visible prompt is its own decision
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=first.id, option_id="approve")],
            principal=ALICE,
        )
        assert r.status == "waiting"
        assert [p.id for p in r.pending] == [second.id]
        assert [e.input["order_id"] for e in log.executions] == ["1"]
        assert seen.conversations == []  # the model waits for every call of its response
        r = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=second.id, option_id="cancel", text="just one")],
            principal=ALICE,
        )
        # all resolved now: the grant applies and the later call runs without asking
        assert r.status == "completed"
        assert [e.input["order_id"] for e in log.executions] == ["1", "3"]
        results = tool_results(seen.last)
        assert [m.is_error for m in results] == [False, True]
        assert results[1].content["reason"] == "just one"


async def test_once_grant_waits_for_every_matching_pending_request() -> None:
    """The seed rule, on the policy itself: a grant is ignored while a matching request pends."""
    policy = so.once()
    session = so.SessionInfo(
        id="ses_1", agent="a", turn="trn_1", auth=so.SessionAuth(current=None, initiator=None)
    )

    def ctx(approved: set[str], pending: set[str]) -> so.ApprovalContext:
        return so.ApprovalContext(
            session=session,
            tool_name="refund",
            tool_input=None,
            approved_tools=frozenset(approved),
            call_id="call_1",
            abort_signal=asyncio.Event(),
            pending_tools=frozenset(pending),
        )

    assert (await policy.decide(ctx(set(), set()))).action == "ask"
    assert (await policy.decide(ctx({"refund"}, {"refund"}))).action == "ask"
    assert (await policy.decide(ctx({"refund"}, {"other"}))).action == "run"
    assert (await policy.decide(ctx({"other"}, set()))).action == "ask"


async def test_an_unannotated_policy_function_is_told_by_its_first_parameters_name() -> None:
    """Without an `ApprovalContext` annotation, a first parameter named `ctx` or `context` gets
    the context; any other name gets the validated input."""
    ctx = so.ApprovalContext(
        session=so.SessionInfo(
            id="ses_1", agent="ops", turn="trn_1", auth=so.SessionAuth(current=None, initiator=None)
        ),
        tool_name="refund",
        tool_input={"amount": 5},
        approved_tools=frozenset(),
        call_id="call_1",
        abort_signal=asyncio.Event(),
    )
    seen: list[Any] = []

    def named_ctx(ctx: Any) -> bool:
        seen.append(ctx)
        return True

    def named_context(context: Any) -> bool:
        seen.append(context)
        return True

    def named_otherwise(c: Any) -> bool:
        seen.append(c)
        return True

    for fn in (named_ctx, named_context, named_otherwise):
        assert (await as_policy(fn).decide(ctx)).action == "ask"
    assert seen == [ctx, ctx, {"amount": 5}]


async def test_once_grant_is_per_session(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), reply("ok")],
        tools=[refund_tool(log, so.once())],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r1 = await rt.generate("a", prompt="go")
        await rt.generate(
            session_id=r1.session_id, approvals=[so.Decision(id=r1.pending[0].id, approved=True)]
        )
        r2 = await rt.generate("a", prompt="go again, new session")
        assert r2.status == "waiting"


async def test_once_denied_first_request_grants_nothing(tmp_path: Path) -> None:
    log = ExecutionLog()
    agent = scripted_agent(
        "a",
        [
            call_tools(call("refund", order_id="1")),
            call_tools(call("refund", order_id="2")),
            reply("x"),
        ],
        tools=[refund_tool(log, so.once())],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        r = await rt.generate(
            session_id=r.session_id, approvals=[so.Decision(id=r.pending[0].id, approved=False)]
        )
        assert r.status == "waiting"
        assert r.pending[0].input["order_id"] == "2"
        assert log.count() == 0


# -- predicates -----------------------------------------------------------------------------------


async def test_sync_and_async_predicates_see_validated_input(tmp_path: Path) -> None:
    log = ExecutionLog()
    seen: list[Any] = []

    def sync_pred(input: Any) -> bool:
        seen.append(("sync", input))
        return bool(input.amount > 100)

    async def async_pred(input: Any) -> bool:
        await asyncio.sleep(0)
        seen.append(("async", input))
        return bool(input.amount > 100)

    @log.tool(approval=sync_pred)
    async def refund_a(order_id: str, amount: float) -> str:
        """A."""
        return "a"

    @log.tool(approval=so.predicate(async_pred))
    async def refund_b(order_id: str, amount: float) -> str:
        """B."""
        return "b"

    agent = scripted_agent(
        "a",
        [
            call_tools(
                call("refund_a", order_id="1", amount="150"),
                call("refund_a", order_id="2", amount=5),
                call("refund_b", order_id="3", amount=500),
                call("refund_b", order_id="4", amount=1),
            ),
            reply("ok"),
        ],
        tools=[refund_a, refund_b],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        assert sorted(p.input["order_id"] for p in r.pending) == ["1", "3"]
        assert sorted(e.input["order_id"] for e in log.executions) == ["2", "4"]
        assert [(kind, i.order_id, i.amount) for kind, i in seen] == [
            ("sync", "1", 150.0),
            ("sync", "2", 5.0),
            ("async", "3", 500.0),
            ("async", "4", 1.0),
        ]


# -- policy functions of an ApprovalContext -------------------------------------------------------


async def test_policy_receives_the_approval_context(tmp_path: Path) -> None:
    log = ExecutionLog()
    contexts: list[so.ApprovalContext] = []

    def policy(ctx: so.ApprovalContext) -> so.ApprovalStatus:
        contexts.append(ctx)
        return "not-applicable"

    agent = scripted_agent(
        "support",
        [
            call_tools(call("refund", order_id="1", amount=3, call_id="call_model_1")),
            call_tools(call("gate", x=1)),
            call_tools(call("refund", order_id="2")),
            reply("ok"),
        ],
        tools=[refund_tool(log, policy), gate_tool(log)],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("support", prompt="go", auth=ALICE)
        assert r.status == "waiting"
        r = await rt.generate(
            session_id=r.session_id,
            approvals=[so.Decision(id=r.pending[0].id, approved=True)],
            auth=ALICE,
        )
        assert r.status == "completed"
        state = await rt.state(r.session_id)
        first, second = contexts
        assert first.session.id == r.session_id
        assert first.session.agent == "support"
        assert first.session.turn == r.turn_id
        assert first.session.parent is None
        assert first.session.auth.current == ALICE
        assert first.session.auth.initiator == ALICE
        assert first.tool_name == "refund"
        assert first.tool_input.order_id == "1"
        assert first.tool_input.amount == 3.0
        assert first.tool_input.model_dump() == {"order_id": "1", "amount": 3.0}
        assert first.call_id == "call_model_1"
        assert isinstance(first.abort_signal, asyncio.Event)
        assert not first.abort_signal.is_set()
        assert first.approved_tools == frozenset()
        assert second.approved_tools == frozenset({"gate"})
        assert second.tool_input.amount == 10.0  # the default filled in by validation
        assert second.call_id != first.call_id
        assert state.approved_tools == {"gate"}


def _status_value(value: Any, mode: str) -> Callable[[so.ApprovalContext], Any]:
    if mode == "async-def":

        async def policy(ctx: so.ApprovalContext) -> Any:
            await asyncio.sleep(0)
            return value

        return policy
    if mode == "returns-awaitable":

        async def later() -> Any:
            return value

        def deferred(ctx: so.ApprovalContext) -> Any:
            # A coroutine, awaited on the loop: the function itself runs in a thread, where no
            # loop runs (one that uses the loop fails closed: test_approval_threads.py).
            return later()

        return deferred

    def sync_policy(ctx: so.ApprovalContext) -> Any:
        return value

    return sync_policy


STATUSES: list[tuple[Any, str, str | None]] = [
    ("user-approval", "ask", None),
    ("not-applicable", "run", None),
    ("approved", "run", None),
    ("denied", "deny", None),
    (so.Approved("fine"), "run", "fine"),
    (so.Denied("not allowed here"), "deny", "not allowed here"),
    (True, "ask", None),
    (False, "run", None),
    ({"type": "approved", "reason": "ok"}, "run", "ok"),
    ({"type": "denied", "reason": "no"}, "deny", "no"),
]


@pytest.mark.parametrize("mode", ["sync", "async-def", "returns-awaitable"])
@pytest.mark.parametrize(("value", "expected", "reason"), STATUSES, ids=repr)
async def test_policy_statuses(
    tmp_path: Path, value: Any, expected: str, reason: str | None, mode: str
) -> None:
    log = ExecutionLog()
    seen = Capture(reply("finished"))
    agent = scripted_agent(
        "a",
        [call_tools(call("refund", order_id="1")), seen],
        tools=[refund_tool(log, _status_value(value, mode))],
    )
    async with sqlite_runtime(tmp_path, agent) as rt:
        r = await rt.generate("a", prompt="go")
        if expected == "ask":
            assert r.status == "waiting"
            (req,) = r.pending
            assert req.policy_error is None
            assert log.count() == 0
            return
        assert r.status == "completed"
        assert r.pending == []
        (result,) = tool_results(seen.last)
        if expected == "run":
            assert log.count() == 1
            ran = {"refunded": 10.0, "order_id": "1"}
            if reason is None:
                assert result.content == ran
            else:  # Approved(reason): the reason reaches the model beside the result
                assert result.content == {
                    "result": ran,
                    "approval": {"approved": True, "by": "policy", "reason": reason},
                }
        else:
            assert log.count() == 0
            assert result.is_error
            assert result.content["denied"] is True
            assert result.content["reason"] == reason
            assert result.content["by"] == "policy"
