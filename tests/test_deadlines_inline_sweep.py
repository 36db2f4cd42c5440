"""The deadline sweep of a runtime that drives turns itself (`rt.expire_due()`, or `serve` with no
workers): the turns its deadlines make runnable run beside each other and beside later sweeps,
not one after another inside the sweep, holding up the deadlines behind them."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any

import pytest
from starlette.testclient import TestClient

import signoff as so
from signoff.server import create_app

from ._steer import ALICE, BOB
from ._workers import ORDER, is_, refund_agent, until

SLOW = 1.0  # seconds the refund tool takes once a deadline approves it


def approved_on_timeout(runs: list[str], expires_in: float) -> so.Agent:
    return refund_agent(
        runs, approval=so.always(expires_in=expires_in, on_timeout="approve"), delay=SLOW
    )


async def closed(rt: so.Runtime, request_id: str) -> bool:
    stored = await rt.store.get_request(request_id)
    return stored is not None and stored.status != "pending"


async def test_an_inline_sweep_records_every_deadline_before_it_runs_their_turns(
    store_url: str,
) -> None:
    """The sweep recorded one session's passed deadline, ran the turn it made runnable (a slow
    tool approved on timeout), and only then recorded the next session's: that one was applied
    a whole turn late, and the turns ran one after another. Here each tool waits until the test
    lets it end, so a sweep that runs turns one after another never gets to the second."""
    runs: list[str] = []
    hold = asyncio.Event()
    agent = refund_agent(runs, approval=so.always(expires_in=0.2, on_timeout="approve"), hold=hold)
    async with so.Runtime([agent], store=store_url) as rt:
        asked = [await rt.generate("support", prompt=f"Refund order {ORDER}") for _ in range(2)]
        await asyncio.sleep(0.3)
        sweep = asyncio.create_task(rt.expire_due())
        try:
            await until(lambda: _all_closed(rt, [r.pending[0].id for r in asked]))
            await until(lambda: asyncio.sleep(0, len(runs) == 2))  # both tools run at once
            assert not sweep.done()
        finally:
            hold.set()
        assert await sweep == 2
        await until(lambda: _all_completed(rt, [r.session_id for r in asked]))
    assert len(runs) == 2


async def test_a_server_without_workers_records_a_deadline_while_an_earlier_turn_runs(
    store_url: str,
) -> None:
    """`serve` without workers sweeps with `expire_due()`: a turn one deadline made runnable
    ran inside that sweep, so no later sweep came by until it ended, and a deadline passing
    meanwhile was applied only then. Here the first turn's tool waits until the test lets it
    end, so the later deadline must be recorded while it runs."""
    runs: list[str] = []
    hold = asyncio.Event()
    agent = refund_agent(runs, approval=so.always(expires_in=0.1, on_timeout="approve"), hold=hold)
    rt = so.Runtime([agent], store=store_url)
    app = create_app(rt, dev=True, workers=0, sweep_every=0.05)
    async with app.router.lifespan_context(app):
        try:
            first = await rt.generate("support", prompt="Refund order 1042")
            await until(lambda: asyncio.sleep(0, len(runs) == 1))  # its tool runs, held
            second = await rt.generate("support", prompt="Refund order 1043")
            await until(lambda: closed(rt, second.pending[0].id))
            assert not await is_(rt, first.session_id, "completed")  # its tool still runs
            await until(lambda: asyncio.sleep(0, len(runs) == 2))
        finally:
            hold.set()
        await until(lambda: is_(rt, first.session_id, "completed"))
        await until(lambda: is_(rt, second.session_id, "completed"))
    await rt.close()


async def _all_completed(rt: so.Runtime, session_ids: list[str]) -> bool:
    return all([await is_(rt, s, "completed") for s in session_ids])


async def _all_closed(rt: so.Runtime, request_ids: list[str]) -> bool:
    return all([await closed(rt, r) for r in request_ids])


async def test_a_server_stopping_stops_its_sweeps_turns_and_gives_their_leases_back(
    store_url: str,
) -> None:
    """A turn a deadline made runnable, running in the background of `serve`'s sweep when the
    app shuts down, is stopped with it, its lease given back: another process may go on with
    it at once, not once the lease lapses."""
    runs: list[str] = []
    rt = so.Runtime([approved_on_timeout(runs, 0.1)], store=store_url, lease_ttl=30.0)
    app = create_app(rt, dev=True, workers=0, sweep_every=0.05)
    async with app.router.lifespan_context(app):
        r = await rt.generate("support", prompt="Refund order 1042")
        await until(lambda: asyncio.sleep(0, len(runs) == 1))  # its slow tool runs
    token = await rt.store.acquire_lease(r.session_id, "another", 10.0, rt.now())
    assert token is not None  # not leased by the stopped drive
    await rt.close()


async def test_a_server_without_workers_logs_a_sweep_failing_for_a_while_once(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """`serve` without workers sweeping while its store is down logged a whole traceback at
    every sweep (every 5 s by default) for as long as the outage lasted, though an outage is
    no bug: a worker's sweep logs it once, and once more when it works again."""
    rt = so.Runtime([refund_agent([])], store=store_url, inline=False)
    pending = rt.store.pending
    failures = [0]

    async def down_pending(*args: Any) -> list[so.InputRequest]:
        if failures[0] < 5:
            failures[0] += 1
            raise so.StoreUnavailable("listing requests: the database is down (test)")
        return await pending(*args)

    rt.store.pending = down_pending  # type: ignore[method-assign,assignment]
    app = create_app(rt, dev=True, workers=0, sweep_every=0.01)
    with caplog.at_level(logging.INFO, logger="signoff.server"):
        async with app.router.lifespan_context(app):
            await until(lambda: asyncio.sleep(0.05, failures[0] == 5))
            await asyncio.sleep(0.2)  # sweeps that work
    await rt.close()
    failed = [r for r in caplog.records if "applying request deadlines failed" in r.getMessage()]
    assert len(failed) == 1, [r.getMessage() for r in failed]
    assert failed[0].levelno == logging.WARNING and failed[0].exc_info is None
    assert "database is down" in failed[0].getMessage()
    assert "applying request deadlines works again" in caplog.text


@pytest.mark.parametrize("indexed", [True, False], ids=["store-query", "every-running"])
async def test_an_inline_sweep_goes_on_with_turns_left_undriven_across_pages(
    store_url: str, monkeypatch: pytest.MonkeyPatch, indexed: bool
) -> None:
    """Five turns whose passed deadlines a sweep recorded but never drove on (as a process
    killed in between leaves them), beside three turns stranded mid-way for another reason: the
    next inline sweep drives the five, over pages of two. It reads the stranded ones' events
    only where the store cannot list the candidates itself (`running_unheld`): one query a page
    instead of two reads per running session every sweep (1,000 running sessions: SQLite 19 ms
    a sweep, PostgreSQL 395 ms, before)."""
    from signoff import _sweeping
    from signoff._events import Event

    monkeypatch.setattr(_sweeping, "_SWEEP_PAGE", 2)
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.always(expires_in=0.2, on_timeout="approve"))
    async with so.Runtime([agent], store=store_url) as rt:
        asked = [await rt.generate("support", prompt=f"Refund order {i}") for i in range(5)]
        stranded = [f"ses_stranded{i:012d}" for i in range(3)]
        for sid in stranded:
            created = Event(session_id=sid, seq=1, type="session.created", at=rt.now(), data={})
            started = Event(
                session_id=sid, seq=2, type="turn.started", at=rt.now(), turn_id="trn_1"
            )
            await rt.store.create_session(
                sid, "support", [created, started], None, status="running"
            )
        await asyncio.sleep(0.3)
        token = _sweeping._handing.set(lambda sid, wait: None)  # recorded, then not driven
        try:
            assert await rt.expire_due() == 5
        finally:
            _sweeping._handing.reset(token)
        assert runs == [], runs
        listed = {r.id: r.status for r in await rt.store.sessions(agent="support", limit=20)}
        assert set(listed.values()) == {"running"} and len(listed) == 8
        read: list[str] = []
        reading = rt.store.read_events

        async def counted(session_id: str, *args: Any, **kwargs: Any) -> Any:
            read.append(session_id)
            return await reading(session_id, *args, **kwargs)

        monkeypatch.setattr(rt.store, "read_events", counted)
        if not indexed:
            monkeypatch.setattr(rt.store, "running_unheld", None)
        assert await rt.expire_due() == 5
        for sid in [r.session_id for r in asked]:
            await until(functools.partial(is_, rt, sid, "completed"))
        assert len(runs) == 5
        assert bool(set(read) & set(stranded)) is not indexed
        listed = {r.id: r.status for r in await rt.store.sessions(agent="support", limit=20)}
        assert {sid: listed[sid] for sid in stranded} == dict.fromkeys(stranded, "running")


def two_approvals(runs: list[str], hold: asyncio.Event) -> so.Agent:
    """One response proposing two gated calls: `timed`, denied once its deadline (0.2 s)
    passes, and `gated`, with no deadline, which logs its key and waits until `hold` is set."""

    @so.tool(approval=so.always(expires_in=0.2))
    async def timed() -> str:
        """Run with a deadline."""
        return "timed"

    @so.tool(approval=so.always())
    async def gated(ctx: so.ToolContext) -> str:
        """Run once a person approves."""
        runs.append(ctx.idempotency_key())
        await hold.wait()
        return "gated"

    calls = [so.ToolCall(id="call_timed", name="timed"), so.ToolCall(id="call_gated", name="gated")]
    model = so.models.Scripted([so.ModelResponse(tool_calls=calls), so.ModelResponse(text="Done.")])
    return so.Agent(name="support", model=model, tools=[timed, gated])


async def stopped_mid_tool(rt: so.Runtime, sid: str, runs: list[str], drive: Any) -> None:
    """Run `drive` until the gated call's body started, then stop it, as a process that died
    there leaves the turn: `running`, its lease not held."""
    task = asyncio.ensure_future(drive)
    await until(lambda: asyncio.sleep(0, len(runs) == 1))
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert (await rt.state(sid)).status == "running"
    assert not await rt.store.lease_held(sid, rt.now())  # type: ignore[attr-defined]


async def test_an_inline_sweep_goes_on_with_a_turn_its_drive_left_mid_tool(
    store_url: str,
) -> None:
    """A sweep approves a call on timeout and drives the turn on; that drive stops in the call's
    body (its process stopped, say: `serve` shut down). The next sweep finishes the turn, the
    interrupted body run again. Before, it read `running` for good: the sweep went on only with
    a turn whose last event was the deadline's record."""
    runs: list[str] = []
    hold = asyncio.Event()
    agent = refund_agent(runs, approval=so.always(expires_in=0.2, on_timeout="approve"), hold=hold)
    async with so.Runtime([agent], store=store_url) as rt:
        r = await rt.generate("support", prompt=f"Refund order {ORDER}")
        await asyncio.sleep(0.3)
        await stopped_mid_tool(rt, r.session_id, runs, rt.expire_due())
        hold.set()
        assert await rt.expire_due() == 1
        assert await is_(rt, r.session_id, "completed")
        assert await rt.expire_due() == 0
    assert len(runs) == 2 and len(set(runs)) == 1  # again, with its key


async def test_an_inline_sweep_leaves_a_turn_a_persons_answer_resumed_to_its_caller(
    store_url: str,
) -> None:
    """A turn waiting on two calls: one's deadline passes (the sweep records it; the turn still
    waits on the other), then a person's approval resumes the turn, and that call's drive stops
    mid-tool. That turn is the caller's to retry, as after any other crash: no sweep takes it
    up, though a deadline was recorded since the turn parked."""
    runs: list[str] = []
    hold = asyncio.Event()
    async with so.Runtime([two_approvals(runs, hold)], store=store_url) as rt:
        r = await rt.generate("support", prompt="Go")
        gated = next(p for p in r.pending if p.action and p.action.tool_name == "gated")
        await asyncio.sleep(0.3)
        assert await rt.expire_due() == 1  # the deadline recorded; the turn waits on
        assert (await rt.state(r.session_id)).status == "waiting"
        answer = so.InputResponse(request_id=gated.id, option_id="approve")
        await stopped_mid_tool(rt, r.session_id, runs, rt.respond(r.session_id, [answer]))
        assert await rt.expire_due() == 0
        assert (await rt.state(r.session_id)).status == "running" and len(runs) == 1
        hold.set()
        assert (await rt.generate(session_id=r.session_id)).status == "completed"
    assert len(runs) == 2


async def _serving(app: Any, ready: asyncio.Event, stop: asyncio.Event) -> None:
    """Run the app's lifespan: `ready` once started, shut down once `stop` is set."""
    async with app.router.lifespan_context(app):
        ready.set()
        await stop.wait()


@contextlib.asynccontextmanager
async def served(app: Any) -> Any:
    """Start the app's lifespan; the event its shutdown begins at, and its task."""
    ready, stop = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(_serving(app, ready, stop))
    try:
        await ready.wait()
        yield stop, task
    finally:
        stop.set()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_served_app_stopping_waits_for_the_turn_its_sweep_drives(
    store_url: str,
) -> None:
    """Under `serve`, which owns the signals (a second one cuts the stop short) and so sets
    `Background.grace`, the app's shutdown waits for a turn its sweep drives to finish: it was
    cut short mid-tool, and the next process ran the tool's body again."""
    runs: list[str] = []
    hold = asyncio.Event()
    rt = so.Runtime([approved_on_timeout_held(runs, hold)], store=store_url)
    app = create_app(rt, dev=True, workers=0, sweep_every=0.05)
    app.state.signoff.background.grace = 30.0
    async with served(app) as (stop, task):
        r = await rt.generate("support", prompt="Refund order 1042")
        await until(lambda: asyncio.sleep(0, len(runs) == 1))  # its tool runs, held
        stop.set()
        assert not (await asyncio.wait([task], timeout=0.3))[0]  # the shutdown waits
        hold.set()
        await task
    assert await is_(rt, r.session_id, "completed") and len(runs) == 1
    await rt.close()


async def test_a_served_app_stopping_cuts_its_sweeps_turn_short_past_its_bound(
    store_url: str,
) -> None:
    """The graceful stop waits for a turn its sweep drives for `Background.grace` seconds at
    most: then the turn is cut short and its lease given back, for the next process."""
    runs: list[str] = []
    hold = asyncio.Event()
    rt = so.Runtime([approved_on_timeout_held(runs, hold)], store=store_url, lease_ttl=30.0)
    app = create_app(rt, dev=True, workers=0, sweep_every=0.05)
    app.state.signoff.background.grace = 0.3
    try:
        async with served(app) as (stop, task):
            r = await rt.generate("support", prompt="Refund order 1042")
            await until(lambda: asyncio.sleep(0, len(runs) == 1))  # its tool runs, held
            stop.set()
            began = time.monotonic()
            async with asyncio.timeout(10):
                await task
            assert 0.3 <= time.monotonic() - began < 5
    finally:
        hold.set()
    assert (await rt.state(r.session_id)).status == "running"
    assert await rt.store.acquire_lease(r.session_id, "another", 10.0, rt.now()) is not None
    await rt.close()


async def test_a_served_app_stopping_starts_no_turn_its_sweep_queued(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one turn at a time for the sweep, a second deadline's turn waits for the first's:
    once the app stops, the first finishes and the second is not started (it began once the
    first ended, after the stop). Its deadline is recorded, and the next sweep goes on with it."""
    from signoff import _sweeping

    monkeypatch.setattr(_sweeping, "SWEEP_DRIVES", 1)
    runs: list[str] = []
    hold = asyncio.Event()
    rt = so.Runtime([approved_on_timeout_held(runs, hold)], store=store_url)
    app = create_app(rt, dev=True, workers=0, sweep_every=0.05)
    app.state.signoff.background.grace = 30.0
    async with served(app) as (stop, task):
        first = await rt.generate("support", prompt="Refund order 1042")
        await until(lambda: asyncio.sleep(0, len(runs) == 1))  # its tool runs, held
        second = await rt.generate("support", prompt="Refund order 1043")
        await until(lambda: closed(rt, second.pending[0].id))  # its turn queued behind
        stop.set()
        hold.set()
        await task
    assert await is_(rt, first.session_id, "completed") and len(runs) == 1
    assert (await rt.state(second.session_id)).status == "running"
    assert await rt.expire_due() == 1
    assert await is_(rt, second.session_id, "completed") and len(runs) == 2
    await rt.close()


async def test_a_served_app_stopping_starts_the_message_queued_behind_its_sweeps_turn(
    store_url: str,
) -> None:
    """A message queued behind a turn the sweep drives (another person's) is started by that
    drive though the app is stopping, within the same bound: left there, as a worker's drive
    leaves it, no process would start it (no claims in a runtime that drives its own turns, and
    a sweep goes on only with turns a deadline resumed)."""
    runs: list[str] = []
    hold = asyncio.Event()
    agent = refund_agent(
        runs,
        approval=so.always(expires_in=0.1, on_timeout="approve"),
        hold=hold,
        repeat_last=True,
    )
    rt = so.Runtime([agent], store=store_url)
    app = create_app(rt, dev=True, workers=0, sweep_every=0.05)
    app.state.signoff.background.grace = 30.0
    async with (
        served(app) as (stop, task),
        so.Runtime([agent], store=store_url, inline=False) as elsewhere,
    ):
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        await until(lambda: asyncio.sleep(0, len(runs) == 1))  # its tool runs, held
        await elsewhere.send(r.session_id, "And 1043?", principal=BOB, turn_policy="queue")
        stop.set()
        hold.set()
        await task
    types = [e.type async for e in rt.events(r.session_id, follow=False)]
    assert types.count("turn.started") == 2 and types.count("turn.completed") == 2, types
    assert (await rt.state(r.session_id)).status == "idle" and len(runs) == 1
    await rt.close()


def approved_on_timeout_held(runs: list[str], hold: asyncio.Event) -> so.Agent:
    """A refund approved once 0.1 s pass unanswered, its tool waiting until `hold` is set."""
    return refund_agent(runs, approval=so.always(expires_in=0.1, on_timeout="approve"), hold=hold)


def test_an_app_under_a_test_client_stops_at_once_with_a_turn_its_sweep_drives(
    store_url: str,
) -> None:
    """Under the app's own server (uvicorn, Starlette's TestClient), which may not force a stop
    on a second signal, the shutdown does not wait for a turn its sweep drives (a 30 s tool):
    it is cut short at once, its lease given back, as before."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.always(expires_in=0.1, on_timeout="approve"), delay=30)
    with so.Runtime([agent], store=store_url) as asking:
        session_id = asking.generate_sync("support", prompt="Refund order 1042").session_id
    rt = so.Runtime([agent], store=store_url, lease_ttl=30.0)
    app = create_app(rt, dev=True, workers=0, sweep_every=0.05, close_runtime=True)
    with TestClient(app):
        deadline = time.monotonic() + 10
        while not runs:  # its tool runs
            assert time.monotonic() < deadline, "the refund never began"
            time.sleep(0.02)
        began = time.monotonic()
    assert time.monotonic() - began < 5

    async def after() -> tuple[list[str], int | None]:
        async with so.Runtime([], store=store_url) as reading:
            types: list[str] = [e.type async for e in reading.events(session_id, follow=False)]
            lease = await reading.store.acquire_lease(session_id, "another", 10.0, reading.now())
            return types, lease

    types, lease = asyncio.run(after())
    assert "tool.started" in types and "tool.completed" not in types, types
    assert lease is not None  # given back by the drive cut short
