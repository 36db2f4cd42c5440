"""A drive's lease lost while a model call runs: the call is cancelled, or its late answer
discarded; a subagent's drive stopped with its parent's gives the child's lease back.
Run on both stores.
"""

from __future__ import annotations

import asyncio
import time

import signoff as so
from signoff.testing import ManualClock

from ._leasing import (
    counting_renewals,
    event_types,
    finished_by_a_worker,
    take_over,
    until,
)


class SlowModel:
    """A model whose first call awaits a long sleep (noting how many of `renewals` were made
    when it is cancelled; with `stubborn`, it answers instead of stopping) and whose later
    calls answer at once."""

    def __init__(self, *, stubborn: bool = False) -> None:
        self.calls = 0
        self.stubborn = stubborn
        self.renewals: list[int] = []
        self.cancelled = asyncio.Event()
        self.renewals_at_cancel: int | None = None

    async def complete(self, request: so.models.ModelRequest) -> so.ModelResponse:
        self.calls += 1
        if self.calls == 1:
            try:
                await asyncio.sleep(600)
            except asyncio.CancelledError:
                self.renewals_at_cancel = len(self.renewals)
                self.cancelled.set()
                if not self.stubborn:
                    raise
                return so.ModelResponse(text="Answered anyway.")
        return so.ModelResponse(text="Done.")


async def test_a_lease_taken_over_cancels_the_model_call_running_under_it(
    store_url: str,
) -> None:
    """The first renewal that finds the lease taken over cancels the model call, whose response
    could not be recorded: the drive ends recording nothing, and the worker that takes the turn
    over calls the model again and finishes the turn."""
    slow = SlowModel()
    agent = so.Agent(name="support", model=slow)
    async with so.Runtime([agent], store=store_url, lease_ttl=3.0) as rt:
        slow.renewals = counting_renewals(rt.store)
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: slow.calls == 1)
        before = await event_types(rt, sid)
        await take_over(rt.store, sid)
        made = len(slow.renewals)
        result = await asyncio.wait_for(drive, 10)
        assert slow.cancelled.is_set() and slow.renewals_at_cancel is not None
        assert slow.renewals_at_cancel - made <= 1  # the first renewal after found it lost
        assert result.status == "running"
        assert await event_types(rt, sid) == before and before[-1] == "turn.started"
    types = await finished_by_a_worker(store_url, agent, sid)
    assert slow.calls == 2
    assert types.count("model.completed") == 1 and types.count("turn.completed") == 1
    assert "turn.failed" not in types


async def test_a_model_that_answers_after_its_lease_is_lost_has_its_answer_discarded(
    store_url: str,
) -> None:
    """A model call that ignores the cancel and answers all the same: the answer is recorded
    nowhere, and the drive ends as one whose lease was lost."""
    slow = SlowModel(stubborn=True)
    agent = so.Agent(name="support", model=slow)
    async with so.Runtime([agent], store=store_url, lease_ttl=3.0) as rt:
        slow.renewals = counting_renewals(rt.store)
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: slow.calls == 1)
        before = await event_types(rt, sid)
        await take_over(rt.store, sid)
        made = len(slow.renewals)
        result = await asyncio.wait_for(drive, 10)
        assert slow.renewals_at_cancel is not None and slow.renewals_at_cancel - made <= 1
        assert result.status == "running"
        assert await event_types(rt, sid) == before
    types = await finished_by_a_worker(store_url, agent, sid)
    assert types.count("model.completed") == 1
    texts = [e.data.get("text") for e in await _events(store_url, agent, sid)]
    assert "Answered anyway." not in texts and "Done." in texts


async def _events(store_url: str, agent: so.Agent, session_id: str) -> list[so.Event]:
    async with so.Runtime([agent], store=store_url) as rt:
        return [e async for e in rt.events(session_id, follow=False)]


async def test_a_subagent_stopped_by_its_parents_lost_lease_gives_the_childs_lease_back(
    store_url: str,
) -> None:
    """The parent's lease is lost while its delegate call drives the child: the call is
    cancelled, the child's model call with it, and the child's lease is given back at once
    rather than held until it lapses (the lease clock here stands still: it never would)."""
    clock = ManualClock(time.time())
    slow = SlowModel()
    child = so.Agent(name="billing", model=slow)
    call = so.ToolCall(id="call_1", name="billing", input={"message": "Refund order 1042"})
    parent = so.Agent(
        name="support",
        model=so.models.Scripted([so.ModelResponse(tool_calls=[call]), so.ModelResponse()]),
        tools=[so.delegate("billing")],
    )
    async with so.Runtime([parent, child], store=store_url, lease_ttl=0.3, clock=clock) as rt:
        sid = await rt.create_session("support")
        drive = asyncio.create_task(rt.generate("support", "Refund", session_id=sid))
        await until(lambda: slow.calls == 1)
        before = await event_types(rt, sid)
        await take_over(rt.store, sid)
        result = await asyncio.wait_for(drive, 10)
        assert slow.cancelled.is_set() and result.status == "running"
        assert await event_types(rt, sid) == before and before[-1] == "tool.step"  # its child
        (kid,) = await rt.store.sessions(agent="billing")
        token = await rt.store.acquire_lease(kid.id, "probe", 60.0, rt.now())
        assert token is not None  # free: no lease of the cancelled drive left on it
