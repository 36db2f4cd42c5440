"""`_child_closes`: a subagent's request closing on its own (answered on the subagent, its
deadline) closes every mirror of it up the chain at once, and a listing or sweep that goes on
with the parent waits for no other drive holding it. Both stores."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import signoff as so
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, tool_results

from ._subagents import ALICE


class _Chain:
    """`support` delegating to `billing`, delegating to `ledger`, whose refund needs approval
    and, approved, runs until `release` is set (`started` set as it starts)."""

    def __init__(self) -> None:
        self.started, self.release = asyncio.Event(), asyncio.Event()
        started, release = self.started, self.release

        @so.tool(approval=so.always())
        async def issue_refund(order_id: str) -> str:
            """Refund an order (slowly)."""
            started.set()
            await release.wait()
            return "refunded"

        def said(name: str) -> Any:
            return lambda conv: reply(f"{name}: {tool_results(conv)[-1].content}")

        self.agents = [
            scripted_agent(
                "support",
                [call_tools(call("billing", message="refund 3")), said("support")],
                tools=[so.delegate("billing")],
            ),
            scripted_agent(
                "billing",
                [call_tools(call("ledger", message="refund 3")), said("billing")],
                tools=[so.delegate("ledger")],
            ),
            scripted_agent(
                "ledger",
                [call_tools(call("issue_refund", order_id="3")), said("ledger")],
                tools=[issue_refund],
            ),
        ]


async def test_answering_a_grandchild_directly_closes_the_top_mirror_while_its_tool_runs(
    store_url: str,
) -> None:
    """support -> billing -> ledger; ledger's request answered on ledger, its approved refund
    running: support's mirror stayed `pending` (listed by `rt.pending()`, support `waiting`)
    for the whole of the refund, and a denial through it was refused `ConflictingAnswer`.
    Only billing's mirror (the one on ledger's own parent) closed. Now support's closes with
    it, as with one level."""
    tree = _Chain()
    async with so.Runtime(tree.agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        [top] = r.pending
        [bottom] = [p for p in await rt.pending() if p.agent == "ledger"]
        answer = so.InputResponse(request_id=bottom.id, option_id="approve")
        direct = asyncio.create_task(rt.respond(bottom.session_id, [answer], principal=ALICE))
        await asyncio.wait_for(tree.started.wait(), 10)
        assert await rt.pending() == []
        state = await rt.state(r.session_id)
        assert state.requests[top.id].status == "settled"
        assert state.status == "running"
        deny = so.InputResponse(request_id=top.id, option_id="cancel")
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(r.session_id, [deny], principal=ALICE, resume=False)
        tree.release.set()
        assert (await asyncio.wait_for(direct, 10)).status == "completed"
        done = await rt.state(r.session_id)
        assert done.turn is not None and done.turn.status == "completed"
        assert done.turn.text == "support: billing: ledger: refunded"


def _deadline_tree(ran: list[str]) -> list[so.Agent]:
    """`support` delegating to `ledger`, whose refund is approved once its 60 s deadline passes
    (`ran` told when it runs)."""

    @so.tool(approval=so.always(expires_in=60, on_timeout="approve"))
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    return [
        scripted_agent(
            "support",
            [
                call_tools(call("ledger", message="refund 3")),
                lambda conv: reply(f"support: {tool_results(conv)[-1].content}"),
            ],
            tools=[so.delegate("ledger")],
        ),
        scripted_agent(
            "ledger",
            [call_tools(call("issue_refund", order_id="3")), reply("ledger: refunded")],
            tools=[issue_refund],
        ),
    ]


@pytest.mark.parametrize("how", ["pending", "expire_due"])
async def test_a_read_going_on_after_a_subagent_waits_for_no_drive_holding_its_parent(
    store_url: str, how: str
) -> None:
    """A listing (`rt.pending()`, `GET /v1/requests`) or a sweep records a subagent's passed
    deadline and drives its turn; its parent's lease is held by another process's drive (a
    slow tool of the parent's running beside the delegate call). The read then waited
    `lease_wait` (10 s) for that drive: every listing took 10 s. It leaves the parent to its
    holder at once; once that drive is gone without going on, a sweep goes on with it (its
    mirror closed by a deadline)."""
    ran: list[str] = []
    clock = ManualClock()
    async with so.Runtime(_deadline_tree(ran), store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        clock.advance(61)
        token = await rt.store.acquire_lease(r.session_id, "another", 30.0, clock.now)
        assert token is not None
        started = time.monotonic()
        if how == "pending":
            assert await rt.pending() == []
        else:
            await rt.expire_due()
        assert time.monotonic() - started < 5, rt.lease_wait
        assert ran == ["3"]
        kid = (await rt.state(mirror.child.session_id)).turn
        assert kid is not None and kid.status == "completed"
        state = await rt.state(r.session_id)
        assert state.requests[mirror.id].status == "expired"
        assert state.status == "running"  # its holder's to go on with
        await rt.store.release_lease(r.session_id, "another", token)
        await rt.expire_due()
        done = (await rt.state(r.session_id)).turn
        assert done is not None and done.status == "completed"
        assert done.text == "support: ledger: refunded"
