"""Benchmark: `rt.verify_audit()` over a whole store, its peak memory and its time, on SQLite and
on PostgreSQL (a script, not a test).

    .venv/bin/python -m bench.verify                                     # SQLite only
    scripts/pg run -- .venv/bin/python -m bench.verify --sessions 5000   # both stores

N sessions each run one turn whose tool call is approved (one settled request, six audit
entries); with `--events E`, each then runs plain turns until its log holds E events (past 64
it has a snapshot, which verification checks by folding the events before it). A fresh
runtime (a cold cache, as in a separate process) then verifies the whole store: once timed
(wall and CPU), once under `tracemalloc` for the peak of Python memory it allocates. Both runs
must find nothing wrong. PostgreSQL runs when `SIGNOFF_PG_URL` is set, in
a schema of its own that is dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

import signoff as so

__all__ = ["fill", "main", "measure"]


def agent() -> so.Agent:
    """`ops`: each turn proposes one approval-gated call, then replies."""

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    call = so.ToolCall(name="refund", input={"order_id": "A1"})
    model = so.models.Scripted(
        [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text="done")], repeat_last=True
    )
    return so.Agent(name="ops", model=model, tools=[refund])


async def _one(rt: so.Runtime, events: int) -> None:
    r = await rt.generate("ops", prompt="refund A1")
    decision = so.Decision(id=r.pending[0].id, approved=True, reason="ok")
    done = await rt.generate(session_id=r.session_id, approvals=[decision])
    assert done.status == "completed", done.status
    while (await rt.state(r.session_id)).seq < events:
        await rt.generate(session_id=r.session_id, prompt="and now?")


async def fill(url: str, sessions: int, events: int = 0) -> None:
    """`sessions` sessions on the store at `url`, each with one approved and settled request,
    then plain turns until its log holds `events` events."""
    async with so.Runtime([agent()], store=url) as rt:
        for start in range(0, sessions, 50):
            await asyncio.gather(*(_one(rt, events) for _ in range(min(50, sessions - start))))


async def measure(url: str) -> tuple[float, float, float]:
    """Wall and CPU seconds of one verification by a fresh runtime, and the peak MB of Python
    memory a second one allocates (under tracemalloc, which slows it: not timed)."""
    async with so.Runtime([agent()], store=url) as rt:
        await rt.open()
        wall, cpu = time.perf_counter(), time.process_time()
        assert await rt.verify_audit() == []
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    async with so.Runtime([agent()], store=url) as rt:
        await rt.open()
        tracemalloc.start()
        try:
            assert await rt.verify_audit() == []
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    return wall, cpu, peak / 1e6


def _report(store: str, sessions: int, wall: float, cpu: float, peak: float) -> None:
    print(
        f"{store:<10} {sessions:>7} sessions: verify {wall * 1000:9.1f} ms  "
        f"CPU {cpu * 1000:9.1f} ms  peak {peak:8.2f} MB  ({peak * 1e6 / sessions:7.0f} B/session)"
    )


async def main(sessions: int, keep: Path | None, events: int = 0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = keep or Path(tmp) / "verify.db"
        url = f"sqlite:///{path}"
        if not path.exists():
            await fill(url, sessions, events)
        _report("sqlite", sessions, *await measure(url))
    pg = os.environ.get("SIGNOFF_PG_URL")
    if pg:
        schema = f"verify_{uuid.uuid4().hex[:8]}"
        url = f"{pg}{'&' if '?' in pg else '?'}schema={schema}"
        try:
            await fill(url, sessions, events)
            _report("postgres", sessions, *await measure(url))
        finally:
            import psycopg

            async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=5000)
    parser.add_argument(
        "--keep", type=Path, help="a SQLite file to fill once and verify on each run"
    )
    parser.add_argument(
        "--events", type=int, default=0, help="plain turns until each log holds this many events"
    )
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.keep, args.events))
