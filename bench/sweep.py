"""Benchmark: one deadline sweep (`rt.expire_due()`, what a worker runs every 5 s) over many parked
sessions, on SQLite and on PostgreSQL (a script, not a test).

    .venv/bin/python -m bench.sweep                                   # SQLite only
    scripts/pg run -- .venv/bin/python -m bench.sweep --sessions 10000  # both stores

N sessions are parked waiting on an approval: 5% with a request deadline an hour away, 5% with a
session TTL of an hour, 10% through a subagent (a parent waiting on a child session that waits
on the approval), the rest with neither, so no deadline is due, no child is orphaned and a
sweep finds nothing to do. A sweep is timed `--repeat` times on a runtime that parked nothing (a
cold state cache, as in a worker process); the median and the fastest are reported, with the
sweep's CPU time. PostgreSQL runs when `SIGNOFF_PG_URL` is set, in a schema of its own that is
dropped afterwards.

`--running M` adds M sessions left `running` with no lease held, as a turn whose process died in
its middle leaves them: the sweep of a runtime that drives its own turns (no worker) reads the
last event of each to find those whose recorded deadline nobody went on with.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import signoff as so

__all__ = ["main", "park", "strand", "time_sweeps"]


def agents() -> list[so.Agent]:
    """`plain` (no deadline), `timed` (a request deadline of an hour) and `ttl` (sessions that
    expire an hour after their last event): each turn proposes one approval-gated call."""

    def agent(name: str, policy: so.ApprovalPolicy, limits: so.Limits | None = None) -> so.Agent:
        @so.tool(name="refund", approval=policy)
        async def refund(order_id: str) -> str:
            """Refund an order."""
            return "refunded"

        call = so.ToolCall(name="refund", input={"order_id": "A1"})
        model = so.models.Scripted([so.ModelResponse(tool_calls=[call])], repeat_last=True)
        return so.Agent(name=name, model=model, tools=[refund], limits=limits or so.Limits())

    delegating = so.ToolCall(name="child", input={"message": "refund A1"})
    boss = so.Agent(
        name="boss",
        model=so.models.Scripted([so.ModelResponse(tool_calls=[delegating])], repeat_last=True),
        tools=[so.delegate("plain", name="child")],
    )
    return [
        agent("plain", so.always()),
        agent("timed", so.always(expires_in=3600)),
        agent("ttl", so.always(), so.Limits(ttl=3600)),
        boss,
    ]


async def park(url: str, sessions: int) -> None:
    """Park `sessions` sessions on the store at `url`, 5% `timed`, 5% `ttl`, 10% `boss` (each
    waiting on a `plain` child it delegated to: the orphan sweep's business), the rest `plain`."""
    async with so.Runtime(agents(), store=url) as rt:
        names = [
            "timed" if i % 20 == 0 else "ttl" if i % 20 == 1 else "boss" if i % 10 == 2 else "plain"
            for i in range(sessions)
        ]
        for start in range(0, sessions, 50):
            batch = names[start : start + 50]
            await asyncio.gather(*(rt.generate(n, prompt="refund A1") for n in batch))


async def strand(url: str, running: int) -> None:
    """Write `running` sessions of `plain` whose first turn started and was never gone on with:
    `running`, their last event a `turn.started`, no lease (the store's own writes, as a
    process that died mid-turn leaves them)."""
    from signoff._events import Event
    from signoff.stores import open_store

    store = open_store(url)
    try:
        now = time.time()
        for i in range(running):
            sid = f"ses_stranded{i:015d}"
            events = [
                Event(session_id=sid, seq=1, type="session.created", at=now, data={}),
                Event(session_id=sid, seq=2, type="turn.started", at=now, turn_id="trn_1"),
            ]
            await store.create_session(sid, "plain", events, None, status="running")
    finally:
        await store.close()


async def time_sweeps(url: str, repeat: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of `repeat` sweeps by a fresh runtime; each sweep must touch none."""
    async with so.Runtime(agents(), store=url) as rt:
        await rt.open()
        walls, cpus = [], []
        for _ in range(repeat):
            wall, cpu = time.perf_counter(), time.process_time()
            touched = await rt.expire_due()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
            assert touched == 0, touched
    return walls, cpus


def _report(store: str, sessions: int, walls: list[float], cpus: list[float]) -> None:
    ms = 1000
    print(
        f"{store:<10} {sessions:>7} sessions: sweep median {statistics.median(walls) * ms:8.2f} ms"
        f"  fastest {min(walls) * ms:8.2f} ms  CPU median {statistics.median(cpus) * ms:8.2f} ms"
    )


async def main(sessions: int, repeat: int, running: int = 0) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'sweep.db'}"
        await park(url, sessions)
        await strand(url, running)
        _report("sqlite", sessions, *await time_sweeps(url, repeat))
    pg = os.environ.get("SIGNOFF_PG_URL")
    if pg:
        schema = f"sweep_{uuid.uuid4().hex[:8]}"
        url = f"{pg}{'&' if '?' in pg else '?'}schema={schema}"
        try:
            await park(url, sessions)
            await strand(url, running)
            _report("postgres", sessions, *await time_sweeps(url, repeat))
        finally:
            import psycopg

            async with await psycopg.AsyncConnection.connect(pg, autocommit=True) as conn:
                await conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--running", type=int, default=0)
    args = parser.parse_args()
    asyncio.run(main(args.sessions, args.repeat, args.running))
