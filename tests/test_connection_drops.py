"""PostgreSQL connections dropped while signoff's processes live: an admin (or a pooler, or an
idle-session timeout) terminates the backends of a `signoff worker` and of the process that
answers, its LISTEN connection among them, again and again while turns park and resume.

Every approved tool must run once, every answer be applied once, every log stay gap-free with
its audit chain intact, every caller get a result or a named `StoreError`, and the worker must
go on resuming turns, its LISTEN connection terminated too (it polls only every `IDLE_WAIT`
seconds here, so a worker left deaf would be slow to resume them).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import TypeVar

import psycopg

import signoff as so

from ._worker_procs import (
    AGENT,
    check_logs,
    make_agent,
    read_records,
    settled_counts,
    start_worker,
)

T = TypeVar("T")

SESSIONS = 12
IDLE_WAIT = 5.0
"""The worker's longest sleep between claims: it is woken by NOTIFY well before that."""
APP = "signoff-drops"
"""The `application_name` of the processes under test: only their backends are terminated."""


async def _terminate(url: str, stop: asyncio.Event, kills: list[int]) -> None:
    """Terminate every backend of the processes under test every 50 to 250 ms until `stop`."""
    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    async with conn:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(random.uniform(0.05, 0.25)):
                    await stop.wait()
            cur = await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND application_name = %s",
                (APP,),
            )
            kills.append(len(await cur.fetchall()))


async def _until_stored(call: Callable[[], Awaitable[T]], closed_ok: bool = False) -> T | None:
    """`call` until it succeeds; a `StoreError` (a named one, never psycopg's) is retried. With
    `closed_ok`, a request found closed after a failed try was applied by that try: None."""
    failed = False
    for _ in range(400):
        try:
            return await call()
        except so.StoreError:
            failed = True
        except (so.RequestClosed, so.StaleAnswer):
            if closed_ok and failed:
                return None
            raise
        await asyncio.sleep(0.02)
    raise AssertionError("the store kept failing")


async def test_backends_terminated_under_a_worker_and_its_answerer_lose_nothing(
    pg_store_url: str, tmp_path: Path
) -> None:
    records = tmp_path / "runs.jsonl"
    url = f"{pg_store_url}?application_name={APP}"
    worker = start_worker(url, tmp_path, "w", records, lease_ttl=2, idle_wait=IDLE_WAIT, delay=0.1)
    stop = asyncio.Event()
    kills: list[int] = []
    try:
        async with so.Runtime([make_agent(str(records))], store=url, inline=False) as front:
            ids = [
                (await front.generate(AGENT, prompt=f"Refund {i}")).session_id
                for i in range(SESSIONS)
            ]
            terminating = asyncio.create_task(_terminate(pg_store_url, stop, kills))
            deadline = time.monotonic() + 90
            for sid in ids:  # one at a time, so that every resume meets terminated backends
                while True:
                    assert time.monotonic() < deadline, f"{sid} did not park:\n{worker.log()}"
                    state = await _until_stored(partial(front.state, sid))
                    assert state is not None
                    if state.pending_requests():
                        break
                    await asyncio.sleep(0.05)
                (req,) = state.pending_requests()
                answer = [so.InputResponse(request_id=req.id, option_id="approve")]
                await _until_stored(partial(front.respond, sid, answer), closed_ok=True)
                while state is None or state.status != "idle":
                    assert time.monotonic() < deadline, f"{sid} did not resume:\n{worker.log()}"
                    await asyncio.sleep(0.05)
                    state = await _until_stored(partial(front.state, sid))
            stop.set()
            await terminating
            for sid in ids:
                state = await front.state(sid)
                assert state.turn is not None and state.turn.status == "completed", sid
            assert await front.verify_audit() == []
        assert sum(kills) > len(kills)  # the worker's backends were there to terminate
        assert worker.proc.poll() is None, worker.log()
        # Each approved tool ran once, in the worker, and its run was recorded once.
        recs = read_records(records)
        starts = Counter(key for what, key, _ in recs if what == "start")
        dones = Counter(key for what, key, _ in recs if what == "done")
        assert len(starts) == SESSIONS
        assert starts == dones == Counter({key: 1 for key in starts}), recs
        heads = check_logs(pg_store_url)
        assert set(heads) == set(ids)
        events, rows = settled_counts(pg_store_url)
        assert events == rows == Counter({sid: 1 for sid in ids})
        assert _unnamed(worker.log()) == []
    finally:
        stop.set()
        worker.close()


def _unnamed(log: str) -> list[str]:
    """The psycopg errors that end a traceback in `log`: each escaped unnamed. One that a
    `StoreError` was raised from is followed by the note chaining them before any other text
    that is not its (indented) message."""
    lines = log.splitlines()
    unnamed: list[str] = []
    for i, line in enumerate(lines):
        if not line.startswith("psycopg"):
            continue
        after = [x for x in lines[i + 1 :] if x.strip() and not x.startswith(("\t", " "))]
        if not after or not after[0].startswith(("The above exception", "During handling")):
            unnamed.append(line)
    return unnamed
