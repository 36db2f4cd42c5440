"""A reply billed after its turn was cancelled from another process (a worker's model call in
flight while the server cancels): what it cost is counted in the session's usage and budgets
(`model.spent`), once, and nothing else of it is recorded. Both stores."""

from __future__ import annotations

import asyncio
from typing import Any

import signoff as so
from signoff._events import Event
from signoff._state import SessionState

BILLED = so.Usage(input_tokens=500, output_tokens=500, cost_usd=0.5)


class Held:
    """A model whose call waits until the test lets it go, then replies (or fails) billed."""

    price_per_mtok = None

    def __init__(self, *, fail: bool = False) -> None:
        self.called = asyncio.Event()
        self.go = asyncio.Event()
        self.fail = fail

    async def complete(self, request: Any) -> so.ModelResponse:
        self.called.set()
        await self.go.wait()
        if self.fail:
            raise so.ModelError("the reply was refused", usage=BILLED)
        return so.ModelResponse(text="hello", usage=BILLED)


async def _cancelled_in_flight(store_url: str, model: Held) -> tuple[str, list[Event], Any]:
    """rt1 drives a turn whose model call is held; rt2 (another runtime on the same store)
    cancels it; then the reply comes. The session's events and its state as rt2 reads it."""
    agent = so.Agent(name="a", model=model, limits=so.Limits(max_tokens=1000))
    other = so.Agent(name="a", model=Held())
    async with (
        so.Runtime([agent], store=store_url) as rt1,
        so.Runtime([other], store=store_url) as rt2,
    ):
        sid = await rt1.create_session("a")
        drive = asyncio.create_task(rt1.generate(session_id=sid, prompt="hi"))
        await asyncio.wait_for(model.called.wait(), 10)
        cancelled = await rt2.cancel(sid, "stop")
        assert cancelled.cancelled and cancelled.status == "cancelled"
        model.go.set()  # the reply arrives once the cancel is recorded
        assert (await asyncio.wait_for(drive, 10)).status == "cancelled"
        events = [e async for e in rt2.events(sid, follow=False)]
        state = await rt2.state(sid)
        again = await rt1.generate(session_id=sid, prompt="more")  # the budget is spent
        assert again.status == "waiting", again
        [limit] = [r for r in again.pending if r.kind == "session-limit"]
        assert limit is not None
    return sid, events, state


async def test_a_reply_billed_after_a_cancel_elsewhere_is_counted(store_url: str) -> None:
    _, events, state = await _cancelled_in_flight(store_url, Held())
    types = [e.type for e in events]
    assert types == [
        "session.created",
        "turn.started",
        "turn.cancelled",
        "session.waiting",
        "model.spent",
    ]
    assert events[-1].data == {"usage": BILLED.model_dump()}
    assert events[-1].turn_id == events[1].turn_id  # the turn that spent it
    assert state.usage == BILLED  # counted once
    assert state.turn is not None and state.turn.status == "cancelled"
    assert state.status == "cancelled" and state.model_responses == 0  # not revived
    # Bookkeeping: the session was last active at the cancel, its TTL runs from there.
    assert state.updated_at == events[3].at


async def test_a_billed_failure_after_a_cancel_elsewhere_is_counted(store_url: str) -> None:
    _, events, state = await _cancelled_in_flight(store_url, Held(fail=True))
    assert [e.type for e in events][2:] == ["turn.cancelled", "session.waiting", "model.spent"]
    assert state.usage == BILLED
    assert state.turn is not None and state.turn.status == "cancelled"


def test_model_spent_folds_into_usage_whatever_turn_is_open() -> None:
    """Folded as bookkeeping: counted in usage, the turn (another, by now) untouched, the TTL
    not restarted; a snapshot keeps the count."""

    def at(seq: int, kind: Any, when: float, turn: str | None, **data: Any) -> Event:
        return Event(session_id="s1", seq=seq, type=kind, at=when, turn_id=turn, data=data)

    state = SessionState(id="s1")
    for e in [
        at(1, "session.created", 1.0, None, agent="a", ttl=60),
        at(2, "turn.started", 2.0, "t1", message="hi"),
        at(3, "turn.cancelled", 3.0, "t1", reason=None, by=None),
        at(4, "session.waiting", 3.0, "t1"),
        at(5, "turn.started", 4.0, "t2", message="again"),
        at(6, "model.spent", 50.0, "t1", usage=BILLED.model_dump()),
    ]:
        state.apply(e)
    assert state.usage == BILLED
    assert state.turn is not None and state.turn.id == "t2" and state.turn.status == "running"
    assert state.updated_at == 4.0 and state.expires_at == 64.0
    assert SessionState.from_snapshot(state.to_snapshot()).usage == BILLED


async def test_a_bill_counted_after_the_turn_ended_is_no_activity(store_url: str) -> None:
    """The reply billed 100 s after the cancel is counted (`model.spent`), which the fold and
    the TTL take for no activity; the session row took its time as its last activity, so a
    prune of sessions idle for 50 s left it, as a listing showed it active just now."""
    from signoff.testing import ManualClock

    model, clock = Held(), ManualClock()
    agent = so.Agent(name="a", model=model, limits=so.Limits(max_tokens=1000))
    async with (
        so.Runtime([agent], store=store_url, clock=clock) as rt1,
        so.Runtime([so.Agent(name="a", model=Held())], store=store_url, clock=clock) as rt2,
    ):
        sid = await rt1.create_session("a")
        drive = asyncio.create_task(rt1.generate(session_id=sid, prompt="hi"))
        await asyncio.wait_for(model.called.wait(), 10)
        await rt2.cancel(sid, "stop")
        cancelled_at = clock()
        clock.advance(100)
        model.go.set()
        assert (await asyncio.wait_for(drive, 10)).status == "cancelled"
        events = [e async for e in rt2.events(sid, follow=False)]
        assert events[-1].type == "model.spent" and events[-1].at == cancelled_at + 100
        [row] = await rt2.sessions()
        assert row.updated_at == (await rt2.state(sid)).updated_at == cancelled_at
        assert await rt2.prune(older_than=50) == [sid]
