"""Recording a passed TTL is not activity: a session's `updated_at` (its listing order, a prune's
age) stays its last activity, whoever looked at it first, on either store; so is cancelling the
delegated turns below it with it, for every session of its tree."""

from __future__ import annotations

import pytest

import signoff as so
from signoff.testing import ManualClock, call, call_tools, scripted_agent

from ._subagents import events
from .test_deletion import ALICE, chat_with_ttl
from .test_subagents_spend import orders, support, tokens


async def _two_waiting(rt: so.Runtime) -> tuple[str, str]:
    """Two sessions parked on an approval no one gives (their TTL is 60 s)."""
    a = await rt.generate("chat", prompt="refund it", auth=ALICE)
    b = await rt.generate("chat", prompt="refund it", auth=ALICE)
    assert a.status == b.status == "waiting"
    return a.session_id, b.session_id


async def test_a_read_recording_the_expiry_keeps_the_last_activity(store_url: str) -> None:
    """The read that records the expiry (its turn fails, its request expires) leaves the
    session's `updated_at` at its last activity; the events keep the time they were recorded."""
    clock = ManualClock()
    async with so.Runtime([chat_with_ttl()], store=store_url, clock=clock) as rt:
        a, b = await _two_waiting(rt)
        t0 = clock()
        clock.advance(61)
        state = await rt.state(a)
        assert state.turn is not None and state.turn.status == "failed"
        assert state.turn.error is not None and state.turn.error["code"] == "session_expired"
        events = await rt.store.read_events(a)
        assert events[-1].type == "turn.failed" and events[-1].at == t0 + 61
        rows = {s.id: s for s in await rt.sessions()}  # which records b's expiry too
        assert rows[a].status == rows[b].status == "failed"
        assert rows[a].updated_at == rows[b].updated_at == t0


async def test_a_session_whose_expiry_a_read_recorded_is_pruned_by_its_last_activity(
    store_url: str,
) -> None:
    """Both sessions were last active at t0: a prune at t0+200 of those idle over 150 s deletes
    both, whether a read recorded one's expiry at t0+61 or no one had looked."""
    clock = ManualClock()
    async with so.Runtime([chat_with_ttl()], store=store_url, clock=clock) as rt:
        a, b = await _two_waiting(rt)
        clock.advance(61)
        await rt.state(a)  # records a's expiry
        clock.advance(139)
        assert sorted(await rt.prune(older_than=150)) == sorted([a, b])
        assert await rt.sessions() == []
        assert await rt.verify_audit() == []


async def test_a_listing_before_the_prune_changes_nothing(store_url: str) -> None:
    """A listing at t0+200 records both expiries: the prune right after still deletes both."""
    clock = ManualClock()
    async with so.Runtime([chat_with_ttl()], store=store_url, clock=clock) as rt:
        a, b = await _two_waiting(rt)
        clock.advance(61)
        await rt.state(a)
        clock.advance(139)
        assert {s.status for s in await rt.sessions()} == {"failed"}
        assert sorted(await rt.prune(older_than=150)) == sorted([a, b])
        assert await rt.sessions() == []


def desk() -> so.Agent:
    """A top agent (TTL 60 s) delegating to `support`, which delegates to `orders`."""
    return scripted_agent(
        "desk",
        [call_tools(call("support", message="refund 3"), usage=tokens(5))],
        tools=[so.delegate("support")],
        limits=so.Limits(ttl=60),
        repeat_last=True,
    )


async def _tree_stays_put(rt: so.Runtime, top: str, t0: float, clock: ManualClock) -> None:
    """Every session of the tree under `top` (each listed) keeps `t0` as its last activity,
    its delegated turns ended; at t0+200 a prune of those idle over 150 s deletes the tree."""
    rows = await rt.sessions()
    assert len(rows) >= 2 and {s.updated_at for s in rows} == {t0}
    assert all(s.status in ("cancelled", "failed") for s in rows)
    clock.advance(139)
    assert await rt.prune(older_than=150) == [top]
    assert await rt.sessions() == []
    assert await rt.verify_audit() == []


@pytest.mark.parametrize("child_ttl", [None, 30], ids=["child-lives", "child-expired-too"])
@pytest.mark.parametrize("look", ["listing", "state", "sweep", "call"])
async def test_cancelling_the_subagents_with_the_expiry_keeps_their_last_activity(
    store_url: str, look: str, child_ttl: int | None
) -> None:
    """The parent (TTL 60 s) waits on its child, which waits on an approval. At t0+61 a look
    records the parent's expiry, cancelling the child's delegated turn (or recording the child's
    own expiry): the child's `updated_at` stays t0, so the prune at t0+200 deletes the tree, as
    it does when no one looked. Before, the cancel was activity: the tree was young again."""
    clock = ManualClock()
    child = orders(tokens(40))
    if child_ttl is not None:
        child.limits = so.Limits(ttl=child_ttl)
    async with so.Runtime([support(ttl=60), child], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        assert r.pending[0].child is not None
        parent, kid = r.session_id, r.pending[0].child.session_id
        t0 = clock()
        clock.advance(61)
        if look == "listing":
            await rt.sessions()
        elif look == "state":
            await rt.state(parent)
        elif look == "sweep":
            assert await rt.expire_due() >= 1
        else:  # a call to the parent records it, and raises
            with pytest.raises(so.SessionExpired):
                await rt.generate(session_id=parent, prompt="again", auth=ALICE)
        turn = (await rt.state(kid)).turn
        assert turn is not None and turn.status == ("cancelled" if child_ttl is None else "failed")
        if child_ttl is None:
            [cancelled] = [e for e in await events(rt, kid) if e.type == "turn.cancelled"]
            assert cancelled.data["expiry"] is True and cancelled.at == t0 + 61
        await _tree_stays_put(rt, parent, t0, clock)


async def test_a_persons_cancel_of_the_parent_is_its_subagents_activity(store_url: str) -> None:
    """Cancelling the parent (no TTL passed) is someone's doing: the child's turn cancelled with
    it is the child's activity, as the parent's own is, and says no `expiry`."""
    clock = ManualClock()
    async with so.Runtime([support(), orders(tokens(40))], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        assert r.pending[0].child is not None
        kid = r.pending[0].child.session_id
        clock.advance(61)
        await rt.cancel(r.session_id, principal=ALICE)
        assert {s.updated_at for s in await rt.sessions()} == {clock()}
        [cancelled] = [e for e in await events(rt, kid) if e.type == "turn.cancelled"]
        assert "expiry" not in cancelled.data


async def test_the_orphan_sweep_cancelling_a_child_of_an_expired_parent_keeps_its_age(
    store_url: str,
) -> None:
    """A runtime without the child's agent records the parent's expiry (it leaves the child to
    one that has it); the sweep of one that has it cancels the orphan: no activity either."""
    clock = ManualClock()
    agents = [support(ttl=60), orders(tokens(40))]
    async with (
        so.Runtime(agents, store=store_url, clock=clock) as rt,
        so.Runtime([support(ttl=60)], store=store_url, clock=clock) as lacking,
    ):
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        assert r.pending[0].child is not None
        parent, kid = r.session_id, r.pending[0].child.session_id
        t0 = clock()
        clock.advance(61)
        await lacking.state(parent)
        turn = (await lacking.state(kid)).turn  # (`rt.state` would cancel it, as the sweep does)
        assert turn is not None and turn.status == "waiting"  # left to `rt`
        assert await rt.expire_due() >= 1
        turn = (await rt.state(kid)).turn
        assert turn is not None and turn.status == "cancelled"
        await _tree_stays_put(rt, parent, t0, clock)


async def test_a_grandchild_cancelled_with_the_expiry_keeps_its_last_activity(
    store_url: str,
) -> None:
    """desk -> support -> orders, the grandchild waiting on an approval: the top's expiry,
    recorded by a listing at t0+61, cancels both delegated turns below it, neither activity."""
    clock = ManualClock()
    agents = [desk(), support(), orders(tokens(40))]
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        r = await rt.generate("desk", prompt="refund 3", auth=ALICE)
        assert r.status == "waiting"
        t0 = clock()
        clock.advance(61)
        await rt.sessions()
        assert len(await rt.sessions()) == 3
        await _tree_stays_put(rt, r.session_id, t0, clock)


async def test_the_orphan_sweep_cancelling_a_grandchild_under_an_expired_top_keeps_its_age(
    store_url: str,
) -> None:
    """desk (TTL 60 s) -> support -> orders: a runtime without `orders` records the top's expiry
    at t0+61, cancelling support's turn (`expiry`) and leaving orders to the orphan sweep. Its
    parent, support, has no TTL of its own, but its turn was ended by the one above: the sweep's
    cancel of orders (at t0+66) says `expiry` and is no activity, so a prune of those idle
    over 150 s deletes the tree at t0+205."""
    clock = ManualClock()
    async with (
        so.Runtime([desk(), support(), orders(tokens(40))], store=store_url, clock=clock) as rt,
        so.Runtime([desk(), support()], store=store_url, clock=clock) as lacking,
    ):
        r = await rt.generate("desk", prompt="refund 3", auth=ALICE)
        assert r.status == "waiting"
        top, t0 = r.session_id, clock()
        clock.advance(61)
        await lacking.state(top)
        kid = next(s.id for s in await lacking.sessions() if s.agent == "orders")
        turn = (await lacking.state(kid)).turn  # (`rt.state` would cancel it, as the sweep does)
        assert turn is not None and turn.status == "waiting"  # left to `rt`
        clock.advance(5)
        assert await rt.expire_due() >= 1
        [cancelled] = [e for e in await events(rt, kid) if e.type == "turn.cancelled"]
        assert cancelled.data["expiry"] is True and cancelled.at == t0 + 66
        await _tree_stays_put(rt, top, t0, clock)
