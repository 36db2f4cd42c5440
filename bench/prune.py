"""Benchmark: `Runtime.prune` of many finished sessions, and `delete_session` of each in turn,
on SQLite (a file on disk) and PostgreSQL (a script, not a test).

    .venv/bin/python -m bench.prune                                   # SQLite only
    scripts/pg run -- .venv/bin/python -m bench.prune --fsync         # both stores

`--sessions` finished sessions (1,000) are made by one-turn conversations, then pruned in one
batch; as many again are deleted one `delete_session` at a time. Each is reported in ms per
session. PostgreSQL runs when `SIGNOFF_PG_URL` is set, in a database of its own; `--fsync`
turns the server's `fsync` on first (`scripts/pg` starts it off, as the tests do), without
which no commit waits for the disk there and a synchronous commit costs little.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import signoff as so
from signoff.testing import ManualClock, scripted_agent

__all__ = ["main"]


def _agents() -> list[so.Agent]:
    return [scripted_agent("chat", [so.ModelResponse(text="hello")], repeat_last=True)]


async def _made(rt: so.Runtime, n: int) -> None:
    for _ in range(n):
        await rt.generate("chat", prompt="hi")


async def _measure(url: str, n: int) -> dict[str, float]:
    """ms per session: a prune of `n`, then `n` single deletions."""
    clock = ManualClock()
    async with so.Runtime(_agents(), store=url, clock=clock) as rt:
        await _made(rt, n)
        clock.advance(3600)
        began = time.perf_counter()
        deleted = await rt.prune(older_than=60, limit=n)
        pruned = time.perf_counter() - began
        assert len(deleted) == n, len(deleted)
        await _made(rt, n)
        ids = [s.id for s in await rt.sessions(limit=n)]
        began = time.perf_counter()
        for sid in ids:
            await rt.delete_session(sid)
        single = time.perf_counter() - began
    return {"prune": pruned * 1000 / n, "delete_session": single * 1000 / n}


def _pg_database(base: str, name: str, fsync: bool) -> str:
    import psycopg

    with psycopg.connect(base, autocommit=True) as con:
        if fsync:
            con.execute("ALTER SYSTEM SET fsync = on")
            con.execute("SELECT pg_reload_conf()")
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        con.execute(f'CREATE DATABASE "{name}"')
    parts = urlsplit(base)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--fsync", action="store_true", help="turn PostgreSQL's fsync on first")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as where:  # on disk, not a tmpfs
        rows = {"sqlite": asyncio.run(_measure(f"sqlite:///{where}/prune.db", args.sessions))}
    base = os.environ.get("SIGNOFF_PG_URL")
    if base:
        url = _pg_database(base, "bench_prune", args.fsync)
        rows["postgres" + (" (fsync on)" if args.fsync else "")] = asyncio.run(
            _measure(url, args.sessions)
        )
    print(f"{args.sessions} sessions, ms per session")
    print(f"{'store':<22}{'prune':>10}{'delete_session':>16}")
    for store, row in rows.items():
        print(f"{store:<22}{row['prune']:>10.2f}{row['delete_session']:>16.2f}")


if __name__ == "__main__":
    main()
