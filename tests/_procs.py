"""Child processes for the restart and race tests: each runs one step of a session and exits.

Run as `python -m tests._procs COMMAND ...` from the repository root. A child prints one JSON
object per line on stdout; the parent reads them with `Child.expect()`. The gated tool appends
one line per execution (with its idempotency key) to a records file, so the parent can count
how often the body really ran, across processes and crashes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import queue
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit, urlunsplit

import signoff as so
from signoff.stores._codec import stored_type

from ._forks import python_env

__all__ = [
    "ROOT",
    "Child",
    "lapse_leases",
    "make_agent",
    "query",
    "read_executions",
    "record_execution",
    "spawn",
    "sqlite_url",
]

ROOT = Path(__file__).resolve().parent.parent
ORDER = {"order_id": "1042", "amount": 180.0}
LEASE_TTL = 2.0
"""The children's lease TTL: one a loaded machine's stall does not outlast (at 0.5 s a drive
waking past its lease's expiry gave its renewal 50 ms, then gave the lease up mid-drive); a
resumer waits for a killed child's lease to lapse, about this long."""


# -- what the children run -------------------------------------------------------------------


def record_execution(path: str, key: str, pid: int) -> None:
    """Append one execution record and fsync it, so a SIGKILL right after cannot lose it."""
    line = json.dumps({"key": key, "pid": pid, "at": time.time()}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def read_executions(path: str | Path) -> list[dict[str, Any]]:
    """Every execution the gated tool recorded, in order."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def make_agent(records: str, *, block_in_tool: bool = False, delay: float = 0.0) -> so.Agent:
    """The support agent: one gated refund call, then a final text; the tool body takes
    `delay` seconds (awaiting, as real I/O would)."""

    @so.tool(approval=so.always())
    async def issue_refund(ctx: so.ToolContext, order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        record_execution(records, ctx.idempotency_key(), os.getpid())
        if delay:
            await asyncio.sleep(delay)
        if block_in_tool:
            emit({"event": "tool-entered", "key": ctx.idempotency_key(), "pid": os.getpid()})
            await asyncio.Event().wait()  # the parent SIGKILLs us here; the loop stays alive
        return {"refunded": amount, "order_id": order_id}

    model = so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[so.ToolCall(id="call_refund", name="issue_refund", input=dict(ORDER))]
            ),
            so.ModelResponse(text="Refunded 180.00."),
        ]
    )
    return so.Agent(name="support", model=model, tools=[issue_refund])


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _result(r: so.GenerateResult) -> dict[str, Any]:
    return {
        "event": "result",
        "status": r.status,
        "session_id": r.session_id,
        "text": r.text,
        "pending": [p.id for p in r.pending],
        "outcomes": [dataclasses.asdict(o) for o in r.outcomes],
    }


async def _answer(rt: so.Runtime, args: argparse.Namespace) -> so.GenerateResult:
    approve = args.decision == "approve"
    if args.via == "generate":
        return await rt.generate(
            session_id=args.session,
            approvals=[so.Decision(id=args.request, approved=approve, reason=args.reason)],
        )
    return await rt.respond(
        args.session,
        [so.InputResponse(request_id=args.request, option_id=args.decision, text=args.reason)],
    )


async def _main(args: argparse.Namespace) -> None:
    agent = make_agent(args.records, block_in_tool=getattr(args, "block_in_tool", False))
    rt = so.Runtime([agent], store=args.store, lease_ttl=args.lease_ttl)
    await rt.open()
    if args.command == "start":
        r = await rt.generate("support", prompt="Refund order 1042, it arrived broken")
        emit({**_result(r), "request_id": r.pending[0].id if r.pending else None})
        while True:  # parked; the parent SIGKILLs us
            time.sleep(3600)
    elif args.command == "answer":
        emit(_result(await _answer(rt, args)))
    elif args.command == "resume":
        emit(_result(await rt.generate(session_id=args.session)))
    elif args.command == "race":
        emit({"event": "ready", "pid": os.getpid()})
        start = Path(args.start_file)
        while not start.exists():
            time.sleep(0.0002)
        try:
            emit(_result(await _answer(rt, args)))
        except so.SignoffError as exc:
            emit({"event": "error", "type": type(exc).__name__, "message": str(exc)})
    await rt.close()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests._procs")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("start", "answer", "resume", "race"):
        p = sub.add_parser(name)
        p.add_argument("--store", required=True, help="store URL (sqlite:/// or postgresql://)")
        p.add_argument("--records", required=True)
        p.add_argument("--lease-ttl", type=float, default=LEASE_TTL)
        if name != "start":
            p.add_argument("--session", required=True)
        if name in ("answer", "race"):
            p.add_argument("--request", required=True)
            p.add_argument("--decision", choices=["approve", "cancel"], default="approve")
            p.add_argument("--via", choices=["respond", "generate"], default="respond")
            p.add_argument("--reason", default=None)
            p.add_argument("--block-in-tool", action="store_true")
        if name == "race":
            p.add_argument("--start-file", required=True)
    return parser


# -- what the parent uses --------------------------------------------------------------------


def is_type(name: str) -> str:
    """SQL matching the `type` column of an event of type `name`, however the store keeps it."""
    return f"IN ('{name}', '{stored_type(name)}')"


def query(url: str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read (or write, committed) signoff's tables directly, bypassing signoff: `{t}` in `sql`
    is the table prefix and `{p}` a parameter placeholder, so one query serves SQLite and
    PostgreSQL."""
    if url.startswith("sqlite:///"):
        with contextlib.closing(sqlite3.connect(url[len("sqlite:///") :])) as db, db:
            return list(db.execute(sql.format(t="", p="?"), params).fetchall())
    import psycopg

    parts = urlsplit(url)
    options = parse_qs(parts.query)
    schema = options.pop("schema", ["signoff"])[0]
    for name in ("pool_min", "pool_max", "pool_timeout"):  # signoff's, not libpq's
        options.pop(name, None)
    libpq = urlunsplit(parts._replace(query=urlencode(options, doseq=True)))
    with psycopg.connect(libpq) as conn:
        cur = conn.execute(sql.format(t=f'"{schema}".', p="%s").encode(), params)
        return list(cur.fetchall())


def lapse_leases(url: str) -> None:
    """Lapse every session lease in the store at `url`, as their TTL passing would: a process
    killed while it held one leaves it to the next at once, so the crash tests' children can
    hold theirs with a TTL long enough for a loaded machine without waiting it out."""
    query(url, "UPDATE {t}leases SET expires_at = 0 RETURNING sk")


class Child:
    """A running child process whose stdout lines arrive on a queue (read with a timeout)."""

    def __init__(self, argv: list[str], stderr_path: Path, *, module: str = "tests._procs") -> None:
        self._stderr = stderr_path.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module, *argv],
            cwd=ROOT,
            env=python_env(),
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
        )
        self.stderr_path = stderr_path
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def expect(self, event: str | tuple[str, ...], timeout: float = 15.0) -> dict[str, Any]:
        """The next JSON line whose `"event"` is `event` (or one of them); fails with the
        child's stderr if none comes."""
        wanted = (event,) if isinstance(event, str) else event
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.0))
            except queue.Empty:
                raise AssertionError(
                    f"child {self.pid} sent no {event!r} within {timeout}s; stderr:\n"
                    f"{self.stderr()}"
                ) from None
            if line is None:
                self.proc.wait(timeout=5)
                raise AssertionError(
                    f"child {self.pid} exited ({self.proc.returncode}) before {event!r}; "
                    f"stderr:\n{self.stderr()}"
                )
            obj: dict[str, Any] = json.loads(line)
            if obj.get("event") in wanted:
                return obj

    def wait(self, timeout: float = 15.0) -> int:
        rc = self.proc.wait(timeout=timeout)
        if rc != 0:
            raise AssertionError(f"child {self.pid} exited with {rc}; stderr:\n{self.stderr()}")
        return rc

    def sigkill(self) -> None:
        """Kill for real (no cleanup runs in the child) and reap it."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stderr(self) -> str:
        self._stderr.flush()
        return self.stderr_path.read_text()

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self._reader.join(timeout=5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        self._stderr.close()


def sqlite_url(tmp: Path) -> str:
    """The store URL the tests use when they are given none: a SQLite file in `tmp`."""
    return f"sqlite:///{tmp / 'state.db'}"


def spawn(tmp: Path, command: str, *args: str, store: str | None = None) -> Child:
    """Start `python -m tests._procs COMMAND --store URL --records FILE ARGS`; the records file
    and the child's stderr live in `tmp`, the store defaults to a SQLite file there."""
    n = len(list(tmp.glob("child-*.err")))
    url = store or sqlite_url(tmp)
    argv = [command, "--store", url, "--records", str(tmp / "runs.jsonl"), *args]
    return Child(argv, tmp / f"child-{n}-{command}.err")


if __name__ == "__main__":
    asyncio.run(_main(_parser().parse_args()))
