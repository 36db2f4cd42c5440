"""`Runtime.work()` while its store fails: a failure that lasts a while is logged when it starts
and when it ends, not at every try, and retried less and less often; one that waiting cannot
mend (the store's file deleted) stops the worker with that error instead of a retry loop."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import signoff as so
from signoff import _child_sessions
from signoff.stores import PendingFilter
from signoff.stores.postgres import STORE_SCHEMA as PG_SCHEMA
from signoff.stores.sqlite._schema import STORE_SCHEMA as SQLITE_SCHEMA
from signoff.testing import ExecutionLog, ManualClock, call, call_tools, reply, scripted_agent

from . import _orphan_child as orphan_child
from ._procs import ROOT
from ._subagents import ALICE, Counted, refund_agents
from ._ttl import ttl_agent
from ._workers import is_, refund_agent, until, working
from .test_deadlines import asked, escalating_spec, payout_agent
from .test_upgrade_initiators import back_to_the_schema_before


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno >= logging.WARNING and text in r.getMessage()]


async def test_claims_failing_for_a_while_are_logged_once_and_backed_off(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker claiming every `idle_wait` against a database that is down logged a warning at
    every try (twice a second by default) for as long as the outage lasted."""
    runs: list[str] = []
    agent = refund_agent(runs)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=2.0) as worker,
    ):
        claim = worker.store.claim
        down = [True]
        tries: list[float] = []

        async def down_claim(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            if down:
                tries.append(time.monotonic())
                raise so.StoreError("claiming runnable sessions: no connection (test)")
            return await claim(*args, **kwargs)

        worker.store.claim = down_claim  # type: ignore[method-assign]
        r = await front.generate("support", prompt="Refund order 1042")
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(worker):  # idle_wait=0.05: 30 tries in 1.5 s without a backoff
                await asyncio.sleep(1.5)
                down.clear()
                await until(lambda: is_(front, r.session_id, "waiting"))
        assert 2 <= len(tries) <= 8, len(tries)
        assert len(_warnings(caplog, "claiming sessions failed")) == 1
        assert "claiming sessions works again" in caplog.text


async def test_a_sweep_failing_for_a_while_is_logged_once_without_a_traceback(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The deadline sweep failing because the store is down logged a whole traceback at every
    sweep, though an outage is no bug."""
    async with so.Runtime([refund_agent([])], store=store_url, inline=False) as worker:
        pending = worker.store.pending
        failures = [0]

        async def down_pending(*args: Any) -> list[so.InputRequest]:
            if failures[0] < 5:
                failures[0] += 1
                raise so.StoreUnavailable("listing requests: the database is down (test)")
            return await pending(*args)

        worker.store.pending = down_pending  # type: ignore[method-assign,assignment]
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(worker, sweep_every=0.01):
                await until(lambda: asyncio.sleep(0.05, failures[0] == 5))
                # A sweep that works, however busy the machine.
                await until(lambda: asyncio.sleep(0, "deadlines works again" in caplog.text))
        (warning,) = _warnings(caplog, "applying passed deadlines failed")
        assert warning.exc_info is None and "database is down" in warning.getMessage()
        assert "applying passed deadlines works again" in caplog.text


async def test_changes_that_cannot_be_waited_for_do_not_spin_the_claims(
    store_url: str,
) -> None:
    """A store whose change wait fails at once (its file gone, its listener down) made the
    worker claim again after only the 20 ms claim gap: a busy loop of claims."""
    async with so.Runtime([refund_agent([])], store=store_url, inline=False) as worker:
        claim = worker.store.claim
        tries = [0]

        async def counted(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            tries[0] += 1
            return await claim(*args, **kwargs)

        async def broken_wait(*args: Any, **kwargs: Any) -> bool:
            raise so.StoreError("waiting for changes: no listener (test)")

        worker.store.claim = counted  # type: ignore[method-assign]
        worker.store.wait_for_change = broken_wait  # type: ignore[attr-defined]
        stop = asyncio.Event()
        task = asyncio.create_task(worker.work(stop=stop, idle_wait=0.2))
        await asyncio.sleep(1.0)
        stop.set()
        await asyncio.wait_for(task, 10)
        assert tries[0] <= 8, tries[0]  # one per idle_wait, not one per 20 ms


async def test_a_deleted_store_file_stops_the_worker_with_store_gone(tmp_path: Path) -> None:
    """`StoreGone` is mended only by opening the store again: a worker retrying it looped
    for ever, claiming and warning 50 times a second. It stops, raising it, once its running
    turns are over."""
    path = tmp_path / "state.db"
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.never(), delay=0.5)
    async with (
        so.Runtime([agent], store=f"sqlite:///{path}", inline=False) as front,
        so.Runtime([agent], store=f"sqlite:///{path}", inline=False) as worker,
    ):
        await front.generate("support", prompt="Refund order 1042")
        stop = asyncio.Event()
        task = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        await until(lambda: asyncio.sleep(0, bool(runs)))  # the tool body is running
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        try:
            with pytest.raises(so.StoreGone):
                await asyncio.wait_for(task, 10)
        finally:
            stop.set()
        assert len(runs) == 1  # the tool body in flight was let finish, and run only once


def test_the_worker_command_exits_with_one_line_when_its_store_file_is_deleted(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "worker", "tests._worker_procs:runtime"]
        + ["--store", f"sqlite:///{path}", "--idle-wait", "0.05"],
        cwd=ROOT,
        env={**os.environ, "SIGNOFF_TEST_RECORDS": str(tmp_path / "runs.jsonl")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert "worker " in proc.stderr.readline()
        for suffix in ("", "-wal", "-shm"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        _, rest = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1, rest
    assert "error: StoreGone: " in rest and "Traceback" not in rest, rest


async def test_work_refuses_a_runtime_without_agents(tmp_path: Path) -> None:
    """A worker of no agents claims nothing and sweeps nothing (both are left to processes that
    have the sessions' agents): it ran silently for ever, as though it were working."""
    async with so.Runtime([], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        with pytest.raises(so.UsageError, match="no agents"):
            await asyncio.wait_for(rt.work(), 2)


async def test_concurrency_bounds_the_turns_in_flight_and_sessions_run_in_order(
    store_url: str,
) -> None:
    """`concurrency` turns at a time, never more (nor fewer while more wait), taken oldest
    first, so a session made runnable later is not passed over for ever."""
    live: list[str] = []
    peak = [0]
    started: list[str] = []

    @so.tool(approval=so.never())
    async def slow(ctx: so.ToolContext) -> str:
        """Work a while."""
        started.append(ctx.session.id)
        live.append(ctx.session.id)
        peak[0] = max(peak[0], len(live))
        await asyncio.sleep(0.3)
        live.remove(ctx.session.id)
        return "ok"

    def agent() -> so.Agent:
        call = so.ModelResponse(tool_calls=[so.ToolCall(id="c1", name="slow", input={})])
        model = so.models.Scripted([call, so.ModelResponse(text="Done.")])
        return so.Agent(name="support", model=model, tools=[slow])

    async with (
        so.Runtime([agent()], store=store_url, inline=False) as front,
        so.Runtime([agent()], store=store_url, inline=False) as worker,
    ):
        ids = []
        for _ in range(5):
            ids.append((await front.generate("support", prompt="go")).session_id)
            await asyncio.sleep(0.01)  # each later than the one before
        async with working(worker, concurrency=2):
            for sid in ids:
                await until(lambda sid=sid: is_(front, sid, "completed"))  # type: ignore[misc]
    assert peak[0] == 2
    assert set(started[:2]) == set(ids[:2])  # the two oldest first
    assert sorted(started) == sorted(ids)  # each once, the later ones too


# -- the deadline sweep reads only what is due ---------------------------------------------------


async def _due(store: Any, at: float) -> tuple[list[str], list[str]]:
    """The ids of the requests and of the sessions the store answers a sweep at `at` with."""
    requests = await store.pending(PendingFilter(due_by=at))
    return [r.id for r in requests], [r.id for r in await store.lapsed_sessions(at)]


async def test_a_sweep_reads_only_what_is_due_and_applies_it(store_url: str) -> None:
    """The store answers a sweep with the due requests and lapsed sessions alone, from their
    deadlines kept in its rows (an escalation lifts one), and the sweep applies each."""
    clock = ManualClock()
    log = ExecutionLog()
    agents = [
        payout_agent(log, so.always(expires_in=60), name="deny"),
        payout_agent(log, escalating_spec()),
        payout_agent(log, so.always(), name="never"),
        ttl_agent(),
    ]
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        _, r1, _ = await asked(rt, "deny")
        _, r2, _ = await asked(rt)
        _, r3, _ = await asked(rt, "never")
        parked = await rt.generate("desk", prompt="reset it")
        start = clock()
        assert await _due(rt.store, start + 59.9) == ([], [])
        requests, sessions = await _due(rt.store, start + 60)  # the deadline itself counts
        assert sorted(requests) == sorted([r1.id, r2.id]) and sessions == [parked.session_id]
        store: Any = rt.store
        among = [r1.session_id, "no such", parked.session_id]
        lapsed = await store.lapsed_sessions(start + 60, ids=among)
        assert [s.id for s in lapsed] == [parked.session_id]
        assert await store.lapsed_sessions(start + 60, ids=[r1.session_id]) == []
        assert await store.lapsed_sessions(start + 60, ids=[]) == []
        clock.advance(60)
        assert await rt.expire_due() == 3
        assert await _due(rt.store, start + 10**6) == ([], [])  # the escalation lifted r2's
        assert sorted(r.id for r in await rt.pending()) == sorted([r2.id, r3.id])
        stored = await rt.store.get_request(r1.id)
        assert stored is not None and stored.status == "expired"
        state = await rt.state(parked.session_id)
        assert state.turn is not None and state.turn.status == "failed"
        assert log.count() == 0


def _as_schema_before_deadline_columns(url: str) -> None:
    """Make the store at `url` what the schema before request rows kept their deadlines was:
    no such column, no index on it, nor what later schemas added, and the older version
    marked."""
    _as_schema_before_session_parents(url)
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute("DROP INDEX requests_due")
            conn.execute("ALTER TABLE requests DROP COLUMN expires_at")
            conn.execute("UPDATE meta SET value='4' WHERE key='schema'")
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP INDEX signoff.requests_due")
        conn.execute("ALTER TABLE signoff.requests DROP COLUMN expires_at")
        conn.execute("DELETE FROM signoff.schema_version WHERE version = 6")


def _as_schema_before_session_parents(url: str) -> None:
    """Make the store at `url` what the schema before session rows named their parent was: no
    such columns, no index on them, nor what later schemas added, and the older version
    marked."""
    back_to_the_schema_before(url)  # session rows naming their initiator
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.execute("DROP INDEX sessions_children")
            conn.execute("DROP INDEX sessions_by_parent")  # schema 10's, after this one
            conn.execute("ALTER TABLE sessions DROP COLUMN parent")
            conn.execute("ALTER TABLE sessions DROP COLUMN parent_turn")
            conn.execute("UPDATE meta SET value='5' WHERE key='schema'")
        return
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("DROP INDEX signoff.sessions_children")
        conn.execute("ALTER TABLE signoff.sessions DROP COLUMN parent, DROP COLUMN parent_turn")
        conn.execute("DELETE FROM signoff.schema_version WHERE version = 7")


async def test_an_idle_worker_applies_passed_deadlines_every_sweep_every(store_url: str) -> None:
    """A worker waiting for changes swept only when its `idle_wait` ran out: with
    `idle_wait=30, sweep_every=0.05`, a deadline that passed was applied up to 30 s late."""
    clock = ManualClock()
    log = ExecutionLog()
    agent = payout_agent(log, so.always(expires_in=60, on_timeout="approve"))
    async with (
        so.Runtime([agent], store=store_url, clock=clock) as front,
        so.Runtime([agent], store=store_url, clock=clock, inline=False) as worker,
    ):
        session_id, _, _ = await asked(front)
        expire_due, swept = worker.expire_due, [0]

        async def counted() -> int:
            swept[0] += 1
            return await expire_due()

        worker.expire_due = counted  # type: ignore[method-assign]
        stop = asyncio.Event()
        task = asyncio.create_task(worker.work(stop=stop, idle_wait=30, sweep_every=0.05))
        try:
            await until(lambda: asyncio.sleep(0, swept[0] > 0))
            clock.advance(60)  # after its first sweep: only a later one applies it
            await until(lambda: is_(front, session_id, "completed"), timeout=5)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)
        assert log.count() == 1


async def test_a_store_upgraded_with_pending_deadlines_still_sweeps_them(store_url: str) -> None:
    """Requests parked with deadlines before the store kept them in their rows get them when
    the store is upgraded, so the sweep applies them on time."""
    clock = ManualClock()
    log = ExecutionLog()
    agents = [
        payout_agent(log, so.always(expires_in=60), name="deny"),
        payout_agent(log, so.always(), name="never"),
    ]
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        _, r1, _ = await asked(rt, "deny")
        _, r2, _ = await asked(rt, "never")
    start = clock()
    _as_schema_before_deadline_columns(store_url)
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        await rt.open()
        assert await _due(rt.store, start + 59.9) == ([], [])
        assert await _due(rt.store, start + 60) == ([r1.id], [])
        clock.advance(60)
        assert await rt.expire_due() == 1
        stored = await rt.store.get_request(r1.id)
        assert stored is not None and stored.status == "expired"
        assert [r.id for r in await rt.pending()] == [r2.id]
    if store_url.startswith("sqlite:///"):
        with sqlite3.connect(store_url.removeprefix("sqlite:///")) as conn:
            found = conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            assert found == (str(SQLITE_SCHEMA),)
    else:
        with psycopg.connect(store_url) as conn:
            found = conn.execute("SELECT MAX(version) FROM signoff.schema_version").fetchone()
            assert found == (PG_SCHEMA,)


async def test_a_store_that_cannot_tell_lapsed_sessions_is_swept_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`lapsed_sessions` is optional for a store: without it the sweep lists every running or
    waiting session, and still records the expiry of those whose TTL passed."""
    clock = ManualClock()
    async with so.Runtime([ttl_agent()], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt:
        parked = await rt.generate("desk", prompt="reset it")
        monkeypatch.setattr(rt.store, "lapsed_sessions", None)
        clock.advance(59)
        assert await rt.expire_due() == 0
        clock.advance(1)
        assert await rt.expire_due() == 1
        state = await rt.state(parked.session_id)
        assert state.turn is not None and state.turn.status == "failed"


async def _orphans(store: Any, agents: list[str]) -> list[Any]:
    return list(await store.orphaned_children(agents))


async def _children_of_three_parents(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[so.Agent], set[str], set[str]]:
    """Three parents each delegate to a child that waits on an approval; one keeps waiting,
    one is cancelled and one cancelled then sent a new message (a new turn, waiting on a new
    child), both cancels missing their children (as if their process died there). Returns the
    agents, the orphaned children and those whose parent still waits for them."""
    _, child = refund_agents([], Counted("unused"))
    delegating = call_tools(call("billing", call_id="d1", message="Refund order 1042"))
    parent = scripted_agent(
        "support", [delegating, delegating, reply("unused")], tools=[so.delegate("billing")]
    )
    async with so.Runtime([parent, child], store=store_url) as rt:
        kept, ended, replaced = [
            await rt.generate("support", prompt="Refund", auth=ALICE) for _ in range(3)
        ]
        with monkeypatch.context() as m:
            m.setattr(_child_sessions, "children", lambda requests: [])
            m.setattr(_child_sessions, "delegated", lambda state: [])
            await rt.cancel(ended.session_id)
            await rt.cancel(replaced.session_id)
        again = await rt.generate(session_id=replaced.session_id, prompt="Again", auth=ALICE)
    children = {
        r.session_id: r.pending[0].child.session_id  # type: ignore[union-attr]
        for r in (kept, ended, again)
    }
    orphans = {children[ended.session_id], replaced.pending[0].child.session_id}  # type: ignore[union-attr]
    return [parent, child], orphans, {children[kept.session_id], children[again.session_id]}


async def test_the_orphan_sweep_reads_only_children_no_parent_waits_for(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store lists the children whose parent's turn ended or was replaced, not those a
    parent waits for: the sweep cancels the former without loading the latter."""
    agents, orphans, live = await _children_of_three_parents(store_url, monkeypatch)
    async with so.Runtime(agents, store=store_url) as rt:
        await rt.open()
        assert {r.id for r in await _orphans(rt.store, ["billing"])} == orphans
        assert await _orphans(rt.store, ["support"]) == []
        loaded: list[str] = []
        load = rt.store.load

        async def counted(session_id: str) -> Any:
            loaded.append(session_id)
            return await load(session_id)

        monkeypatch.setattr(rt.store, "load", counted)
        assert await rt.expire_due() == 2
        assert not live & set(loaded)
        assert {s.id for s in await rt.sessions(agent="billing", status="cancelled")} == orphans
        assert {s.id for s in await rt.sessions(agent="billing", status="waiting")} == live
        assert await _orphans(rt.store, ["billing"]) == []


async def test_the_sweep_cancels_a_child_created_as_its_parent_moved_to_a_new_turn(
    store_url: str,
) -> None:
    """A delegate call creates its child just after another process cancelled the parent's turn
    and ran a new one (which failed), and its process is killed right after creating the child
    with its turn started, before it could cancel it. The child's row names the turn that
    delegated to it,
    not the new one current as it was created, so the store lists it and the sweep cancels it."""
    proc = subprocess.run(
        [sys.executable, "-m", "tests._orphan_child", store_url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    ids = json.loads(proc.stdout.splitlines()[0])
    async with so.Runtime(orphan_child.agents(), store=store_url) as rt:
        parent = await rt.state(ids["parent"])
        assert parent.turn is not None and parent.turn.status == "failed"
        child = await rt.state(ids["child"])
        assert child.parent == ids["parent"]
        assert child.turn is not None and child.turn.status == "running"  # left by the kill
        assert [r.id for r in await _orphans(rt.store, ["billing"])] == [ids["child"]]
        assert await rt.expire_due() == 1
        child = await rt.state(ids["child"])
        assert child.turn is not None and child.turn.status == "cancelled"
        assert await _orphans(rt.store, ["billing"]) == []
        assert await rt.expire_due() == 0


async def test_a_store_upgraded_with_parked_children_names_their_parents(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Children created before session rows named their parent get it (and the parent's turn)
    when the store is upgraded: the sweep lists the same orphans as if they were new."""
    agents, orphans, _ = await _children_of_three_parents(store_url, monkeypatch)
    _as_schema_before_session_parents(store_url)
    async with so.Runtime(agents, store=store_url) as rt:
        await rt.open()
        assert {r.id for r in await _orphans(rt.store, ["billing"])} == orphans
        assert await rt.expire_due() == 2


# -- a worker cancelled --------------------------------------------------------------------------


async def test_a_cancelled_worker_stops_its_turns_and_gives_their_leases_back(
    store_url: str,
) -> None:
    """`work()` cancelled (its task's cancel, a second Ctrl-C of `signoff worker`, a server's
    shutdown cut short) stops the turns it was driving before it ends: their tool bodies are
    cancelled and their leases given back, so none runs on unseen after the worker is gone (its
    store then closed under it) and another worker takes the session now, not after the TTL."""
    began, stopped = asyncio.Event(), asyncio.Event()

    @so.tool(approval=so.never())
    async def nap(ctx: so.ToolContext) -> str:
        """Sleep a long while."""
        began.set()
        try:
            await asyncio.sleep(60)
        finally:
            stopped.set()
        return "rested"

    def agent() -> so.Agent:
        call = so.ModelResponse(tool_calls=[so.ToolCall(id="c1", name="nap", input={})])
        model = so.models.Scripted([call, so.ModelResponse(text="Rested.")])
        return so.Agent(name="support", model=model, tools=[nap])

    # concurrency 1: the worker waits on its full set of turns, as it does with a turn per slot
    for concurrency in (1, 4):
        began.clear()
        stopped.clear()
        async with (
            so.Runtime([agent()], store=store_url, inline=False) as front,
            so.Runtime([agent()], store=store_url, inline=False, lease_ttl=600) as worker,
        ):
            session_id = (await front.generate("support", prompt="nap")).session_id
            task = asyncio.create_task(worker.work(concurrency=concurrency, idle_wait=0.05))
            await asyncio.wait_for(began.wait(), 10)
            await asyncio.sleep(0.1)  # the worker back in its wait, not in a claim
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 10)
            assert stopped.is_set()  # the nap was cancelled with the worker, not left running
            token = await front.store.acquire_lease(session_id, "another", 30.0, front.now())
            assert token is not None  # given back: another worker takes the session at once


@pytest.mark.parametrize("where", ["answer", "confirmation", "mirrors"])
async def test_a_worker_cancelled_mid_claim_gives_the_claimed_lease_back(
    store_url: str, where: str
) -> None:
    """`work()` cancelled between a claim's grant and the drive that takes it over: while the
    claim's answer is on its way (the store granted it all the same), while the claim that
    waited long is confirmed, or while the drive looks at a parent's mirrors before taking the
    lease over. The lease is given back (once the claim answers), so another worker takes the
    session at once; it was left held for the whole TTL (600 s here), no drive of it running
    anywhere."""
    clock = ManualClock(time.time())
    reached = asyncio.Event()
    agent = scripted_agent("support", [reply("Done.")])
    async with (
        so.Runtime([agent], store=store_url, inline=False, clock=clock) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=600, clock=clock) as worker,
    ):
        session_id = (await front.generate("support", prompt="hello")).session_id
        store = worker.store
        claim, renew, load = store.claim, store.renew_lease, store.load

        async def held_up() -> None:
            reached.set()
            await asyncio.sleep(0.3)  # the answer on its way, or a slow read

        async def claiming(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            claimed = await claim(*args, **kwargs)
            if claimed and where == "answer":
                await held_up()
            if claimed and where == "confirmation":
                clock.advance(300)  # the claim waited long: it is renewed before it is driven
            return claimed

        async def renewing(*args: Any) -> bool:
            if where == "confirmation":
                await held_up()
            return await renew(*args)

        async def loading(*args: Any, **kwargs: Any) -> Any:
            if where == "mirrors" and asyncio.current_task().get_name() == session_id:  # type: ignore[union-attr]
                await held_up()
            return await load(*args, **kwargs)

        store.claim = claiming  # type: ignore[method-assign]
        store.renew_lease = renewing  # type: ignore[method-assign,assignment]
        store.load = loading  # type: ignore[method-assign]
        task = asyncio.create_task(worker.work(idle_wait=0.05))
        await asyncio.wait_for(reached.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)

        async def taken() -> bool:
            token = await front.store.acquire_lease(session_id, "another", 30.0, front.now())
            return token is not None

        # Given back once the answer came (the worker's return did not wait for it): another
        # worker takes the session within a moment, not after the TTL.
        await until(taken, timeout=5)
