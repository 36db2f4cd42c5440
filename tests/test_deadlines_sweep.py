"""The deadline sweep (`expire_due`, a worker's and `serve`'s) across many sessions: one session
it cannot record or go on with is logged and left for the next sweep, not a stop for the rest."""

from __future__ import annotations

import asyncio
import itertools
import logging
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores import PendingFilter
from signoff.testing import ExecutionLog, ManualClock

from ._procs import query
from ._ttl import ttl_agent
from .test_deadlines import asked, payout_agent


def failing_loads(rt: so.Runtime, session_id: str) -> list[str]:
    """Make `rt`'s store fail every load of `session_id` (a damaged row, a read that times out);
    returns the list the failed loads are noted in."""
    store = rt.store
    load = store.load
    failed: list[str] = []

    async def broken(sid: str, *args: Any, **kwargs: Any) -> Any:
        if sid == session_id:
            failed.append(sid)
            raise so.StoreError(f"session {sid!r} is damaged (test)")
        return await load(sid, *args, **kwargs)

    store.load = broken  # type: ignore[method-assign,assignment]
    return failed


async def test_a_session_the_sweep_cannot_read_does_not_hold_up_the_others_deadlines(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The oldest due session, listed first at every sweep, failing to load stopped the sweep
    there, so no other session's deadline was ever applied by a worker: it is logged and the
    others go on; once it can be read again, the next sweep applies its deadline too."""
    clock = ManualClock()
    log = ExecutionLog()
    agent = payout_agent(log, so.always(expires_in=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        s1, r1, _ = await asked(rt)  # older: listed first
        clock.advance(1)
        s2, r2, _ = await asked(rt)
    clock.advance(60)
    async with so.Runtime([agent], store=store_url, clock=clock) as worker:
        load = worker.store.load
        failed = failing_loads(worker, s1)
        with caplog.at_level(logging.WARNING, logger="signoff.worker"):
            await worker.expire_due()
        assert failed
        assert s1 in caplog.text and "damaged (test)" in caplog.text
        stored = await worker.store.get_request(r2.id)
        assert stored is not None and stored.status == "expired"
        assert (await worker.state(s2)).turn_status == "completed"
        stored = await worker.store.get_request(r1.id)
        assert stored is not None and stored.status == "pending"
        worker.store.load = load  # type: ignore[method-assign]
        await worker.expire_due()
        stored = await worker.store.get_request(r1.id)
        assert stored is not None and stored.status == "expired"
        assert (await worker.state(s1)).turn_status == "completed"


@pytest.mark.parametrize("page", [500, 2])
async def test_a_request_row_no_one_can_read_does_not_hold_up_the_others_deadlines(
    store_url: str, page: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One request row whose data is not JSON (a hand edit, a bad restore) failed the sweep's
    listing of due requests as a whole, at every sweep: no other session's deadline was ever
    applied, nor any TTL recorded. Its page is read again in halves down to that row: it is
    logged with its session and passed, the others applied, also on the pages after it."""
    from signoff import _sweeping

    from .test_store_edited_rows import edit

    monkeypatch.setattr(_sweeping, "_SWEEP_PAGE", page)
    clock = ManualClock()
    log = ExecutionLog()
    agent = payout_agent(log, so.always(expires_in=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        asked_ = []
        for _ in range(4):
            asked_.append(await asked(rt))
            clock.advance(1)
    s1, r1, _ = asked_[1]
    edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"{broken", r1.id)
    clock.advance(60)
    async with so.Runtime([agent], store=store_url, clock=clock) as worker:
        with caplog.at_level(logging.WARNING, logger="signoff.worker"):
            assert await worker.expire_due() == 3
        assert s1 in caplog.text and r1.id in caplog.text
        for sid, request, _ in asked_:
            if sid == s1:
                continue
            stored = await worker.store.get_request(request.id)
            assert stored is not None and stored.status == "expired"
            assert (await worker.state(sid)).turn_status == "completed"


async def test_a_page_with_a_request_no_one_can_read_is_read_again_in_a_few_reads(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """While the damaged row stays, every sweep reads its page again: a read a row (500 on a
    full page, at every sweep) became a few reads, the page halved down to the row."""
    from .test_store_edited_rows import edit

    store_url = f"sqlite:///{tmp_path / 's.db'}"
    clock = ManualClock()
    agent = payout_agent(ExecutionLog(), so.always(expires_in=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        sessions = [await asked(rt) for _ in range(64)]
    damaged = sessions[37][1].id
    edit(store_url, "UPDATE {t}requests SET data = {p} WHERE id = {p}", b"{broken", damaged)
    clock.advance(61)
    async with so.Runtime([agent], store=store_url, clock=clock) as worker:
        reads: list[int] = []
        pending, get_request = worker.store.pending, worker.store.get_request

        async def counted(flt: PendingFilter) -> list[so.InputRequest]:
            reads.append(flt.limit)
            return await pending(flt)

        async def one(request_id: str) -> Any:
            reads.append(1)
            return await get_request(request_id)

        worker.store.pending = counted  # type: ignore[method-assign]
        worker.store.get_request = one  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="signoff.worker"):
            assert await worker.expire_due() == 63
        assert damaged in caplog.text
        assert len(reads) <= 2 + 2 * 6, reads  # the page, then log2(64) halvings of two reads


@pytest.mark.parametrize("listing", [False, True])
async def test_a_sweep_lets_the_loops_other_tasks_run_between_the_deadlines_it_records(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listing: bool
) -> None:
    """SQLite's store never suspends: recording 3,000 passed deadlines held the event loop for
    2.9 s, a server answering nothing (and renewing no lease) meanwhile. Another task runs
    between one session's deadlines and the next's, in a sweep and in a listing."""
    clock = ManualClock()
    agent = payout_agent(ExecutionLog(), so.always(expires_in=60))
    store_url = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        for _ in range(8):
            await asked(rt)
    clock.advance(61)
    async with so.Runtime([agent], store=store_url, clock=clock) as worker:
        ticks: list[int] = []
        seen: list[int] = []  # how many ticks had run as each session's deadlines were read
        checked = worker._checked

        async def counted(sid: str, *args: Any, **kwargs: Any) -> Any:
            seen.append(len(ticks))
            return await checked(sid, *args, **kwargs)

        async def ticker() -> None:
            while True:
                ticks.append(1)
                await asyncio.sleep(0)

        monkeypatch.setattr(worker, "_checked", counted)
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        await (worker.pending() if listing else worker.expire_due())
        task.cancel()
        recording = seen[:8]  # then the turns driven read them again
        assert len(recording) == 8, seen
        assert all(b > a for a, b in itertools.pairwise(recording)), seen


async def test_a_lapsed_session_the_sweep_cannot_record_does_not_hold_up_deadlines(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A session past its TTL that cannot be read stopped the sweep before any deadline was
    applied (the lapsed sessions are recorded first): the deadline is applied all the same."""
    clock = ManualClock()
    log = ExecutionLog()
    agents = [payout_agent(log, so.always(expires_in=60)), ttl_agent()]
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        lapsed = await rt.generate("desk", prompt="reset it")
        assert lapsed.status == "waiting"
        s2, r2, _ = await asked(rt)
    clock.advance(61)
    async with so.Runtime(agents, store=store_url, clock=clock) as worker:
        failing_loads(worker, lapsed.session_id)
        with caplog.at_level(logging.WARNING, logger="signoff.worker"):
            await worker.expire_due()
        assert lapsed.session_id in caplog.text
        stored = await worker.store.get_request(r2.id)
        assert stored is not None and stored.status == "expired"
        assert (await worker.state(s2)).turn_status == "completed"


async def test_an_orphan_the_sweep_cannot_read_does_not_hold_up_deadlines(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The sweep cancels children whose parent's turn ended before it applies deadlines: a child
    it could not read stopped it there, so no deadline was applied while that child stayed."""
    from ._subagents import ALICE
    from .test_subagents_cancel import _cancel_once_created, _lookup_agents

    clock = ManualClock()
    parent, child = _lookup_agents([])
    agents = [parent, child, payout_agent(ExecutionLog(), so.always(expires_in=60))]
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        _cancel_once_created(monkeypatch, rt, [sid], check=False)
        with pytest.raises(so.StoreError, match="died here"):
            await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        assert (await rt.state(sid)).turn_status == "cancelled"
        [orphan] = await rt.sessions(agent="billing")
        assert orphan.status == "running"
        monkeypatch.undo()
        s2, r2, _ = await asked(rt)
    clock.advance(61)
    async with so.Runtime(agents, store=store_url, clock=clock) as worker:
        failing_loads(worker, orphan.id)
        with caplog.at_level(logging.WARNING):
            await worker.expire_due()
        assert orphan.id in caplog.text
        stored = await worker.store.get_request(r2.id)
        assert stored is not None and stored.status == "expired"
        assert (await worker.state(s2)).turn_status == "completed"


async def test_a_sweep_reads_no_passed_deadline_of_an_agent_it_lacks(store_url: str) -> None:
    """A worker serving some agents read every passed deadline of every other agent at each
    sweep (every 5 s), though it applies none of them: with no process of that agent running,
    the same ones again and again, for as long as they stay open (2,000 on SQLite: 114 to 234 ms
    a sweep; now under 1 ms)."""
    clock = ManualClock()
    log = ExecutionLog()
    mine, theirs = (
        payout_agent(log, so.always(expires_in=60), name="mine"),
        payout_agent(log, so.always(expires_in=30), name="theirs"),
    )
    async with so.Runtime([mine, theirs], store=store_url, clock=clock) as rt:
        for _ in range(3):
            await asked(rt, "theirs")
        _, own, _ = await asked(rt, "mine")
    clock.advance(61)
    async with so.Runtime([mine], store=store_url, clock=clock) as worker:
        pending = worker.store.pending
        read: list[str] = []

        async def reading(flt: so.stores.PendingFilter) -> list[so.InputRequest]:
            page = await pending(flt)
            read.extend(r.agent or "" for r in page)
            return page

        worker.store.pending = reading  # type: ignore[method-assign]
        assert await worker.expire_due() == 1
        assert read == ["mine"]
        stored = await worker.store.get_request(own.id)
        assert stored is not None and stored.status == "expired"
        read.clear()
        assert await worker.expire_due() == 0
        assert read == []


async def test_a_sweep_reads_no_lapsed_session_of_an_agent_it_lacks(store_url: str) -> None:
    """Likewise the sessions whose TTL passed: those of an agent the worker lacks, which it
    cannot record, were read again at every sweep."""
    clock = ManualClock()
    log = ExecutionLog()
    async with so.Runtime([ttl_agent()], store=store_url, clock=clock) as rt:
        for _ in range(3):
            assert (await rt.generate("desk", prompt="reset it")).status == "waiting"
    clock.advance(61)
    agent = payout_agent(log, so.always(expires_in=60))
    async with so.Runtime([agent], store=store_url, clock=clock) as worker:
        lapsed = worker.store.lapsed_sessions  # type: ignore[attr-defined]
        read: list[str] = []

        async def reading(*args: Any, **kwargs: Any) -> list[so.stores.SessionSummary]:
            rows: list[so.stores.SessionSummary] = await lapsed(*args, **kwargs)
            read.extend(r.agent for r in rows)
            return rows

        worker.store.lapsed_sessions = reading  # type: ignore[attr-defined]
        assert await worker.expire_due() == 0
        assert read == []
    async with so.Runtime([ttl_agent()], store=store_url, clock=clock) as rt:
        assert await rt.expire_due() == 3  # its own it still reads and records


# -- session rows no one can read (SQLite keeps what a hand edit puts in a REAL column; in
# PostgreSQL's typed NOT NULL columns no such value can be) -------------------------------------


def damage_session_row(url: str, session_id: str) -> None:
    """Make the session's row unreadable to a listing: its `updated_at` text, not a number."""
    from .test_store_edited_rows import edit

    edit(url, "UPDATE {t}sessions SET updated_at = {p} WHERE id = {p}", "garbage", session_id)


@pytest.mark.parametrize("page", [500, 1])
async def test_a_lapsed_session_row_no_one_can_read_does_not_stop_the_sweep(
    tmp_path: Path, page: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """One session row whose TTL passed and that cannot be read (`updated_at` not a number)
    failed the listing of lapsed sessions as a whole, at every sweep: no expiry recorded, no
    deadline applied. It is logged, naming it, and passed; the others' expiries (also on the
    pages after it) and deadlines are recorded. The store's own listing still fails on it; those
    people read log it and leave it out (test_listing_damaged_rows.py)."""
    from signoff import _sweeping

    monkeypatch.setattr(_sweeping, "_SWEEP_PAGE", page)
    url = f"sqlite:///{tmp_path / 's.db'}"
    clock = ManualClock()
    agents = [ttl_agent(), payout_agent(ExecutionLog(), so.always(expires_in=60))]
    async with so.Runtime(agents, store=url, clock=clock) as rt:
        parked = []
        for _ in range(3):
            parked.append((await rt.generate("desk", prompt="reset it")).session_id)
            clock.advance(1)
        s2, r2, _ = await asked(rt)
    bad = parked[1]
    damage_session_row(url, bad)
    clock.advance(61)
    async with so.Runtime(agents, store=url, clock=clock) as worker:
        with caplog.at_level(logging.WARNING, logger="signoff.worker"):
            assert await worker.expire_due() == 3
        assert f"session {bad}: its expiry not recorded" in caplog.text
        assert "garbage" in caplog.text
        for sid in parked:  # as the rows hold them (a read of the session would record it)
            [(status,)] = query(url, "SELECT status FROM {t}sessions WHERE id = {p}", sid)
            assert status == ("waiting" if sid == bad else "failed")
        stored = await worker.store.get_request(r2.id)
        assert stored is not None and stored.status == "expired"
        assert (await worker.state(s2)).turn_status == "completed"
        with pytest.raises(so.StoreDamaged, match=bad):
            await worker.store.sessions()
        assert bad not in {s.id for s in await worker.sessions()}


async def test_an_orphan_row_no_one_can_read_does_not_stop_the_orphan_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Likewise one orphaned child's row failed the listing of orphans, at every sweep: no other
    orphan cancelled, and no deadline applied (they come after). It is logged and passed."""
    from signoff import _subagents

    from .test_offset_skips import three_orphans

    monkeypatch.setattr(_subagents, "_PAGE", 2)
    url = f"sqlite:///{tmp_path / 's.db'}"
    agents, orphans = await three_orphans(url, monkeypatch)
    bad = sorted(orphans)[1]
    damage_session_row(url, bad)
    async with so.Runtime(agents, store=url) as worker:
        with caplog.at_level(logging.WARNING):
            assert await worker.expire_due() == 2
        assert f"session {bad}: its orphaned turn not cancelled" in caplog.text
        for sid in orphans:
            turn = (await worker.state(sid)).turn
            assert turn is not None and (turn.status == "cancelled") is (sid != bad)


async def test_a_running_session_row_no_one_can_read_does_not_stop_an_inline_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Likewise, on a runtime that drives its own turns, one row among the running sessions a
    sweep goes on with (their deadlines recorded, their turns never driven): it is logged and
    passed, and the other turns go on."""
    from signoff import _sweeping

    from ._workers import refund_agent

    monkeypatch.setattr(_sweeping, "_SWEEP_PAGE", 2)
    url = f"sqlite:///{tmp_path / 's.db'}"
    clock = ManualClock()
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.always(expires_in=60, on_timeout="approve"))
    async with so.Runtime([agent], store=url, clock=clock) as rt:
        asked_ = [await rt.generate("support", prompt=f"Refund order {i}") for i in range(3)]
        clock.advance(61)
        token = _sweeping._handing.set(lambda sid, wait: None)  # recorded, then not driven
        try:
            assert await rt.expire_due() == 3
        finally:
            _sweeping._handing.reset(token)
    assert runs == []
    sessions = sorted(r.session_id for r in asked_)
    bad = sessions[1]
    damage_session_row(url, bad)
    async with so.Runtime([agent], store=url, clock=clock) as worker:
        with caplog.at_level(logging.WARNING, logger="signoff.worker"):
            assert await worker.expire_due() == 2
        assert f"session {bad}: its recorded deadlines not gone on with" in caplog.text
        for sid in sessions:
            status = (await worker.state(sid)).turn_status
            assert status == ("running" if sid == bad else "completed")
    assert len(runs) == 2


@pytest.mark.parametrize(
    "point", ["input.resolved", "tool.started", "tool.completed", "turn.completed"]
)
async def test_a_sweep_whose_drive_after_the_deadline_fails_says_the_deadline_was_recorded(
    store_url: str, point: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The deadline approved the call, in its own commit, and the store refused a later commit
    of the drive that went on with the turn (`point`'s): the log said the session's passed
    deadlines were not applied. It says they were recorded and the drive failed (and not
    applied only when the deadline's commit is the one refused); the next sweeps finish the
    turn, the call run once."""
    clock = ManualClock()
    log = ExecutionLog()
    agent = payout_agent(log, so.always(expires_in=60, on_timeout="approve"))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        sid, req, _ = await asked(rt)
    clock.advance(61)
    async with so.Runtime([agent], store=store_url, clock=clock) as worker:
        commit = worker.store.commit
        refused: list[str] = []

        async def once(batch: Any, *args: Any, **kwargs: Any) -> Any:
            if not refused and point in [e.type for e in batch.events]:
                refused.append(point)
                raise so.StoreError(f"refused (test) {point}")
            return await commit(batch, *args, **kwargs)

        worker.store.commit = once  # type: ignore[method-assign,assignment]
        with caplog.at_level(logging.WARNING, logger="signoff.worker"):
            touched = await worker.expire_due()
        assert refused == [point] and touched == (0 if point == "input.resolved" else 1)
        said = [r.getMessage() for r in caplog.records if r.name == "signoff.worker"]
        what = "recorded; driving its turn on failed"
        if point == "input.resolved":
            what = "not applied"
        assert said == [f"session {sid}: its passed deadlines {what}: refused (test) {point}"]
        stored = await worker.store.get_request(req.id)
        assert stored is not None
        assert stored.status == ("pending" if point == "input.resolved" else "expired")
        for _ in range(50):
            if (await worker.state(sid)).turn_status == "completed":
                break
            await worker.expire_due()
            await asyncio.sleep(0.05)
        assert (await worker.state(sid)).turn_status == "completed"
        assert len(log.executions) == 1
