"""Internal loops that read open requests page after page (the deadline sweep, the hidden
requests of a listing, a filtered server listing) skip none when one on an earlier page closes
between two page reads: they page by keyset (`PendingFilter.after`), not by offset."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff import _child_sessions, _subagents, _sweeping, _unlisted
from signoff._child_sessions import cancel_orphan
from signoff.server import TokenAuth, _context
from signoff.server._context import ServerContext
from signoff.stores import PendingFilter, SessionSummary
from signoff.testing import ExecutionLog, ManualClock, call, call_tools, scripted_agent

from ._subagents import ALICE as SUB_ALICE
from ._subagents import Counted, refund_agents
from ._ttl import ttl_agent
from .test_context_rules import _own_only
from .test_deadlines import asked, payout_agent
from .test_server_common import ALICE


def closing_once(rt: so.Runtime, monkeypatch: pytest.MonkeyPatch, close: object) -> list[str]:
    """Make `rt.store.pending` cancel (in another process, as it were) the session of the first
    request of the first non-empty page it returns, right after reading it; returns the ids it
    closed."""
    reading = rt.store.pending
    closed: list[str] = []

    async def closing_meanwhile(flt: PendingFilter) -> list[so.InputRequest]:
        page = await reading(flt)
        if not closed and page:
            closed.append(page[0].id)
            await close(page[0])  # type: ignore[operator]
        return page

    monkeypatch.setattr(rt.store, "pending", closing_meanwhile)
    return closed


async def test_a_sweep_misses_no_due_request_when_one_closes_between_its_pages(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A due request closed by another process after the sweep read its page shifted the next
    due one out of the next page: its deadline was applied a sweep late."""
    monkeypatch.setattr(_sweeping, "_SWEEP_PAGE", 2)
    clock = ManualClock()
    agent = payout_agent(ExecutionLog(), so.always(expires_in=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        asks = []
        for _ in range(3):
            asks.append(await asked(rt))
            clock.advance(1)
    clock.advance(60)
    async with (
        so.Runtime([agent], store=store_url, clock=clock) as worker,
        so.Runtime([agent], store=store_url, clock=clock) as other,
    ):

        async def cancel(request: so.InputRequest) -> None:
            await other.cancel(request.session_id)

        closed = closing_once(worker, monkeypatch, cancel)
        await worker.expire_due()
        assert closed == [asks[0][1].id]
        for _, request, _ in asks[1:]:
            stored = await worker.store.get_request(request.id)
            assert stored is not None and stored.status == "expired", request.id


async def test_the_hidden_requests_of_a_listing_miss_none_when_one_closes_between_pages(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request past its deadline (nothing recorded it) closed by another process after its
    page was read shifted the next one out of the hidden ones: a listing's count then counted
    a request its pages leave out."""
    monkeypatch.setattr(_unlisted, "_SCAN", 2)
    clock = ManualClock()
    agent = payout_agent(ExecutionLog(), so.always(expires_in=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        asks = []
        for _ in range(3):
            asks.append(await asked(rt))
            clock.advance(1)
        clock.advance(60)
        async with so.Runtime([agent], store=store_url, clock=clock) as other:

            async def cancel(request: so.InputRequest) -> None:
                await other.cancel(request.session_id)

            closed = closing_once(rt, monkeypatch, cancel)
            hidden = await _unlisted.unlisted(rt.store, PendingFilter(), clock())
        assert closed == [asks[0][1].id]
        assert {r.id for _, r, _ in asks[1:]} <= set(hidden)


async def test_a_filtered_server_listing_misses_no_request_when_one_closes_between_reads(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a rule the store cannot apply, the server reads the queue `REQUEST_CHUNK` at a
    time and filters it: a request closed by another process after its read shifted the next
    one out of the listing and its total."""
    monkeypatch.setattr(_context, "REQUEST_CHUNK", 2)
    clock = ManualClock()
    async with so.Runtime([ttl_agent()], store=store_url, clock=clock) as rt:
        mine = []
        for _ in range(3):
            mine += (await rt.generate("desk", prompt="reset", auth=ALICE)).pending
            clock.advance(1)
        async with so.Runtime([ttl_agent()], store=store_url, clock=clock) as other:

            async def cancel(request: so.InputRequest) -> None:
                await other.cancel(request.session_id)

            closed = closing_once(rt, monkeypatch, cancel)
            ctx = ServerContext(runtime=rt, auth=TokenAuth({}), access=_own_only, secret=b"k" * 32)
            items, total = await ctx.visible_requests(ALICE, PendingFilter(limit=50))
        assert closed == [mine[0].id]
        listed = [r.id for r in items]
        assert {r.id for r in mine[1:]} <= set(listed), listed
        assert total == len(listed)


async def test_a_sweep_misses_no_lapsed_session_when_one_is_recorded_between_its_pages(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Likewise the sessions whose TTL passed: one recorded by another process after the sweep
    read its page shifted the next one out of the next page, recorded a sweep late."""
    monkeypatch.setattr(_sweeping, "_SWEEP_PAGE", 2)
    clock = ManualClock()
    async with so.Runtime([ttl_agent()], store=store_url, clock=clock) as rt:
        sessions = []
        for _ in range(3):
            sessions.append((await rt.generate("desk", prompt="reset it")).session_id)
            clock.advance(1)
    clock.advance(61)
    async with (
        so.Runtime([ttl_agent()], store=store_url, clock=clock) as worker,
        so.Runtime([ttl_agent()], store=store_url, clock=clock) as other,
    ):
        lapsed = worker.store.lapsed_sessions  # type: ignore[attr-defined]
        recorded: list[str] = []

        async def recording_meanwhile(*args: Any, **kwargs: Any) -> list[SessionSummary]:
            rows: list[SessionSummary] = await lapsed(*args, **kwargs)
            if not recorded and rows:
                recorded.append(rows[0].id)
                assert await other._record_lapsed(rows[:1], clock()) == 1
            return rows

        monkeypatch.setattr(worker.store, "lapsed_sessions", recording_meanwhile)
        await worker.expire_due()
        assert recorded == [sessions[0]]
        assert await lapsed(clock(), limit=10) == []  # none left for the next sweep


async def three_orphans(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[so.Agent], set[str]]:
    """Three parents each delegate to a child and are cancelled, each cancel missing its child
    (as if its process died there); returns the agents and the orphaned children."""
    _, child = refund_agents([], Counted("unused"))
    delegating = call_tools(call("billing", call_id="d1", message="Refund order 1042"))
    parent = scripted_agent("support", [delegating], tools=[so.delegate("billing")])
    agents = [parent, child]
    async with so.Runtime(agents, store=store_url) as rt:
        parents = [await rt.generate("support", prompt="Refund", auth=SUB_ALICE) for _ in range(3)]
        with monkeypatch.context() as m:
            m.setattr(_child_sessions, "children", lambda requests: [])
            m.setattr(_child_sessions, "delegated", lambda state: [])
            for p in parents:
                await rt.cancel(p.session_id)
    return agents, {p.pending[0].child.session_id for p in parents}  # type: ignore[union-attr]


async def test_the_orphan_sweep_misses_no_orphan_when_one_is_cancelled_between_its_pages(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The children whose parent's turn ended, likewise: one cancelled by another process after
    the sweep read its page shifted the next one out of the next page, cancelled a sweep late."""
    monkeypatch.setattr(_subagents, "_PAGE", 2)
    agents, orphans = await three_orphans(store_url, monkeypatch)
    async with (
        so.Runtime(agents, store=store_url) as worker,
        so.Runtime(agents, store=store_url) as other,
    ):
        await worker.open()
        listed = worker.store.orphaned_children  # type: ignore[attr-defined]
        cancelled: list[str] = []

        async def cancelling_meanwhile(*args: Any, **kwargs: Any) -> list[SessionSummary]:
            rows: list[SessionSummary] = await listed(*args, **kwargs)
            if not cancelled and rows:
                cancelled.append(rows[0].id)
                assert await cancel_orphan(other, await other._state(rows[0].id))
            return rows

        monkeypatch.setattr(worker.store, "orphaned_children", cancelling_meanwhile)
        assert await worker.expire_due() == 2
        assert cancelled and cancelled[0] in orphans
        states = [await worker.state(sid) for sid in orphans]
        assert all(s.turn is not None and s.turn.status == "cancelled" for s in states)


async def test_the_orphan_sweep_pages_a_store_without_after_by_offset(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`after` is new to `orphaned_children`: a store whose listing takes only an offset is
    still read to the end, page after page."""
    monkeypatch.setattr(_subagents, "_PAGE", 2)
    store_url = f"sqlite:///{tmp_path / 's.db'}"
    agents, orphans = await three_orphans(store_url, monkeypatch)
    async with so.Runtime(agents, store=store_url) as rt:
        await rt.open()
        listed = rt.store.orphaned_children  # type: ignore[attr-defined]
        offsets: list[int] = []

        async def by_offset(
            agents: list[str], *, limit: int = 100, offset: int = 0
        ) -> list[SessionSummary]:
            offsets.append(offset)
            rows: list[SessionSummary] = await listed(agents, limit=limit, offset=offset)
            return rows

        monkeypatch.setattr(rt.store, "orphaned_children", by_offset)
        assert await rt.expire_due() == 3
        assert offsets == [0, 2]
        states = [await rt.state(sid) for sid in orphans]
        assert all(s.turn is not None and s.turn.status == "cancelled" for s in states)
