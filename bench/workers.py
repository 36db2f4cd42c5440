"""Benchmark: `signoff worker` processes on PostgreSQL (a script, not a test).

    scripts/pg run -- .venv/bin/python -m bench.workers            # about two minutes
    scripts/pg run -- .venv/bin/python -m bench.workers --quick

Needs `SIGNOFF_PG_URL` (an admin URL: every scenario gets a database of its own). Reports:

- settled approvals per second with 1, 2 and 4 worker processes: N sessions wait on an approval;
  a front process answers them all (`respond`, `inline=False`), and the clock runs from the first
  answer until every turn has run its tool and completed; then the workers alone: the answers
  are recorded while no worker runs, and the clock runs from the workers' start;
- turns per second at 1,000 concurrent sessions on one worker process (`--concurrency 1000`),
  with a Scripted model that sleeps 100 ms per call (two calls per turn); the worker's thread
  count is sampled while it runs;
- resume latency: an answer accepted on one process (the `respond` call returned) until the tool
  body starts on another (a worker woken by LISTEN/NOTIFY, its polling fallback set to 5 s).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from psycopg import conninfo

import signoff as so
from signoff.stores._codec import stored_type

__all__ = ["main", "runtime"]

ROOT = Path(__file__).resolve().parent.parent


# -- what the worker processes load (`signoff worker bench.workers:runtime`) -----------------


def runtime() -> so.Runtime:
    """Two agents: `support` (an approved refund, then a text) and `slow` (a model that sleeps
    100 ms per call: a tool call, then a text). The refund writes its start time to
    `BENCH_RECORDS` if set."""
    records = os.environ.get("BENCH_RECORDS")

    @so.tool(approval=so.always())
    async def issue_refund(ctx: so.ToolContext, order_id: str) -> str:
        """Refund an order."""
        if records:
            with open(records, "a") as f:
                f.write(f"{ctx.session.id} {time.time()}\n")
        return "refunded"

    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return "shipped"

    async def slow_call(messages: list[so.Message]) -> so.ModelResponse:
        await asyncio.sleep(0.1)
        return so.ModelResponse(tool_calls=[so.ToolCall(name="lookup", input={"order_id": "1"})])

    async def slow_text(messages: list[so.Message]) -> so.ModelResponse:
        await asyncio.sleep(0.1)
        return so.ModelResponse(text="It shipped.")

    support = so.Agent(
        name="support",
        model=so.models.Scripted(
            [
                so.ModelResponse(
                    tool_calls=[so.ToolCall(name="issue_refund", input={"order_id": "1042"})]
                ),
                so.ModelResponse(text="Refunded."),
            ]
        ),
        tools=[issue_refund],
    )
    slow = so.Agent(name="slow", model=so.models.Scripted([slow_call, slow_text]), tools=[lookup])
    return so.Runtime([support, slow], store="sqlite:///:memory:")


# -- the harness ------------------------------------------------------------------------------


def new_database(admin: str, pool_max: int = 10) -> str:
    name = f"bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"'.encode())
    params = conninfo.conninfo_to_dict(admin)
    user, host, port = params.get("user", "postgres"), params.get("host"), params.get("port")
    password = f":{params['password']}" if params.get("password") else ""
    return f"postgresql://{user}{password}@{host}:{port}/{name}?pool_max={pool_max}"


class Worker:
    def __init__(self, url: str, log: Path, *args: str, env: dict[str, str] | None = None):
        self.log_path = log
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "signoff", "worker", "bench.workers:runtime", "--store", url]
            + list(args),
            cwd=ROOT,
            env={**os.environ, **(env or {})},
            stdout=subprocess.DEVNULL,
            stderr=self._log,
        )

    def started(self) -> None:
        deadline = time.monotonic() + 30
        while "worker " not in self.log_path.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"worker did not start:\n{self.log_path.read_text()}")
            time.sleep(0.02)

    def threads(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
        return -1

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()


async def count(rt: so.Runtime, url: str, sql: str) -> int:
    schema = "signoff"
    base = url.split("?")[0]
    async with await psycopg.AsyncConnection.connect(base) as conn:
        cur = await conn.execute(sql.format(s=schema).encode())
        row = await cur.fetchone()
        return int(row[0]) if row else 0


async def wait_count(rt: so.Runtime, url: str, sql: str, n: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while await count(rt, url, sql) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {n}: {sql}")
        await asyncio.sleep(0.02)


WAITING = "SELECT COUNT(*) FROM {s}.requests WHERE status = 'pending'"
# Rows keep a type's one-letter code (older ones its name).
COMPLETED = (
    "SELECT COUNT(*) FROM {s}.events "
    f"WHERE type IN ('turn.completed', '{stored_type('turn.completed')}')"
)


async def gather_limited(n: int, jobs: list[Any]) -> list[Any]:
    gate = asyncio.Semaphore(n)

    async def one(job: Any) -> Any:
        async with gate:
            return await job

    return await asyncio.gather(*(one(j) for j in jobs))


async def settled_per_second(admin: str, workers: int, sessions: int, tmp: Path) -> float:
    url = new_database(admin, pool_max=12)
    pool = [
        Worker(url, tmp / f"settle-{workers}-{i}.log", "--concurrency", "10")
        for i in range(workers)
    ]
    try:
        for w in pool:
            w.started()
        async with so.Runtime([runtime().agent("support")], store=url, inline=False) as front:
            started = await gather_limited(
                10, [front.generate("support", prompt="Refund 1042") for _ in range(sessions)]
            )
            await wait_count(front, url, WAITING, sessions)
            pending = await front.pending(limit=sessions)
            t0 = time.perf_counter()
            await gather_limited(
                10,
                [
                    front.respond(
                        r.session_id, [so.InputResponse(request_id=r.id, option_id="approve")]
                    )
                    for r in pending
                ],
            )
            accepted = time.perf_counter() - t0
            await wait_count(front, url, COMPLETED, len(started))
            elapsed = time.perf_counter() - t0
        print(
            f"  {workers} worker(s): {sessions} approvals settled and run in {elapsed:.2f} s "
            f"= {sessions / elapsed:.0f}/s (answers accepted at {sessions / accepted:.0f}/s)"
        )
        return sessions / elapsed
    finally:
        for w in pool:
            w.stop()


async def resumed_per_second(admin: str, workers: int, sessions: int, tmp: Path) -> float:
    """The workers alone: every approval is recorded while no worker runs; then the clock runs
    from the moment all workers are up until every turn has run its tool and completed."""
    url = new_database(admin, pool_max=12)
    first = Worker(url, tmp / f"resume-{workers}-setup.log", "--concurrency", "10")
    try:
        first.started()
        async with so.Runtime([runtime().agent("support")], store=url, inline=False) as front:
            await gather_limited(
                10, [front.generate("support", prompt="Refund 1042") for _ in range(sessions)]
            )
            await wait_count(front, url, WAITING, sessions)
            first.stop()
            await gather_limited(
                10,
                [
                    front.respond(
                        r.session_id, [so.InputResponse(request_id=r.id, option_id="approve")]
                    )
                    for r in await front.pending(limit=sessions)
                ],
            )
            pool = [
                Worker(url, tmp / f"resume-{workers}-{i}.log", "--concurrency", "10")
                for i in range(workers)
            ]
            try:
                for w in pool:
                    w.started()
                t0 = time.perf_counter()
                await wait_count(front, url, COMPLETED, sessions)
                elapsed = time.perf_counter() - t0
            finally:
                for w in pool:
                    w.stop()
    finally:
        if first.proc.poll() is None:
            first.stop()
    print(
        f"  {workers} worker(s): {sessions} approved turns resumed, tool run and completed in "
        f"{elapsed:.2f} s = {sessions / elapsed:.0f}/s"
    )
    return sessions / elapsed


async def turns_per_second(admin: str, sessions: int, tmp: Path) -> None:
    url = new_database(admin, pool_max=20)
    async with so.Runtime([runtime().agent("slow")], store=url, inline=False) as front:
        await gather_limited(
            20, [front.generate("slow", prompt="Where is 1042?") for _ in range(sessions)]
        )
        worker = Worker(url, tmp / "turns.log", "--concurrency", str(sessions))
        try:
            worker.started()
            t0 = time.perf_counter()
            threads = worker.threads()
            deadline = time.monotonic() + 600
            while (done := await count(front, url, COMPLETED)) < sessions:
                threads = max(threads, worker.threads())
                assert time.monotonic() < deadline
                await asyncio.sleep(0.05)
            elapsed = time.perf_counter() - t0
        finally:
            worker.stop()
    print(
        f"  {done} turns (2 model calls of 100 ms + 1 tool call each), {sessions} at once on one "
        f"worker process: {elapsed:.2f} s = {done / elapsed:.0f} turns/s "
        f"(floor 0.2 s per turn; worker threads: {threads} at most)"
    )


async def resume_latency(admin: str, samples: int, tmp: Path) -> None:
    url = new_database(admin)
    records = tmp / "latency.txt"
    records.write_text("")
    worker = Worker(
        url,
        tmp / "latency.log",
        "--concurrency",
        "8",
        "--idle-wait",
        "5",  # polling can't explain a fast wake-up: NOTIFY must
        env={"BENCH_RECORDS": str(records)},
    )
    try:
        worker.started()
        async with so.Runtime([runtime().agent("support")], store=url, inline=False) as front:
            await gather_limited(
                10, [front.generate("support", prompt="Refund 1042") for _ in range(samples)]
            )
            await wait_count(front, url, WAITING, samples)
            lat: list[float] = []
            for r in await front.pending(limit=samples):
                await asyncio.sleep(0.05)  # the worker is idle, waiting on LISTEN
                before = len(records.read_text().splitlines())
                await front.respond(
                    r.session_id, [so.InputResponse(request_id=r.id, option_id="approve")]
                )
                accepted = time.time()
                while len(lines := records.read_text().splitlines()) == before:
                    await asyncio.sleep(0.0005)
                sid, at = lines[-1].split()
                assert sid == r.session_id
                lat.append(float(at) - accepted)
    finally:
        worker.stop()
    lat.sort()
    p50 = statistics.median(lat) * 1000
    p99 = lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000
    print(
        f"  answer accepted -> tool body starts in another process: p50 {p50:.1f} ms, "
        f"p99 {p99:.1f} ms ({len(lat)} samples; worker polling fallback 5 s)"
    )


async def run(args: argparse.Namespace) -> None:
    admin = os.environ.get("SIGNOFF_PG_URL")
    if not admin:
        raise SystemExit("set SIGNOFF_PG_URL: scripts/pg run -- .venv/bin/python -m bench.workers")
    tmp = Path(args.tmp or f"/tmp/bench-workers-{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    with psycopg.connect(admin) as conn:
        version = conn.execute("SHOW server_version").fetchone()
    print(
        f"signoff {so.__version__}, Python {platform.python_version()}, PostgreSQL "
        f"{version[0] if version else '?'}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f}"
    )
    n = 100 if args.quick else 300
    print(f"settled approvals per second ({n} sessions, worker --concurrency 10):")
    for workers in (1, 2, 4):
        await settled_per_second(admin, workers, n, tmp)
    print(f"approved turns run per second, answers recorded beforehand ({n} sessions):")
    for workers in (1, 2, 4):
        await resumed_per_second(admin, workers, n, tmp)
    print("turns per second:")
    await turns_per_second(admin, 1000, tmp)
    print("resume latency via LISTEN/NOTIFY:")
    await resume_latency(admin, 30 if args.quick else 100, tmp)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.workers")
    parser.add_argument("--quick", action="store_true", help="fewer sessions and samples")
    parser.add_argument("--tmp", help="directory for worker logs")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
