"""A subagent session whose delegated turn ended and which a message sent to it put on a turn of
its own (waiting on a person, say) is no orphan: the orphan sweep leaves it alone, and does not
even list it, so a sweep's cost does not grow with how many such sessions wait."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.testing import call, call_tools, reply, scripted_agent

from ._subagents import ALICE, two_step_children


def agents() -> list[so.Agent]:
    """`support` delegates to `billing`, whose delegated turn only replies; a message sent to
    the child afterwards proposes an approval-gated refund, so that turn waits on a person."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    child = scripted_agent(
        "billing",
        [reply("Looked into it."), call_tools(call("issue_refund", order_id="1042")), reply("ok")],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", id="d1", message="Look into order 1042")), reply("Done.")],
        tools=[so.delegate("billing")],
    )
    return [parent, child]


async def test_a_child_on_a_turn_of_its_own_is_not_listed_as_an_orphan(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, `orphaned_children` listed every such child (its parent idle), and each sweep
    read each one's events to find its turn was its own: 100 of them cost 100 reads and about
    100 ms a sweep on SQLite, for ever, for nothing."""
    async with so.Runtime(agents(), store=store_url) as rt:
        kids = []
        for _ in range(3):
            r = await rt.generate("support", prompt="Order 1042?", auth=ALICE)
            assert (r.status, r.text) == ("completed", "Done.")
            [kid] = [s.id for s in await rt.sessions(agent="billing") if s.id not in kids]
            own = await rt.send(kid, "Now refund it.", principal=ALICE)
            assert own.status == "waiting"
            kids.append(kid)
        listed = rt.store.orphaned_children  # type: ignore[attr-defined]
        assert await listed(["billing", "support"]) == []
        reads: list[str] = []
        read_events = rt.store.read_events

        async def counted(session_id: str, *args: Any, **kwargs: Any) -> list[so.Event]:
            reads.append(session_id)
            return await read_events(session_id, *args, **kwargs)

        monkeypatch.setattr(rt.store, "read_events", counted)
        assert await rt.expire_due() == 0
        assert reads == []
        for kid in kids:  # left alone: still waiting on its person
            state = await rt.state(kid)
            assert state.turn is not None and state.turn.status == "waiting"
            assert len(state.pending_requests()) == 1


async def test_a_message_cannot_take_the_first_turn_of_a_child_not_yet_started(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older signoff's delegate call created the child's session, then started its turn: two
    writes, the session listed (idle) between them. A message sent to it then became its first
    turn; the delegate call failed (`SessionBusy`) or took the message's turn as its own, and
    the message's turn was cancelled as its parent's ended (found by the retention load test).
    Such a message is refused (`SessionBusy`, nothing recorded); the delegated task runs."""
    from signoff._subagents import RuntimeHost

    two_step_children(monkeypatch)

    refused: list[Exception] = []
    start_child = RuntimeHost.start_child

    async def a_message_first(self: RuntimeHost, child: str, *args: Any) -> bool:
        try:
            await self.runtime.send(child, "Something else.", principal=ALICE)
        except so.SessionBusy as exc:
            refused.append(exc)
        return await start_child(self, child, *args)

    monkeypatch.setattr(RuntimeHost, "start_child", a_message_first)
    async with so.Runtime(agents(), store=store_url) as rt:
        r = await rt.generate("support", prompt="Order 1042?", auth=ALICE)
        assert (r.status, r.text) == ("completed", "Done.")
        [kid] = await rt.sessions(agent="billing")
        [turn] = [e for e in await rt.store.read_events(kid.id) if e.type == "turn.started"]
        assert turn.data["message"] == "Look into order 1042"
        assert (await rt.state(kid.id)).status == "idle"
        [busy] = refused
        assert "has not started yet" in str(busy)
