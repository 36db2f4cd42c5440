"""Benchmark: what idle followers cost the commits of others (a script, not a test).

    scripts/pg run -- .venv/bin/python -m bench.followers              # PostgreSQL
    .venv/bin/python -m bench.followers --store sqlite                 # SQLite, in a temp dir

N followers (500 by default) each wait on a session of their own as `Runtime.events(...,
follow=True)` does (`wait_for_change(sid, 2.0, after=head)`, then a read of the head), while one
writer commits an event at a time to those sessions in turn, `--rate` commits a second. Reports
the commit latency (p50/p95), how soon a commit's follower wakes (p50/p95), and the store's
reads a second: on PostgreSQL the transactions `pg_stat_database` counts (commits included), on
SQLite the polls `wait_for_change` makes. PostgreSQL needs `SIGNOFF_PG_URL`.
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
from typing import Any

import psycopg

from signoff._events import Event
from signoff.stores import Commit, open_store

T0 = 1_700_000_000.0


def _ev(sid: str, seq: int, type_: Any = "turn.started") -> Event:
    return Event(session_id=sid, seq=seq, type=type_, at=T0 + seq, turn_id="trn_1", data={})


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def _transactions(url: str) -> int:
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT xact_commit + xact_rollback FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def run(store_url: str, followers: int, seconds: float, rate: float) -> dict[str, Any]:
    store: Any = open_store(store_url)
    polls = [0]
    if store_url.startswith("sqlite"):
        mark = store._mark

        def counted(session_id: str | None) -> tuple[int, ...]:
            polls[0] += 1
            result: tuple[int, ...] = mark(session_id)
            return result

        store._mark = counted
    sids = [f"ses_{uuid.uuid4().hex[:20]}" for _ in range(followers)]
    for sid in sids:
        await store.create_session(sid, "support", [_ev(sid, 1, "session.created")], None)
    heads = dict.fromkeys(sids, 1)
    committed: dict[tuple[str, int], float] = {}
    woke: list[float] = []
    stop = asyncio.Event()

    async def follow(sid: str) -> None:
        after = 1
        while not stop.is_set():
            await store.wait_for_change(sid, 2.0, after=after)
            head = await store.head(sid)
            if head is not None and head > after:
                at = committed.get((sid, head))
                if at is not None:
                    woke.append(time.monotonic() - at)
                after = head

    tasks = [asyncio.create_task(follow(sid)) for sid in sids]
    await asyncio.sleep(3.0)  # every follower waiting
    before = await _transactions(store_url) if store_url.startswith("postgres") else 0
    polls[0] = 0
    latencies: list[float] = []
    started = time.monotonic()
    i = 0
    while time.monotonic() - started < seconds:
        sid = sids[i % followers]
        i += 1
        t = time.monotonic()
        await store.commit(
            Commit(session_id=sid, expected_seq=heads[sid], events=[_ev(sid, heads[sid] + 1)])
        )
        done = time.monotonic()
        latencies.append(done - t)
        heads[sid] += 1
        committed[(sid, heads[sid])] = done
        await asyncio.sleep(max(0.0, 1 / rate - (time.monotonic() - t)))
    elapsed = time.monotonic() - started
    after_count = await _transactions(store_url) if store_url.startswith("postgres") else 0
    reads = polls[0] if store_url.startswith("sqlite") else after_count - before
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await store.close()
    return {
        "followers": followers,
        "commits": len(latencies),
        "commit_p50_ms": round(_pct(latencies, 0.5), 2),
        "commit_p95_ms": round(_pct(latencies, 0.95), 2),
        "wake_p50_ms": round(_pct(woke, 0.5), 2) if woke else None,
        "wake_p95_ms": round(_pct(woke, 0.95), 2) if woke else None,
        "store_reads_per_s": round(reads / elapsed, 1),
        "mean_commit_ms": round(statistics.fmean(latencies) * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--followers", type=int, default=500)
    parser.add_argument("--seconds", type=float, default=15.0)
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
