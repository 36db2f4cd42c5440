"""A listing of the queue that meets passed deadlines records them all before it goes on with
any turn they make runnable, and goes on with those turns `SWEEP_DRIVES` at once, as a sweep
does: one after another, a listing took as long as all their model calls together."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import signoff as so
from signoff._sweeping import SWEEP_DRIVES
from signoff.testing import ExecutionLog, ManualClock

from .test_deadlines import ALICE, payout_agent

SESSIONS = SWEEP_DRIVES + 2


async def test_a_listing_records_every_deadline_before_it_drives_their_turns(
    store_url: str,
) -> None:
    """Before, `rt.pending()` recorded one session's deadline, drove its turn to the end, then
    the next: with 6 due sessions and a model taking 0.5 s, the listing took 3.1 s, and at the
    first resumed model call only 1 of the 6 deadlines was recorded."""
    clock = ManualClock()
    agent = payout_agent(ExecutionLog(), so.always(expires_in=60))
    complete = agent.model.complete
    resumed = {"running": 0, "most": 0, "seen": 0}
    expired_at_first: list[int] = []
    together = asyncio.Event()

    async def slow(request: Any) -> so.ModelResponse:
        if clock.now > start:  # a turn the deadline made runnable
            resumed["running"] += 1
            if not resumed["seen"]:
                resumed["seen"] = 1
                closed = await rt.store.pending(so.stores.PendingFilter(status="expired"))
                expired_at_first.append(len(closed))
            resumed["most"] = max(resumed["most"], resumed["running"])
            if resumed["running"] == SWEEP_DRIVES:
                together.set()
            # Held until as many run at once as may (2 s at most: one at a time, as before).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(together.wait(), 2)
            resumed["running"] -= 1
        return await complete(request)

    agent.model.complete = slow  # type: ignore[method-assign]
    start = clock.now
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        sids = [(await rt.generate("pay", prompt="pay", auth=ALICE)).session_id for _ in range(6)]
        clock.advance(60)
        assert await rt.pending() == []
        assert expired_at_first == [SESSIONS]
        assert resumed["most"] == SWEEP_DRIVES
        for sid in sids:  # each turn moved on, as before
            state = await rt.state(sid)
            assert state.turn is not None and state.turn.status == "completed"
