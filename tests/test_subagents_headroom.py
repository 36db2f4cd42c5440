"""A running subagent is bounded by what its parent's budget had left when it was created
(`headroom` in its `session.created`): its turn fails with `session_limit_reached` once it spent
that, its delegate call fails, and the parent asks to continue or stop at its next model step;
a grandchild is bounded by what the top had left, on both stores."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

from ._subagents import ALICE, events


def tokens(n: int) -> so.Usage:
    return so.Usage(output_tokens=n)


@so.tool
async def look_up(order_id: str) -> str:
    """Look an order up."""
    return "shipped"


def busy(name: str, each: so.Usage, **limits: Any) -> so.Agent:
    """A child that looks an order up at every model step (each costing `each`), for ever."""
    return scripted_agent(
        name,
        [call_tools(call("look_up", order_id="3"), usage=each)],
        tools=[look_up],
        limits=so.Limits(**limits),
        repeat_last=True,
    )


def delegating(name: str, to: str, first: so.Usage, **limits: Any) -> so.Agent:
    """An agent whose first step (costing `first`) delegates to `to`, then replies."""
    return scripted_agent(
        name,
        [call_tools(call(to, call_id="d1", message="look 3 up"), usage=first), reply("done")],
        tools=[so.delegate(to)],
        limits=so.Limits(**limits),
    )


async def created(rt: so.Runtime, session_id: str) -> dict[str, Any]:
    return (await events(rt, session_id))[0].data


async def test_a_child_stops_once_it_spent_what_its_parent_had_left(store_url: str) -> None:
    """The parent (max_tokens=100) spent 90 and delegates to a child whose own budget allows
    1000: the child's turn fails after 12 tokens (3 steps of 4, the first past 10), not 1000,
    and the parent, at 102, asks to continue or stop."""
    agents = [delegating("support", "orders", tokens(90), max_tokens=100)]
    agents.append(busy("orders", tokens(4), max_tokens=1000))
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        [child] = await rt.sessions(agent="orders")
        assert (await created(rt, child.id))["headroom"] == {"max_tokens": 10}
        kid = await rt.state(child.id)
        assert kid.usage == tokens(12)
        assert kid.turn is not None and kid.turn.status == "failed"
        assert kid.turn.error is not None
        assert kid.turn.error["code"] == "session_limit_reached"
        assert "10 its parent session had left" in kid.turn.error["message"]
        assert r.status == "waiting"
        [limit] = r.pending
        assert limit.kind == "session-limit" and limit.child is None
        assert "102 of max_tokens=100 (12 of them by its subagents)" in (limit.question or "")


async def test_a_grandchild_is_bounded_by_what_the_top_had_left(store_url: str) -> None:
    """Top (max_tokens=100) spent 50; its child, unbounded itself, spent 20 and delegates; the
    grandchild (its own max_cost_usd only) stops at 30, the child then stops at 50 spent (its
    headroom), and the top, at 100, asks."""
    agents = [
        delegating("support", "orders", tokens(50), max_tokens=100),
        delegating("orders", "stock", tokens(20)),
        busy("stock", tokens(10), max_cost_usd=5.0),
    ]
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        [child] = await rt.sessions(agent="orders")
        [grandchild] = await rt.sessions(agent="stock")
        assert (await created(rt, child.id))["headroom"] == {"max_tokens": 50}
        assert (await created(rt, grandchild.id))["headroom"] == {"max_tokens": 30}
        g = await rt.state(grandchild.id)
        assert g.usage == tokens(30)
        assert g.turn is not None and g.turn.status == "failed"
        c = await rt.state(child.id)
        assert (c.usage, c.delegated) == (tokens(20), tokens(30))
        assert c.turn is not None and c.turn.status == "failed"
        assert r.status == "waiting"
        [limit] = r.pending
        assert "100 of max_tokens=100 (50 of them by its subagents)" in (limit.question or "")


async def test_a_cost_budget_bounds_by_cost_and_no_budget_by_nothing(store_url: str) -> None:
    """A cost budget leaves its remainder as a cost; a parent without budgets gives none, and
    the child runs to its own budget alone."""
    agents = [
        delegating("support", "orders", so.Usage(input_tokens=1, cost_usd=1.9), max_cost_usd=2.0),
        busy("orders", so.Usage(input_tokens=1, cost_usd=0.04), max_cost_usd=10.0),
    ]
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        [child] = await rt.sessions(agent="orders")
        headroom = (await created(rt, child.id))["headroom"]
        assert set(headroom) == {"max_cost_usd"}
        assert abs(headroom["max_cost_usd"] - 0.1) < 1e-9
        assert abs((await rt.state(child.id)).usage.cost_usd - 0.12) < 1e-9  # 3 steps, not 250
        assert r.status == "waiting"
    free = [delegating("support", "orders", tokens(90)), busy("orders", tokens(4), max_tokens=20)]
    async with so.Runtime(free, store=store_url) as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        [limit] = r.pending  # its own budget spent, the child asks to raise it
        assert limit.kind == "session-limit" and limit.child is not None
        kid = limit.child.session_id
        assert "headroom" not in await created(rt, kid)
        assert (await rt.state(kid)).usage == tokens(20)


@pytest.mark.parametrize("answer", ["continue", "stop"])
async def test_a_child_whose_next_call_would_not_fit_its_share_makes_the_parent_ask(
    store_url: str, answer: str
) -> None:
    """The parent (max_tokens=200) spent 10 and delegates: the child's first reply reads 100
    tokens and writes 10, leaving 80 of its share, which its next call (reading at least 100)
    cannot fit, so it fails on its parent's share. The parent, at 120 of 200, asks to continue
    or stop at its next model step (docs/subagents.md); before, its model read the failure and
    went on, nobody asked. `continue` raises its budget and goes on; `stop` ends the turn."""
    agents = [
        delegating("support", "orders", so.Usage(input_tokens=10), max_tokens=200),
        busy("orders", so.Usage(input_tokens=100, output_tokens=10)),
    ]
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        [child] = await rt.sessions(agent="orders")
        kid = (await rt.state(child.id)).turn
        assert kid is not None and kid.error is not None
        assert "not one output token of what its parent session had left" in kid.error["message"]
        assert r.status == "waiting"
        [limit] = r.pending
        assert limit.kind == "session-limit" and limit.child is None
        [ended] = [e for e in await events(rt, r.session_id) if e.type == "tool.completed"]
        assert ended.data["share_spent"] == child.id
        question = limit.question or ""
        assert f"its subagent (session {child.id}) stopped on what" in question
        assert "120 of max_tokens=200 (110 of them by its subagents)" in question
        reply_ = so.InputResponse(request_id=limit.id, option_id=answer)
        r = await rt.respond(r.session_id, [reply_], principal=ALICE)
        if answer == "continue":
            assert (r.status, r.text) == ("completed", "done")
        else:
            assert r.status == "failed" and r.error is not None
            assert r.error["code"] == "session_limit_reached"
            assert "the person chose to stop" in r.error["message"]
        assert len(await rt.sessions(agent="orders")) == 1


@pytest.mark.parametrize("own", [None, 1000])
async def test_a_middle_session_on_its_share_fails_in_turn_and_the_top_asks(
    store_url: str, own: int | None
) -> None:
    """As above, a level down: the grandchild stops on its share, which its parent (no budget of
    its own, or one that leaves more) had from the top. That parent cannot raise the top's
    budget, so it fails on its share in turn, and the top (130 of 200) asks."""
    limits = {} if own is None else {"max_tokens": own}
    agents = [
        delegating("support", "orders", so.Usage(input_tokens=10), max_tokens=200),
        delegating("orders", "stock", so.Usage(input_tokens=10), **limits),
        busy("stock", so.Usage(input_tokens=100, output_tokens=10)),
    ]
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        [child] = await rt.sessions(agent="orders")
        [grandchild] = await rt.sessions(agent="stock")
        c = (await rt.state(child.id)).turn
        assert c is not None and c.status == "failed" and c.error is not None
        assert f"its subagent (session {grandchild.id}) stopped" in c.error["message"]
        assert "its parent session had left when it delegated" in c.error["message"]
        [limit] = r.pending
        assert limit.kind == "session-limit" and limit.child is None
        question = limit.question or ""
        assert f"its subagent (session {child.id}) stopped on what" in question
        assert "130 of max_tokens=200 (120 of them by its subagents)" in question


async def test_a_child_whose_own_budget_and_share_are_spent_at_once_fails_on_the_share(
    store_url: str,
) -> None:
    """The parent (max_tokens=60) spent 10 and delegates to a child of max_tokens=50: after ten
    steps of 5 the child spent both its own budget and its share. It fails on the share rather
    than asking (docs/subagents.md): a `continue` raising its own would fail it at once, and
    the parent ask again. It used to ask that pointless question first; now the parent asks."""
    agents = [delegating("support", "orders", tokens(10), max_tokens=60)]
    agents.append(busy("orders", tokens(5), max_tokens=50))
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="where is 3?", auth=ALICE)
        [child] = await rt.sessions(agent="orders")
        kid = await rt.state(child.id)
        assert kid.usage == tokens(50) and kid.raised == {}
        assert kid.turn is not None and kid.turn.error is not None
        assert kid.turn.error["code"] == "session_limit_reached"
        assert "past the 50 its parent session had left" in kid.turn.error["message"]
        assert not [q for q in kid.requests.values() if q.request.kind == "session-limit"]
        [limit] = r.pending
        assert limit.kind == "session-limit" and limit.child is None
        assert "60 of max_tokens=60 (50 of them by its subagents)" in (limit.question or "")
