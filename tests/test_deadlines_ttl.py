"""A passed deadline's escalation and the session's TTL: recording the escalation is time's doing,
not activity, so the session expires, is listed and is pruned by its last activity, whenever a
sweep (or a listing, or the answer itself) happened to record it. Run on both stores."""

from __future__ import annotations

import pytest

import signoff as so
from signoff._state import FOLD_VERSION
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from .test_snapshot_fields import write_snapshot

ALICE = so.Principal(authenticator="sso", principal_id="alice")


def _escalating() -> so.Agent:
    """Agent `desk`: its one call waits on an approval escalated to `finance` 30 s after it was
    asked; its sessions expire after 60 idle seconds."""

    @so.tool(approval=so.always(expires_in=30, on_timeout="escalate", escalate_to="finance"))
    async def pay(invoice: str) -> str:
        """Pay an invoice."""
        return "paid"

    return scripted_agent(
        "desk",
        [call_tools(call("pay", invoice="7")), reply("done")],
        tools=[pay],
        limits=so.Limits(ttl=60),
    )


def _approve(r: so.GenerateResult) -> list[so.InputResponse]:
    return [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]


async def _escalated_at(rt: so.Runtime, session_id: str) -> float:
    """When the request's escalation was recorded."""
    (event,) = [
        e
        for e in await rt.store.read_events(session_id)
        if e.type == "approval.candidate" and e.data["outcome"] == "escalated"
    ]
    return event.at


@pytest.mark.parametrize("swept_at", [None, 31, 55])
async def test_an_escalation_does_not_move_the_ttl_whenever_it_is_recorded(
    store_url: str, swept_at: int | None
) -> None:
    """No one acts after the request is asked at t0: the session is idle from t0, and 70 s on
    it is expired, whether no sweep came by, or one recorded the escalation at t0+31 or t0+55.
    It was listed `waiting` at t0+70 with the answer taken, its TTL run on from the sweep's
    time, when a sweep had recorded the escalation, and `failed` (`SessionExpired`) when none
    had: the outcome depended on when a sweep looked."""
    clock = ManualClock()
    async with so.Runtime([_escalating()], store=store_url, clock=clock) as rt:
        t0 = clock()
        r = await rt.generate("desk", prompt="pay invoice 7", auth=ALICE)
        assert r.status == "waiting"
        if swept_at is not None:
            clock.advance(swept_at)
            assert await rt.expire_due() == 1
            assert await _escalated_at(rt, r.session_id) == t0 + swept_at
            (row,) = await rt.sessions()
            assert (row.status, row.updated_at, row.expires_at) == ("waiting", t0, t0 + 60)
            state = await rt.state(r.session_id)
            assert (state.updated_at, state.expires_at) == (t0, t0 + 60)
            (asked,) = state.pending_requests()
            assert asked.escalated_to == "finance"
        clock.advance(t0 + 70 - clock())
        (row,) = await rt.sessions()
        assert (row.status, row.updated_at) == ("failed", t0)
        with pytest.raises(so.SessionExpired):
            await rt.respond(r.session_id, _approve(r), principal=ALICE)
        (row,) = await rt.sessions()
        assert (row.status, row.updated_at) == ("failed", t0)


async def test_an_escalated_request_is_answered_within_the_ttl_of_the_last_activity(
    store_url: str,
) -> None:
    """The escalation shortens nothing either: the request, escalated at t0+31, takes an
    answer at t0+59, and the answer is activity."""
    clock = ManualClock()
    async with so.Runtime([_escalating()], store=store_url, clock=clock) as rt:
        t0 = clock()
        r = await rt.generate("desk", prompt="pay invoice 7", auth=ALICE)
        clock.advance(31)
        assert await rt.expire_due() == 1
        clock.advance(28)
        done = await rt.respond(r.session_id, _approve(r), principal=ALICE)
        assert (done.status, done.text) == ("completed", "done")
        (row,) = await rt.sessions()
        assert (row.status, row.updated_at) == ("idle", t0 + 59)


async def test_an_escalation_leaves_the_listing_order_and_the_prune_age(store_url: str) -> None:
    """`a` was last active at t0 and `b` at t0+10; `a`'s escalation, recorded at t0+35, put it
    first in the listing and kept it from a prune of those idle over 150 s at t0+180."""
    clock = ManualClock()
    async with so.Runtime([_escalating()], store=store_url, clock=clock) as rt:
        t0 = clock()
        a = await rt.generate("desk", prompt="pay invoice 7", auth=ALICE)
        clock.advance(10)
        b = await rt.generate("desk", prompt="pay invoice 8", auth=ALICE)
        clock.advance(25)
        assert await rt.expire_due() == 1  # a's deadline, not b's
        assert await _escalated_at(rt, a.session_id) == t0 + 35
        rows = await rt.sessions()
        assert [(s.id, s.updated_at) for s in rows] == [(b.session_id, t0 + 10), (a.session_id, t0)]
        clock.advance(t0 + 180 - clock())
        assert sorted(await rt.prune(older_than=150)) == sorted([a.session_id, b.session_id])
        assert await rt.sessions() == []


async def test_a_snapshot_the_fold_before_wrote_after_an_escalation_is_folded_again(
    store_url: str,
) -> None:
    """Fold 5 took the escalation for activity: a snapshot it wrote after one holds the
    escalation's time as `updated_at`, which loaded kept the session alive a TTL from then. It
    is folded again instead, and verification names nothing; the same snapshot recording this
    fold is named by its `updated_at`."""
    clock = ManualClock()
    async with so.Runtime([_escalating()], store=store_url, clock=clock) as rt:
        t0 = clock()
        r = await rt.generate("desk", prompt="pay invoice 7", auth=ALICE)
        clock.advance(31)
        assert await rt.expire_due() == 1
        events = await rt.store.read_events(r.session_id)
    folded = so.SessionState(id=r.session_id)
    for event in events:
        folded.apply(event)
    assert (folded.updated_at, events[-1].at) == (t0, t0 + 31)
    older = {**folded.to_snapshot(), "fold": 5, "updated_at": t0 + 31}
    write_snapshot(store_url, r.session_id, older)
    async with so.Runtime([_escalating()], store=store_url, clock=clock) as rt:
        state = await rt.state(r.session_id)
        assert (state.seq, state.updated_at, state.expires_at) == (folded.seq, t0, t0 + 60)
        assert await rt.verify_audit() == []
        clock.advance(29)
        with pytest.raises(so.SessionExpired):
            await rt.respond(r.session_id, _approve(r), principal=ALICE)
    write_snapshot(store_url, r.session_id, {**older, "fold": FOLD_VERSION})
    async with so.Runtime([_escalating()], store=store_url, clock=clock) as rt:
        [problem] = await rt.verify_audit()
        assert (problem.stream, problem.reason) == (
            r.session_id,
            f"the snapshot at event {folded.seq} differs from the event log: updated_at",
        )
