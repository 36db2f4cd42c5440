"""Children that one model response of a parent delegates to share what the parent had left,
on both stores: each child's bound, checked before each of its model steps, counts what its
live siblings spent, read from the store, so three children of a parent with 10 tokens left
spend about 10 between them, not 10 each."""

from __future__ import annotations

from typing import Any

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

from ._subagents import ALICE, events


def tokens(n: int) -> so.Usage:
    return so.Usage(output_tokens=n)


def agents(parent_spent: int, child: so.Limits | None = None, **limits: Any) -> list[so.Agent]:
    """support's first step (costing `parent_spent`) delegates to orders three times; each
    orders child asks to refund (4 tokens), then, approved, looks up for ever (4 a step)."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    @so.tool
    async def look_up(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    calls = [call("orders", call_id=f"d{i}", message=f"refund {i}") for i in (1, 2, 3)]
    return [
        scripted_agent(
            "support",
            [call_tools(*calls, usage=tokens(parent_spent))],
            tools=[so.delegate("orders")],
            limits=so.Limits(**limits),
            repeat_last=True,
        ),
        scripted_agent(
            "orders",
            [
                call_tools(call("issue_refund", order_id="3"), usage=tokens(4)),
                call_tools(call("look_up", order_id="3"), usage=tokens(4)),
            ],
            tools=[issue_refund, look_up],
            limits=child,
            repeat_last=True,
        ),
    ]


async def test_children_of_one_response_share_what_the_parent_had_left(store_url: str) -> None:
    """The parent spent 90 of max_tokens=100 and delegates to three children at once. The
    first asks after 4 tokens; the second, 4 already spent by its sibling, asks after 4 more;
    the third after 4 more (8 < 10 when it checked). Approved, each finds its siblings' spend
    with its own past the 10 and fails: 12 between them, not 36, and the parent asks."""
    async with so.Runtime(agents(90, max_tokens=100), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1, 2 and 3", auth=ALICE)
        assert [m.kind for m in r.pending] == ["tool-approval"] * 3
        kids = [m.child.session_id for m in r.pending if m.child is not None]
        for kid in kids:
            assert (await events(rt, kid))[0].data["headroom"] == {"max_tokens": 10}
        answers = [so.InputResponse(request_id=m.id, option_id="approve") for m in r.pending]
        r = await rt.respond(r.session_id, answers, principal=ALICE)
        spent = [(await rt.state(kid)).usage.total_tokens for kid in kids]
        assert spent == [4, 4, 4]
        for kid in kids:
            turn = (await rt.state(kid)).turn
            assert turn is not None and turn.status == "failed" and turn.error is not None
            assert turn.error["code"] == "session_limit_reached"
            assert "less 8 spent since by its parent's other subagents" in turn.error["message"]
        assert r.status == "waiting"
        [limit] = r.pending
        assert limit.kind == "session-limit" and limit.child is None
        assert "102 of max_tokens=100 (12 of them by its subagents)" in (limit.question or "")


async def test_a_new_process_decides_the_same_from_the_store(store_url: str) -> None:
    """The children asked in one process; another, with nothing cached, runs them on once
    approved: it reads the siblings' spend from the store and stops them alike."""
    async with so.Runtime(agents(90, max_tokens=100), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1, 2 and 3", auth=ALICE)
    async with so.Runtime(agents(90, max_tokens=100), store=store_url) as rt:
        kids = [m.child.session_id for m in r.pending if m.child is not None]
        answers = [so.InputResponse(request_id=m.id, option_id="approve") for m in r.pending]
        r = await rt.respond(r.session_id, answers, principal=ALICE)
        assert [(await rt.state(kid)).usage.total_tokens for kid in kids] == [4, 4, 4]
        [limit] = r.pending
        assert "102 of max_tokens=100 (12 of them by its subagents)" in (limit.question or "")


async def test_a_sibling_that_ended_counts_through_the_parent(store_url: str) -> None:
    """The parent spent 80 of 100: its three children ask after 4 tokens each (12 < 20). The
    first, approved alone, runs until its spend and its waiting siblings' reach 20 (12 tokens:
    8 + 4 + 4 = 16, then 20); its call's end counts it in the parent. The second, approved,
    finds the first's 12 counted in the parent and the third's 4 live: 20 with its own 4, so
    it fails before another model call, and so does the third."""
    async with so.Runtime(agents(80, max_tokens=100), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1, 2 and 3", auth=ALICE)
        kids = [m.child.session_id for m in r.pending if m.child is not None]
        assert len(kids) == 3
        for m in r.pending:
            answer = [so.InputResponse(request_id=m.id, option_id="approve")]
            r = await rt.respond(r.session_id, answer, principal=ALICE)
        spent = [(await rt.state(kid)).usage.total_tokens for kid in kids]
        assert spent == [12, 4, 4]
        [limit] = r.pending
        assert "100 of max_tokens=100 (20 of them by its subagents)" in (limit.question or "")


async def test_children_of_a_parent_without_budgets_are_bounded_by_their_own(
    store_url: str,
) -> None:
    """A parent without budgets leaves nothing to share: each child runs to its own limits
    (`max_steps=4` here), whatever its siblings spent."""
    async with so.Runtime(agents(90, so.Limits(max_steps=4)), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1, 2 and 3", auth=ALICE)
        kids = [m.child.session_id for m in r.pending if m.child is not None]
        for kid in kids:
            assert "headroom" not in (await events(rt, kid))[0].data
        answers = [so.InputResponse(request_id=m.id, option_id="approve") for m in r.pending]
        await rt.respond(r.session_id, answers, principal=ALICE)
        assert [(await rt.state(kid)).usage.total_tokens for kid in kids] == [16, 16, 16]


async def test_grandchildren_share_what_the_top_had_left(store_url: str) -> None:
    """The top spent 90 of 100 and delegates to two children at once, each of which hands the
    task to a grandchild that asks after 4 tokens. Approved, the first grandchild stops at 8
    (its 8 with its cousin's 4 reach 10 past the top's 90), the second at once (the first's 8
    counted up the tree): 12 between them, not 24."""
    spec = agents(90, max_tokens=100)
    calls = [call("middle", call_id=f"d{i}", message=f"refund {i}") for i in (1, 2)]
    spec[0] = scripted_agent(
        "support",
        [call_tools(*calls, usage=tokens(90))],
        tools=[so.delegate("middle")],
        limits=so.Limits(max_tokens=100),
        repeat_last=True,
    )
    spec.append(
        scripted_agent(
            "middle",
            [call_tools(call("orders", call_id="m1", message="refund it"))],
            tools=[so.delegate("orders")],
            repeat_last=True,
        )
    )
    async with so.Runtime(spec, store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1 and 2", auth=ALICE)
        assert [m.kind for m in r.pending] == ["tool-approval"] * 2
        answers = [so.InputResponse(request_id=m.id, option_id="approve") for m in r.pending]
        r = await rt.respond(r.session_id, answers, principal=ALICE)
        grandchildren = [s.id for s in await rt.sessions(agent="orders")]
        spent = sorted([(await rt.state(g)).usage.total_tokens for g in grandchildren])
        assert spent == [4, 8]
        [limit] = r.pending
        assert "102 of max_tokens=100 (12 of them by its subagents)" in (limit.question or "")


def cousins(*, stock: bool = True) -> list[so.Agent]:
    """support (10 tokens, max_tokens=200) delegates to orders twice at once; each orders child
    (40) hands the task to stock, which asks to refund (30), then, approved, looks up for ever
    (10 a step); without `stock` when asked."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    @so.tool
    async def look_up(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    calls = [call("orders", call_id=f"d{i}", message=f"refund {i}") for i in (1, 2)]
    out = [
        scripted_agent(
            "support",
            [call_tools(*calls, usage=tokens(10)), reply("done")],
            tools=[so.delegate("orders")],
            limits=so.Limits(max_tokens=200),
        ),
        scripted_agent(
            "orders",
            [call_tools(call("stock", message="refund it"), usage=tokens(40)), reply("done")],
            tools=[so.delegate("stock")],
        ),
    ]
    if stock:
        out.append(
            scripted_agent(
                "stock",
                [
                    call_tools(call("issue_refund", order_id="3"), usage=tokens(30)),
                    call_tools(call("look_up", order_id="3"), usage=tokens(10)),
                ],
                tools=[issue_refund, look_up],
                repeat_last=True,
            )
        )
    return out


async def test_a_sibling_counted_short_shares_what_its_child_spent_past_the_count(
    store_url: str,
) -> None:
    """The first child is cancelled directly by a process without stock, leaving its grandchild
    waiting with 30 tokens: the call counts the child's 40 only, short. The second child's
    grandchild, approved, counts those 30 as its cousins': of the top's 200, 10 + 40 + 30 + 40
    leave it 80 in all (50 more), not 110."""
    async with so.Runtime(cousins(), store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 1 and 2", auth=ALICE)
        assert [m.kind for m in r.pending] == ["tool-approval"] * 2
        first, second = [m.child.session_id for m in r.pending if m.child is not None]
    async with so.Runtime(cousins(stock=False), store=store_url) as rt:
        await rt.cancel(first, principal=ALICE)
        assert set((await rt.state(r.session_id)).short) == {first}
    async with so.Runtime(cousins(), store=store_url) as rt:
        [grandchild] = [
            s.id
            for s in await rt.sessions(agent="stock")
            if (await rt.state(s.id)).parent == second
        ]
        # Answered on the grandchild itself: nothing drives the top (to count the rest) first.
        [asked] = (await rt.state(grandchild)).pending_requests()
        answer = [so.InputResponse(request_id=asked.id, option_id="approve")]
        await rt.respond(grandchild, answer, principal=ALICE)
        assert (await rt.state(grandchild)).usage == tokens(80)
