"""Recording a passed TTL is not activity: a session's `updated_at` (its listing order, a prune's
age) stays its last activity, whoever looked at it first, on either store."""

from __future__ import annotations

import signoff as so
from signoff.testing import ManualClock

from .test_deletion import ALICE, chat_with_ttl


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
