"""A subagent session whose delegated turn ended and which a message sent to it put on a turn of
its own (waiting on a person, say) is no orphan: the orphan sweep leaves it alone, and does not
even list it, so a sweep's cost does not grow with how many such sessions wait; and a parent's
cancel, or the sweep, that checked the delegated turn just before it ended cancels only that
turn, never the child's own one that began meanwhile."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff import _child_sessions
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
        [call_tools(call("billing", call_id="d1", message="Look into order 1042")), reply("Done.")],
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


def waiting_agents() -> list[so.Agent]:
    """As `agents`, but the child's delegated turn waits on an approval too (mirrored on the
    parent), and its own turn, begun by a message, waits on another."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042")),
            call_tools(call("issue_refund", call_id="again", order_id="1043")),
            reply("ok"),
        ],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund order 1042")), reply("unused")],
        tools=[so.delegate("billing")],
    )
    return [parent, child]


@pytest.mark.parametrize("by", ["parent_cancel", "sweep"])
async def test_a_parents_cancel_checked_before_the_child_moved_on_leaves_its_own_turn(
    store_url: str, monkeypatch: pytest.MonkeyPatch, by: str
) -> None:
    """The parent's cancel (or the orphan sweep, after a cancel that died before reaching the
    child) read the child's delegated turn; before it cancelled that turn, another process
    cancelled it and a message to the child began the child's own turn, waiting on a person.
    That own turn is left waiting: it used to be cancelled with the parent's reason, because
    the child was cancelled by session, not by the turn that was checked."""
    agents = waiting_agents()
    async with (
        so.Runtime(agents, store=store_url) as rt,
        so.Runtime(agents[1:], store=store_url) as other,
    ):
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        kid = mirror.child.session_id
        if by == "sweep":
            with monkeypatch.context() as m:  # the cancel reaches no child: as if it died there
                m.setattr(_child_sessions, "children", lambda requests: [])
                m.setattr(_child_sessions, "delegated", lambda state: [])
                assert (await rt.cancel(r.session_id, principal=ALICE)).cancelled
        own: list[str] = []
        cancel_child = _child_sessions._cancel_child

        async def moved_on_meanwhile(*args: Any) -> bool:
            await other.cancel(kid, "stop that refund", principal=ALICE)
            later = await other.send(kid, "Refund 1043 too.", principal=ALICE)
            assert later.status == "waiting" and later.turn_id is not None
            own.append(later.turn_id)
            return await cancel_child(*args)

        monkeypatch.setattr(_child_sessions, "_cancel_child", moved_on_meanwhile)
        if by == "sweep":
            await rt.expire_due()
        else:
            assert (await rt.cancel(r.session_id, "wrong customer", principal=ALICE)).cancelled
        state = await rt.state(kid)
        assert state.turn is not None and [state.turn.id] == own
        assert state.turn.status == "waiting" and len(state.pending_requests()) == 1
        reasons = [
            e.data["reason"] for e in await rt.store.read_events(kid) if e.type == "turn.cancelled"
        ]
        assert reasons == ["stop that refund"]


async def test_a_steer_checked_before_the_child_moved_on_leaves_its_own_turn(
    store_url: str,
) -> None:
    """A message steers the parent while its child waits on an approval: the delegate call
    reads the child's delegated turn and cancels it. Before that cancel, another process
    cancelled that turn and a message to the child began the child's own turn. That own turn is
    left waiting (the call's result is the delegated turn's, cancelled); it used to be
    cancelled as "steered"."""
    agents = waiting_agents()
    async with (
        so.Runtime(agents, store=store_url) as rt,
        so.Runtime(agents[1:], store=store_url) as other,
    ):
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        kid = mirror.child.session_id
        own: list[str] = []
        cancel = rt.cancel

        async def moved_on_meanwhile(session_id: str, *args: Any, **kwargs: Any) -> Any:
            if session_id == kid and not own:
                await other.cancel(kid, "stop that refund", principal=ALICE)
                later = await other.send(kid, "Refund 1043 too.", principal=ALICE)
                assert later.status == "waiting" and later.turn_id is not None
                own.append(later.turn_id)
            return await cancel(session_id, *args, **kwargs)

        rt.cancel = moved_on_meanwhile  # type: ignore[method-assign]
        steered = await rt.send(r.session_id, "Actually, leave it.", principal=ALICE)
        assert steered.status == "completed" and own
        state = await rt.state(kid)
        assert state.turn is not None and [state.turn.id] == own
        assert state.turn.status == "waiting" and len(state.pending_requests()) == 1
        cancels = [e for e in await rt.store.read_events(kid) if e.type == "turn.cancelled"]
        assert [e.data["reason"] for e in cancels] == ["stop that refund"]
