"""Whose budget a subagent spends: what a delegate call's child (and its own children) spent is
recorded on the call's `tool.completed` as `delegated` and counts against the parent's token and
cost budgets, once, however the child's turn ended and across a restart."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent, tool_results

from ._subagents import ALICE, Counted, events


def tokens(n: int) -> so.Usage:
    return so.Usage(input_tokens=n)


def orders(spent: so.Usage) -> so.Agent:
    """A child whose one reply costs `spent`."""
    return scripted_agent("orders", [reply("Order 3 shipped.", usage=spent)])


def support(after: Counted, **limits: Any) -> so.Agent:
    """A parent that delegates once (its own step costs 10 tokens), then answers with `after`."""
    return scripted_agent(
        "support",
        [call_tools(call("orders", call_id="d1", message="where is 3?"), usage=tokens(10)), after],
        tools=[so.delegate("orders")],
        limits=so.Limits(**limits),
    )


async def delegated_on_the_call(rt: so.Runtime, session_id: str) -> list[Any]:
    """The `delegated` of each `tool.completed` of the session (None where it has none)."""
    return [
        e.data.get("delegated") for e in await events(rt, session_id) if e.type == "tool.completed"
    ]


async def test_a_childs_spend_past_the_parents_max_tokens_parks_the_parent(
    store_url: str,
) -> None:
    """The child spends 150 tokens; the parent's own 10 are far below its max_tokens=100, but
    its next model step asks to continue or stop, exactly as its own spending would."""
    after = Counted("It shipped.")
    async with so.Runtime(
        [support(after, max_tokens=100), orders(tokens(150))], store=store_url
    ) as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        assert r.status == "waiting" and after.calls == 0
        [limit] = r.pending
        assert limit.kind == "session-limit" and limit.child is None
        assert [o.id for o in limit.options] == ["continue", "stop"]
        assert "160 of max_tokens=100" in (limit.question or "")
        assert "150 of them by its subagents" in (limit.question or "")
        state = await rt.state(r.session_id)
        assert state.usage == tokens(10)  # its own model calls only
        assert state.delegated == tokens(150)
        [child] = await rt.sessions(agent="orders")
        assert (await rt.state(child.id)).usage == tokens(150)
        assert await delegated_on_the_call(rt, r.session_id) == [tokens(150).model_dump()]
        done = await rt.send(r.session_id, "continue", principal=ALICE)
        assert done.status == "completed" and done.text == "It shipped." and after.calls == 1
        assert tool_results(after.capture.last)[0].content == "Order 3 shipped."
        assert (await rt.state(r.session_id)).delegated == tokens(150)


async def test_a_childs_cost_counts_against_max_cost_usd_and_stop_fails_the_turn(
    store_url: str,
) -> None:
    after = Counted("unused")
    dear = so.Usage(input_tokens=1, cost_usd=0.75)
    agents = [support(after, max_cost_usd=0.5), orders(dear)]
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        [limit] = r.pending
        assert limit.kind == "session-limit"
        assert "cost 0.7500 of max_cost_usd=0.5" in (limit.question or "")
        done = await rt.send(r.session_id, "stop", principal=ALICE)
        assert done.status == "failed" and after.calls == 0
        assert done.error is not None and done.error["code"] == "session_limit_reached"


def unpriced(name: str) -> so.Agent:
    """An agent on a provider model signoff knows no price for (it counts every reply free)."""
    model = so.models.OpenAIChat("qwen3:8b", base_url="http://127.0.0.1:9/v1", api_key="k")
    return so.Agent(name=name, model=model)


def test_a_cost_budget_over_a_subagent_of_no_known_price_is_a_usage_error() -> None:
    """A parent's `max_cost_usd` bounds what its subagents spend, but a child on a provider
    model of no known price counts every reply as costing 0: one that read 2,000,000 tokens and
    wrote 500,000 added $0 to the parent's `delegated` under `max_cost_usd=0.01` (measured
    against a fake OpenAI server). `Agent` refuses such a budget over its own model; a runtime
    now refuses it over a subagent's, however deep, naming the two agents."""
    boss = support(Counted("unused"), max_cost_usd=0.01)
    with pytest.raises(so.UsageError, match=r"'support' bounds its cost .* delegates to 'orders'"):
        so.Runtime([boss, unpriced("orders")], store="sqlite:///:memory:")
    middle = scripted_agent("orders", [reply("ok")], tools=[so.delegate("stock")])
    with pytest.raises(so.UsageError, match=r"delegates to 'stock', whose model"):
        so.Runtime([boss, middle, unpriced("stock")], store="sqlite:///:memory:")
    # The auto() reviewer of one of the subagent's tools spends the parent's budget too.
    unknown = so.models.OpenAIChat("qwen3:8b", base_url="http://127.0.0.1:9/v1", api_key="k")

    @so.tool(approval=so.auto(unknown))
    async def restock(sku: str) -> str:
        """Restock an item."""
        return sku

    reviewed = scripted_agent("orders", [reply("ok")], tools=[restock])
    with pytest.raises(so.UsageError, match=r"delegates to 'orders', whose model OpenAIChat"):
        so.Runtime([boss, reviewed], store="sqlite:///:memory:")
    # A price of 0 said so, a token budget only, or a runtime without the child: no problem.
    free = so.models.OpenAIChat("qwen3:8b", base_url="http://127.0.0.1:9/v1", price_per_mtok=(0, 0))
    so.Runtime([boss, so.Agent(name="orders", model=free)], store="sqlite:///:memory:")
    tokens_only = support(Counted("unused"), max_tokens=1000)
    so.Runtime([tokens_only, unpriced("orders")], store="sqlite:///:memory:")
    so.Runtime([boss], store="sqlite:///:memory:")
    so.Runtime([middle, unpriced("stock")], store="sqlite:///:memory:")


async def test_a_scheduled_parent_over_budget_through_its_child_fails(store_url: str) -> None:
    """Nobody can raise a scheduled turn's budget: the delegated spend fails it as its own
    spending does (`SessionLimitReached`)."""
    after = Counted("unused")
    async with so.Runtime(
        [support(after, max_tokens=100), orders(tokens(150))], store=store_url
    ) as rt:
        with pytest.raises(so.SessionLimitReached, match="160 of max_tokens=100"):
            await rt.schedule("support", "where is 3?")
        assert after.calls == 0


async def test_a_grandchilds_spend_counts_once(store_url: str) -> None:
    """front -> desk -> billing: the desk's delegate call records billing's 100 tokens, the
    front's records the desk's 20 plus those 100, and the front's budget sees 121, not 221."""
    billing = scripted_agent("billing", [reply("refunded", usage=tokens(100))])
    desk = scripted_agent(
        "desk",
        [
            call_tools(call("billing", message="refund 1042"), usage=tokens(10)),
            reply("billing refunded it", usage=tokens(10)),
        ],
        tools=[so.delegate("billing")],
    )
    after = Counted("All sorted.")
    front = scripted_agent(
        "front",
        [call_tools(call("desk", message="sort out 1042"), usage=tokens(1)), after],
        tools=[so.delegate("desk")],
        limits=so.Limits(max_tokens=150),  # 121 fits; 221 (billing counted twice) would not
    )
    async with so.Runtime([front, desk, billing], store=store_url) as rt:
        r = await rt.generate("front", prompt="sort out 1042", auth=ALICE)
        assert r.status == "completed" and r.text == "All sorted." and after.calls == 1
        top = await rt.state(r.session_id)
        assert (top.usage, top.delegated) == (tokens(1), tokens(120))
        [middle] = await rt.sessions(agent="desk")
        mid = await rt.state(middle.id)
        assert (mid.usage, mid.delegated) == (tokens(20), tokens(100))
        [bottom] = await rt.sessions(agent="billing")
        low = await rt.state(bottom.id)
        assert (low.usage, low.delegated) == (tokens(100), so.Usage())


async def test_a_failed_child_turns_spend_counts(store_url: str) -> None:
    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    child = scripted_agent(
        "orders",
        [call_tools(call("lookup", order_id="3"), usage=tokens(70)), ConnectionError("down")],
        tools=[lookup],
    )
    after = Counted("The orders agent is down.")
    async with so.Runtime([support(after, max_tokens=1000), child], store=store_url) as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        assert r.status == "completed" and after.calls == 1
        [result] = tool_results(after.capture.last)
        assert result.is_error and result.content["error"].startswith("SubagentFailed: ")
        assert (await rt.state(r.session_id)).delegated == tokens(70)


async def test_an_interrupted_childs_spend_counts(store_url: str) -> None:
    """A message steering the parent cancels the child waiting on an approval: what the child
    spent before it waited is the parent's too."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    child = scripted_agent(
        "orders",
        [call_tools(call("issue_refund", order_id="3"), usage=tokens(40)), reply("done")],
        tools=[issue_refund],
    )
    after = Counted("Okay, dropped it.")
    async with so.Runtime([support(after, max_tokens=1000), child], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        assert (await rt.state(r.session_id)).delegated == so.Usage()  # the call has not ended
        done = await rt.send(r.session_id, "actually, forget it", principal=ALICE)
        assert done.status == "completed" and after.calls == 1
        [result] = tool_results(after.capture.last)
        assert result.content == {"interrupted": True, "session_id": mirror.child.session_id}
        assert (await rt.state(r.session_id)).delegated == tokens(40)


async def test_a_replayed_delegate_call_counts_its_child_once(store_url: str) -> None:
    """The child asks for an approval, so the delegate call runs twice (parked, then replayed
    once answered): its child's spend, 40 + 5 tokens, is recorded once, at its end."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    child = scripted_agent(
        "orders",
        [
            call_tools(call("issue_refund", order_id="3"), usage=tokens(40)),
            reply("Refunded.", usage=tokens(5)),
        ],
        tools=[issue_refund],
    )
    after = Counted("Done.")
    async with so.Runtime([support(after, max_tokens=1000), child], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        done = await rt.send(r.session_id, "approve", principal=ALICE)
        assert done.status == "completed" and after.calls == 1
        assert (await rt.state(r.session_id)).delegated == tokens(45)
        assert await delegated_on_the_call(rt, r.session_id) == [tokens(45).model_dump()]


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("restart", [False, True], ids=["same-process", "new-process"])
async def test_a_failure_recording_the_calls_end_neither_loses_nor_doubles_the_spend(
    store_url: str, when: str, restart: bool
) -> None:
    """The child's turn ended; the parent's record of the delegate call's end fails (before its
    commit: nothing recorded; after it: recorded, the drive failed). Resuming the parent, in
    this process or a new one on the same store, counts the child's 150 tokens exactly once."""
    refused: list[str] = []

    def full(moment: str, label: str) -> None:
        if moment == when and label == "tool.completed" and not refused:
            refused.append(label)
            raise so.StoreError("could not extend file: No space left on device")

    after = Counted("It shipped.")
    agents = [support(after, max_tokens=1000), orders(tokens(150))]
    async with so.Runtime(agents, store=store_url) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        rt.store.set_fault_hook(full)
        with pytest.raises(so.StoreError, match="No space left"):
            await rt.generate(session_id=sid, prompt="where is 3?", auth=ALICE)
        rt.store.set_fault_hook(None)
        if not restart:
            done = await rt.generate(session_id=sid, auth=ALICE)
    if restart:
        async with so.Runtime(agents, store=store_url) as rt2:
            done = await rt2.generate(session_id=sid, auth=ALICE)
    assert refused == ["tool.completed"]
    assert done.status == "completed" and done.text == "It shipped." and after.calls == 1
    async with so.Runtime(agents, store=store_url) as rt3:
        state = await rt3.state(sid)
        assert (state.usage, state.delegated) == (tokens(10), tokens(150))
        assert await delegated_on_the_call(rt3, sid) == [tokens(150).model_dump()]
        [child] = await rt3.sessions(agent="orders")
        turns = [e.type for e in await events(rt3, child.id)].count("turn.started")
        assert turns == 1  # the child ran once


async def test_a_child_answered_directly_by_a_process_that_died_counts_once(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's approval is answered on the child and its turn ends, and that process dies
    before telling the parent: the worker that carries the parent on records the child's spend
    with the call's end, once."""
    from signoff import _child_sessions

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    def agents(after: Counted) -> list[so.Agent]:
        child = scripted_agent(
            "orders",
            [
                call_tools(call("issue_refund", order_id="3"), usage=tokens(40)),
                reply("Refunded.", usage=tokens(5)),
            ],
            tools=[issue_refund],
        )
        return [support(after, max_tokens=1000), child]

    async def died(rt: so.Runtime, session_id: str) -> None:
        return None

    async with so.Runtime(agents(Counted("unused")), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        with monkeypatch.context() as m:
            m.setattr(_child_sessions, "after_drive", died)
            answered = await rt.respond(
                mirror.child.session_id,
                [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
                principal=ALICE,
            )
        assert answered.status == "completed"
        assert (await rt.state(r.session_id)).delegated == so.Usage()
    after = Counted("Refund done.")
    async with so.Runtime(agents(after), store=store_url, inline=False, lease_ttl=2.0) as worker:
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        try:
            for _ in range(250):
                turn = (await worker.state(r.session_id)).turn
                if turn is not None and turn.status == "completed":
                    break
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(working, 10)
        state = await worker.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed", state.status
        assert after.calls == 1
        assert state.delegated == tokens(45)
        assert await delegated_on_the_call(worker, r.session_id) == [tokens(45).model_dump()]


async def test_the_http_api_and_the_dashboard_show_what_subagents_spent(tmp_path: Path) -> None:
    """`GET /v1/sessions/{id}` has `delegated` beside `usage` (its own), and the dashboard's
    session header shows it as Subagents (left out for a session that delegated nothing)."""
    from signoff.server import create_app

    after = Counted("It shipped.")
    spent = so.Usage(input_tokens=1200, output_tokens=80, cost_usd=0.0042)
    agents = [support(after), orders(spent)]
    async with so.Runtime(agents, store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        [child] = await rt.sessions(agent="orders")
        transport = httpx.ASGITransport(app=create_app(rt, dev=True))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            view = (await c.get(f"/v1/sessions/{r.session_id}")).json()
            assert view["usage"] == tokens(10).model_dump()
            assert view["delegated"] == spent.model_dump()
            assert (await c.get(f"/v1/sessions/{child.id}")).json()["delegated"] == (
                so.Usage().model_dump()
            )
            page = (await c.get(f"/_signoff/sessions/{r.session_id}")).text
            assert "<dt>Subagents</dt><dd>1,280 tokens · $0.0042</dd>" in page
            assert "<dt>Subagents</dt>" not in (await c.get(f"/_signoff/sessions/{child.id}")).text


@so.tool(approval=True)
async def refund(order_id: str) -> str:
    """Refund an order."""
    return f"refunded {order_id}"


@pytest.mark.parametrize("kind", ["session-limit", "tool-approval"])
async def test_a_requests_run_so_far_counts_what_subagents_spent(tmp_path: Path, kind: str) -> None:
    """The child spent 150 tokens, the parent 10: the request the parent asks next (at 160 of
    max_tokens=100, "150 of them by its subagents", or an approval of a refund) records the
    run's 160 as its `usage`, as its question counts it: the HTTP API's request and the
    dashboard's "Run so far" show it. Before, they showed the parent's own 10 beside a
    question that said 160."""
    from signoff.server import create_app

    steps = [
        call_tools(call("orders", call_id="d1", message="where is 3?"), usage=tokens(10)),
        call_tools(call("refund", call_id="r1", order_id="3")),
        reply("Refunded."),
    ]
    limits = so.Limits(max_tokens=100) if kind == "session-limit" else None
    parent = scripted_agent("support", steps, tools=[so.delegate("orders"), refund], limits=limits)
    async with so.Runtime([parent, orders(tokens(150))], store=f"sqlite:///{tmp_path}/s.db") as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        [asked] = r.pending
        assert asked.kind == kind and asked.child is None
        if kind == "session-limit":
            assert "160 of max_tokens=100 (150 of them by its subagents)" in (asked.question or "")
        assert asked.usage == tokens(160)
        transport = httpx.ASGITransport(app=create_app(rt, dev=True))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            view = (await c.get(f"/v1/sessions/{r.session_id}")).json()
            assert [p["usage"] for p in view["pending"]] == [tokens(160).model_dump()]
            page = (await c.get(f"/_signoff/sessions/{r.session_id}")).text
            card = page[page.index(f'id="{asked.id}"') :]
            assert "<dt>Run so far</dt><dd>160 tokens" in card[: card.index("</article>")]
