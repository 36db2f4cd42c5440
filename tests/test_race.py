"""Race: 8 processes answer the same 100 requests at once; exactly 100 settlements happen.

Each process is a Runtime (`inline=False`) on the same store that approves all 100 requests
with `respond()` (all at once, after a shared start signal) while it also works (`rt.work`), so
the resumed turns race to be claimed as well. Every other answer is reported as a repeat
(`applied=False`), and each approved tool runs exactly once.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import IO, Any

import signoff as so

from ._forks import python_env
from ._procs import ROOT, query
from ._worker_procs import AGENT, ALICE, check_logs, make_agent, read_records, settled_counts

PROCESSES = 8
REQUESTS = 100


async def test_eight_processes_answer_the_same_hundred_requests(
    pg_store_url: str, tmp_path: Path
) -> None:
    store_url = pg_store_url  # SQLite's own race: tests/test_concurrency.py
    records = tmp_path / "runs.jsonl"
    async with so.Runtime([make_agent(str(records))], store=store_url) as rt:
        gate = asyncio.Semaphore(10)

        async def start(i: int) -> tuple[str, str]:
            async with gate:
                r = await rt.generate(AGENT, prompt=f"Refund order {i}", auth=ALICE)
            assert r.status == "waiting" and len(r.pending) == 1
            return r.session_id, r.pending[0].id

        pairs = await asyncio.gather(*(start(i) for i in range(REQUESTS)))
    (tmp_path / "requests.json").write_text(json.dumps(pairs))
    go = tmp_path / "go"
    children: list[subprocess.Popen[str]] = []
    logs: list[IO[str]] = []
    try:
        for n in range(PROCESSES):
            argv = [sys.executable, "-m", "tests._worker_procs", "answer", "--store", store_url]
            argv += ["--records", str(records), "--requests", str(tmp_path / "requests.json")]
            argv += ["--start-file", str(go)]
            err: IO[str] = (tmp_path / f"answerer-{n}.err").open("w")
            logs.append(err)
            children.append(
                subprocess.Popen(
                    argv, cwd=ROOT, env=python_env(), stdout=subprocess.PIPE, stderr=err, text=True
                )
            )
        for child in children:  # the barrier: every process is connected and waiting
            assert child.stdout is not None
            line = child.stdout.readline()
            assert json.loads(line or "{}").get("event") == "ready", (
                tmp_path / f"answerer-{children.index(child)}.err"
            ).read_text()
        go.touch()
        results: list[str] = []
        for n, child in enumerate(children):
            out, _ = await asyncio.to_thread(child.communicate, timeout=60)
            assert child.returncode == 0, (tmp_path / f"answerer-{n}.err").read_text()
            done: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
            assert done["event"] == "done"
            results += done["results"]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait(timeout=10)
            if child.stdout is not None:
                child.stdout.close()
        for err in logs:
            err.close()

    # Exactly one answer per request settled it; the other 700 were told it was a repeat.
    assert Counter(results) == {"applied": REQUESTS, "noop": (PROCESSES - 1) * REQUESTS}
    events, rows = settled_counts(store_url)
    sessions = [sid for sid, _ in pairs]
    assert events == rows == Counter({sid: 1 for sid in sessions})
    statuses = query(store_url, "SELECT status, COUNT(*) FROM {t}requests GROUP BY status")
    assert dict(statuses) == {"settled": REQUESTS}

    # The turns went on in whichever process claimed each session: each tool ran once.
    async with so.Runtime([make_agent(str(records))], store=store_url) as rt:
        for sid in sessions:
            state = await rt.state(sid)
            assert state.turn is not None and state.turn.status == "completed", sid
    recs = read_records(records)
    assert Counter(key for what, key, _ in recs if what == "start") == Counter(
        {f"{sid}:1:call_refund": 1 for sid in sessions}
    )
    check_logs(store_url)
