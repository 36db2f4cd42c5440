"""Benchmark: what idle followers cost the commits of others (a script, not a test).

    scripts/pg run -- .venv/bin/python -m bench.followers              # PostgreSQL
    .venv/bin/python -m bench.followers --store sqlite                 # SQLite, in a temp dir

N followers (500 by default) each follow a session of their own that waits for an approval
(`Runtime.events(..., follow=True)`, the default `poll_interval`), while one writer commits an
event at a time to sessions of its own, `--rate` commits a second, through the same store (and
event loop). Reports the commit latency (p50/p95) and the store's reads a second: the calls of
`head`, `read_events` and SQLite's per-poll `_mark` the followers made, and on PostgreSQL the
transactions `pg_stat_database` counts (the commits included). PostgreSQL needs `SIGNOFF_PG_URL`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg

import signoff as so
from signoff._events import Event
from signoff.stores import Commit

T0 = 1_700_000_000.0


def _ev(sid: str, seq: int, type_: Any = "turn.started") -> Event:
    return Event(session_id=sid, seq=seq, type=type_, at=T0 + seq, turn_id="trn_1", data={})


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def _agent() -> so.Agent:
    @so.tool(approval=so.always())
    async def reset_password(email: str) -> str:
        """Reset a password."""
        return "reset"

    call = so.ToolCall(name="reset_password", input={"email": "a@example.com"})
    model = so.models.Scripted([so.ModelResponse(tool_calls=[call])], repeat_last=True)
    return so.Agent(name="desk", model=model, tools=[reset_password])


async def _transactions(url: str) -> int:
    if not url.startswith("postgres"):
        return 0
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


def _count(store: Any, calls: Counter[str]) -> None:
    """Count the followers' reads: `head`, `read_events`, SQLite's poll (`_mark`) and
    PostgreSQL's shared re-check (`_session_heads`)."""
    for name in ("head", "read_events", "_mark", "_session_heads"):
        method = getattr(store, name, None)
        if method is None:
            continue
        if asyncio.iscoroutinefunction(method):

            async def counted(*a: Any, _m: Any = method, _n: str = name, **k: Any) -> Any:
                calls[_n] += 1
                return await _m(*a, **k)

        else:

            def counted(*a: Any, _m: Any = method, _n: str = name, **k: Any) -> Any:  # type: ignore[misc]
                calls[_n] += 1
                return _m(*a, **k)

        setattr(store, name, counted)


async def run(store_url: str, followers: int, seconds: float, rate: float) -> dict[str, Any]:
    async with so.Runtime([_agent()], store=store_url) as rt:
        store: Any = rt.store
        sids = [(await rt.generate("desk", prompt="reset")).session_id for _ in range(followers)]
        own = [f"ses_{uuid.uuid4().hex[:20]}" for _ in range(10)]
        for sid in own:
            await store.create_session(sid, "desk", [_ev(sid, 1, "session.created")], None)
        heads = dict.fromkeys(own, 1)

        async def follow(sid: str) -> None:
            async for _ in rt.events(sid, follow=True):
                pass

        calls: Counter[str] = Counter()
        _count(store, calls)
        tasks = [asyncio.create_task(follow(sid)) for sid in sids]
        # Every follower read its events and waits; PostgreSQL's statistics of those reads are
        # flushed (a backend idle for 10 s flushes its own).
        await asyncio.sleep(12.0)
        calls.clear()
        before = await _transactions(store_url)
        latencies: list[float] = []
        started = time.monotonic()
        i = 0
        while time.monotonic() - started < seconds:
            sid = own[i % len(own)]
            i += 1
            t = time.monotonic()
            await store.commit(
                Commit(session_id=sid, expected_seq=heads[sid], events=[_ev(sid, heads[sid] + 1)])
            )
            latencies.append(time.monotonic() - t)
            heads[sid] += 1
            await asyncio.sleep(max(0.0, 1 / rate - (time.monotonic() - t)))
        elapsed = time.monotonic() - started
        transactions = await _transactions(store_url) - before
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return {
        "followers": followers,
        "commits": len(latencies),
        "commit_p50_ms": round(_pct(latencies, 0.5), 2),
        "commit_p95_ms": round(_pct(latencies, 0.95), 2),
        "mean_commit_ms": round(statistics.fmean(latencies) * 1000, 2),
        "follower_reads_per_s": {k: round(v / elapsed, 1) for k, v in sorted(calls.items())},
        "pg_transactions_per_s": round(transactions / elapsed, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--followers", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=50.0, help="commits a second")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.store == "sqlite":
            url = f"sqlite:///{Path(tmp) / 'bench.db'}"
        else:
            admin = os.environ.get("SIGNOFF_PG_URL")
            if not admin:
                raise SystemExit("set SIGNOFF_PG_URL (scripts/pg run -- ...)")
            url = admin
        figures = asyncio.run(run(url, args.followers, args.seconds, args.rate))
    for key, value in figures.items():
        print(f"{key:>20}: {value}")


if __name__ == "__main__":
    main()
