"""Benchmark: what `signoff sessions` and `signoff pending` cost to print many rows, as a table
(to a file, as in a pipe, and to a terminal's 80 columns) and as `--json` (a script, not a test).

    .venv/bin/python -m bench.listings                        # 10,000 rows, SQLite
    .venv/bin/python -m bench.listings --rows 2000 --repeat 3

Each figure is the median of `--repeat` runs of the real command in a new process (its start,
about 0.3 s, included), wall time and CPU time, in seconds. The sessions are written straight
into the store's tables (as `bench/session_totals.py` does); the open requests are parked by
real turns of an agent whose one tool always asks for approval, a hundred at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pty
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import signoff as so
from bench.session_totals import fill

__all__ = ["main"]


@so.tool(approval=so.always())
async def refund(order_id: str, amount: float) -> str:
    """Refund an order."""
    return "refunded"


def _agent() -> so.Agent:
    call = so.ModelResponse(
        tool_calls=[so.ToolCall(name="refund", input={"order_id": "1042", "amount": 180.0})]
    )
    return so.Agent(name="support", model=so.models.Scripted([call]), tools=[refund])


async def park(url: str, requests: int) -> None:
    """Leave `requests` approvals open, one a session."""
    async with so.Runtime([_agent()], store=url) as runtime:
        for start in range(0, requests, 100):
            batch = range(start, min(start + 100, requests))
            await asyncio.gather(*(runtime.generate("support", f"refund {i}") for i in batch))


def _run(argv: list[str], terminal: bool) -> tuple[float, float]:
    """(wall, CPU) seconds of one `signoff ARGV`, its output to a file or an 80-column pty."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    command = [sys.executable, "-m", "signoff", *argv]
    if terminal:
        reader, writer = pty.openpty()
        env = {**os.environ, "COLUMNS": "80", "LINES": "24"}
        proc = subprocess.Popen(command, stdout=writer, stderr=subprocess.DEVNULL, env=env)
        os.close(writer)
        while True:  # drain it, as a terminal does
            try:
                if not os.read(reader, 1 << 16):
                    break
            except OSError:  # the pty's other end closed
                break
        os.close(reader)
        assert proc.wait() == 0
    else:
        with open(os.devnull, "w") as out:
            subprocess.run(command, stdout=out, stderr=subprocess.DEVNULL, check=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sessions_url = f"sqlite:///{Path(tmp) / 'sessions.db'}"
        pending_url = f"sqlite:///{Path(tmp) / 'pending.db'}"
        asyncio.run(fill(sessions_url, args.rows, False))
        started = time.perf_counter()
        asyncio.run(park(pending_url, args.rows))
        print(f"parked {args.rows} requests in {time.perf_counter() - started:.1f}s")
        limit = ["--limit", str(args.rows)]
        print(f"{'command':<40} {'output':<10} {'wall s':>8} {'CPU s':>8}")
        for name, url in (("sessions", sessions_url), ("pending", pending_url)):
            for shape, extra, terminal in (
                ("table", [], False),
                ("table", [], True),
                ("--json", ["--json"], False),
            ):
                runs = [
                    _run([name, *limit, *extra, "--store", url], terminal)
                    for _ in range(args.repeat)
                ]
                wall = statistics.median(r[0] for r in runs)
                cpu = statistics.median(r[1] for r in runs)
                where = "terminal" if terminal else "file"
                label = f"{name} --limit {args.rows} {shape}"
                print(f"{label:<40} {where:<10} {wall:>8.2f} {cpu:>8.2f}")


if __name__ == "__main__":
    main()
