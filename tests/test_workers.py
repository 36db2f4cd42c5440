"""Workers in one process: `Runtime(inline=False)` records what it is given, `Runtime.work()`
claims the sessions that have work under a lease and runs them. Run on both stores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff._events import Event
from signoff._exceptions import LeaseLost
from signoff.stores import Commit
from signoff.testing import ManualClock

from ._procs import ROOT

ORDER = {"order_id": "1042", "amount": 180.0}


def refund_agent(
    runs: list[str],
    *,
    approval: Any = None,
    delay: float = 0.0,
    first: Callable[[list[so.Message]], Awaitable[so.ModelResponse]] | None = None,
    ttl: float | None = None,
) -> so.Agent:
    """One refund call that needs approval (by default), then a text; the tool logs its key."""

    @so.tool(approval=approval or so.always())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        await asyncio.sleep(delay)
        return {"refunded": amount}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )
    steps: list[Any] = [first or call, so.ModelResponse(text="Done.")]
    return so.Agent(
        name="support",
        model=so.models.Scripted(steps),
        tools=[issue_refund],
        limits=so.Limits(ttl=ttl),
    )


@contextlib.asynccontextmanager
async def working(rt: so.Runtime, **kw: Any) -> AsyncIterator[asyncio.Event]:
    """Run `rt.work()` in the background; stop it gracefully (and check it returned) at exit."""
    stop = asyncio.Event()
    task = asyncio.create_task(rt.work(stop=stop, idle_wait=0.05, **kw))
    try:
        yield stop
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)


async def is_(rt: so.Runtime, session_id: str, wanted: str) -> bool:
    """Whether the session's turn has status `wanted`."""
    turn = (await rt.state(session_id)).turn
    return turn is not None and turn.status == wanted


async def test_a_front_records_and_a_worker_runs_the_turns(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    runs: list[str] = []
    agent = refund_agent(runs)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        assert r.status == "running" and r.pending == []  # recorded; nobody ran it yet
        assert await front.store.head(r.session_id) == 2
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(worker, concurrency=2):
                await until(lambda: is_(front, r.session_id, "waiting"))
                (req,) = await front.pending(session_id=r.session_id)
                answered = await front.respond(
                    r.session_id, [so.InputResponse(request_id=req.id, option_id="approve")]
                )
                assert answered.outcomes[0].applied and runs == []  # the worker runs the tool
                await until(lambda: is_(front, r.session_id, "completed"))
        assert runs == [f"{r.session_id}:1:call_refund"]
        assert (await front.state(r.session_id)).turn.text == "Done."  # type: ignore[union-attr]
        assert f"claimed session {r.session_id}" in caplog.text


async def test_a_live_lease_keeps_workers_off_and_an_expired_one_is_fenced(
    store_url: str,
) -> None:
    runs: list[str] = []
    agent = refund_agent(runs)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        sid = r.session_id
        # Another process claimed it first (and then stalled): its lease is live for 0.5 s.
        ((got, token),) = await front.store.claim("stalled", 0.5, time.time(), 10)
        assert got == sid
        assert await front.store.claim("nobody", 10, time.time(), 10) == []
        async with working(worker):
            await asyncio.sleep(0.25)
            assert await front.store.head(sid) == 2  # nobody ran the turn under the live lease
            await until(lambda: is_(front, sid, "waiting"))  # taken over once it expired
        head = await front.store.head(sid)
        assert head is not None
        late = Event(session_id=sid, seq=head + 1, type="turn.message", at=time.time(), data={})
        with pytest.raises(LeaseLost):  # the stalled holder's token no longer writes
            await front.store.commit(
                Commit(session_id=sid, expected_seq=head, events=[late], lease_token=token)
            )
        assert await front.store.head(sid) == head


async def test_a_worker_retries_a_failed_turn_when_asked(store_url: str) -> None:
    runs: list[str] = []
    calls = 0

    async def flaky(messages: list[so.Message]) -> so.ModelResponse:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise so.ModelError("upstream overloaded")
        return so.ModelResponse(text="Done.")

    agent = refund_agent(runs, first=flaky)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker):
            await until(lambda: is_(front, r.session_id, "failed"))
            state = await front.state(r.session_id)
            assert state.turn is not None and state.turn.retryable
            await asyncio.sleep(0.2)
            assert calls == 1  # a failed turn is not retried by itself
            again = await front.generate(session_id=r.session_id)  # retry: a worker runs it
            assert again.status == "running"
            await until(lambda: is_(front, r.session_id, "completed"))
        assert calls == 2
        types = [e.type async for e in front.events(r.session_id, follow=False)]
        assert types.count("turn.failed") == 1 and types.count("turn.resumed") == 1


async def test_the_worker_sweep_applies_passed_deadlines(store_url: str) -> None:
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.always(expires_in=0.3))
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker, sweep_every=0.1):
            await until(lambda: is_(front, r.session_id, "waiting"))
            (req,) = await front.pending(session_id=r.session_id)
            assert req.expires_at is not None
            # Nobody answers: the sweep denies it and a worker finishes the turn.
            await until(lambda: is_(front, r.session_id, "completed"))
        assert time.time() >= req.expires_at
        assert runs == []  # denied by the deadline: the tool never ran
        stored = await front.store.get_request(req.id)
        assert stored is not None and stored.status == "expired"
        assert await front.pending(session_id=r.session_id) == []


async def test_stop_lets_a_running_turn_finish_and_releases_its_lease(store_url: str) -> None:
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.never(), delay=0.4)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=30.0) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        stop = asyncio.Event()
        task = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        await until(lambda: asyncio.sleep(0, bool(runs)))  # the tool body is running
        stop.set()
        await asyncio.wait_for(task, 10)  # returns once the turn in flight is over
        assert await is_(front, r.session_id, "completed")
        assert runs == [f"{r.session_id}:1:call_refund"]
        # Released, not left to expire: another owner gets the lease at once.
        assert await front.store.acquire_lease(r.session_id, "next", 30, time.time()) is not None
        other = await front.generate(prompt="Refund order 7", agent="support")
        await asyncio.sleep(0.2)
        assert await is_(front, other.session_id, "running")  # a stopped worker claims nothing


async def test_work_refuses_a_concurrency_below_one(store_url: str) -> None:
    async with so.Runtime([refund_agent([])], store=store_url, inline=False) as rt:
        with pytest.raises(so.UsageError, match="concurrency"):
            await rt.work(concurrency=0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"concurrency": -3}, "concurrency"),
        ({"concurrency": 2.5}, "concurrency"),
        ({"concurrency": True}, "concurrency"),
        ({"idle_wait": 0}, "idle_wait"),  # a claim loop that never sleeps
        ({"idle_wait": -1.0}, "idle_wait"),
        ({"sweep_every": 0}, "sweep_every"),  # a full deadline sweep on every round
        ({"sweep_every": float("nan")}, "sweep_every"),
    ],
)
async def test_work_refuses_settings_that_would_spin(
    tmp_path: Path, kwargs: dict[str, Any], name: str
) -> None:
    async with so.Runtime([refund_agent([])], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        with pytest.raises(so.UsageError, match=name):
            await asyncio.wait_for(rt.work(**kwargs), 2)


@pytest.mark.parametrize("ttl", [0, -5.0, float("inf"), float("nan"), "30"])
def test_a_runtime_refuses_a_lease_ttl_that_is_not_a_positive_duration(ttl: Any) -> None:
    """A lease of 0 s (or less) is expired as it is granted, so every worker could claim the
    same session at once; an infinite one never lets a dead worker's sessions be resumed."""
    with pytest.raises(so.UsageError, match="lease_ttl"):
        so.Runtime([refund_agent([])], store="sqlite:///:memory:", lease_ttl=ttl)


# -- the commands ---------------------------------------------------------------------------


def _signoff(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "signoff", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_db_upgrade_migrates_once_and_names_a_bad_store(pg_url: str) -> None:
    first = _signoff("db", "upgrade", "--store", pg_url)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("schema created (version ")
    again = _signoff("db", "upgrade", "--store", pg_url)
    assert again.returncode == 0 and again.stdout.startswith("schema is up to date")
    bad = _signoff("db", "upgrade", "--store", "postgresql://postgres@127.0.0.1:1/nowhere")
    assert bad.returncode == 1 and "StoreUnavailable: cannot connect" in bad.stderr


def test_worker_command_stops_gracefully_on_sigint(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "worker", "tests._worker_procs:runtime"]
        + ["--store", url, "--concurrency", "3"],
        cwd=ROOT,
        env={**os.environ, "SIGNOFF_TEST_RECORDS": str(tmp_path / "runs.jsonl")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert "worker " in first and "concurrency 3" in first, first
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, rest
    assert "SIGINT: stopping after the running turns" in rest and "worker stopped" in rest


def test_worker_command_reports_a_bad_target() -> None:
    bad = _signoff("worker", "no_such_module_xyz:runtime", "--store", "sqlite:///:memory:")
    assert bad.returncode == 1 and "UsageError" in bad.stderr


def test_worker_command_reports_a_factory_that_fails() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SIGNOFF_TEST_RECORDS"}
    bad = subprocess.run(  # the factory reads SIGNOFF_TEST_RECORDS: a KeyError without it
        [sys.executable, "-m", "signoff", "worker", "tests._worker_procs:runtime"]
        + ["--store", "sqlite:///:memory:"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    assert "UsageError: tests._worker_procs:runtime() failed: KeyError" in bad.stderr


# -- a store that fails or stalls for a while -----------------------------------------------


async def test_a_worker_outlives_a_store_outage(store_url: str) -> None:
    """Claims and the deadline sweep failing for a while (the database restarting, its pool
    timing out) are logged and retried: the worker keeps going and runs the turns after."""
    runs: list[str] = []
    agent = refund_agent(runs)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        failures = {"claim": 3, "pending": 2}
        claim, pending = worker.store.claim, worker.store.pending

        async def down_claim(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            if failures["claim"]:
                failures["claim"] -= 1
                raise so.StoreError("claiming runnable sessions: no connection (test)")
            return await claim(*args, **kwargs)

        async def down_pending(*args: Any) -> list[so.InputRequest]:
            if failures["pending"]:
                failures["pending"] -= 1
                raise so.StoreError("listing requests: no connection (test)")
            return await pending(*args)

        worker.store.claim = down_claim  # type: ignore[method-assign]
        worker.store.pending = down_pending  # type: ignore[method-assign,assignment]
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker, sweep_every=0.01):
            await until(lambda: is_(front, r.session_id, "waiting"))
        assert failures == {"claim": 0, "pending": 0}


async def test_a_claim_that_waited_long_still_holds_a_live_lease(store_url: str) -> None:
    """A claim stuck longer than the lease TTL (waiting for a pool connection) must not hand
    the worker a lease that is already expired, which any other worker could claim at once."""
    entered = asyncio.Event()
    release = asyncio.Event()

    async def slow(messages: list[so.Message]) -> so.ModelResponse:
        entered.set()
        await release.wait()
        return so.ModelResponse(text="Done.")

    agent = refund_agent([], first=slow)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=0.6) as worker,
    ):
        claim = worker.store.claim

        async def stuck(
            owner: str, ttl: float, now: float, limit: int, agents: Sequence[str] | None = None
        ) -> list[tuple[str, int]]:
            await asyncio.sleep(0.9)  # the `now` it was given is older than the TTL by then
            return await claim(owner, ttl, now, limit, agents)

        worker.store.claim = stuck  # type: ignore[method-assign]
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(worker):
            await asyncio.wait_for(entered.wait(), 10)
            try:
                assert await front.store.claim("other", 10, time.time(), 10) == []
            finally:
                release.set()
            await until(lambda: is_(front, r.session_id, "completed"))


async def test_a_failed_renewal_is_retried_and_does_not_fail_the_turn(store_url: str) -> None:
    """One renewal failing (a dropped connection) must not end the renewals, or the lease lapses
    under a long tool call and another worker runs it again, nor turn the drive into an error."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.never(), delay=1.2)
    async with so.Runtime([agent], store=store_url, lease_ttl=0.45) as rt:
        renew = rt.store.renew_lease
        calls = 0

        async def flaky(*args: Any) -> bool:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise so.StoreError("renewing the lease: connection lost (test)")
            return await renew(*args)

        rt.store.renew_lease = flaky  # type: ignore[method-assign,assignment]
        sid = await rt.create_session("support")
        task = asyncio.create_task(rt.generate("support", "Refund order 1042", session_id=sid))
        await until(lambda: asyncio.sleep(0, bool(runs)))  # the tool body is running
        await asyncio.sleep(0.7)  # past the TTL since the failed renewal
        try:
            assert await rt.store.claim("other", 10, time.time(), 10) == []
        finally:
            result = await asyncio.wait_for(task, 10)
        assert result.status == "completed" and calls >= 2
        assert runs == [f"{sid}:1:call_refund"]


async def test_a_renewal_failing_in_a_claim_gives_back_only_what_it_could_not_confirm(
    store_url: str,
) -> None:
    """A claim that took long renews each lease before driving it; one renewal failing (a
    dropped connection) must not drop the whole claim, leaving every session leased to this
    worker and driven by nobody until the TTL lapses: that one is given back, the rest driven."""
    clock = ManualClock(time.time())
    agent = refund_agent([])
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, clock=clock, lease_ttl=30) as worker,
    ):
        first = await front.generate("support", prompt="Refund order 1042")
        second = await front.generate("support", prompt="Refund order 1042")
        claim, renew = worker.store.claim, worker.store.renew_lease
        slow, failing = [True], [True]

        async def slow_claim(
            owner: str, ttl: float, now: float, limit: int, agents: Sequence[str] | None = None
        ) -> list[tuple[str, int]]:
            claimed = await claim(owner, ttl, now, limit, agents)
            if slow:  # as if it waited half the TTL: each lease is renewed before it is driven
                slow.clear()
                assert len(claimed) == 2
                clock.advance(15)
            return claimed

        async def flaky_renew(*args: Any) -> bool:
            if failing:
                failing.clear()
                raise so.StoreError("renewing the lease: connection lost (test)")
            return await renew(*args)

        worker.store.claim = slow_claim  # type: ignore[method-assign]
        worker.store.renew_lease = flaky_renew  # type: ignore[method-assign,assignment]
        async with working(worker):
            for r in (first, second):  # long before the 30 s lease could lapse
                await until(lambda r=r: is_(front, r.session_id, "waiting"))  # type: ignore[misc]
        assert not slow and not failing


@pytest.mark.parametrize("pending", [False, True])
async def test_a_session_that_expires_with_its_turn_unfinished_is_recorded_expired(
    store_url: str, pending: bool
) -> None:
    """A session whose TTL passes while its turn is unfinished (no worker ran it, or one died;
    or its open requests expire with it) can never run again: claims skip it. The sweep records
    that, so the store stops listing it as `running` for ever, and it stays expired after."""
    clock = ManualClock(time.time())
    runs: list[str] = []
    approval = so.always() if pending else so.never()
    agent = refund_agent(runs, approval=approval, ttl=60)
    async with so.Runtime([agent], store=store_url, inline=pending, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        # waiting for a person, or recorded for a worker that never comes
        assert r.status == ("waiting" if pending else "running")
        clock.advance(61)
        await rt.expire_due()
        assert await rt.store.sessions(status="running") == []
        assert await rt.store.claim("other", 10, time.time(), 10) == []
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "failed"
        assert not state.turn.retryable and state.expired(clock())
        [summary] = await rt.sessions()
        assert summary.status == "failed"
        with pytest.raises(so.SessionExpired):
            await rt.generate(session_id=r.session_id, prompt="hello again")
        clock.advance(3600)
        await rt.expire_due()  # recorded once
        types = [e.type async for e in rt.events(r.session_id, follow=False)]
        assert types.count("turn.failed") == 1
        assert runs == []


async def test_the_listing_records_a_running_session_whose_ttl_passed(store_url: str) -> None:
    """Like a request whose deadline passed, a session that expired running is never listed
    as running, even before any sweep has run: the listing records its expiry first."""
    clock = ManualClock(time.time())
    agent = refund_agent([], ttl=60)
    async with so.Runtime([agent], store=store_url, inline=False, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        [summary] = await rt.sessions(status="running")
        assert summary.id == r.session_id
        clock.advance(61)
        assert await rt.sessions(status="running") == []
        assert [s.status for s in await rt.sessions()] == ["failed"]


async def test_resuming_a_session_that_expired_running_records_its_expiry(store_url: str) -> None:
    """`generate(session_id=...)` drives under a lease of its own, then finds the TTL passed:
    it records the expiry under that lease (no one else can hold the session), so the store
    stops listing it running; while another process holds the lease, nothing is recorded."""
    clock = ManualClock(time.time())
    agent = refund_agent([], ttl=60)
    async with so.Runtime([agent], store=store_url, inline=False, clock=clock) as rt:
        held = await rt.generate("support", prompt="Refund order 1042")
        r = await rt.generate("support", prompt="Refund order 1043")
        clock.advance(61)
        now = rt.now()
        assert await rt.store.acquire_lease(held.session_id, "other", 60, now) is not None
    async with so.Runtime([agent], store=store_url, inline=True, clock=clock, lease_wait=0.1) as rt:
        with pytest.raises(so.SessionExpired):
            await rt.generate(session_id=r.session_id)
        [summary] = await rt.store.sessions(status="running")
        assert summary.id == held.session_id  # the other process's turn is left to it
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "failed"
        assert (state.turn.error or {}).get("code") == "session_expired"
        assert await rt.generate(session_id=held.session_id) is not None
        assert (await rt.state(held.session_id)).turn.status == "running"  # type: ignore[union-attr]


async def test_a_worker_whose_claimed_session_expired_logs_it_without_a_traceback(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A session whose TTL passes between a worker's claim and its drive: the drive records the
    expiry, and the worker said "the turn failed in the worker" with a traceback."""
    clock = ManualClock(time.time())
    agent = refund_agent([], ttl=60)
    async with so.Runtime([agent], store=store_url, inline=False, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
        owner = f"{rt.owner}:worker"
        token = await rt.store.acquire_lease(r.session_id, owner, 60, rt.now())
        assert token is not None
        clock.advance(61)
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            await rt._work_on(r.session_id, owner, token)
        assert [x for x in caplog.records if x.levelno >= logging.WARNING] == []
        assert f"session {r.session_id}: expired" in caplog.text
        state = await rt.state(r.session_id)
        assert state.turn is not None and (state.turn.error or {}).get("code") == "session_expired"


async def test_a_listing_that_cannot_record_an_expiry_shows_it(store_url: str) -> None:
    """A runtime without the session's agent (as `signoff sessions` is) cannot record that
    its TTL passed running; like a passed deadline, it lists it as the expiry leaves it:
    failed, and not among the running ones."""
    clock = ManualClock(time.time())
    agent = refund_agent([], ttl=60)
    async with so.Runtime([agent], store=store_url, inline=False, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042")
    clock.advance(61)
    async with so.Runtime([], store=store_url, clock=clock) as rt:
        assert await rt.sessions(status="running") == []
        [summary] = await rt.sessions()
        assert (summary.id, summary.status) == (r.session_id, "failed")
        assert [s.id for s in await rt.store.sessions(status="running")] == [r.session_id]


async def test_a_worker_leaves_sessions_of_agents_it_does_not_have(store_url: str) -> None:
    """A worker claims only sessions of its own agents (as in a rolling deploy, or workers
    split by agent), so those wait for a worker that can drive them rather than its lease."""
    other = so.Agent(name="other", model=so.models.Scripted([so.ModelResponse(text="x")]))
    async with (
        so.Runtime([refund_agent([])], store=store_url, inline=False) as front,
        so.Runtime([other], store=store_url, inline=False) as stranger,
        so.Runtime([refund_agent([])], store=store_url, inline=False) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        head = await front.store.head(r.session_id)
        async with working(stranger):
            await asyncio.sleep(0.5)
            assert await front.store.head(r.session_id) == head  # untouched
            token = await front.store.acquire_lease(r.session_id, "probe", 10, time.time())
            assert token is not None  # and not leased by the stranger
            await front.store.release_lease(r.session_id, "probe", token)
            async with working(worker):
                await until(lambda: is_(front, r.session_id, "waiting"))


async def test_a_session_a_worker_cannot_drive_is_retried_per_lease_not_in_a_loop(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A drive that fails every time (here: a bug in it) keeps its lease until it lapses;
    released at once, it was claimed again at once, hundreds of times a second on PostgreSQL,
    whose release wakes every worker."""
    async with (
        so.Runtime([refund_agent([])], store=store_url, inline=False) as front,
        so.Runtime([refund_agent([])], store=store_url, inline=False, lease_ttl=3.0) as worker,
    ):

        async def broken(session_id: str, **kwargs: Any) -> so.GenerateResult:
            raise RuntimeError("a bug in the drive (test)")

        worker._drive = broken  # type: ignore[method-assign]
        r = await front.generate("support", prompt="Refund order 1042")
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(worker):
                await asyncio.sleep(1.0)
        assert caplog.text.count(f"claimed session {r.session_id}") == 1
        assert "retried once its lease expires" in caplog.text
        assert await front.store.claim("other", 10, time.time(), 10) == []  # still leased


@pytest.mark.parametrize("on_timeout", ["deny", "approve"])
async def test_sweeps_racing_in_two_workers_expire_a_request_once(
    store_url: str, on_timeout: str
) -> None:
    """Workers sweep deadlines independently: six sweeps at once over two runtimes record one
    expiry (and, with on_timeout='approve', one settlement and one tool run)."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.always(expires_in=0.2, on_timeout=on_timeout))  # type: ignore[arg-type]
    async with (
        so.Runtime([agent], store=store_url) as front,
        so.Runtime([agent], store=store_url) as a,
        so.Runtime([agent], store=store_url) as b,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        assert r.status == "waiting"
        await asyncio.sleep(0.3)
        await asyncio.gather(*(rt.expire_due() for rt in (a, b, a, b, a, b)))
        await until(lambda: is_(front, r.session_id, "completed"))
        types = [e.type async for e in front.events(r.session_id, follow=False)]
        assert types.count("input.resolved") == 1
        assert types.count("approval.settled") == (1 if on_timeout == "approve" else 0)
        assert len(runs) == (1 if on_timeout == "approve" else 0)
        assert types.count("turn.completed") == 1


async def test_a_stalled_holder_is_fenced_and_its_caller_told_the_turn_moved_on(
    store_url: str,
) -> None:
    """A drive whose lease lapsed while it stalled (here: in a tool body, its renewals not
    getting through) and was taken over by a worker writes nothing after: the worker's run
    is the one recorded, and the stalled caller gets the session's state, not `LeaseLost`."""
    runs: list[str] = []
    gate = asyncio.Event()

    @so.tool(approval=so.never())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        runs.append(ctx.idempotency_key())
        if len(runs) == 1:
            await gate.wait()  # the first holder stalls here
        return {"refunded": amount}

    call = so.ModelResponse(
        tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
    )

    def agent() -> so.Agent:
        steps = [call, so.ModelResponse(text="Done.")]
        return so.Agent(name="support", model=so.models.Scripted(steps), tools=[issue_refund])

    async with (
        so.Runtime([agent()], store=store_url, lease_ttl=0.4) as stalled,
        so.Runtime([agent()], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):

        async def no_renewal(*args: Any) -> bool:
            return True  # the renewals of a stalled process never reach the store

        stalled.store.renew_lease = no_renewal  # type: ignore[method-assign,assignment]
        sid = await stalled.create_session("support")
        first = asyncio.create_task(stalled.generate("support", "Refund", session_id=sid))
        await until(lambda: asyncio.sleep(0, bool(runs)))
        async with working(worker):
            await until(lambda: is_(worker, sid, "completed"))
        gate.set()
        result = await asyncio.wait_for(first, 10)
        assert result.status == "completed" and result.text == "Done."
        assert runs == [f"{sid}:1:call_refund"] * 2  # ran again, with the same key
        types = [e.type async for e in worker.events(sid, follow=False)]
        assert types.count("tool.completed") == 1 and types.count("turn.completed") == 1


async def test_a_holder_that_stalled_before_a_tool_body_does_not_run_it_once_taken_over(
    store_url: str,
) -> None:
    """A drive that stalls (a paused process: no renewal gets through) right after recording
    `tool.started` and resumes once a worker has taken the turn over and run the call must not
    run the tool body again: its lease is checked before the body, not only at its next write."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.never())
    async with (
        so.Runtime([agent], store=store_url, lease_ttl=0.4) as stalled,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        paused, resumed = asyncio.Event(), asyncio.Event()
        commit, renew = stalled.store.commit, stalled.store.renew_lease

        async def stalling_commit(c: Commit) -> None:
            await commit(c)
            if any(e.type == "tool.started" for e in c.events):
                paused.set()
                await resumed.wait()  # paused right after the commit, before the body

        async def paused_renewal(*args: Any) -> bool:
            await resumed.wait()  # nothing runs while paused
            return await renew(*args)

        stalled.store.commit = stalling_commit  # type: ignore[method-assign,assignment]
        stalled.store.renew_lease = paused_renewal  # type: ignore[method-assign,assignment]
        sid = await stalled.create_session("support")
        first = asyncio.create_task(stalled.generate("support", "Refund", session_id=sid))
        await asyncio.wait_for(paused.wait(), 10)
        await asyncio.sleep(0.6)  # past the stalled drive's TTL
        async with working(worker):
            await until(lambda: is_(worker, sid, "completed"))
        resumed.set()
        result = await asyncio.wait_for(first, 10)
        assert result.status == "completed" and result.text == "Done."
        assert runs == [f"{sid}:1:call_refund"]  # by the worker only
        types = [e.type async for e in worker.events(sid, follow=False)]
        assert types.count("tool.started") == 1 and types.count("tool.completed") == 1


async def test_a_change_announced_while_a_worker_claims_is_not_missed(pg_store_url: str) -> None:
    """A commit announced while an idle worker is busy claiming (or sweeping) wakes it as soon
    as it goes back to waiting, not only when its `idle_wait` poll comes round."""
    agent = refund_agent([])
    async with (
        so.Runtime([agent], store=pg_store_url, inline=False) as front,
        so.Runtime([agent], store=pg_store_url, inline=False, lease_ttl=5.0) as worker,
    ):
        claim = worker.store.claim
        late: list[str] = []

        async def claim_then_commit(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            found = await claim(*args, **kwargs)
            # A session becomes runnable just after the claim looked: at the first claim (the
            # listener is not subscribed yet), and once more when the first one has parked.
            if not late or (len(late) == 1 and await is_(front, late[0], "waiting")):
                late.append((await front.generate("support", prompt="Refund")).session_id)
                await asyncio.sleep(0.1)  # its NOTIFY arrives before the worker waits again
            return found

        worker.store.claim = claim_then_commit  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(worker.work(stop=stop, idle_wait=5.0, sweep_every=60))
        try:
            await until(lambda: asyncio.sleep(0, bool(late)))
            await until(lambda: is_(front, late[0], "waiting"), timeout=2.0)
            await until(lambda: asyncio.sleep(0, len(late) == 2), timeout=2.0)
            await until(lambda: is_(front, late[1], "waiting"), timeout=2.0)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)


@pytest.mark.parametrize("skewed", ["ahead", "behind"])
async def test_workers_whose_clocks_differ_keep_each_others_leases(
    pg_store_url: str, skewed: str
) -> None:
    """Leases on PostgreSQL are timed by the database's clock, not each machine's: a worker
    whose clock runs two minutes ahead must not take a live lease as lapsed, nor one whose
    clock runs behind grant leases that others take as lapsed (either ran the tool twice)."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.never(), delay=1.0)
    shift = 120.0 if skewed == "ahead" else -120.0

    def off() -> float:
        return time.time() + shift

    async with (
        so.Runtime([agent], store=pg_store_url, inline=False) as front,
        so.Runtime([agent], store=pg_store_url, inline=False, lease_ttl=2.0) as right,
        so.Runtime([agent], store=pg_store_url, inline=False, lease_ttl=2.0) as wrong,
    ):
        # Its machine's wall clock is off. (A clock given as `Runtime(clock=...)` is taken as
        # every process's: tests move time with one.)
        wrong.clock = off
        # The one behind claims first (its lease is the one others misread); the one ahead
        # second (it misreads the other's lease).
        first, second = (right, wrong) if skewed == "ahead" else (wrong, right)
        r = await front.generate("support", prompt="Refund order 1042")
        async with working(first):
            await until(lambda: asyncio.sleep(0, bool(runs)))  # its tool body is running
            async with working(second):
                await until(lambda: is_(front, r.session_id, "completed"))
        assert runs == [f"{r.session_id}:1:call_refund"]


# -- started while the database is down ----------------------------------------------------


def _wait_for_log(worker: Any, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in worker.log():
        assert worker.proc.poll() is None, f"the worker exited:\n{worker.log()}"
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{worker.log()}"
        time.sleep(0.05)


async def test_a_worker_started_while_postgres_is_down_waits_for_it(tmp_path: Path) -> None:
    """`signoff worker` started before its database (as when both start together) waits for
    it, saying so, and then runs the turns; SIGTERM still stops it promptly while it waits."""
    from ._worker_procs import AGENT, Worker, make_agent
    from .conftest import PgCluster

    cluster = PgCluster.start()
    records = tmp_path / "runs.jsonl"
    workers: list[Worker] = []
    try:
        url = cluster.admin_url
        async with so.Runtime([make_agent(str(records))], store=url, inline=False) as front:
            r = await front.generate(AGENT, prompt="Refund order 1042")
            assert r.status == "running"
        await asyncio.to_thread(cluster.halt)

        waiting = Worker(url, tmp_path, "waiting", records, delay=0.0, idle_wait=0.2)
        workers.append(waiting)
        stopped = Worker(url, tmp_path, "stopped", records, delay=0.0)
        workers.append(stopped)
        for w in (waiting, stopped):
            _wait_for_log(w, "waiting for the store")
        assert "Traceback" not in waiting.log()

        stopped.proc.send_signal(signal.SIGTERM)
        assert stopped.proc.wait(timeout=5) == 0, stopped.log()
        assert "worker stopped" in stopped.log()

        await asyncio.to_thread(cluster.resume)
        _wait_for_log(waiting, "the store is up")
        async with so.Runtime([make_agent(str(records))], store=url, inline=False) as front:
            deadline = time.monotonic() + 30
            while (await front.state(r.session_id)).status != "waiting":
                assert time.monotonic() < deadline, waiting.log()
                await asyncio.sleep(0.1)
            assert [p.tool_name for p in await front.pending()] == ["issue_refund"]
        assert f"claimed session {r.session_id}" in waiting.log()
        waiting.proc.send_signal(signal.SIGTERM)
        assert waiting.proc.wait(timeout=10) == 0, waiting.log()
    finally:
        for w in workers:
            w.close()
        cluster.stop()
