"""Benchmark: `lapsed_ancestors(now)`, run on every count of open requests, over many sessions,
with the index of children on their status and deadline (PostgreSQL: the copy of it children
keep, since migration 11) or (`--old-index`) on the status alone as before SQLite schema 8 and
PostgreSQL migration 10 (a script, not a test).

    .venv/bin/python -m bench.lapsed [--old-index]                       # SQLite only
    scripts/pg run -- .venv/bin/python -m bench.lapsed [--old-index]     # both stores
    scripts/pg run -- .venv/bin/python -m bench.lapsed --ttl-turns 300   # what the index costs

N sessions (200,000) are written straight into the tables: a third top-level sessions waiting
with a TTL, a third live subagent sessions (running or waiting, one in three without a TTL), a
third finished; ten children's TTL passed, under parents with an open request. The median of
`--repeat` calls is reported, with that of `count_pending()` (the count it goes with).
`--ttl-turns N` instead runs N turns of one session with a TTL on PostgreSQL, in turn on a store
with each index of children (on the status; on the status and `expires_at`, as migration 10 had
it; as now), and reports how many updates of its row were HOT and the bytes of `sessions` with
its indexes after. PostgreSQL runs when `SIGNOFF_PG_URL` is set, in a database
of its own that is dropped afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg

import signoff as so
from signoff.stores import PendingFilter, open_store
from signoff.testing import call, call_tools, reply, scripted_agent

__all__ = ["main"]

NOW = 1_000_000.0
OLD_INDEX = "CREATE INDEX sessions_children ON {t}sessions (status) WHERE parent IS NOT NULL"
INDEXES = {
    "status": OLD_INDEX,
    "status, expires_at": (
        "CREATE INDEX sessions_children ON {t}sessions (status, expires_at) "
        "WHERE parent IS NOT NULL"
    ),
    "status, child_expires_at": None,  # as the store is made
}
"""The index of children before PostgreSQL's migration 10, as it made it, and as now."""


def rows(sessions: int) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[str]]:
    """The session and request rows, and the ids of the sessions `lapsed_ancestors` names."""
    rnd = random.Random(7)
    third = sessions // 3
    out: list[tuple[Any, ...]] = []
    for sk in range(1, sessions + 1):
        sid = f"ses_{sk:07d}"
        if sk <= third:
            out.append((sk, sid, "a", 3, "waiting", NOW - 100, NOW - 100, NOW + 3600, None))
        elif sk <= 2 * third:
            status = rnd.choice(["running", "waiting"])
            deadline = None if sk % 3 == 0 else NOW + rnd.uniform(1, 3600)
            parent = rnd.randint(1, third)
            out.append((sk, sid, "b", 3, status, NOW - 50, NOW - 50, deadline, parent))
        else:
            status = rnd.choice(["idle", "completed"])
            out.append((sk, sid, "a", 5, status, NOW - 9e3, NOW - 9e3, None, None))
    parents = set()
    for i in range(10):
        sk = third + 1 + i * 1000
        sk += 1 if sk % 3 == 0 else 0  # one with a TTL
        out[sk - 1] = (*out[sk - 1][:7], NOW - 5, out[sk - 1][8])
        parents.add(out[sk - 1][8])
    asks = sorted(parents | set(range(2, third, 7)))
    requests = [(f"req_{sk:07d}", sk, "a", "approval", "pending", NOW - 100) for sk in asks]
    return out, requests, [f"ses_{sk:07d}" for sk in sorted(parents)]


SESSION_COLUMNS = "sk, id, agent, head, status, created_at, updated_at, expires_at, parent"
REQUEST_COLUMNS = "id, sk, agent, kind, status, created_at"


def fill_sqlite(path: str, sessions: int, old_index: bool) -> list[str]:
    new, requests, expected = rows(sessions)
    conn = sqlite3.connect(path)
    with conn:
        conn.executemany(f"INSERT INTO sessions ({SESSION_COLUMNS}) VALUES ({'?,' * 8}?)", new)
        conn.executemany(f"INSERT INTO requests ({REQUEST_COLUMNS}) VALUES (?,?,?,?,?,?)", requests)
        if old_index:
            conn.execute("DROP INDEX sessions_children")
            conn.execute(OLD_INDEX.format(t=""))
    conn.close()
    return expected


def fill_postgres(url: str, sessions: int, old_index: bool) -> list[str]:
    new, requests, expected = rows(sessions)
    with psycopg.connect(url) as conn:
        with conn.cursor() as cur:
            columns = f"{SESSION_COLUMNS}, child_expires_at"  # a child's copy of its deadline
            with cur.copy(f"COPY signoff.sessions ({columns}) FROM STDIN") as copy:
                for row in new:
                    copy.write_row((*row, None if row[8] is None else row[7]))
            with cur.copy(f"COPY signoff.requests ({REQUEST_COLUMNS}) FROM STDIN") as copy:
                for row in requests:
                    copy.write_row(row)
        if old_index:
            conn.execute("DROP INDEX signoff.sessions_children")
            conn.execute(OLD_INDEX.format(t="signoff."))
        conn.commit()
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE signoff.sessions")
        conn.execute("VACUUM ANALYZE signoff.requests")
    return expected


@asynccontextmanager
async def database(pg: str) -> AsyncIterator[str]:
    """A new database on the server of `pg`, dropped afterwards."""
    name = f"lapsed_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield pg.rsplit("/", 1)[0] + "/" + name
    finally:
        with psycopg.connect(pg, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


async def time_reads(url: str, expected: list[str], repeat: int) -> tuple[float, float]:
    """Median milliseconds of `lapsed_ancestors(NOW)` and of `count_pending()`."""
    store = open_store(url)
    await store.open()
    try:
        lapsed: Any = store  # both stores' reads, beyond the `Store` protocol
        assert await lapsed.lapsed_ancestors(NOW) == expected
        walls, counts = [], []
        for _ in range(repeat):
            wall = time.perf_counter()
            await lapsed.lapsed_ancestors(NOW)
            walls.append(time.perf_counter() - wall)
        for _ in range(max(3, repeat // 4)):
            wall = time.perf_counter()
            await store.count_pending(PendingFilter())
            counts.append(time.perf_counter() - wall)
    finally:
        await store.close()
    return statistics.median(walls) * 1000, statistics.median(counts) * 1000


async def ttl_turns(pg: str, turns: int) -> None:
    """Turns of one session with a TTL, in turn on a store with each of `INDEXES`: per-turn
    wall medians, HOT updates of the session row, bytes after."""

    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up."""
        return "found"

    steps = [
        s
        for i in range(turns + 1)
        for s in (call_tools(call("lookup", order_id=str(i))), reply("ok"))
    ]
    async with database(pg) as a, database(pg) as b, database(pg) as c:
        urls = dict(zip(INDEXES, (a, b, c), strict=True))
        runtimes = {}
        for name, url in urls.items():
            agent = scripted_agent("a", steps, tools=[lookup], limits=so.Limits(ttl=3600))
            runtimes[name] = rt = so.Runtime([agent], store=url)
            await rt.open()
            index = INDEXES[name]
            if index is not None:
                with psycopg.connect(url, autocommit=True) as conn:
                    conn.execute("DROP INDEX signoff.sessions_children")
                    conn.execute(index.format(t="signoff."))
        sessions = {
            n: (await rt.generate("a", prompt="go")).session_id for n, rt in runtimes.items()
        }
        walls: dict[str, list[float]] = {name: [] for name in urls}
        order = list(urls)
        for i in range(turns):
            for name in order[i % 3 :] + order[: i % 3]:
                wall = time.perf_counter()
                await runtimes[name].generate(session_id=sessions[name], prompt="again")
                walls[name].append(time.perf_counter() - wall)
        for rt in runtimes.values():
            await rt.close()
        await asyncio.sleep(1.5)  # the closed connections' statistics reach the server
        for name, url in urls.items():
            with psycopg.connect(url) as conn:
                found = conn.execute(
                    "SELECT n_tup_upd, n_tup_hot_upd, pg_total_relation_size(relid) "
                    "FROM pg_stat_user_tables WHERE schemaname = 'signoff' AND relname = 'sessions'"
                ).fetchone()
            assert found is not None
            print(
                f"{name}: turn median {statistics.median(walls[name]) * 1000:.2f} ms, "
                f"{found[1]} of {found[0]} session updates HOT, sessions with indexes {found[2]} B"
            )


async def main(sessions: int, repeat: int, old_index: bool) -> None:
    which = "old index (status)" if old_index else "new index (status, deadline)"
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp) / 'lapsed.db'}"
        store = open_store(url)
        await store.open()
        await store.close()
        expected = fill_sqlite(url[len("sqlite:///") :], sessions, old_index)
        lapsed, count = await time_reads(url, expected, repeat)
        print(f"sqlite    {which}: lapsed_ancestors {lapsed:.3f} ms, count_pending {count:.2f} ms")
    pg = os.environ.get("SIGNOFF_PG_URL")
    if pg:
        async with database(pg) as url:
            store = open_store(url)
            await store.open()
            await store.close()
            expected = fill_postgres(url, sessions, old_index)
            lapsed, count = await time_reads(url, expected, repeat)
            print(
                f"postgres  {which}: lapsed_ancestors {lapsed:.3f} ms, count_pending {count:.2f} ms"
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sessions", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=41)
    parser.add_argument("--old-index", action="store_true")
    parser.add_argument("--ttl-turns", type=int, default=0)
    args = parser.parse_args()
    if args.ttl_turns:
        pg = os.environ.get("SIGNOFF_PG_URL")
        if not pg:
            parser.error("--ttl-turns needs PostgreSQL: run it under scripts/pg run")
        asyncio.run(ttl_turns(pg, args.ttl_turns))
    else:
        asyncio.run(main(args.sessions, args.repeat, args.old_index))
