"""The delegate call itself: bad names, targets and tasks refused, a failed or over-budget
child turn as its result, a later turn of the child or a message after either side finished,
a child driven elsewhere, and a parent turn replaced meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import signoff as so
from signoff import _session_cache, _subagents
from signoff._answers import MAX_TEXT_BYTES
from signoff.testing import (
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

from ._replaced import assert_only_the_new_turn, assert_told_cancelled, replace_turn
from ._subagents import (
    ALICE,
    Counted,
    refund_agents,
)


def test_delegate_rejects_bad_names() -> None:
    with pytest.raises(so.UsageError, match="agent"):
        so.delegate("")
    for bad in ("billing team", "facturación", "b" * 65):  # the model APIs refuse these names
        with pytest.raises(so.UsageError, match="name="):
            so.delegate(bad)
    assert so.delegate("billing team", name="billing").name == "billing"


async def test_delegating_to_an_unknown_agent_is_a_tool_error(tmp_path: Path) -> None:
    after = Counted("sorry")
    parent = scripted_agent(
        "support", [call_tools(call("nobody", message="hi")), after], tools=[so.delegate("nobody")]
    )
    rt = sqlite_runtime(tmp_path, parent)
    r = await rt.generate("support", prompt="hi")
    assert r.status == "completed"
    [result] = tool_results(after.capture.last)
    assert result.is_error and "unknown agent 'nobody'" in result.content["error"]
    await rt.close()


def test_a_runtime_lacking_a_delegate_target_says_so_when_it_is_made(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its delegate calls can only fail, so the runtime logs it as it is made, once per process,
    instead of leaving it to the model to find. It is not refused: a process may hold only
    some agents (to record answers, or to resume a parent whose child ran elsewhere). The
    process's memory of what it said starts empty, so the test holds run again in one process."""
    monkeypatch.setattr(_session_cache, "_told", set())
    parent = scripted_agent("helpdesk", [reply("hi")], tools=[so.delegate("ledger", name="books")])
    child = scripted_agent("ledger", [reply("done")])
    url = f"sqlite:///{tmp_path}/state.db"
    with caplog.at_level(logging.WARNING, logger="signoff.runtime"):
        for agents in ([parent], [parent, child], [child], [parent]):
            so.Runtime(agents, store=url).close_sync()
    assert [r.getMessage() for r in caplog.records] == [
        "agent 'helpdesk' delegates to 'ledger' (tool 'books'), which this runtime does not "
        "have: the calls it runs fail (it has: helpdesk)"
    ]


async def test_a_blank_task_is_a_tool_error_and_makes_no_child(tmp_path: Path) -> None:
    # the child's turn would refuse the prompt after its session was made, left without a turn
    after = Counted("sorry")
    child = scripted_agent("billing", [reply("never")])
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message=" \n ")), after],
        tools=[so.delegate("billing")],
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="hi")
    assert r.status == "completed"
    [result] = tool_results(after.capture.last)
    assert result.is_error and "whitespace" in str(result.content)
    assert [s.id for s in await rt.sessions()] == [r.session_id]
    await rt.close()


async def test_a_task_over_the_prompt_limit_is_a_tool_error_and_makes_no_child(
    tmp_path: Path,
) -> None:
    # A parent allowed model responses over 4 MiB can hand over a task its child's turn would
    # refuse as a prompt (`MAX_TEXT_BYTES`): refused before the child session is made.
    after = Counted("sorry")
    child = scripted_agent("billing", [reply("never")])
    task = "x" * (MAX_TEXT_BYTES + 1)
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message=task)), after],
        tools=[so.delegate("billing")],
        limits=so.Limits(max_response_bytes=2 * MAX_TEXT_BYTES),
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="hi")
    assert r.status == "completed"
    [result] = tool_results(after.capture.last)
    assert result.is_error and f"over the limit of {MAX_TEXT_BYTES} bytes" in str(result.content)
    assert [s.id for s in await rt.sessions()] == [r.session_id]
    await rt.close()


async def test_a_later_turn_of_the_child_is_not_the_delegate_calls_result(tmp_path: Path) -> None:
    """A message sent to the child after its delegated turn completed (here before a process
    with the parent's agent went on) starts another turn of the child: the delegate call's
    result is still the delegated turn's text, not the answer to that later message."""
    ran: list[str] = []

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042")),
            reply("Refund done."),
            reply("Noted, thanks."),
        ],
        tools=[issue_refund],
    )
    after = Counted("unused")
    after.capture.respond = lambda conv: reply(f"parent saw: {tool_results(conv)[-1].content}")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund order 1042")), after],
        tools=[so.delegate("billing")],
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    billing_only = sqlite_runtime(tmp_path, child)
    child_id = mirror.child.session_id
    await billing_only.respond(
        child_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
    )
    later = await billing_only.send(child_id, "thanks!", principal=ALICE)
    assert (later.status, later.text) == ("completed", "Noted, thanks.")
    await billing_only.close()
    finished = await rt.generate(session_id=r.session_id)
    assert (finished.status, finished.text) == ("completed", "parent saw: Refund done.")
    assert ran == ["1042"] and after.calls == 1
    await rt.close()


async def test_a_message_to_the_parent_after_its_child_finished_keeps_the_childs_text(
    tmp_path: Path,
) -> None:
    """The child's request is answered on the child by a process without the parent's agent,
    and the child's turn completes; a message then steers the parent before it went on. The
    child's turn can no longer be cancelled and its refund ran: the delegate call's result is
    the child's text, not `interrupted`, which told the parent's model nothing was done."""
    ran: list[dict[str, Any]] = []
    after = Counted("Noted.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    billing_only = sqlite_runtime(tmp_path, child)
    await billing_only.respond(
        mirror.child.session_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
    )
    await billing_only.close()
    assert ran == [{"order_id": "1042", "amount": 180.0}]
    done = await rt.send(r.session_id, "is it done?", principal=ALICE)
    assert (done.status, done.text) == ("completed", "Noted.")
    [result] = tool_results(after.capture.last)
    assert result.content == "Refunded: {'refunded': 180.0}"
    child_state = await rt.state(mirror.child.session_id)
    assert child_state.turn is not None and child_state.turn.status == "completed"
    assert after.calls == 1 and len(ran) == 1
    await rt.close()


async def test_a_message_to_a_child_after_its_parent_finished_gets_a_reply(
    tmp_path: Path,
) -> None:
    """The child is an ordinary session: a message sent to it after its delegated turn and its
    parent's turn completed starts a turn that runs, not one cancelled as an orphan of a
    parent turn that ended long ago (only the delegated turn belongs to the parent's)."""
    ran: list[str] = []

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042")),
            reply("Refund done."),
            reply("Noted, thanks."),
        ],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund order 1042")), reply("Done.")],
        tools=[so.delegate("billing")],
    )
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        done = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="approve")],
            principal=ALICE,
        )
        assert (done.status, done.text) == ("completed", "Done.")
        later = await rt.send(mirror.child.session_id, "thanks!", principal=ALICE)
        assert (later.status, later.text) == ("completed", "Noted, thanks.")
        assert ran == ["1042"]


async def test_a_failed_child_turn_is_the_delegate_calls_error(tmp_path: Path) -> None:
    child = scripted_agent("billing", [ConnectionError("model unavailable")])
    after = Counted("The billing agent is down.")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 1")), after],
        tools=[so.delegate("billing")],
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="refund 1")
    assert r.status == "completed" and after.calls == 1
    [result] = tool_results(after.capture.last)
    assert result.is_error and result.content["error"].startswith("SubagentFailed: ")
    assert "model unavailable" in result.content["error"]
    await rt.close()


async def test_a_childs_spent_budget_is_asked_on_the_parent_and_raises_only_the_childs(
    tmp_path: Path,
) -> None:
    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    spent = so.Usage(input_tokens=0, output_tokens=50)
    child = scripted_agent(
        "orders",
        [call_tools(call("lookup", order_id="3"), usage=spent), reply("Order 3 shipped.")],
        tools=[lookup],
        limits=so.Limits(max_tokens=40),
    )
    after = Counted("It shipped.")
    parent = scripted_agent(
        "support",
        [call_tools(call("orders", message="where is 3?")), after],
        tools=[so.delegate("orders")],
        limits=so.Limits(max_tokens=1000),
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
    [limit] = r.pending
    assert limit.kind == "session-limit" and limit.source == "child"
    assert [o.id for o in limit.options] == ["continue", "stop"]
    done = await rt.send(r.session_id, "continue", principal=ALICE)
    assert done.status == "completed" and after.calls == 1
    assert tool_results(after.capture.last)[0].content == "Order 3 shipped."
    assert limit.child is not None
    assert (await rt.state(limit.child.session_id)).raised == {"max_tokens": 80}
    parents = await rt.state(r.session_id)
    assert (parents.limit_grants, parents.raised) == (0, {})
    await rt.close()


async def test_one_continue_on_the_parent_raises_the_childs_budget_as_far_as_it_needs(
    tmp_path: Path,
) -> None:
    """The child (max_tokens=40) read 100 tokens and wrote 5; its next call reads those 100
    again. The prompt, asked on the parent, says the child's budget goes to 240, what that call
    needs, and one `continue` lets it answer (before, four `continue`s did nothing but ask
    again); the parent's own budget is not raised."""

    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    read = so.Usage(input_tokens=100, output_tokens=5)
    child = scripted_agent(
        "orders",
        [
            call_tools(call("lookup", order_id="3"), usage=read),
            reply("Order 3 shipped.", usage=so.Usage(input_tokens=110, output_tokens=5)),
        ],
        tools=[lookup],
        limits=so.Limits(max_tokens=40),
    )
    after = Counted("It shipped.")
    parent = scripted_agent(
        "support",
        [call_tools(call("orders", message="where is 3?")), after],
        tools=[so.delegate("orders")],
        limits=so.Limits(max_tokens=1000),
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
    [limit] = r.pending
    assert limit.kind == "session-limit" and limit.source == "child"
    assert limit.question == (
        "the session used 105 of max_tokens=40. Continue with max_tokens raised to 240, or stop?"
    )
    done = await rt.send(r.session_id, "continue", principal=ALICE)
    assert done.status == "completed" and after.calls == 1
    assert tool_results(after.capture.last)[0].content == "Order 3 shipped."
    assert limit.child is not None
    assert (await rt.state(limit.child.session_id)).raised == {"max_tokens": 240}
    parents = await rt.state(r.session_id)
    assert (parents.limit_grants, parents.raised) == (0, {})
    await rt.close()


class _SlowRefund:
    """`support` delegating to `billing`, whose approved refund runs until `release` is set
    (`entered` set as it starts); `after` answers with what the delegate call returned."""

    def __init__(self) -> None:
        self.entered, self.release = asyncio.Event(), asyncio.Event()
        self.ran: list[str] = []
        entered, release, ran = self.entered, self.release, self.ran

        @so.tool(approval=so.always())
        async def issue_refund(order_id: str) -> str:
            """Refund an order, slowly."""
            entered.set()
            await release.wait()
            ran.append(order_id)
            return "refunded"

        self.child = scripted_agent(
            "billing",
            [call_tools(call("issue_refund", order_id="1042")), reply("Refund done.")],
            tools=[issue_refund],
        )
        self.after = after = Counted("unused")
        after.capture.respond = lambda conv: reply(f"parent saw: {tool_results(conv)[-1].content}")
        self.parent = scripted_agent(
            "support",
            [call_tools(call("billing", call_id="d1", message="Refund order 1042")), after],
            tools=[so.delegate("billing")],
        )

    async def answered_twice(
        self, rt: so.Runtime
    ) -> tuple[str, asyncio.Task[Any], asyncio.Task[Any]]:
        """The parent's session; the child's approval answered directly, its refund running;
        then the same answer given through the parent's mirror of it (both calls' tasks)."""
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        direct = asyncio.create_task(
            rt.respond(
                mirror.child.session_id,
                [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
                principal=ALICE,
            )
        )
        await self.entered.wait()
        through_parent = asyncio.create_task(
            rt.respond(
                r.session_id,
                [so.InputResponse(request_id=mirror.id, option_id="approve")],
                principal=ALICE,
            )
        )
        return r.session_id, direct, through_parent

    async def settled(self, rt: so.Runtime, session_id: str, direct: asyncio.Task[Any]) -> None:
        """The child's drive ends, then the parent's turn, with its text; each tool ran once."""
        assert (await direct).status == "completed"
        state = await rt.state(session_id)
        assert state.turn is not None and state.turn.status == "completed"
        assert state.turn.text == "parent saw: Refund done."
        assert self.ran == ["1042"] and self.after.calls == 1


# The runtime's cache as it comes, and none: a child's drive finds its parent either way.
_CACHES = pytest.mark.parametrize("cache", [{}, {"cache_size": 0}], ids=["cached", "cache_size=0"])


@_CACHES
async def test_a_delegate_call_waits_for_a_child_driven_elsewhere(
    tmp_path: Path, cache: dict[str, Any]
) -> None:
    """The child's request is answered directly and its approved tool is still running when
    the same answer comes through the parent: the parent's delegate call must not fail as busy
    (which told the parent's model that a refund that ran had failed): its call waits
    `lease_wait` for that drive, and the parent's turn gets the child's text."""
    tree = _SlowRefund()
    async with sqlite_runtime(tmp_path, tree.parent, tree.child, lease_wait=0.2, **cache) as rt:
        sid, direct, through_parent = await tree.answered_twice(rt)
        await asyncio.sleep(0.6)  # past lease_wait, the child's tool still running
        tree.release.set()
        done = await through_parent
        await tree.settled(rt, sid, direct)
        assert done.outcomes[0].outcome == "approved"


@_CACHES
async def test_a_call_whose_delegate_call_waits_on_a_child_driven_elsewhere_honours_lease_wait(
    tmp_path: Path, cache: dict[str, Any]
) -> None:
    """The delegate call waited for as long as another drive held the child (a slow tool, a
    store refusing its outcome): the call through the parent hung far past its `lease_wait`.
    It answers `running` once that passed, recording nothing, and the parent's turn goes on
    once the child's drive ends (with `cache_size=0` it never did: the child's drive looked
    for its parent only in the cache)."""
    tree = _SlowRefund()
    async with sqlite_runtime(tmp_path, tree.parent, tree.child, lease_wait=0.2, **cache) as rt:
        sid, direct, through_parent = await tree.answered_twice(rt)
        done = await asyncio.wait_for(through_parent, 5)  # the child's tool still running
        assert done.status == "running" and done.outcomes[0].outcome == "approved", done
        assert tree.after.calls == 0 and not tree.ran
        tree.release.set()
        await tree.settled(rt, sid, direct)


async def test_a_call_giving_up_on_a_child_driven_elsewhere_is_no_failed_drive_or_error_span(
    tmp_path: Path,
) -> None:
    """Giving up on a subagent another drive holds stops the parent's drive as if another held
    the parent's turn: it counted as a failed drive (`signoff_turns_failed_total`) and failed
    the drive's and the delegate call's spans (`lease_lost`), though nothing failed."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tree = _SlowRefund()
    async with sqlite_runtime(
        tmp_path, tree.parent, tree.child, lease_wait=0.2, tracer_provider=provider
    ) as rt:
        sid, direct, through_parent = await tree.answered_twice(rt)
        failed = rt._counts.failed_drives
        done = await asyncio.wait_for(through_parent, 5)  # the child's tool still running
        assert done.status == "running", done
        assert rt._counts.failed_drives == failed
        spans = exporter.get_finished_spans()
        assert [s.name for s in spans if s.status.status_code == StatusCode.ERROR] == []
        calls = [s for s in spans if s.name == "execute_tool billing"]
        assert [(s.attributes or {}).get("signoff.tool.outcome") for s in calls][-1] == "held"
        tree.release.set()
        await tree.settled(rt, sid, direct)
        assert rt._counts.failed_drives == failed


async def test_a_delegate_call_whose_parent_turn_was_replaced_records_nothing_into_the_new_one(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a delegate call creates its child, another process cancels the parent's turn and
    starts a new one (left running: this process holds the lease). The call then finds its own
    turn stopped: the child is cancelled, nothing of the old turn lands in the new one (its
    `tool.completed` there made the parent unloadable), and the new turn runs normally."""

    def agents(script: list[Any]) -> list[so.Agent]:
        parent = scripted_agent("support", script, tools=[so.delegate("billing")])
        return [parent, scripted_agent("billing", [reply("Refund done.")])]

    delegate = call_tools(call("billing", call_id="d1", message="Refund order 1042"))
    async with (
        so.Runtime(agents([delegate, reply("Tried again.")]), store=store_url) as rt,
        so.Runtime(agents([reply("Tried again.")]), store=store_url, lease_wait=0) as other,
    ):
        sid = await rt.create_session("support", auth=ALICE)
        original = _subagents.RuntimeHost.create_child
        new_turn: list[str] = []

        async def create_child(
            host: _subagents.RuntimeHost, agent: str, parent_id: str, key: str, **kw: Any
        ) -> str:
            new_turn.append(await replace_turn(other, sid))
            return await original(host, agent, parent_id, key, **kw)

        monkeypatch.setattr(_subagents.RuntimeHost, "create_child", create_child)
        first = await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        monkeypatch.undo()
        # This process drove the new turn once its own stopped; its caller is told its turn ended.
        await assert_told_cancelled(rt, sid, first, new_turn[0], "Tried again.")
        started = await assert_only_the_new_turn(rt, sid, new_turn[0])
        assert started.data["message"] == "Try again"
        [row] = await rt.sessions(agent="billing")
        assert row.status == "cancelled", row
        assert await rt.verify_audit() == []


@pytest.mark.parametrize(
    ("label", "nth"),
    [("session.created", 1), ("tool.started", 2)],
    ids=["creating-and-starting-the-child", "driving-it"],
)
async def test_a_store_failure_in_a_delegate_call_fails_the_drive_not_the_call(
    store_url: str, label: str, nth: int
) -> None:
    """The store failing as the delegate call creates, starts or drives its child (the
    database down a moment) is the runtime's failure, as a step's record the store refuses:
    the drive fails with it and a retry goes on, rather than the model reading
    `StoreUnavailable` as what the billing agent answered."""
    ran: list[str] = []

    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        ran.append(order_id)
        return "paid"

    child = scripted_agent(
        "billing",
        [call_tools(call("lookup", order_id="7")), reply("Order 7 is paid.")],
        tools=[lookup],
    )
    after = Counted("Billing says it is paid.")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Is order 7 paid?")), after],
        tools=[so.delegate("billing")],
    )
    seen: list[str] = []

    def down_once(when: str, at: str) -> None:
        if when == "before" and at == label:
            seen.append(at)
            if len(seen) == nth:
                raise so.StoreUnavailable("the database is down")

    async with so.Runtime([parent, child], store=store_url) as rt:
        sid = await rt.create_session("support")
        rt.store.set_fault_hook(down_once)
        with pytest.raises(so.StoreUnavailable):
            await rt.generate(session_id=sid, prompt="Is order 7 paid?", auth=ALICE)
        rt.store.set_fault_hook(None)
        assert after.calls == 0
        async with asyncio.timeout(10):  # not waiting out the child's lease (30 s)
            done = await rt.generate(session_id=sid)
        assert (done.status, done.text) == ("completed", "Billing says it is paid.")
        [result] = tool_results(after.capture.last)
        assert (result.is_error, result.content) == (False, "Order 7 is paid.")
        assert ran == ["7"]
        log = [e async for e in rt.events(sid, follow=False)]
        assert [e.data["status"] for e in log if e.type == "tool.completed"] == ["ok"]


async def test_a_child_drive_that_loses_its_lease_is_waited_for_not_a_busy_error(
    store_url: str,
) -> None:
    """The child's drive gives up its lease when no renewal gets through (the database down a
    moment): the child is then another drive's, and the delegate call waits for it, driving
    it itself once the lease lapses, as for a child driven elsewhere. It read `SessionBusy` as
    its result, and the child was left running with no one to take its result."""
    ran: list[str] = []

    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        ran.append("start")
        await asyncio.sleep(1.5)
        ran.append("end")
        return "paid"

    child = scripted_agent(
        "billing",
        [call_tools(call("lookup", order_id="7")), reply("Order 7 is paid.")],
        tools=[lookup],
    )
    after = Counted("Billing says it is paid.")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Is order 7 paid?")), after],
        tools=[so.delegate("billing")],
    )
    async with so.Runtime([parent, child], store=store_url, lease_ttl=1.0) as rt:
        sid = await rt.create_session("support")
        renew = rt.store.renew_lease
        down: list[int] = []  # the child's first lease: none of its renewals gets through

        async def renew_lease(
            session_id: str, owner: str, token: int, ttl: float, now: float
        ) -> bool:
            if session_id != sid and (not down or down == [token]):
                down[:] = [token]
                raise so.StoreUnavailable("the database is down")
            return await renew(session_id, owner, token, ttl, now)

        rt.store.renew_lease = renew_lease  # type: ignore[method-assign]
        async with asyncio.timeout(20):
            done = await rt.generate(session_id=sid, prompt="Is order 7 paid?", auth=ALICE)
        assert (done.status, done.text) == ("completed", "Billing says it is paid.")
        [result] = tool_results(after.capture.last)
        assert (result.is_error, result.content) == (False, "Order 7 is paid.")
        assert ran == ["start", "start", "end"]  # stopped with its lease, run again under one
        [kid] = [s for s in await rt.sessions() if s.agent == "billing"]
        assert kid.status == "idle"
