"""A grandchild's spend reaches the top once, on both stores: a child is counted in its parent
only with its own children counted in it (a process that died between cancelling the child and
counting the grandchild leaves that to the next count), and a grandchild counted later (left to
a process that has its agent) is carried on up."""

from __future__ import annotations

import contextlib

import httpx
import pytest

import signoff as so
from signoff import _child_sessions
from signoff.server import create_app
from signoff.testing import call, call_tools, reply, scripted_agent

from ._subagents import ALICE, events


def tokens(n: int) -> so.Usage:
    return so.Usage(input_tokens=n)


def agents(*, stock: bool = True) -> list[so.Agent]:
    """support (10 tokens) delegates to orders (40), which delegates to stock (30), whose refund
    waits for approval; without `stock` when asked."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    out = [
        scripted_agent(
            "support",
            [call_tools(call("orders", message="refund 3"), usage=tokens(10))],
            tools=[so.delegate("orders")],
            repeat_last=True,
        ),
        scripted_agent(
            "orders",
            [call_tools(call("stock", message="refund 3"), usage=tokens(40))],
            tools=[so.delegate("stock")],
            repeat_last=True,
        ),
    ]
    if stock:
        out.append(
            scripted_agent(
                "stock",
                [call_tools(call("issue_refund", order_id="3"), usage=tokens(30))],
                tools=[issue_refund],
                repeat_last=True,
            )
        )
    return out


async def nested(rt: so.Runtime) -> tuple[str, str, str]:
    """A turn of support whose grandchild waits: the top's, the child's, the grandchild's ids."""
    r = await rt.generate("support", prompt="refund 3", auth=ALICE)
    assert [m.kind for m in r.pending] == ["tool-approval"]
    [child] = await rt.sessions(agent="orders")
    [grandchild] = await rt.sessions(agent="stock")
    return r.session_id, child.id, grandchild.id


async def spent(rt: so.Runtime, session_id: str) -> list[str]:
    return [
        e.data["session_id"] for e in await events(rt, session_id) if e.type == "subagent.spent"
    ]


async def test_a_child_counted_after_a_failure_counting_its_grandchild_carries_it(
    store_url: str,
) -> None:
    """Cancelling the top cancels the child and the grandchild; recording the grandchild's 30
    tokens in the child fails (as a process dying there would leave it). The top's next cancel
    counts the grandchild in the child first, so the top counts 70, not 40, once."""
    refused: list[str] = []

    def full(moment: str, label: str) -> None:
        if moment == "before" and label == "subagent.spent" and not refused:
            refused.append(label)
            raise so.StoreError("could not extend file: No space left on device")

    async with so.Runtime(agents(), store=store_url) as rt:
        top, child, grandchild = await nested(rt)
        rt.store.set_fault_hook(full)
        with pytest.raises(so.StoreError, match="No space left"):
            await rt.cancel(top, principal=ALICE)
        rt.store.set_fault_hook(None)
        for sid in (child, grandchild):
            turn = (await rt.state(sid)).turn
            assert turn is not None and turn.status == "cancelled"
        assert (await rt.state(top)).delegated == so.Usage()
        await rt.cancel(top, principal=ALICE)
        assert (await rt.state(child)).delegated == tokens(30)
        assert (await rt.state(top)).delegated == tokens(70)
        assert (await spent(rt, top), await spent(rt, child)) == ([child], [grandchild])
        await rt.cancel(top, principal=ALICE)
        assert (await rt.state(top)).delegated == tokens(70)


async def test_a_grandchild_counted_after_its_parent_ended_reaches_the_top(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process cancelling the top dies after cancelling the child, before reaching the
    grandchild, which is left waiting: the child, though cancelled, is not counted in the top
    yet. The orphan sweep cancels the grandchild and counts it in the child, and the child in
    the top: 70 tokens, once."""
    async with so.Runtime(agents(), store=store_url) as rt:
        top, child, grandchild = await nested(rt)
        listed, journaled = _child_sessions.children, _child_sessions.delegated
        with monkeypatch.context() as m:
            m.setattr(
                _child_sessions,
                "children",
                lambda requests: [k for k in listed(requests) if k != grandchild],
            )
            m.setattr(
                _child_sessions,
                "delegated",
                lambda state: [k for k in journaled(state) if k != grandchild],
            )

            async def unreached(rt: so.Runtime, state: so.SessionState) -> bool:
                return False

            m.setattr(_child_sessions, "cancel_orphan", unreached)
            await rt.cancel(top, principal=ALICE)
        turn = (await rt.state(grandchild)).turn
        assert turn is not None and turn.status == "waiting"  # left for the sweep
        assert (await rt.state(top)).delegated == so.Usage()  # not without the grandchild's
        assert await rt.expire_due() == 1
        assert (await rt.state(child)).delegated == tokens(30)
        assert (await rt.state(top)).delegated == tokens(70)
        assert await rt.expire_due() == 0
        assert (await spent(rt, top), await spent(rt, child)) == ([child], [grandchild])


async def test_a_grandchild_counted_after_the_childs_next_turn_started_reaches_the_top(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but a message sent to the child starts its next turn (which delegates anew)
    before the sweep: the end of that turn's drive counts what the child's cancelled delegated
    turn owes (`counted_once_stopped`), the grandchild cancelled and counted in the child after
    that turn started, which still belongs to the delegated turn's figure, and reaches the top:
    70 tokens, once. The sweep then has nothing left to do."""
    async with so.Runtime(agents(), store=store_url) as rt:
        top, child, grandchild = await nested(rt)
        listed, journaled = _child_sessions.children, _child_sessions.delegated
        with monkeypatch.context() as m:
            m.setattr(
                _child_sessions,
                "children",
                lambda requests: [k for k in listed(requests) if k != grandchild],
            )
            m.setattr(
                _child_sessions,
                "delegated",
                lambda state: [k for k in journaled(state) if k != grandchild],
            )

            async def unreached(rt: so.Runtime, state: so.SessionState) -> bool:
                return False

            m.setattr(_child_sessions, "cancel_orphan", unreached)
            await rt.cancel(top, principal=ALICE)
        again = await rt.generate(session_id=child, prompt="refund 4", auth=ALICE)
        assert again.status == "waiting"  # its own turn, delegating to a new grandchild
        turn = (await rt.state(grandchild)).turn
        assert turn is not None and turn.status == "cancelled"
        assert (await rt.state(top)).delegated == tokens(70)
        assert await spent(rt, top) == [child]
        assert await rt.expire_due() == 0
        assert (await rt.state(top)).delegated == tokens(70)
        assert await spent(rt, top) == [child]


def ends(*, stock: bool = True) -> list[so.Agent]:
    """As `agents`, but support and orders reply once their delegate call ended."""
    out = agents(stock=stock)
    for i, name in enumerate(("support", "orders")):
        first = out[i].model.steps[0]  # type: ignore[attr-defined]
        out[i] = scripted_agent(name, [first, reply("done")], tools=list(out[i].tools.values()))
    return out


async def test_a_child_cancelled_on_its_own_carries_a_grandchild_counted_later(
    store_url: str,
) -> None:
    """The child is cancelled directly by a process without the grandchild's agent, which
    leaves the grandchild waiting: the delegate call ends with the child's 40 tokens. The
    orphan sweep of a process that has the agent cancels the grandchild and counts its 30 in
    the child, and the rest on up in the top: 70 tokens, once."""
    async with so.Runtime(ends(), store=store_url) as rt:
        top, child, grandchild = await nested(rt)
    async with so.Runtime(ends(stock=False), store=store_url) as rt:
        await rt.cancel(child, principal=ALICE)
        assert (await rt.state(top)).status == "idle"  # the call took the cancelled result
        assert (await rt.state(top)).delegated == tokens(40)
    async with so.Runtime(ends(), store=store_url) as rt:
        turn = (await rt.state(grandchild)).turn
        assert turn is not None and turn.status == "waiting"  # left for the sweep
        assert await rt.expire_due() == 1
        assert (await rt.state(child)).delegated == tokens(30)
        assert (await rt.state(top)).delegated == tokens(70)
        assert await rt.expire_due() == 0
        await rt.cancel(top, principal=ALICE)
        assert (await rt.state(top)).delegated == tokens(70)
        assert (await spent(rt, top), await spent(rt, child)) == ([child], [grandchild])


async def test_the_rest_of_a_short_child_left_uncounted_is_counted_at_the_next_cancel(
    store_url: str,
) -> None:
    """As above, but recording the rest in the top fails (as a process dying there would leave
    it), once the grandchild is counted in the child: the top's next cancel adds it, once."""
    async with so.Runtime(ends(), store=store_url) as rt:
        top, child, grandchild = await nested(rt)
    async with so.Runtime(ends(stock=False), store=store_url) as rt:
        await rt.cancel(child, principal=ALICE)
    seen: list[str] = []

    def full(moment: str, label: str) -> None:
        if moment == "before" and label == "subagent.spent":
            seen.append(label)
            if len(seen) == 2:  # the grandchild's count in the child went through
                raise so.StoreError("could not extend file: No space left on device")

    async with so.Runtime(ends(), store=store_url) as rt:
        rt.store.set_fault_hook(full)
        with contextlib.suppress(so.StoreError):
            await rt.expire_due()
        rt.store.set_fault_hook(None)
        assert (await rt.state(child)).delegated == tokens(30)
        assert (await rt.state(top)).delegated == tokens(40)
        await rt.cancel(top, principal=ALICE)
        assert (await rt.state(top)).delegated == tokens(70)
        await rt.cancel(top, principal=ALICE)
        assert (await rt.state(top)).delegated == tokens(70)
        assert await spent(rt, top) == [child]


async def test_the_trace_says_a_short_childs_late_count_is_the_rest(store_url: str) -> None:
    """The top's `subagent.spent` for a child its call's end counted short (its grandchild
    still waited) adds only the rest: the trace said the child "spent 30 tokens (counted after
    its turn)", which it did not. It says they are more, and past what the call counted."""
    async with so.Runtime(ends(), store=store_url) as rt:
        top, child, _ = await nested(rt)
    async with so.Runtime(ends(stock=False), store=store_url) as rt:
        await rt.cancel(child, principal=ALICE)
    async with so.Runtime(ends(), store=store_url) as rt:
        assert await rt.expire_due() == 1
        [rest] = [e.data for e in await events(rt, top) if e.type == "subagent.spent"]
        assert rest == {
            "session_id": child,
            "delegated": tokens(30).model_dump(),
            "counted": tokens(40).model_dump(),
        }
        transport = httpx.ASGITransport(app=create_app(rt, dev=True))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            page = (await c.get(f"/_signoff/sessions/{top}")).text
        assert (
            f"Subagent {child} spent 30 more tokens, past the 40 its call counted"
            " (its own subagent was still working then)"
        ) in page
        assert "counted after its turn" not in page
