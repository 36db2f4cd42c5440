"""The store failing a write (a full disk): the caller gets a `StoreError`, nothing is half
written, and once the store takes writes again the turn finishes as it would have, each
approved tool having run once."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

import signoff as so
from signoff import _kept_outcomes
from signoff.stores import FaultHook
from signoff.testing import call, call_tools, reply, scripted_agent

from ._disk_full import FAIL_INSERTS
from ._procs import ROOT, read_executions
from ._workers import until


def _events(url: str, session_id: str) -> list[so.Event]:
    rt = so.Runtime([], store=url)
    try:
        return rt.events_sync(session_id)
    finally:
        rt.close_sync()


def test_a_disk_full_when_a_tool_ends_keeps_its_result_and_does_not_run_it_again(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    records = tmp_path / "runs.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "tests._full_child", url, str(records)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    failed, result = (json.loads(line) for line in done.stdout.splitlines())
    # The commit of the tool's result failed as on a full disk: a named store error.
    assert failed["type"] == "StoreError", failed
    assert "full" in failed["message"] or "I/O" in failed["message"], failed
    # Space again: the turn ends as an uninterrupted one would, the tool having run once.
    assert result["status"] == "completed" and result["text"] == "Report sent.", result
    runs = read_executions(records)
    assert [r["key"] for r in runs] == [f"{result['session_id']}:1:call_1"], runs
    events = _events(url, result["session_id"])
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    types = Counter(e.type for e in events)
    assert types["tool.completed"] == 1 and types["turn.completed"] == 1, types


async def test_a_failed_postgres_commit_of_a_tool_result_does_not_run_the_tool_again(
    pg_store_url: str,
) -> None:
    admin = pg_store_url.split("?")[0]
    runs: list[str] = []

    @so.tool(approval=so.always())
    async def ship(ctx: so.ToolContext, order_id: str) -> str:
        """Ship an order: a side effect."""
        runs.append(ctx.idempotency_key())
        if len(runs) == 1:  # the database refuses every insert from now on
            with psycopg.connect(admin, autocommit=True) as conn:
                conn.execute(FAIL_INSERTS)
        return f"shipped {order_id}"

    model = so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="ship", input={"order_id": "7"})]),
            so.ModelResponse(text="Shipped."),
        ]
    )
    agent = so.Agent(name="support", model=model, tools=[ship])
    async with so.Runtime([agent], store=pg_store_url) as rt:
        r = await rt.generate("support", prompt="ship order 7")
        answer = [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        with pytest.raises(so.StoreError, match="No space left"):
            await rt.respond(r.session_id, answer)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("DROP TRIGGER disk_full ON signoff.events")
        done = await rt.respond(r.session_id, answer)
        assert (done.status, done.text) == ("completed", "Shipped.")
        assert len(runs) == 1
        events = [e async for e in rt.events(r.session_id, follow=False)]
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert Counter(e.type for e in events)["tool.completed"] == 1


def _workflow(
    steps: list[str], fill: Callable[[], None], unfill: Callable[[], None]
) -> tuple[so.Agent, FaultHook]:
    """A tool whose journaled step fills the disk, so the step's record fails; the store's fault
    hook frees it before the next commit (the tool's end). Returns the agent and the hook."""

    @so.tool
    async def plan(ctx: so.ToolContext, order_id: str) -> str:
        """Plan a remedy with a journaled quote."""

        def quote() -> str:
            steps.append(ctx.idempotency_key("quote"))
            if len(steps) == 1:
                fill()
            return os.urandom(32 * 1024).hex()  # a result that needs new pages

        await ctx.step("quote", quote)
        return f"planned {order_id}"

    def hook(when: str, label: str) -> None:
        if when == "before" and label == "tool.completed":
            unfill()

    def echo(conversation: list[so.Message]) -> so.ModelResponse:
        last = conversation[-1]
        assert isinstance(last, so.ToolResultMessage)
        return so.ModelResponse(text=json.dumps(last.content))

    model = so.models.Scripted(
        [so.ModelResponse(tool_calls=[so.ToolCall(name="plan", input={"order_id": "7"})]), echo]
    )
    return so.Agent(name="support", model=model, tools=[plan]), hook


async def _run_workflow(
    rt: so.Runtime, steps: list[str], hook: FaultHook, unfill: Callable[[], None]
) -> None:
    """The step's record fails: the call is not recorded as failed by a store error; run again
    once there is room, it ends as an uninterrupted run would."""
    rt.store.set_fault_hook(hook)
    sid = await rt.create_session("support")
    with pytest.raises(so.StoreError):
        await rt.generate(session_id=sid, prompt="plan order 7")
    unfill()
    done = await rt.generate(session_id=sid)
    assert (done.status, done.text) == ("completed", '"planned 7"'), done
    events = [e async for e in rt.events(sid, follow=False)]
    ended = [e.data["status"] for e in events if e.type == "tool.completed"]
    assert ended == ["ok"]
    # The step's result, kept when its record failed, is recorded by the next drive here, not
    # run again (it ran twice: a full disk, no kill, and the quote was fetched again).
    assert len(steps) == 1
    assert [e.data["name"] for e in events if e.type == "tool.step"] == ["quote"]


async def test_a_step_whose_record_fails_on_sqlite_does_not_fail_its_tool(tmp_path: Path) -> None:
    steps: list[str] = []
    rt = so.Runtime([], store=f"sqlite:///{tmp_path / 'state.db'}")

    def fill() -> None:
        conn = rt.store.conn  # type: ignore[attr-defined]
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count={pages}")

    def unfill() -> None:
        rt.store.conn.execute("PRAGMA max_page_count=1073741823")  # type: ignore[attr-defined]

    agent, hook = _workflow(steps, fill, unfill)
    rt.agents["support"] = agent
    async with rt:
        await _run_workflow(rt, steps, hook, unfill)


async def test_a_step_whose_record_fails_on_postgres_does_not_fail_its_tool(
    pg_store_url: str,
) -> None:
    admin = pg_store_url.split("?")[0]
    steps: list[str] = []

    def fill() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(FAIL_INSERTS)

    def unfill() -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute("DROP TRIGGER IF EXISTS disk_full ON signoff.events")

    agent, hook = _workflow(steps, fill, unfill)
    async with so.Runtime([agent], store=pg_store_url) as rt:
        await _run_workflow(rt, steps, hook, unfill)


async def test_a_lease_whose_release_failed_is_given_back_by_the_next_drive_here(
    tmp_path: Path,
) -> None:
    """The store refuses every write (full) when a tool's result is committed: the drive's
    release of its lease fails too. Once the store takes writes again, the next call in this
    process must not wait out the lease's TTL (30 s) behind its own dead drive: it gives that
    lease back first and goes on at once."""
    runs: list[str] = []
    rt = so.Runtime([], store=f"sqlite:///{tmp_path / 'state.db'}", lease_wait=0.5)

    def refuse_writes(on: bool) -> None:
        rt.store.conn.execute(f"PRAGMA query_only={int(on)}")  # type: ignore[attr-defined]

    @so.tool(approval=so.always())
    async def ship(ctx: so.ToolContext, order_id: str) -> str:
        """Ship an order: a side effect."""
        runs.append(ctx.idempotency_key())
        refuse_writes(True)
        return f"shipped {order_id}"

    model = so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="ship", input={"order_id": "7"})]),
            so.ModelResponse(text="Shipped."),
        ]
    )
    rt.agents["support"] = so.Agent(name="support", model=model, tools=[ship])
    async with rt:
        r = await rt.generate("support", prompt="ship order 7")
        answer = [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        with pytest.raises(so.StoreError):
            await rt.respond(r.session_id, answer)
        refuse_writes(False)
        done = await rt.respond(r.session_id, answer)
        assert (done.status, done.text) == ("completed", "Shipped."), done
        assert len(runs) == 1


async def test_a_new_sessions_lease_whose_release_failed_survives_the_keyed_retry(
    tmp_path: Path,
) -> None:
    """The store refuses writes (full) when the first drive of a new session asks for an
    approval, and the drive's release of its lease fails too. Retrying the call with its
    idempotency key finds the session made (its own creation gives back a lease of its own
    owner, a no-op); once the store takes writes again, the next drive here must still give
    the dead drive's lease back, not wait behind it and answer "running" until its TTL."""
    rt = so.Runtime([], store=f"sqlite:///{tmp_path / 'state.db'}", lease_wait=0.5)

    def refuse_writes(on: bool) -> None:
        rt.store.conn.execute(f"PRAGMA query_only={int(on)}")  # type: ignore[attr-defined]

    def hook(when: str, label: str) -> None:
        if (when, label) == ("before", "input.requested"):
            refuse_writes(True)

    @so.tool(approval=so.always())
    async def ship(ctx: so.ToolContext, order_id: str) -> str:
        """Ship an order: a side effect."""
        return f"shipped {order_id}"

    model = so.models.Scripted(
        [so.ModelResponse(tool_calls=[so.ToolCall(name="ship", input={"order_id": "7"})])]
    )
    rt.agents["support"] = so.Agent(name="support", model=model, tools=[ship])
    async with rt:
        rt.store.set_fault_hook(hook)
        with pytest.raises(so.StoreError):
            await rt.generate("support", prompt="ship order 7", idempotency_key="k1")
        rt.store.set_fault_hook(None)
        refuse_writes(False)
        again = await rt.generate("support", prompt="ship order 7", idempotency_key="k1")
        assert again.replayed
        resumed = await rt.generate(session_id=again.session_id)
        assert resumed.status == "waiting", resumed
        assert [r.action.tool_name for r in resumed.pending if r.action] == ["ship"]


class _LostCommits:
    """Fails the runtime's commits with a `StoreError` while `down` (a connection lost during
    COMMIT, a `lock_timeout`): set as the refund's body ends, its outcome's commit is the first."""

    def __init__(self, rt: so.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
        self.down = False
        commit = rt.store.commit

        async def failing(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                raise so.StoreError("commit: connection lost during COMMIT; the outcome is unknown")
            return await commit(*args, **kwargs)

        monkeypatch.setattr(rt.store, "commit", failing)


def _refunds(runs: list[str], lost: list[_LostCommits]) -> so.Agent:
    """An agent whose one call refunds (no approval), its body's outcome refused by the store."""

    @so.tool(approval=so.never())
    async def refund(ctx: so.ToolContext, amount: int) -> dict[str, int]:
        """Refund: a side effect."""
        runs.append(ctx.idempotency_key())
        lost[0].down = True
        return {"refunded": amount}

    model = so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(id="c1", name="refund", input={"amount": 5})]),
            so.ModelResponse(text="Done."),
        ]
    )
    return so.Agent(name="a", model=model, tools=[refund])


async def test_an_inline_drive_keeps_its_lease_while_a_tools_outcome_is_unrecorded(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refused a tool's outcome to an inline drive (its call raises `StoreError`),
    which kept the outcome in memory but gave the session's lease back: another process (a
    second replica, a worker) resumed the turn and ran the refund a second time, though nothing
    crashed. The drive keeps the lease, and records the outcome in the background once the
    store takes it, then gives the lease back."""
    runs: list[str] = []
    lost: list[_LostCommits] = []
    agent = _refunds(runs, lost)
    async with (
        so.Runtime([agent], store=store_url) as rt,
        so.Runtime([agent], store=store_url, lease_wait=0.3) as other,
        so.Runtime([agent], store=store_url, inline=False) as worker,
    ):
        lost.append(_LostCommits(rt, monkeypatch))
        sid = await other.create_session("a")
        # While the store refuses it: neither another process's resume nor a worker runs it.
        await _refused_then_resumed(rt, other, sid)
        assert runs == [f"{sid}:1:c1"], "another process ran the refund again"
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        await asyncio.sleep(0.5)
        stop.set()
        await working
        assert runs == [f"{sid}:1:c1"]
        lost[0].down = False  # the store takes commits again: the outcome kept is recorded
        await until(lambda: _is(other, sid, "completed"))
        done = await other.generate(session_id=sid)
        assert (done.status, done.text) == ("completed", "Done."), done
        assert not await other.store.lease_held(sid, other.now())  # type: ignore[attr-defined]
        events = [e async for e in other.events(sid, follow=False)]
    assert runs == [f"{sid}:1:c1"]
    assert Counter(e.type for e in events)["tool.completed"] == 1


def _delegating() -> so.Agent:
    """A parent whose one call delegates a refund to agent `a` (`_refunds`), then answers."""
    return scripted_agent(
        "p",
        [call_tools(call("a", message="refund", call_id="d1")), reply("Delegated.")],
        tools=[so.delegate("a")],
    )


async def test_a_subagents_drive_keeps_its_lease_while_a_tools_outcome_is_unrecorded(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, through `so.delegate()`: the store refused the subagent's refund outcome, and
    its parent's delegate call gave the child's lease back at once, then the parent's drive
    its own: another process resumed the parent, drove the child and ran the refund again.
    Both leases are kept while the outcome is recorded in the background; then the parent's
    turn goes on."""
    runs: list[str] = []
    lost: list[_LostCommits] = []
    child = _refunds(runs, lost)
    parent = _delegating()
    async with (
        so.Runtime([parent, child], store=store_url) as rt,
        so.Runtime([parent, child], store=store_url, lease_wait=0.3) as other,
        so.Runtime([parent, child], store=store_url, inline=False) as worker,
    ):
        lost.append(_LostCommits(rt, monkeypatch))
        sid = await other.create_session("p")
        await _refused_then_resumed(rt, other, sid, before=lambda: len(runs) == 1)
        assert len(runs) == 1, "another process ran the subagent's refund again"
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        await asyncio.sleep(0.5)
        stop.set()
        await working
        assert len(runs) == 1
        lost[0].down = False  # the store takes commits again: recorded, and the parent goes on
        await until(lambda: _is(other, sid, "completed"))
        done = await other.generate(session_id=sid)
        assert (done.status, done.text) == ("completed", "Delegated."), done
        assert not await other.store.lease_held(sid, other.now())  # type: ignore[attr-defined]
        kid = runs[0].rsplit(":", 2)[0]
        assert not await other.store.lease_held(kid, other.now())  # type: ignore[attr-defined]
        events = [e async for e in other.events(kid, follow=False)]
    assert Counter(e.type for e in events)["tool.completed"] == 1
    assert len(runs) == 1


async def test_a_runtime_closing_with_a_tools_outcome_unrecorded_tries_then_names_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store refuses the outcome kept until the runtime closes: `close` tries to record it
    for `RECORD_KEPT_WITHIN`, not for ever, then logs as an error the call whose outcome is
    lost; till then no other process runs the tool again."""
    monkeypatch.setattr(_kept_outcomes, "RECORD_KEPT_WITHIN", 0.5)
    runs: list[str] = []
    lost: list[_LostCommits] = []
    agent = _refunds(runs, lost)
    async with so.Runtime([agent], store=store_url, lease_wait=0.3) as other:
        rt = so.Runtime([agent], store=store_url)
        lost.append(_LostCommits(rt, monkeypatch))
        sid = await other.create_session("a")
        await _refused_then_resumed(rt, other, sid)
        assert runs == [f"{sid}:1:c1"], "another process ran the refund again"
        await asyncio.wait_for(rt.close(), 10)
        assert runs == [f"{sid}:1:c1"]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(
        line.startswith(f"session {sid}: the outcome of refund call c1 ran but") for line in errors
    ), errors


async def test_a_runtime_closing_with_a_subagents_outcome_unrecorded_tries_then_names_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The store refuses the subagent's outcome kept until the runtime closes: `close` returns
    within the bound, naming the call lost, and gives both leases back (its parent's drive,
    waiting on the subagent's recording, begins no drive at the close)."""
    monkeypatch.setattr(_kept_outcomes, "RECORD_KEPT_WITHIN", 0.5)
    runs: list[str] = []
    lost: list[_LostCommits] = []
    child = _refunds(runs, lost)
    parent = _delegating()
    async with so.Runtime([parent, child], store=store_url, lease_wait=0.3) as other:
        rt = so.Runtime([parent, child], store=store_url)
        lost.append(_LostCommits(rt, monkeypatch))
        sid = await other.create_session("p")
        await _refused_then_resumed(rt, other, sid)
        assert len(runs) == 1, "another process ran the subagent's refund again"
        await asyncio.wait_for(rt.close(), 10)
        assert len(runs) == 1
        kid = runs[0].rsplit(":", 2)[0]
        for session in (sid, kid):
            assert not await other.store.lease_held(session, other.now())  # type: ignore[attr-defined]
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(
        line.startswith(f"session {kid}: the outcome of refund call c1 ran but") for line in errors
    ), errors


async def test_a_runtime_closing_once_the_outcome_kept_is_recorded_does_not_wait_for_the_turn(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The outcome kept was recorded, and the background drive went on with the turn into a
    slow tool: `close` waited for the whole turn (up to `RECORD_KEPT_WITHIN`, 60 s), with the
    store working. It stops that drive at once, as it stops a call (a review's repro)."""
    down = [False]
    runs: list[str] = []

    @so.tool
    async def refund(ctx: so.ToolContext, amount: int) -> dict[str, int]:
        """Refund."""
        runs.append(ctx.idempotency_key())
        down[0] = True
        return {"refunded": amount}

    @so.tool
    async def slow(ctx: so.ToolContext) -> str:
        """Slow."""
        await asyncio.sleep(30)
        return "ok"

    agent = scripted_agent(
        "a",
        [
            call_tools(call("refund", call_id="c1", amount=5)),
            call_tools(call("slow", call_id="c2")),
            reply("Done."),
        ],
        tools=[refund, slow],
    )
    rt = so.Runtime([agent], store=store_url)
    await rt.open()
    commit = rt.store.commit

    async def failing(*args: Any, **kwargs: Any) -> Any:
        if down[0]:
            raise so.StoreError("commit: connection lost during COMMIT; the outcome is unknown")
        return await commit(*args, **kwargs)

    monkeypatch.setattr(rt.store, "commit", failing)
    sid = await rt.create_session("a")
    with pytest.raises(so.StoreError, match="connection lost"):
        await rt.generate("a", "refund me", session_id=sid)
    down[0] = False
    await until(lambda: _started(rt, sid, "slow"))
    began = time.monotonic()
    await asyncio.wait_for(rt.close(), 30)
    assert time.monotonic() - began < 10  # not the slow tool's 30 s
    assert runs == [f"{sid}:1:c1"]


async def _started(rt: so.Runtime, session_id: str, tool: str) -> bool:
    events = await rt.store.read_events(session_id, 0, limit=1000)
    return any(e.type == "tool.started" and e.data.get("tool_name") == tool for e in events)


async def _refused_then_resumed(
    rt: so.Runtime,
    other: so.Runtime,
    session_id: str,
    before: Callable[[], bool] | None = None,
) -> None:
    """`rt` drives the session's first turn (`refund me`), whose refund's outcome the store
    refuses (`StoreError`), `before` true by then if given; then `other`, another process,
    resumes it and finds it still running (the lease kept)."""
    agent = (await other.state(session_id)).agent
    with pytest.raises(so.StoreError, match="connection lost"):
        await rt.generate(agent, "refund me", session_id=session_id)
    if before is not None:
        assert before()
    resumed = await asyncio.wait_for(other.generate(session_id=session_id), 10)
    assert resumed.status == "running", resumed


async def _is(rt: so.Runtime, session_id: str, status: str) -> bool:
    turn = (await rt.state(session_id)).turn
    return turn is not None and turn.status == status
