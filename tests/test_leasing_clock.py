"""On PostgreSQL every time a runtime stamps or judges (leases, session TTLs, request deadlines,
ages) is the database's clock, as each process reckons it: a wall clock minutes off the
database's, or stepped after the process measured its distance to it (NTP correcting it, a
virtual machine resumed), must not make it take over a lease another process still holds,
expire a session or a request early, or keep one past its time. A clock given to the runtime
is used as it is, for all of them alike."""

from __future__ import annotations

import asyncio
import functools
import sys
import time
from typing import Any

import pytest

import signoff as so
from signoff import _leasing as leasing
from signoff.testing import ManualClock

from ._workers import is_, refund_agent, until, working

ORDER = {"order_id": "1042", "amount": 180.0}


def _agent(runs: list[str], release: asyncio.Event) -> so.Agent:
    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        await release.wait()
        return {"refunded": amount}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )
    steps = [call, so.ModelResponse(text="Done.")]
    return so.Agent(name="support", model=so.models.Scripted(steps), tools=[issue_refund])


async def test_a_wall_clock_stepped_after_opening_takes_no_live_lease_over(
    pg_store_url: str,
) -> None:
    """A process whose wall clock jumps an hour ahead once it is open still sees the lease
    another process holds (and renews) as live: it waits for it, and the call runs once."""
    runs: list[str] = []
    release = asyncio.Event()
    agent = _agent(runs, release)
    async with (
        # A TTL of seconds: the holder's renewals are not late on a loaded machine, and a
        # clock an hour ahead sees any TTL's lease lapsed.
        so.Runtime([agent], store=pg_store_url, lease_ttl=3.0) as holder,
        so.Runtime([agent], store=pg_store_url, lease_ttl=3.0, lease_wait=0.3) as stepped,
    ):
        sid = await holder.create_session("support")
        drive = asyncio.create_task(holder.generate("support", "Refund", session_id=sid))
        while not runs:
            await asyncio.sleep(0.01)
        stepped.clock = lambda: time.time() + 3600  # its machine's clock stepped
        taking = asyncio.create_task(stepped.generate(session_id=sid))
        try:
            await asyncio.wait({taking}, timeout=5)
            assert runs == [f"{sid}:1:call_refund"]  # not run again by `stepped`
            assert taking.done() and taking.result().status == "running"  # busy elsewhere
        finally:
            release.set()
            done = await asyncio.wait_for(drive, 10)
            await asyncio.wait_for(taking, 10)
        assert done.status == "completed"
    assert runs == [f"{sid}:1:call_refund"]


SKEWS = [pytest.param(-600.0, id="10min-behind"), pytest.param(600.0, id="10min-ahead")]


async def _database_time(rt: so.Runtime) -> float:
    server_time = getattr(rt.store, "server_time")  # noqa: B009
    return float(await server_time())


@pytest.mark.parametrize("skew", SKEWS)
async def test_a_skewed_process_times_the_sessions_it_starts_by_the_database(
    pg_store_url: str, skew: float
) -> None:
    """A front whose wall clock is 10 minutes off the database's starts a session with a 5
    minute TTL: its expiry is 5 minutes from the database's time (not 5 minutes past, when the
    front is behind: no worker would claim it, the sweep would expire it at once; nor 15
    minutes ahead), and a worker with a right clock claims it and runs its turn."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.never(), ttl=300)
    async with (
        so.Runtime([agent], store=pg_store_url, inline=False) as front,
        so.Runtime([agent], store=pg_store_url, inline=False) as worker,
    ):
        front.clock = lambda: time.time() + skew  # its machine's clock is off
        before = await _database_time(worker)
        r = await front.generate("support", prompt="Refund 1042")
        after = await _database_time(worker)
        (summary,) = await worker.sessions()
        assert summary.expires_at is not None
        assert before + 300 - 1 <= summary.expires_at <= after + 300 + 1
        async with working(worker):
            await until(lambda: is_(worker, r.session_id, "completed"))
        assert runs == [f"{r.session_id}:1:call_refund"]


@pytest.mark.parametrize("skew", SKEWS)
async def test_a_skewed_process_expires_no_deadline_early_nor_sets_one_late(
    pg_store_url: str, skew: float
) -> None:
    """Two processes, one with a wall clock 10 minutes off the database's, each park a turn on
    an approval that expires in 5 minutes, in a session with a 5 minute TTL: each deadline is
    5 minutes from the database's time, and a sweep or an `older_than` listing in either
    process finds nothing due, lapsed or minutes old."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.always(expires_in=300), ttl=300)
    async with (
        so.Runtime([agent], store=pg_store_url) as skewed,
        so.Runtime([agent], store=pg_store_url) as right,
    ):
        skewed.clock = lambda: time.time() + skew
        for rt in (skewed, right):
            before = await _database_time(right)
            r = await rt.generate("support", prompt="Refund 1042")
            after = await _database_time(right)
            (req,) = r.pending
            assert req.expires_at is not None
            assert before + 300 - 1 <= req.expires_at <= after + 300 + 1
            assert before - 1 <= req.created_at <= after + 1
        for rt in (skewed, right):
            assert await rt.expire_due() == 0
            assert await rt.pending(older_than=60) == []
            assert len(await rt.pending()) == 2
            for s in await rt.sessions():
                assert (await rt.state(s.id)).turn.status == "waiting"  # type: ignore[union-attr]
        assert runs == []


async def test_a_given_clock_times_claims_as_it_times_ttls(store_url: str) -> None:
    """Runtimes given one clock (a test's) time leases and TTLs alike by it, as it is: a
    worker claims a session whose TTL that clock has not passed (on PostgreSQL the claim judged
    the TTL by the database's clock, years from the test's, so never took it)."""
    runs: list[str] = []
    clock = ManualClock()
    agent = refund_agent(runs, approval=so.never(), ttl=300)
    async with (
        so.Runtime([agent], store=store_url, inline=False, clock=clock) as front,
        so.Runtime([agent], store=store_url, inline=False, clock=clock) as worker,
    ):
        r = await front.generate("support", prompt="Refund 1042")
        async with working(worker):
            await until(lambda: is_(worker, r.session_id, "completed"))
        assert runs == [f"{r.session_id}:1:call_refund"]
        assert front.now() == worker.now() == clock.now


class _Suspended:
    """The `time` module as a process resumed from a suspend sees it: `monotonic()` missed the
    time the machine slept (Linux, macOS), everything else is the real module's."""

    def __init__(self) -> None:
        self.lag = 0.0

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def monotonic(self) -> float:
        return time.monotonic() - self.lag


@pytest.mark.skipif(sys.platform != "linux", reason="CLOCK_BOOTTIME is Linux's")
def test_leases_are_timed_by_a_clock_that_counts_a_suspend() -> None:
    """On Linux the lease clock is CLOCK_BOOTTIME, which goes on while the machine sleeps
    (`time.monotonic()` is CLOCK_MONOTONIC, which stops)."""
    clock = leasing._AWAKE
    assert isinstance(clock, functools.partial)
    assert clock.func is time.clock_gettime and clock.args == (time.CLOCK_BOOTTIME,)
    assert abs(clock() - time.clock_gettime(time.CLOCK_BOOTTIME)) < 0.5


async def test_a_machine_resumed_from_suspend_times_its_leases_by_the_time_that_passed(
    pg_store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A suspend (a laptop's lid closed, a guest suspended) stops `time.monotonic()` on Linux and
    macOS while the database's clock, and every other machine's, goes on. Were leases reckoned
    from it, the resumed process would time them an hour behind: the lease it renews would be
    lapsed for every other process, which would take it over and run the call again. Here the
    monotonic clock of one process lagging by an hour after it opened stands in for the suspend:
    the lease it holds is still seen live by the other, and the call runs once."""
    runs: list[str] = []
    release = asyncio.Event()
    agent = _agent(runs, release)
    # A TTL of seconds, so the holder's renewals (each third of it) are not late on a loaded
    # machine: one has half of it to get through.
    ttl = 3.0
    other = so.Runtime([agent], store=pg_store_url, lease_ttl=ttl, lease_wait=0.3)
    await other.open()  # its clocks did not stop
    suspended = _Suspended()
    monkeypatch.setattr(leasing, "time", suspended)
    async with so.Runtime([agent], store=pg_store_url, lease_ttl=ttl) as resumed, other:
        renewed: list[bool] = []
        renew = resumed.store.renew_lease

        async def counted(*args: Any, **kwargs: Any) -> bool:
            live = await renew(*args, **kwargs)
            renewed.append(live)
            return live

        monkeypatch.setattr(resumed.store, "renew_lease", counted)
        sid = await resumed.create_session("support")
        drive = asyncio.create_task(resumed.generate("support", "Refund", session_id=sid))
        while not runs:
            await asyncio.sleep(0.01)
        suspended.lag = 3600.0  # resumed: its monotonic clock missed the hour it slept
        since = len(renewed)
        # More than a TTL, so the lease it renewed before the suspend has lapsed, and renewals
        # since (one may have been on its way): only those can keep it live now.
        await asyncio.sleep(ttl + 0.2)
        for _ in range(3000):
            if len(renewed) >= since + 2:
                break
            await asyncio.sleep(0.01)
        assert len(renewed) >= since + 2 and all(renewed), renewed
        taking = asyncio.create_task(other.generate(session_id=sid))
        try:
            await asyncio.wait({taking}, timeout=5)
            assert runs == [f"{sid}:1:call_refund"]  # not run again by `other`
            assert taking.done() and taking.result().status == "running"  # busy elsewhere
        finally:
            release.set()
            done = await asyncio.wait_for(drive, 10)
            await asyncio.wait_for(taking, 10)
        assert done.status == "completed"
    assert runs == [f"{sid}:1:call_refund"]


async def test_the_database_clock_is_read_at_the_middle_of_the_round_trip(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The database's answer is taken as its time halfway through the query, so a slow round
    trip puts this process's reckoning off by half of it at most, not all of it."""
    monotonic = [100.0]
    monkeypatch.setattr(leasing, "_AWAKE", lambda: monotonic[0])
    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")

    async def server_time() -> float:
        monotonic[0] += 2  # the query takes two seconds
        return 5000.0

    monkeypatch.setattr(rt, "store", type("Timed", (), {"server_time": staticmethod(server_time)}))
    await rt._sync_lease_clock()
    monotonic[0] = 101.0  # halfway through the query: when the database read its clock
    assert rt.now() == 5000.0
