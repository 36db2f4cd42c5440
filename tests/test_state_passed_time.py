"""Recorded passed time and a session's times: the fold (`SessionState.updated_at`,
`expires_at`: `Runtime.state`, the server's session, the dashboard) says what the store's row (the
listing) says for each kind of it, whoever recorded it and when. A passed TTL's record, and the
cancel of a delegated turn it makes, are no activity; a deadline's close is, its escalation is
not. Run on both stores."""

from __future__ import annotations

import pytest

import signoff as so
from signoff._state import FOLD_VERSION
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from .test_deletion import ALICE, chat_with_ttl
from .test_prune_ttl_age import desk
from .test_snapshot_fields import write_snapshot
from .test_subagents_spend import orders, support, tokens, waiting_child

MONTH = 30 * 86400


async def _agree(rt: so.Runtime, session_id: str) -> tuple[float, float | None]:
    """The session's `updated_at` and `expires_at`, which its state (as held, and as folded
    anew from its events) and its listed row both say."""
    state = await rt.state(session_id)
    [row] = [s for s in await rt.sessions() if s.id == session_id]
    folded = so.SessionState(id=session_id)
    for event in await rt.store.read_events(session_id):
        folded.apply(event)
    times = (state.updated_at, state.expires_at)
    assert (row.updated_at, row.expires_at) == times == (folded.updated_at, folded.expires_at)
    assert (row.status, folded.status) == (state.status, state.status)
    return times


@pytest.mark.parametrize("look", ["state", "listing", "sweep"])
async def test_a_recorded_expiry_keeps_the_last_activity_in_the_state_too(
    store_url: str, look: str
) -> None:
    """A session (TTL 60 s) waiting on an approval no one gives, looked at a month on: its
    expiry, recorded by that look, leaves `updated_at` at its last activity in its state as in
    its row, and both say it expired then. Before, the state took the recording for activity
    (`updated_at` a month on) while the listing did not; a fresh process folding it agrees."""
    clock = ManualClock()
    async with so.Runtime([chat_with_ttl()], store=store_url, clock=clock) as rt:
        r = await rt.generate("chat", prompt="refund it", auth=ALICE)
        assert r.status == "waiting"
        t0 = clock()
        clock.advance(MONTH)
        if look == "state":
            await rt.state(r.session_id)
        elif look == "listing":
            await rt.sessions()
        else:
            assert await rt.expire_due() == 1
        assert (await rt.state(r.session_id)).status == "failed"
        assert await _agree(rt, r.session_id) == (t0, t0 + MONTH)
        clock.advance(10)  # nothing moves once it is recorded
        assert await _agree(rt, r.session_id) == (t0, t0 + MONTH)
    async with so.Runtime([chat_with_ttl()], store=store_url, clock=clock) as rt:
        assert await _agree(rt, r.session_id) == (t0, t0 + MONTH)
        assert await rt.verify_audit() == []


async def test_a_subagent_cancelled_for_the_expiry_keeps_its_ttl_too(store_url: str) -> None:
    """The parent (TTL 60 s) waits on its child (TTL 600 s), which waits on an approval. At
    t0+61 a listing records the parent's expiry, which cancels the child's delegated turn: no
    one's activity, so the child's `updated_at` stays t0 and its TTL runs on from then (t0+600)
    in its state as in its row. Before, its state moved both to t0+61, its row only the TTL."""
    clock = ManualClock()
    child = orders(tokens(40))
    child.limits = so.Limits(ttl=600)
    async with so.Runtime([support(ttl=60), child], store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        assert r.pending[0].child is not None
        parent, kid = r.session_id, r.pending[0].child.session_id
        t0 = clock()
        clock.advance(61)
        await rt.sessions()
        turn = (await rt.state(kid)).turn
        assert turn is not None and turn.status == "cancelled"
        assert await _agree(rt, kid) == (t0, t0 + 600)
        assert await _agree(rt, parent) == (t0, t0 + 61)
    async with so.Runtime([support(ttl=60), child], store=store_url, clock=clock) as rt:
        assert await _agree(rt, kid) == (t0, t0 + 600)
        assert await rt.verify_audit() == []


@pytest.mark.parametrize("lacking", [False, True], ids=["here", "orphan-sweep"])
async def test_a_chain_cancelled_for_the_expiry_agrees_in_every_session(
    store_url: str, lacking: bool
) -> None:
    """desk (TTL 60 s) -> support -> orders (TTL 600 s each), the grandchild waiting on an
    approval: the top's expiry, recorded at t0+61 (by a runtime without `orders`, which leaves
    it to the orphan sweep of one that has it, at t0+66), cancels both delegated turns below
    it. Every session's state says what its row says: last active at t0."""
    clock = ManualClock()
    mid, low = support(ttl=600), orders(tokens(40))
    low.limits = so.Limits(ttl=600)
    async with (
        so.Runtime([desk(), mid, low], store=store_url, clock=clock) as rt,
        so.Runtime([desk(), mid], store=store_url, clock=clock) as without,
    ):
        r = await rt.generate("desk", prompt="refund 3", auth=ALICE)
        assert r.status == "waiting"
        t0 = clock()
        clock.advance(61)
        await (without if lacking else rt).state(r.session_id)
        if lacking:
            clock.advance(5)
            assert await rt.expire_due() >= 1
        rows = {s.agent: s for s in await rt.sessions()}
        assert {a: s.status for a, s in rows.items()} == {
            "desk": "failed",
            "support": "cancelled",
            "orders": "cancelled",
        }
        assert await _agree(rt, rows["desk"].id) == (t0, t0 + 61)
        assert await _agree(rt, rows["support"].id) == (t0, t0 + 600)
        assert await _agree(rt, rows["orders"].id) == (t0, t0 + 600)


def _deadline(on_timeout: str) -> so.Agent:
    """Agent `desk` (TTL 60 s): its one call waits on an approval whose deadline (30 s)
    does `on_timeout`."""
    kind = {"escalate_to": "finance"} if on_timeout == "escalate" else {}

    @so.tool(approval=so.always(expires_in=30, on_timeout=on_timeout, **kind))  # type: ignore[arg-type]
    async def pay(invoice: str) -> str:
        """Pay an invoice."""
        return "paid"

    return scripted_agent(
        "desk",
        [call_tools(call("pay", invoice="7")), reply("done")],
        tools=[pay],
        limits=so.Limits(ttl=60),
    )


@pytest.mark.parametrize(
    ("on_timeout", "active"), [("deny", True), ("approve", True), ("escalate", False)]
)
async def test_a_recorded_deadline_moves_the_state_as_it_moves_the_row(
    store_url: str, on_timeout: str, active: bool
) -> None:
    """A sweep at t0+31 records the request's passed deadline: a close (denied or approved on
    timeout) goes on with the turn, activity in the state as in the row; an escalation waits on
    people as before, activity in neither."""
    clock = ManualClock()
    async with so.Runtime([_deadline(on_timeout)], store=store_url, clock=clock) as rt:
        r = await rt.generate("desk", prompt="pay invoice 7", auth=ALICE)
        assert r.status == "waiting"
        t0 = clock()
        clock.advance(31)
        assert await rt.expire_due() == 1
        at = t0 + 31 if active else t0
        assert await _agree(rt, r.session_id) == (at, at + 60)


async def test_a_snapshot_the_fold_before_wrote_after_an_expiry_is_folded_again(
    store_url: str,
) -> None:
    """Fold 15 took a recorded expiry for activity: a snapshot it wrote then holds the
    recording's time as `updated_at`. It is folded again instead, and verification names
    nothing; the same snapshot claiming this fold is named by its `updated_at`."""
    clock = ManualClock()
    async with so.Runtime([chat_with_ttl()], store=store_url, clock=clock) as rt:
        r = await rt.generate("chat", prompt="refund it", auth=ALICE)
        t0 = clock()
        clock.advance(MONTH)
        await rt.state(r.session_id)
        events = await rt.store.read_events(r.session_id)
    folded = so.SessionState(id=r.session_id)
    for event in events:
        folded.apply(event)
    assert (folded.updated_at, folded.expires_at, events[-1].at) == (t0, t0 + MONTH, t0 + MONTH)
    older = {**folded.to_snapshot(), "fold": 15, "updated_at": t0 + MONTH}
    del older["lapsed_at"]  # fold 15 kept none
    write_snapshot(store_url, r.session_id, older)
    async with so.Runtime([chat_with_ttl()], store=store_url, clock=clock) as rt:
        assert await _agree(rt, r.session_id) == (t0, t0 + MONTH)
        assert await rt.verify_audit() == []
    claimed = {**older, "fold": FOLD_VERSION, "lapsed_at": t0 + MONTH}
    write_snapshot(store_url, r.session_id, claimed)
    async with so.Runtime([chat_with_ttl()], store=store_url, clock=clock) as rt:
        [problem] = await rt.verify_audit()
        assert (problem.stream, problem.reason) == (
            r.session_id,
            f"the snapshot at event {folded.seq} differs from the event log: updated_at",
        )


async def test_a_mirror_closed_by_a_persons_cancel_of_the_subagent_is_activity(
    store_url: str,
) -> None:
    """A person cancels the waiting subagent at t0+100 in a process lacking the parent's agent,
    so the parent's mirror close is a commit of its own. It is activity in the parent's row (no
    TTL passed), and is in its fold too: a mirror's close copying its subagent's withdrawal was
    taken for a cancel's own, the state kept t0 and recorded the parent's expiry at t0+650,
    before its row's TTL (t0+700), failing a turn the row listed as running."""
    clock = ManualClock()
    async with so.Runtime(
        [support(ttl=600), orders(tokens(40))], store=store_url, clock=clock
    ) as rt:
        parent, kid = await waiting_child(rt)
        t0 = clock()
    clock.advance(100)
    async with so.Runtime([orders(tokens(40))], store=store_url, clock=clock) as rt:
        await rt.cancel(kid, "no longer needed", principal=ALICE)
    clock.advance(550)
    async with so.Runtime(
        [support(ttl=600), orders(tokens(40))], store=store_url, clock=clock
    ) as rt:
        assert await _agree(rt, parent) == (t0 + 100, t0 + 700)
        assert (await rt.state(parent)).status != "failed"
