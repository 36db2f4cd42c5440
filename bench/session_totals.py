"""Benchmark: what `signoff sessions --status S --limit 50` costs over 10,000 sessions, its page
(`Runtime.sessions`) and the exact total it prints since it counts a status a passed TTL
changes (`shown_total`: the store's count by status, corrected by the sessions whose TTL passed
unrecorded), on SQLite and (with `SIGNOFF_PG_URL` set) PostgreSQL (a script, not a test).

    .venv/bin/python -m bench.session_totals                      # SQLite only
    scripts/pg run -- .venv/bin/python -m bench.session_totals    # both stores

The sessions are written straight into the tables, 40 % waiting and 20 % running with a TTL an
hour ahead, 20 % idle, the rest failed; then again with 1 % each waiting and running whose TTL
passed unrecorded (listed as failed, each running one after a lease probe). Each figure is the
median of `--repeat` calls, in milliseconds; each total is checked against the whole listing.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg

import signoff as so
from signoff._session_page import session_page, shown_total
from signoff._types import SessionStatus
from signoff.stores import open_store

__all__ = ["main"]

STATUSES: tuple[SessionStatus, ...] = ("waiting", "running", "failed")


def rows(sessions: int, now: float, lapsed: bool) -> list[tuple[Any, ...]]:
    """(sk, id, agent, head, status, created_at, updated_at, expires_at) of each session."""
    out = []
    for sk in range(1, sessions + 1):
        share = sk * 100 // sessions
        status, expires = "failed", None
        if share < 40:
            status, expires = "waiting", now + 3600
        elif share < 60:
            status, expires = "running", now + 3600
        elif share < 80:
            status = "idle"
        elif share == 98 and lapsed:
            status, expires = "waiting", now - 60  # its TTL passed, nothing recorded
        elif share == 99 and lapsed:
            status, expires = "running", now - 60
        at = now - sessions + sk
        out.append((sk, f"ses_{sk:07d}", "a", 3, status, at, at, expires))
    return out


COLUMNS = "sk, id, agent, head, status, created_at, updated_at, expires_at"


async def fill(url: str, sessions: int, lapsed: bool) -> None:
    store = open_store(url)
    await store.migrate()  # type: ignore[attr-defined]
    now = time.time()
    await store.close()
    new = rows(sessions, now, lapsed)
    if url.startswith("sqlite://"):
        lite = sqlite3.connect(url[len("sqlite:///") :])
        with lite:
            lite.executemany(f"INSERT INTO sessions ({COLUMNS}) VALUES (?,?,?,?,?,?,?,?)", new)
        lite.close()
        return
    with psycopg.connect(url) as conn:
        with conn.cursor() as cur, cur.copy(f"COPY signoff.sessions ({COLUMNS}) FROM STDIN") as c:
            for row in new:
                c.write_row(row)
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE signoff.sessions")


async def median_ms(call: Callable[[], Awaitable[Any]], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        await call()
        times.append((time.perf_counter() - started) * 1e3)
    return statistics.median(times)


async def measure(name: str, url: str, sessions: int, repeat: int, lapsed: bool) -> None:
    await fill(url, sessions, lapsed)
    async with so.Runtime([], store=url) as rt:
        which = "2 % of them" if lapsed else "none"
        print(f"== {name}: {sessions:,} sessions, {which} past their TTL unrecorded ==")
        print(f"  {'status':8} {'listed':>7} {'page ms':>8} {'count ms':>9} {'page+total ms':>14}")
        for status in STATUSES:
            listed = len(await rt.sessions(status=status, limit=100_000))
            assert await shown_total(rt, None, status, rt.now()) == listed, status

            async def page(status: str = status) -> None:  # as `signoff sessions` reads it
                now, probes = rt.now(), dict[str, bool]()
                await session_page(rt, None, status, 51, 0, now, probes)
                await shown_total(rt, None, status, now, probes)

            async def count(status: str = status) -> None:
                await rt.store.count_sessions(status=status)

            async def alone(status: str = status) -> None:  # the page without its total
                await session_page(rt, None, status, 51, 0, rt.now(), {})

            before = await median_ms(alone, repeat)
            counted = await median_ms(count, repeat)
            after = await median_ms(page, repeat)
            print(f"  {status:8} {listed:7,} {before:8.2f} {counted:9.2f} {after:14.2f}")


async def amain(args: argparse.Namespace) -> None:
    pg = os.environ.get("SIGNOFF_PG_URL")
    for lapsed in (False, True):
        with tempfile.TemporaryDirectory() as tmp:
            url = f"sqlite:///{Path(tmp) / 'state.db'}"
            await measure("sqlite", url, args.sessions, args.repeat, lapsed)
        if not pg:
            continue
        name = f"totals_{uuid.uuid4().hex[:8]}"
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        try:
            db = pg.rsplit("/", 1)[0] + "/" + name
            await measure("postgres", db, args.sessions, args.repeat, lapsed)
        finally:
            with psycopg.connect(pg, autocommit=True) as conn:
                conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=21)
    asyncio.run(amain(parser.parse_args()))


if __name__ == "__main__":
    main()
