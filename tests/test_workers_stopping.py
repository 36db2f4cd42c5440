"""A worker told to stop (`signoff worker` on SIGTERM, `Runtime.work(stop=...)`) finishes the
turns in flight, but starts none after them: a message queued behind one is left, its lease
given back, to a worker that goes on."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

import signoff as so
from signoff import _kept_outcomes
from signoff.server import create_app

from ._worker_procs import AGENT, ALICE, Worker, make_agent, read_records
from ._workers import refund_agent, until, working

BOB = so.Principal(authenticator="test", principal_id="bob")


def chat_agent(inside: list[str], release: asyncio.Event) -> so.Agent:
    """Its first model call waits for `release`; the next answers at once."""

    async def first(request: Any) -> so.ModelResponse:
        inside.append("first")
        await release.wait()
        return so.ModelResponse(text="One.")

    async def then(request: Any) -> so.ModelResponse:
        inside.append("then")
        return so.ModelResponse(text="Two.")

    return so.Agent(name="chat", model=so.models.Scripted([first, then]))


async def test_a_stopping_worker_starts_no_queued_turn_and_leaves_it_to_others(
    store_url: str,
) -> None:
    """Stopped while it ran a turn with a message queued behind it, a worker went on to run the
    queued message's turn too (and the next, as long as messages kept coming) before it exited,
    when it could have given the session back to a worker that stays."""
    inside: list[str] = []
    release = asyncio.Event()
    agent = chat_agent(inside, release)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False) as stopping,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=600) as other,
    ):
        r = await front.generate("chat", prompt="Hello")
        stop = asyncio.Event()
        task = asyncio.create_task(stopping.work(concurrency=1, stop=stop, idle_wait=0.05))
        try:
            await until(lambda: _has(inside, "first"))
            queued = await front.send(r.session_id, "And then?", turn_policy="queue")
            assert queued.queued
            stop.set()
            release.set()
            await asyncio.wait_for(task, 10)
        finally:
            stop.set()
            release.set()
            await asyncio.wait_for(task, 10)
        assert inside == ["first"]  # the turn in flight finished; the queued one not started
        state = await front.state(r.session_id)
        assert state.status == "running" and state.queued
        # Its lease given back: a worker that goes on runs it at once, not after a lease TTL.
        async with working(other):
            await until(lambda: _has(inside, "then"), timeout=5)
            await until(lambda: _idle(front, r.session_id), timeout=5)
        assert inside == ["first", "then"]


async def _has(seen: list[str], what: str) -> bool:
    return what in seen


async def _idle(rt: so.Runtime, session_id: str) -> bool:
    return (await rt.state(session_id)).status == "idle"


async def test_signoff_worker_on_sigterm_gives_back_a_session_with_a_message_queued(
    store_url: str, tmp_path: Path
) -> None:
    """The same with the command and a real SIGTERM, mid tool body: the worker finishes the
    turn, exits 0, and leaves the queued message's session running with its lease free."""
    records, hold = tmp_path / "runs.jsonl", tmp_path / "hold"
    agent = make_agent(str(records))
    async with so.Runtime([agent], store=store_url, inline=False) as front:
        r = await front.generate(AGENT, prompt="Refund order 1042")
        worker = Worker(store_url, tmp_path, "stopping", records, delay=0.0, hold=hold)
        try:
            await until(lambda: _status(front, r.session_id, "waiting"), timeout=30)
            (request,) = await front.pending()
            answer = so.InputResponse(request_id=request.id, option_id="approve")
            await front.respond(r.session_id, [answer], principal=ALICE)
            await until(lambda: _started(records), timeout=30)  # its body waits for `hold`
            queued = await front.send(r.session_id, "Thanks!", turn_policy="queue")
            assert queued.queued
            worker.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            hold.touch()
            assert await asyncio.to_thread(worker.proc.wait, 30) == 0, worker.log()
        finally:
            worker.close()
        assert [what for what, _, _ in read_records(records)] == ["start", "done"]
        state = await front.state(r.session_id)
        assert state.status == "running" and state.queued, worker.log()
        turn = state.turn
        assert turn is not None and turn.status == "completed"
        # Given back: another owner gets its lease at once.
        assert await front.store.acquire_lease(r.session_id, "other", 30, front.now()) is not None
        # Said so: "running" read as if this worker still ran a turn as it stopped.
        said = f"session {r.session_id}: its turn is done; what is queued behind it is left"
        assert said in worker.log() and f"session {r.session_id}: running" not in worker.log()


async def test_signoff_worker_on_sigterm_while_its_app_loads_stops_cleanly(
    tmp_path: Path,
) -> None:
    """A SIGTERM while the worker imported its app, before the loop's handler was set, killed
    it (exit 143, nothing logged). It is taken as the stop it asks for: exit 0, said."""
    worker, loading = await _loading(tmp_path)
    try:
        worker.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        Path(f"{loading}.go").touch()
        assert await asyncio.to_thread(worker.proc.wait, 30) == 0, worker.log()
    finally:
        worker.close()
    log = worker.log()
    assert "SIGTERM: stopping after the running turns" in log and "worker stopped" in log, log
    assert "Traceback" not in log


async def test_a_second_sigterm_while_its_app_loads_stops_it_at_once(tmp_path: Path) -> None:
    """The first SIGTERM while the app loads is kept for a stop once the worker runs; a second
    one stops it at once, as it does once running (an import that hangs is not waited for)."""
    worker, loading = await _loading(tmp_path)
    try:
        worker.proc.send_signal(signal.SIGTERM)
        await asyncio.sleep(0.2)
        assert worker.proc.poll() is None  # kept: still loading
        worker.proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.proc.wait, 10) == -signal.SIGTERM
        assert not Path(f"{loading}.go").exists()  # it never went on loading
    finally:
        worker.close()


async def _loading(tmp_path: Path) -> tuple[Worker, Path]:
    """A `signoff worker` whose app is loading (it waits for the file `loading.go`), and the
    file `loading` it wrote when it began."""
    loading = tmp_path / "loading"
    url = f"sqlite:///{tmp_path / 'state.db'}"
    worker = Worker(url, tmp_path, "loading", tmp_path / "runs.jsonl", delay=0.0, loading=loading)
    try:
        await until(lambda: _exists(loading), timeout=30)
    except BaseException:
        worker.close()
        raise
    return worker, loading


async def _exists(path: Path) -> bool:
    return path.exists()


async def _status(rt: so.Runtime, session_id: str, wanted: str) -> bool:
    return (await rt.state(session_id)).status == wanted


async def _started(records: Path) -> bool:
    return any(what == "start" for what, _, _ in read_records(records))


async def test_sessions_claimed_as_the_worker_was_told_to_stop_are_given_back_not_started(
    store_url: str,
) -> None:
    """A stop (SIGTERM) landing while a claim was in flight: the worker went on to drive every
    session that claim returned, starting whole turns (their tool calls) after it was told to
    stop, and a supervisor's kill at the end of its grace period could land in them. They are
    no turns in flight: given back at once, for a worker that goes on."""
    runs: list[str] = []
    agent = refund_agent(runs, approval=so.never())
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False, lease_ttl=600) as worker,
    ):
        r = await front.generate("support", prompt="Refund order 1042")
        assert r.status == "running"  # recorded only: a worker runs it
        stop = asyncio.Event()
        claim = worker.store.claim

        async def claim_then_stop(*args: Any, **kwargs: Any) -> list[tuple[str, int]]:
            claimed = await claim(*args, **kwargs)
            if claimed:
                stop.set()  # the signal arrives while the claim's answer is on its way
            return claimed

        worker.store.claim = claim_then_stop  # type: ignore[method-assign]
        await asyncio.wait_for(worker.work(stop=stop, idle_wait=0.05), 10)
        assert runs == []  # no turn started after the stop
        state = await front.state(r.session_id)
        assert state.status == "running" and state.turn is not None and state.turn.steps == 0
        # Given back: another process may take it at once, not after the 600 s lease.
        assert await front.store.acquire_lease(r.session_id, "another", 10.0, front.now())


class _Outage:
    """A worker's store whose writes fail while `down` (a database restarting, a full disk):
    commits, claims and leases, each named in `refused`. `asked` is set at each lease asked
    for while down, which only a drive of a session by its id does (not a claim)."""

    def __init__(self, store: Any) -> None:
        self.down = False
        self.refused: list[str] = []
        self.asked = asyncio.Event()
        for name in ("commit", "claim", "acquire_lease", "renew_lease", "release_lease"):
            setattr(store, name, self._refusing(name, getattr(store, name)))

    def _refusing(self, name: str, real: Any) -> Any:
        async def refusing(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.refused.append(name)
                if name == "acquire_lease":
                    self.asked.set()
                raise so.StoreError(f"{name}: the database is restarting (test)")
            return await real(*args, **kwargs)

        return refusing


async def _stop_with_a_refused_outcome(
    worker: so.Runtime, front: so.Runtime, runs: list[str], hold: asyncio.Event, when: str
) -> tuple[asyncio.Task[None], _Outage, str]:
    """A worker runs a refund whose body waits for `hold`; it is told to stop, and the store
    refuses the record of the body's outcome: `when` "draining", as the body ends after the
    stop; "before", the drive failing before the stop. Returns the worker's task once it is
    trying to record the outcome again (or has returned), its outage and the session."""
    outage = _Outage(worker.store)
    r = await front.generate("support", prompt="Refund order 1042")
    assert r.status == "running"  # recorded only: the worker runs it
    stop = asyncio.Event()
    task = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
    await until(lambda: _has(runs, f"{r.session_id}:1:call_refund"))  # the body runs
    if when == "draining":
        stop.set()
    outage.down = True
    hold.set()  # the refund ran; its record is refused
    if when == "before":
        await until(lambda: _failed(worker, outage, r.session_id))
        stop.set()
    asked = asyncio.create_task(outage.asked.wait())
    await asyncio.wait({task, asked}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    asked.cancel()
    return task, outage, r.session_id


async def _failed(worker: so.Runtime, outage: _Outage, session_id: str) -> bool:
    """Whether the worker's drive of the session ended, the record of its outcome refused: the
    worker then asks for the session's lease again, to record it (once it asked, or drives the
    session no more)."""
    ended = session_id not in worker._driving or outage.asked.is_set()
    return "commit" in outage.refused and ended


@pytest.mark.parametrize("when", ["draining", "before"])
async def test_a_stopping_worker_records_the_outcome_the_store_refused_before_it_returns(
    store_url: str, when: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker told to stop (SIGTERM) whose tool body ended while the store refused writes
    kept the outcome in memory for a later drive here, and returned at once (`signoff worker`
    exited 0): the next worker ran the refund again. It drives the session again, with backoff,
    until the store takes the outcome, and returns once it is recorded: the refund ran once."""
    caplog.set_level(logging.INFO, logger="signoff.worker")
    runs: list[str] = []
    hold = asyncio.Event()
    agent = refund_agent(runs, approval=so.never(), hold=hold)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False) as worker,
    ):
        task, outage, session_id = await _stop_with_a_refused_outcome(
            worker, front, runs, hold, when
        )
        try:
            assert not task.done(), "the worker returned with the outcome only in memory"
            outage.down = False  # the database is back
            await asyncio.wait_for(task, 30)
        finally:
            outage.down = False
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        types = [e.type async for e in front.events(session_id, follow=False)]
        assert types.count("tool.completed") == types.count("turn.completed") == 1, types
        assert runs == [f"{session_id}:1:call_refund"]  # once
    said = [r.getMessage() for r in caplog.records if r.name == "signoff.worker"]
    assert any(
        f"session {session_id}: the outcome of issue_refund call call_refund recorded" in line
        for line in said
    ), said
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_a_stopping_worker_that_cannot_record_an_outcome_names_it_and_fails(
    store_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refusing for longer than `RECORD_KEPT_WITHIN`: the stopping worker gives up,
    logs as an error the session and call whose outcome is lost (the next drive runs the tool
    again), and `work()` fails with a `StoreError` naming them (`signoff worker` exits 1),
    not a return that reads as a clean stop."""
    monkeypatch.setattr(_kept_outcomes, "RECORD_KEPT_WITHIN", 0.5)
    runs: list[str] = []
    hold = asyncio.Event()
    agent = refund_agent(runs, approval=so.never(), hold=hold)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False) as worker,
    ):
        task, outage, session_id = await _stop_with_a_refused_outcome(
            worker, front, runs, hold, "draining"
        )
        try:
            with pytest.raises(so.StoreError) as failed:
                await asyncio.wait_for(task, 30)
        finally:
            outage.down = False
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        types = [e.type async for e in front.events(session_id, follow=False)]
        assert "tool.completed" not in types, types
    lost = f"issue_refund call call_refund in session {session_id}"
    assert lost in str(failed.value), failed.value
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(
        line.startswith(f"session {session_id}: the outcome of issue_refund call call_refund ran")
        and "lost" in line
        for line in errors
    ), errors


async def test_a_second_stop_while_recording_a_kept_outcome_stops_at_once_and_says_it_is_lost(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker trying to record an outcome the store refuses is cancelled (a second SIGTERM):
    it stops at once, not after `RECORD_KEPT_WITHIN`, naming as an error the call whose
    outcome is lost with it."""
    runs: list[str] = []
    hold = asyncio.Event()
    agent = refund_agent(runs, approval=so.never(), hold=hold)
    async with (
        so.Runtime([agent], store=store_url, inline=False) as front,
        so.Runtime([agent], store=store_url, inline=False) as worker,
    ):
        task, outage, session_id = await _stop_with_a_refused_outcome(
            worker, front, runs, hold, "draining"
        )
        try:
            assert not task.done(), "the worker returned with the outcome only in memory"
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await asyncio.wait_for(task, 5)
        finally:
            outage.down = False
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert any(
        line.startswith(f"stopping now: session {session_id}: the outcome of issue_refund call")
        for line in errors
    ), errors


class _Delegation:
    """A support agent delegating to billing, whose refund needs approval and waits for
    `release`; once the child's result is in, the parent calls `parent_tool`, then answers.
    `ran` names the tools that ran; `refunding` is set as the refund's body starts."""

    def __init__(self, release: asyncio.Event | threading.Event) -> None:
        self.ran: list[str] = []
        self.refunding = threading.Event()

        @so.tool(approval=so.always())
        async def issue_refund(order_id: str) -> dict[str, Any]:
            """Refund an order."""
            self.ran.append("issue_refund")
            self.refunding.set()
            while not release.is_set():
                await asyncio.sleep(0.01)
            return {"refunded": order_id}

        @so.tool
        async def parent_tool(x: int) -> dict[str, Any]:
            """A side effect of the parent's turn, after its subagent's result."""
            self.ran.append("parent_tool")
            return {"x": x}

        def support_model(messages: list[so.Message]) -> so.ModelResponse:
            results = sum(isinstance(m, so.ToolResultMessage) for m in messages)
            if results == 0:
                call = so.ToolCall(id="d1", name="billing", input={"message": "Refund 1042"})
                return so.ModelResponse(tool_calls=[call])
            if results == 1:
                call = so.ToolCall(id="p1", name="parent_tool", input={"x": 1})
                return so.ModelResponse(tool_calls=[call])
            return so.ModelResponse(text="Done.")

        refund = so.ToolCall(id="r1", name="issue_refund", input={"order_id": "1042"})
        billing_model = so.models.Scripted(
            [so.ModelResponse(tool_calls=[refund]), so.ModelResponse(text="Refunded.")]
        )
        self.agents = [
            so.Agent(
                name="support",
                model=so.models.Scripted([support_model], repeat_last=True),
                tools=[so.delegate("billing"), parent_tool],
            ),
            so.Agent(name="billing", model=billing_model, tools=[issue_refund]),
        ]

    async def answered_with_a_message_queued(self, front: so.Runtime) -> str:
        """The parent, waiting on its child's request, which is answered on the child with
        `resume=False`, and a message queued behind the parent's turn; returns the parent."""
        r = await front.generate("support", prompt="Refund order 1042", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        answer = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        await front.respond(mirror.child.session_id, [answer], principal=ALICE, resume=False)
        queued = await front.send(r.session_id, "And then?", principal=BOB)
        assert queued.queued
        return r.session_id


async def test_a_stopping_worker_leaves_a_subagents_parent_to_others_with_its_queue(
    store_url: str,
) -> None:
    """A worker of an inline runtime told to stop while it ran a subagent's turn (answered on
    the child with `resume=False`) went on to drive the parent's turn, running its tool, and
    then the message queued behind it, before `work()` returned. The parent is left runnable,
    and a worker that goes on runs both."""
    release = asyncio.Event()
    setup = _Delegation(release)
    async with (
        so.Runtime(setup.agents, store=store_url) as front,
        so.Runtime(setup.agents, store=store_url) as stopping,
        so.Runtime(setup.agents, store=store_url) as other,
    ):
        parent = await setup.answered_with_a_message_queued(front)
        stop = asyncio.Event()
        # One turn at a time: the parent, runnable once its child's drive began, is not
        # claimed before the stop (its turn would be one in flight).
        task = asyncio.create_task(stopping.work(concurrency=1, stop=stop, idle_wait=0.05))
        try:
            await until(lambda: asyncio.sleep(0, setup.refunding.is_set()))
            stop.set()
            release.set()
            await asyncio.wait_for(task, 10)
        finally:
            stop.set()
            release.set()
            await asyncio.wait_for(task, 10)
        assert setup.ran == ["issue_refund"]  # the child's turn finished; the parent's not run
        state = await front.state(parent)
        assert state.status == "running" and state.queued
        async with working(other):
            await until(lambda: _idle(front, parent), timeout=10)
        assert setup.ran == ["issue_refund", "parent_tool"]
        turns = [e for e in await _events(front, parent) if e.type == "turn.completed"]
        assert len(turns) == 2  # the delegating turn, then the queued message's


def test_an_apps_workers_stopping_leave_a_subagents_parent_to_others(tmp_path: Path) -> None:
    """The same through `create_app(workers=1)` (`signoff serve --workers 1`) shutting down:
    its worker drove the parent's turn and the queued message's after the stop."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    release = threading.Event()
    setup = _Delegation(release)

    class Release(logging.Handler):  # the stop is set: the child's refund may end
        def emit(self, record: logging.LogRecord) -> None:
            if record.getMessage().startswith("stopping: waiting for"):
                release.set()

    async def prepare() -> str:
        async with so.Runtime(setup.agents, store=url) as front:
            return await setup.answered_with_a_message_queued(front)

    parent = asyncio.run(prepare())
    handler = Release()
    logger = logging.getLogger("signoff.worker")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        app = create_app(so.Runtime(setup.agents, store=url), workers=1, dev=True)
        with TestClient(app):
            assert setup.refunding.wait(10)
    finally:
        release.set()
        logger.removeHandler(handler)
        logger.setLevel(level)
    assert setup.ran == ["issue_refund"]

    async def check() -> None:
        async with so.Runtime(setup.agents, store=url) as front:
            state = await front.state(parent)
            assert state.status == "running" and state.queued
            types = [e.type for e in await _events(front, parent)]
            assert types.count("turn.completed") == 0, types

    asyncio.run(check())


async def _events(rt: so.Runtime, session_id: str) -> list[so.Event]:
    return [e async for e in rt.events(session_id, follow=False)]
