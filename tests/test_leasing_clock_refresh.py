"""Every process measures the database's clock again once its measurement is
`CLOCK_CHECK_EVERY` old, not only workers at their sweeps: a front, `signoff serve` without
workers or any runtime used for days would otherwise time leases, deadlines and events for its
whole life by its first measurement, off by a step of the database's clock (NTP) or by the drift
of this machine's from it. The measurement runs in the background: no call waits for it.

Most tests here give a SQLite store a database clock of its own (`_Clocked`), which steps when
told, and time the process by a monotonic clock that moves only when told."""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff import _leasing as leasing
from signoff._exceptions import StoreError
from signoff.server import create_app
from signoff.stores.sqlite import SQLiteStore
from signoff.testing import ManualClock

from ._spies import CallSpy
from ._workers import refund_agent, until

BOUND = leasing.CLOCK_CHECK_EVERY


class _Clocked(SQLiteStore):
    """A SQLite store with a database clock of its own, as PostgreSQL's: `offset` ahead of the
    process's monotonic clock (`awake`). `gate`, while unset, holds each reading of it."""

    def __init__(self, url: str, awake: list[float]) -> None:
        super().__init__(url)
        self.awake = awake
        self.offset = 1_000_000.0
        self.reads = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.failing = False

    async def server_time(self) -> float:
        self.reads += 1
        await self.gate.wait()
        if self.failing:
            raise StoreError("the database is unreachable")
        return self.awake[0] + self.offset


@pytest.fixture
def awake(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[float]]:
    """The process's monotonic clock (`_AWAKE`), moved only by the test."""
    clock = [5000.0]
    monkeypatch.setattr(leasing, "_AWAKE", lambda: clock[0])
    yield clock


@pytest.fixture
def store(tmp_path: Path, awake: list[float]) -> _Clocked:
    return _Clocked(f"sqlite:///{tmp_path / 's.db'}", awake)


def _agent() -> so.Agent:
    steps = [so.ModelResponse(text="Done.")] * 10
    return so.Agent(name="support", model=so.models.Scripted(steps))


async def _measured(rt: so.Runtime) -> None:
    """Let a measurement started in the background finish."""
    check = rt._lease_check
    if check is not None:
        await asyncio.wait_for(asyncio.shield(check), 5)


def _store_methods() -> list[str]:
    return [
        name
        for name, member in inspect.getmembers(SQLiteStore)
        if not name.startswith("_") and inspect.iscoroutinefunction(member)
    ] + ["server_time"]


async def test_a_stepped_database_clock_is_picked_up_within_the_bound(
    store: _Clocked, awake: list[float]
) -> None:
    """The database's clock steps 30 s ahead after the process measured it: calls within the
    bound go by the first measurement and do not read the clock again; the first call past
    the bound has it measured again, and the process then goes by the stepped clock."""
    async with so.Runtime([_agent()], store=store) as rt:
        assert store.reads == 1 and rt.now() == awake[0] + 1_000_000.0
        store.offset += 30.0  # NTP steps the database server's clock
        awake[0] += BOUND - 1
        for _ in range(3):
            await rt.sessions()
            await _measured(rt)
        assert store.reads == 1  # no call within the bound reads the clock
        assert rt.now() == awake[0] + 1_000_000.0
        awake[0] += 1
        await rt.sessions()
        await _measured(rt)
        assert store.reads == 2
        assert rt.now() == awake[0] + 1_000_030.0
        awake[0] += BOUND - 1  # measured anew: the bound counts from then
        await rt.sessions()
        assert rt._lease_check is None and store.reads == 2


async def test_the_turn_that_finds_it_due_does_not_wait_for_the_measurement(
    store: _Clocked, awake: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A turn made within the bound reads no clock; one made past it starts one reading, in
    the background, and completes while that reading is held up, with the same store calls as
    the first turn (no round trip added to it). Once the reading is through, the stepped clock
    is the process's."""
    spy = CallSpy(monkeypatch)
    spy.wrap(store, _store_methods())
    async with so.Runtime([_agent()], store=store) as rt:
        spy.on = True
        fresh = await rt.generate("support", "Hello")
        fresh_calls, spy.calls[:] = list(spy.calls), []
        assert fresh.status == "completed" and "server_time" not in fresh_calls
        store.offset += 30.0
        store.gate.clear()  # the database's clock answers only once let
        awake[0] += BOUND
        due = await asyncio.wait_for(rt.generate("support", "Hello"), 5)
        assert due.status == "completed"
        assert spy.calls.count("server_time") == 1  # started, held up: not waited for
        assert [c for c in spy.calls if c != "server_time"] == fresh_calls
        assert rt.now() == awake[0] + 1_000_000.0  # the turn went by the old measurement
        store.gate.set()
        await _measured(rt)
        assert rt.now() == awake[0] + 1_000_030.0


async def test_a_long_drive_picks_the_step_up_from_its_lease_renewals(
    store: _Clocked, awake: list[float]
) -> None:
    """A turn whose tool runs for longer than the bound, with no call made meanwhile: the
    renewals of its lease have the clock measured again, and renew by the stepped clock."""
    release = asyncio.Event()
    running = asyncio.Event()

    @so.tool(approval=so.never())
    async def export(ctx: so.ToolContext) -> str:
        """Export everything (it takes hours)."""
        running.set()
        await release.wait()
        return "exported"

    call = so.ModelResponse(tool_calls=[so.ToolCall(id="c1", name="export", input={})])
    agent = so.Agent(
        name="support",
        model=so.models.Scripted([call, so.ModelResponse(text="Done.")]),
        tools=[export],
    )
    async with so.Runtime([agent], store=store, lease_ttl=0.3) as rt:
        drive = asyncio.create_task(rt.generate("support", "Export"))
        await asyncio.wait_for(running.wait(), 5)
        store.offset += 30.0
        awake[0] += BOUND
        await until(lambda: asyncio.sleep(0, store.reads == 2))
        await _measured(rt)
        assert rt.now() == awake[0] + 1_000_030.0
        release.set()
        assert (await asyncio.wait_for(drive, 5)).status == "completed"


async def test_a_failed_measurement_keeps_the_last_and_is_tried_again_later(
    store: _Clocked, awake: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    """The database failing when its clock is due to be measured: calls go on by the last
    measurement, a warning says so, and the clock is read again `CLOCK_RETRY` later, not at
    every call meanwhile."""
    caplog.set_level(logging.WARNING, "signoff.runtime")
    async with so.Runtime([_agent()], store=store) as rt:
        store.failing = True
        store.offset += 30.0
        awake[0] += BOUND
        await rt.sessions()
        await _measured(rt)
        assert store.reads == 2 and rt.now() == awake[0] + 1_000_000.0
        assert "measuring the database's clock again failed" in caplog.text
        awake[0] += leasing.CLOCK_RETRY - 1
        await rt.sessions()
        assert rt._lease_check is None and store.reads == 2
        store.failing = False
        awake[0] += 1
        await rt.sessions()
        await _measured(rt)
        assert store.reads == 3 and rt.now() == awake[0] + 1_000_030.0


async def test_closing_stops_a_measurement_in_flight(store: _Clocked, awake: list[float]) -> None:
    """A runtime closed while its clock is being measured stops the measurement first (it does
    not read a closed store), and opening it again measures the clock at once."""
    rt = so.Runtime([_agent()], store=store)
    await rt.open()
    store.gate.clear()
    awake[0] += BOUND
    await rt.sessions()
    check = rt._lease_check
    assert check is not None
    await asyncio.sleep(0)  # the reading is under way
    await asyncio.wait_for(rt.close(), 5)
    assert check.cancelled() and rt._lease_check is None
    store.offset += 30.0
    store.gate.set()
    async with rt:
        assert rt.now() == awake[0] + 1_000_030.0


async def test_a_store_without_a_clock_of_its_own_is_never_measured(
    tmp_path: Path, awake: list[float]
) -> None:
    """SQLite (every process on this machine's wall clock) and a clock given to the runtime have
    no distance to measure: no call past the bound starts a measurement."""
    for clock in (None, ManualClock()):
        kw: dict[str, Any] = {} if clock is None else {"clock": clock}
        async with so.Runtime([_agent()], store=f"sqlite:///{tmp_path / 's.db'}", **kw) as rt:
            awake[0] += BOUND * 10
            assert (await rt.generate("support", "Hello")).status == "completed"
            assert rt._lease_check is None and rt._lease_base is None


async def test_serve_without_workers_measures_it_again_while_idle(
    store: _Clocked, awake: list[float]
) -> None:
    """`signoff serve` of a runtime that leaves its turns to workers runs no worker, only its
    sweep of passed deadlines: that sweep has the clock measured again once due, with no
    request made."""
    rt = so.Runtime([_agent()], store=store, inline=False)
    app = create_app(rt, dev=True, workers=0, sweep_every=0.02)
    async with app.router.lifespan_context(app):
        assert store.reads == 1
        store.offset += 30.0
        awake[0] += BOUND
        await until(lambda: asyncio.sleep(0, store.reads == 2))
        await _measured(rt)
        assert rt.now() == awake[0] + 1_000_030.0
    await rt.close()


async def test_a_worker_still_measures_it_at_every_sweep(
    store: _Clocked, awake: list[float]
) -> None:
    """A worker measures the clock at each sweep, as before, well within the bound: a step is
    picked up by its next sweep."""
    runs: list[str] = []
    async with so.Runtime([refund_agent(runs)], store=store) as rt:
        stop = asyncio.Event()
        work = asyncio.create_task(rt.work(stop=stop, idle_wait=0.02, sweep_every=0.02))
        try:
            await until(lambda: asyncio.sleep(0, store.reads >= 3))
            store.offset += 30.0
            await until(lambda: asyncio.sleep(0, rt.now() == awake[0] + 1_000_030.0))
        finally:
            stop.set()
            await asyncio.wait_for(work, 5)


async def test_a_drifted_process_is_right_again_after_the_bound(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL: a process whose clock drifted 90 s from the database's since it opened
    (the bound and more) times by the database's clock again after its next call."""
    drift = [0.0]
    real = leasing._AWAKE
    monkeypatch.setattr(leasing, "_AWAKE", lambda: real() + drift[0])
    async with so.Runtime([], store=pg_store_url) as rt:
        server_time: Any = getattr(rt.store, "server_time")  # noqa: B009
        assert abs(rt.now() - await server_time()) < 0.5
        drift[0] = BOUND + 30
        assert rt.now() - await server_time() > BOUND
        started = time.monotonic()
        await rt.sessions()
        await _measured(rt)
        assert time.monotonic() - started < 5
        assert abs(rt.now() - await server_time()) < 0.5


def test_close_stops_a_measurement_left_on_a_loop_closed_since(
    store: _Clocked, awake: list[float]
) -> None:
    """A measurement started on a loop the caller closed unfinished (`loop.close()` cancels
    nothing): `close` from another loop closes the store instead of raising RuntimeError
    ('Event loop is closed') out of cancelling it there."""
    rt = so.Runtime([_agent()], store=store)
    first = asyncio.new_event_loop()
    try:
        first.run_until_complete(rt.open())
        awake[0] += BOUND
        store.gate.clear()  # the measurement is held: still running when its loop closes
        first.run_until_complete(rt.sessions())
        assert rt._lease_check is not None and not rt._lease_check.done()
    finally:
        first.close()
    asyncio.run(rt.close())
    assert rt._lease_check is None and not rt._opened


def test_close_from_another_thread_cancels_a_measurement_thread_safely(
    store: _Clocked, awake: list[float]
) -> None:
    """A measurement a blocking twin started on the sync bridge's loop, and `close` awaited on
    the caller's own loop (asyncio's debug mode refuses a Task.cancel from another thread):
    it is cancelled on its loop and the store is closed."""
    rt = so.Runtime([_agent()], store=store)
    rt.sessions_sync()  # opens it on the bridge's loop
    bridge = rt._sync._loop
    assert bridge is not None
    bridge.set_debug(True)  # refuses a call_soon from another thread
    awake[0] += BOUND
    store.gate.clear()  # the measurement is held on the bridge's loop
    rt.sessions_sync()
    check = rt._lease_check
    assert check is not None and not check.done()
    asyncio.run(rt.close())
    assert check.cancelled() and not rt._opened
