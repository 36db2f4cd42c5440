"""A workflow tool (`ctx.step`, then `ctx.ask` twice) survives a SIGKILL at each park point.

Every step of the session runs in a child process (`python -m tests.test_workflow_crash ...`) on
one SQLite file; the parent kills children where the tool is parked and starts new ones. The
step's function appends a line to a file each time it really runs, so the parent can prove it
ran exactly once, whatever was killed; the final result must equal an uninterrupted run's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.stores._codec import unpack_snapshot
from signoff.testing import call, call_tools, reply, scripted_agent, timeline

from ._forks import python_env
from ._procs import lapse_leases, query

ROOT = Path(__file__).resolve().parent.parent
ALICE = so.Principal(authenticator="okta", principal_id="alice")
LEASE_TTL = 1.5
"""The lease TTL of the test that needs a step to block past it: long enough that a loaded
machine's stall does not outlast the renewal's half of it (at 0.5 s, a CI run's child lost its
lease so, and the worker ran the step again: the "stalled past its lease" case)."""

CHILD_LEASE_TTL = 5.0
"""The children's lease TTL otherwise: one a loaded machine's stalls cannot outlast (a drive
waking past its lease's expiry gives its renewal a tenth of it); a killed child's lease is
lapsed by hand (`Child.sigkill`), as its TTL passing would."""


# -- what the children run -----------------------------------------------------------------


def append_line(path: Path, obj: dict[str, Any]) -> None:
    """Append one JSON line and fsync it, so a SIGKILL right after cannot lose it."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(obj) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_lines(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def make_agent(
    workdir: Path, *, hang_after_step: bool = False, slow_step: float = 0.0, notes: int = 0
) -> so.Agent:
    """The bank agent: one `transfer` call, then a final reply quoting the tool's result. With
    `slow_step`, its quote (a plain function) blocks that many seconds once it has started; with
    `notes`, the quote is followed by that many more steps, each noted when it really runs."""

    def note(i: int) -> int:
        append_line(workdir / "notes.jsonl", {"pid": os.getpid(), "i": i})
        return i

    def quote(amount: float) -> dict[str, float]:
        append_line(workdir / "steps.jsonl", {"pid": os.getpid(), "amount": amount})
        if slow_step:
            emit({"event": "step-started"})
            time.sleep(slow_step)  # a blocking call: a plain HTTP client's, say
        return {"fee": round(amount * 0.025, 2), "rate": 1.1}

    @so.tool
    async def transfer(ctx: so.ToolContext, amount: float) -> dict[str, Any]:
        """Quote the fee, confirm it, ask for the account, then transfer."""
        append_line(workdir / "bodies.jsonl", {"pid": os.getpid(), "key": ctx.idempotency_key()})
        q = await ctx.step("quote", quote, amount)
        for i in range(notes):
            await ctx.step(f"note{i % 3}", note, i)
        if hang_after_step:
            emit({"event": "step-recorded", "session_id": ctx.session.id})
            await asyncio.Event().wait()  # the parent SIGKILLs us here, inside the tool
        proceed = await ctx.ask(f"The fee is {q['fee']}. Proceed?", options=["yes", "no"])
        account = await ctx.ask("Which account should it come from?")
        return {
            "quote": q,
            "proceed": [proceed.value, proceed.option_id, proceed.principal_id],
            "account": [account.value, account.text, account.principal_id],
        }

    def final(conversation: list[so.Message]) -> so.ModelResponse:
        result = conversation[-1]
        assert isinstance(result, so.ToolResultMessage)
        return reply(f"Done: {json.dumps(result.content, sort_keys=True)}")

    return scripted_agent(
        "bank", [call_tools(call("transfer", call_id="t1", amount=200)), final], tools=[transfer]
    )


def summary(r: so.GenerateResult) -> dict[str, Any]:
    return {
        "event": "result",
        "status": r.status,
        "session_id": r.session_id,
        "text": r.text,
        "pending": [{"id": p.id, "question": p.question} for p in r.pending],
        "pid": os.getpid(),
    }


async def child_main(args: argparse.Namespace) -> None:
    workdir = Path(args.workdir)
    agent = make_agent(
        workdir, hang_after_step=args.hang_after_step, slow_step=args.slow_step, notes=args.notes
    )
    store = args.store or f"sqlite:///{workdir / 'state.db'}"
    rt = so.Runtime([agent], store=store, lease_ttl=args.lease_ttl)
    await rt.open()
    if args.command == "start":
        r = await rt.generate("bank", prompt="move 200 to Bob", auth=ALICE)
    elif args.command == "resume":
        r = await rt.generate(session_id=args.session)
    elif args.command == "choose":
        answer = so.InputResponse(request_id=args.request, option_id=args.option)
        r = await rt.respond(args.session, [answer], principal=ALICE)
    else:
        r = await rt.send(args.session, args.text, principal=ALICE)
    emit(summary(r))
    if args.park:
        while True:  # parked: nothing is held but rows in the store; the parent SIGKILLs us
            time.sleep(3600)
    await rt.close()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m tests.test_workflow_crash")
    p.add_argument("command", choices=["start", "resume", "choose", "say"])
    p.add_argument("--workdir", required=True)
    p.add_argument("--session")
    p.add_argument("--request")
    p.add_argument("--option")
    p.add_argument("--text")
    p.add_argument("--park", action="store_true")
    p.add_argument("--hang-after-step", action="store_true")
    p.add_argument("--slow-step", type=float, default=0.0)
    p.add_argument("--notes", type=int, default=0)
    p.add_argument("--store", help="the store's URL (a SQLite file in --workdir if not given)")
    p.add_argument("--lease-ttl", type=float, default=CHILD_LEASE_TTL)
    return p


# -- what the parent uses ------------------------------------------------------------------


class Child:
    """A child process whose stdout JSON lines are read with a timeout."""

    def __init__(self, workdir: Path, argv: list[str]) -> None:
        self.store = (
            argv[argv.index("--store") + 1]
            if "--store" in argv
            else f"sqlite:///{workdir / 'state.db'}"
        )
        n = len(list(workdir.glob("child-*.err")))
        self.stderr_path = workdir / f"child-{n}-{argv[0]}.err"
        self._stderr = self.stderr_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.test_workflow_crash", *argv, "--workdir", str(workdir)],
            cwd=ROOT,
            env=python_env(),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def expect(self, event: str, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.0))
            except queue.Empty:
                raise AssertionError(
                    f"no {event!r} from the child; stderr:\n{self.err()}"
                ) from None
            if line is None:
                self.proc.wait(timeout=10)
                raise AssertionError(
                    f"child exited ({self.proc.returncode}) before {event!r}:\n{self.err()}"
                )
            obj: dict[str, Any] = json.loads(line)
            if obj.get("event") == event:
                return obj

    def err(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text()

    def sigkill(self) -> None:
        """Kill the child, and lapse the lease it may hold, as its TTL passing would."""
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(timeout=10) == -signal.SIGKILL
        lapse_leases(self.store)

    def finish(self) -> None:
        rc = self.proc.wait(timeout=20)
        assert rc == 0, f"child exited with {rc}:\n{self.err()}"

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


def read_events(workdir: Path, session_id: str, store: str | None = None) -> list[so.Event]:
    rt = so.Runtime([make_agent(workdir)], store=store or f"sqlite:///{workdir / 'state.db'}")
    try:
        return rt.events_sync(session_id)
    finally:
        rt.close_sync()


def outcome(events: list[so.Event]) -> tuple[list[str], Any, str]:
    """What must not depend on crashes: the timeline, the tool's result, the final text."""
    result = next(e.data["result"] for e in events if e.type == "tool.completed")
    done = next(i for i, e in enumerate(events) if e.type == "turn.completed")
    text = next(e.data["text"] for e in reversed(events[:done]) if e.type == "model.completed")
    return timeline(events), result, text


async def uninterrupted(workdir: Path) -> tuple[list[str], Any, str]:
    """The same conversation in one process with no crash: the reference."""
    async with so.Runtime([make_agent(workdir)], store=f"sqlite:///{workdir / 'state.db'}") as rt:
        r = await rt.generate("bank", prompt="move 200 to Bob", auth=ALICE)
        answer = so.InputResponse(request_id=r.pending[0].id, option_id="yes")
        r = await rt.respond(r.session_id, [answer], principal=ALICE)
        r = await rt.send(r.session_id, "savings", principal=ALICE)
        assert r.status == "completed"
        events = [e async for e in rt.events(r.session_id, follow=False)]
    return outcome(events)


@pytest.mark.parametrize(
    "kill_at",
    [("step",), ("ask1",), ("ask2",), ("step", "ask1", "ask2")],
    ids=["after-step", "parked-on-ask-1", "parked-on-ask-2", "at-every-point"],
)
async def test_sigkill_at_each_park_point_then_finish_in_new_processes(
    tmp_path: Path, kill_at: tuple[str, ...]
) -> None:
    reference_dir = tmp_path / "reference"
    reference_dir.mkdir()
    reference = await uninterrupted(reference_dir)
    assert len(read_lines(reference_dir / "steps.jsonl")) == 1
    assert len(read_lines(reference_dir / "bodies.jsonl")) == 3

    work = tmp_path / "crashy"
    work.mkdir()
    children: list[Child] = []

    def run(*argv: str, park: bool = False) -> Child:
        child = Child(work, [*argv, *(["--park"] if park else [])])
        children.append(child)
        return child

    killed: list[int] = []
    try:
        # 1. Start: the tool quotes (the step), then asks the first question.
        if "step" in kill_at:
            first = run("start", "--hang-after-step")
            sid = first.expect("step-recorded")["session_id"]
            first.sigkill()
            killed.append(first.proc.pid)
            started = read_events(work, sid)
            assert timeline(started)[-2:] == ["tool.started transfer", "tool.step transfer:quote"]
            resumed = run("resume", "--session", sid, park="ask1" in kill_at)
            parked = resumed.expect("result")
            last = resumed
        else:
            last = run("start", park="ask1" in kill_at)
            parked = last.expect("result")
            sid = parked["session_id"]
        assert parked["status"] == "waiting"
        [ask1] = parked["pending"]
        assert ask1["question"] == "The fee is 5.0. Proceed?"
        if "ask1" in kill_at:
            last.sigkill()
            killed.append(last.proc.pid)
        else:
            last.finish()

        # 2. Answer the first question (by option id) in a new process.
        chooser = run(
            "choose",
            "--session",
            sid,
            "--request",
            ask1["id"],
            "--option",
            "yes",
            park="ask2" in kill_at,
        )
        parked = chooser.expect("result")
        assert parked["status"] == "waiting"
        [ask2] = parked["pending"]
        assert ask2["question"] == "Which account should it come from?"
        if "ask2" in kill_at:
            chooser.sigkill()
            killed.append(chooser.proc.pid)
        else:
            chooser.finish()

        # 3. Answer the second question (free text, by message) in yet another process.
        sayer = run("say", "--session", sid, "--text", "savings")
        done = sayer.expect("result")
        sayer.finish()
        assert done["status"] == "completed"
    finally:
        for child in children:
            child.close()

    assert len(killed) == len(kill_at)
    steps = read_lines(work / "steps.jsonl")
    assert steps == [{"pid": children[0].proc.pid, "amount": 200}]  # once, by the first child
    bodies = read_lines(work / "bodies.jsonl")
    assert len(bodies) >= 3  # the body re-ran after each park; only the step never did
    assert len({b["pid"] for b in bodies}) >= 3  # in new processes
    assert {b["key"] for b in bodies} == {bodies[0]["key"]}  # one key across processes
    assert bodies[0]["key"].startswith(sid)

    events = read_events(work, sid)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert outcome(events) == reference  # same events in the same order, result and text
    assert reference[1] == {
        "quote": {"fee": 5.0, "rate": 1.1},
        "proceed": ["yes", "yes", "alice"],
        "account": ["savings", "savings", "alice"],
    }
    resolved = [e.data for e in events if e.type == "input.resolved"]
    assert [(d["request_id"], d["outcome"]) for d in resolved] == [
        (ask1["id"], "answered"),
        (ask2["id"], "answered"),
    ]
    assert [e.data["result"] for e in events if e.type == "tool.step"] == [
        {"fee": 5.0, "rate": 1.1}
    ]


async def test_sigkill_after_a_long_journal_whose_snapshot_left_it_out(tmp_path: Path) -> None:
    """A process killed after 150 steps, its latest snapshot taken as they ran (so without the
    journal): a new process reads the journal back from the events, runs none of the steps
    again, and parks on the question; the turn then ends as an uninterrupted one would."""
    notes = 150
    children: list[Child] = []
    try:
        first = Child(tmp_path, ["start", "--hang-after-step", "--notes", str(notes)])
        children.append(first)
        sid = first.expect("step-recorded")["session_id"]
        first.sigkill()
        store = f"sqlite:///{tmp_path / 'state.db'}"
        [(seq, data)] = query(
            store,
            "SELECT n.seq, n.data FROM snapshots n JOIN sessions s ON s.sk = n.sk WHERE s.id = {p}",
            sid,
        )
        [kept] = unpack_snapshot(data, sid, seq)["turn"]["calls"]
        assert seq > notes // 2 and "journal" not in kept and kept["status"] == "running"
        more = ["--notes", str(notes)]
        resumed = Child(tmp_path, ["resume", "--session", sid, *more])
        children.append(resumed)
        parked = resumed.expect("result")
        resumed.finish()
        assert parked["status"] == "waiting"
        [ask1] = parked["pending"]
        chooser = Child(
            tmp_path,
            ["choose", "--session", sid, "--request", ask1["id"], "--option", "yes", *more],
        )
        children.append(chooser)
        assert chooser.expect("result")["status"] == "waiting"
        chooser.finish()
        sayer = Child(tmp_path, ["say", "--session", sid, "--text", "savings", *more])
        children.append(sayer)
        assert sayer.expect("result")["status"] == "completed"
        sayer.finish()
    finally:
        for child in children:
            child.close()
    assert read_lines(tmp_path / "steps.jsonl") == [{"pid": first.proc.pid, "amount": 200}]
    assert read_lines(tmp_path / "notes.jsonl") == [
        {"pid": first.proc.pid, "i": i} for i in range(notes)
    ]
    events = read_events(tmp_path, sid)
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    stepped = [e.data["result"] for e in events if e.type == "tool.step"]
    assert stepped == [{"fee": 5.0, "rate": 1.1}, *range(notes)]
    assert [e.type for e in events].count("tool.completed") == 1


async def test_a_step_blocking_past_the_lease_ttl_is_not_run_again_by_a_worker(
    tmp_path: Path, store_url: str
) -> None:
    """A step's plain function that blocks (here 3 lease TTLs) must not stop its process from
    renewing the lease: else the lease lapses mid-step, a worker elsewhere claims the session
    and runs the step again, while the first is still in it."""
    children: list[Child] = []
    try:
        slow = str(3 * LEASE_TTL)
        options = ["--slow-step", slow, "--store", store_url, "--lease-ttl", str(LEASE_TTL)]
        first = Child(tmp_path, ["start", *options])
        children.append(first)
        first.expect("step-started")
        agent = make_agent(tmp_path)
        async with so.Runtime([agent], store=store_url, lease_ttl=LEASE_TTL) as rt:
            stop = asyncio.Event()
            worker = asyncio.create_task(rt.work(stop=stop, idle_wait=0.05, sweep_every=0.1))
            parked = await asyncio.to_thread(first.expect, "result")
            stop.set()
            await worker
        first.finish()
    finally:
        for child in children:
            child.close()
    assert read_lines(tmp_path / "steps.jsonl") == [{"pid": first.proc.pid, "amount": 200}]
    assert parked["status"] == "waiting"
    assert [p["question"] for p in parked["pending"]] == ["The fee is 5.0. Proceed?"]
    events = read_events(tmp_path, parked["session_id"], store_url)
    assert [e.data["result"] for e in events if e.type == "tool.step"] == [
        {"fee": 5.0, "rate": 1.1}
    ]


if __name__ == "__main__":
    asyncio.run(child_main(parser().parse_args()))
