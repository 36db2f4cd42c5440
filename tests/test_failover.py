"""Failover: `signoff worker` processes share one store; one is SIGKILLed mid-turn and another
SIGTERMed, and every session still completes with each approved tool run once.

A front runtime (`inline=False`) starts the sessions and approves each request as it appears;
the workers do all the turns. The tool writes a `start` and a `done` record per run, keyed by
its idempotency key, so we can count how often each body really ran across processes.

Every tool body waits at a gate (a file) after its `start` record until both signals are sent:
with more sessions than the other workers' concurrency can hold, the victim and the stopping
worker each must come to hold a body there, so the SIGKILL lands mid-body and the SIGTERM with
turns in flight however loaded the machine is, rather than when a poll happens to see one.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

import signoff as so

from ._forks import python_env
from ._procs import ROOT, is_type, query
from ._worker_procs import (
    AGENT,
    Worker,
    check_logs,
    make_agent,
    read_records,
    settled_counts,
    start_worker,
)
from .conftest import PgCluster
from .test_server_common import auth, free_port

# Long enough that a worker of a loaded machine (CI: load 8-12 on 2 CPUs) does not stall past
# its leases: one that does gives a lease up or loses it by design, and the call its body was
# running runs again (at-least-once), which this test counts only for the SIGKILL's calls. At
# 2 s a stall of ~1.3 s sufficed. Only the victim's sessions wait it out, once.
LEASE_TTL = 5.0
CONCURRENCY = 20  # with a pool as large: a renewal never waits for a connection
TOOL_DELAY = 0.3


async def _logged(worker: Worker, line: str) -> None:
    """Wait until `worker` has logged `line`."""
    deadline = time.monotonic() + 20
    while line not in worker.log():
        assert time.monotonic() < deadline, f"not logged: {line!r}\n{worker.log()}"
        await asyncio.sleep(0.02)


def _in_flight(records: Path, pid: int) -> set[str]:
    """Keys whose tool body `pid` started and has not finished."""
    started: set[str] = set()
    for what, key, who in read_records(records):
        if who == pid:
            if what == "start":
                started.add(key)
            else:
                started.discard(key)
    return started


async def _run(url: str, tmp: Path, *, workers: int, sessions: int, sigterm: bool) -> None:
    records = tmp / "runs.jsonl"
    gate = tmp / "gate"  # the tool bodies wait for it: created once the signals are sent
    # Then the others' slots cannot take every session: each worker must come to hold a body.
    assert sessions > (workers - 1) * CONCURRENCY
    options = {
        "concurrency": CONCURRENCY,
        "lease_ttl": LEASE_TTL,
        "idle_wait": 0.2,
        "sweep_every": 60,
        "delay": TOOL_DELAY,
        "hold": gate,
    }
    pool: list[Worker] = []
    try:
        async with so.Runtime([make_agent(str(records))], store=url, inline=False) as front:
            calls = asyncio.Semaphore(10)

            async def start(i: int) -> str:
                async with calls:
                    r = await front.generate(AGENT, prompt=f"Refund order {i}")
                assert r.status == "running"  # recorded only: a worker runs it
                return r.session_id

            async def approve(req: so.InputRequest) -> None:
                async with calls:
                    r = await front.respond(
                        req.session_id, [so.InputResponse(request_id=req.id, option_id="approve")]
                    )
                assert r.outcomes[0].applied

            ids = await asyncio.gather(*(start(i) for i in range(sessions)))
            sized = f"{url}?pool_max={CONCURRENCY + 2}" if url.startswith("postgresql") else url
            for i in range(workers):
                pool.append(start_worker(sized, tmp, f"w{i}", records, **options))
            victim, stopping = pool[0], (pool[1] if sigterm else None)

            answered: set[str] = set()
            interrupted: set[str] = set()
            killed = stop_sent = False
            deadline = time.monotonic() + 50
            while True:
                assert time.monotonic() < deadline, "sessions did not complete in time"
                fresh = [r for r in await front.pending(limit=1000) if r.id not in answered]
                await asyncio.gather(*(approve(r) for r in fresh))
                answered.update(r.id for r in fresh)
                if victim.proc.poll() is None:
                    flight = _in_flight(records, victim.pid)
                    # Both wait at the gate until the signals: each signal finds bodies running.
                    if flight and (stopping is None or _in_flight(records, stopping.pid)):
                        os.kill(victim.pid, signal.SIGKILL)  # mid tool body
                        victim.proc.wait(timeout=10)
                        # Its calls whose result it never recorded may run again elsewhere.
                        recorded = {
                            str(sid)
                            for (sid,) in query(
                                url,
                                "SELECT s.id FROM {t}events e JOIN {t}sessions s ON s.sk = e.sk "
                                f"WHERE e.type {is_type('tool.completed')}",
                            )
                        }
                        interrupted = {
                            key
                            for what, key, pid in read_records(records)
                            if what == "start"
                            and pid == victim.pid
                            and key.split(":")[0] not in recorded
                        }
                        assert flight <= interrupted  # some were killed mid-body
                        killed = True
                if killed and not gate.exists():
                    if stopping is not None:
                        assert _in_flight(records, stopping.pid)  # held at the gate
                        stopping.proc.send_signal(signal.SIGTERM)  # with turns in flight
                        stop_sent = True
                        # Its loop has stopped claiming with those turns still running.
                        await _logged(stopping, "SIGTERM: stopping after the running turns")
                        await _logged(stopping, "stopping: waiting for")
                    gate.touch()  # the running bodies go on
                done = query(
                    url, "SELECT COUNT(*) FROM {t}events WHERE type " + is_type("turn.completed")
                )
                if done[0][0] >= sessions:
                    break
                await asyncio.sleep(0.05)
            assert victim.proc.returncode == -signal.SIGKILL
            assert len(answered) == sessions

            for sid in ids:
                state = await front.state(sid)
                assert state.turn is not None and state.turn.status == "completed", sid
                assert state.turn.text == "Refunded."

        if stopping is not None:
            assert stop_sent
            assert stopping.proc.wait(timeout=20) == 0, stopping.log()
            assert "SIGTERM: stopping after the running turns" in stopping.log()
            assert "worker stopped" in stopping.log()
            held = query(
                url, "SELECT COUNT(*) FROM {t}leases WHERE owner LIKE {p}", f"%:{stopping.pid}:%"
            )
            assert held[0][0] == 0  # released, not left to expire
        survivor = pool[-1]
        assert survivor.proc.poll() is None
        assert "claimed session" in survivor.log()

        # Every approved tool ran once. Only a call the SIGKILL caught before its result was
        # recorded (mid-body, or just after) ran again, elsewhere, with the same key.
        recs = read_records(records)
        starts = Counter(key for what, key, _ in recs if what == "start")
        survivors_done = Counter(
            key for what, key, pid in recs if what == "done" and pid != victim.pid
        )
        assert len(starts) == sessions
        for key, n in starts.items():
            pids = [pid for what, k, pid in recs if what == "start" and k == key]
            if key in interrupted:
                assert n == 2 and pids[0] == victim.pid and pids[1] != victim.pid, (key, pids)
                assert survivors_done[key] == 1
            else:
                assert n == 1, (key, pids)
                assert [p for what, k, p in recs if what == "done" and k == key] == pids
        completed = query(
            url,
            "SELECT s.id, COUNT(*) FROM {t}events e JOIN {t}sessions s ON s.sk = e.sk "
            "WHERE e.type " + is_type("tool.completed") + " GROUP BY s.id",
        )
        assert sorted(str(sid) for sid, n in completed if n == 1) == sorted(ids)

        heads = check_logs(url)
        assert len(heads) == sessions
        events, rows = settled_counts(url)
        assert events == rows == Counter({sid: 1 for sid in ids})
        states = query(url, "SELECT status, COUNT(*) FROM {t}sessions GROUP BY status")
        assert dict(states) == {"idle": sessions}  # the turns are over: nothing left to run
    finally:
        for w in pool:
            w.close()


async def test_three_postgres_workers_survive_a_sigkill_and_a_sigterm(
    pg_store_url: str, tmp_path: Path
) -> None:
    await _run(pg_store_url, tmp_path, workers=3, sessions=200, sigterm=True)


async def test_two_sqlite_workers_survive_a_sigkill(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    await _run(url, tmp_path, workers=2, sessions=30, sigterm=False)


async def test_a_database_restart_under_serve_and_a_worker_loses_nothing(tmp_path: Path) -> None:
    """PostgreSQL stops and starts again under `signoff serve` and `signoff worker`: the API
    answers 503 `store_unavailable` (with Retry-After) while it is down and 2xx after, an open
    event stream goes on, the approval given after the restart is applied once and the tool
    runs once."""
    cluster = PgCluster.start()
    records = tmp_path / "runs.jsonl"
    url = cluster.admin_url
    procs: list[subprocess.Popen[bytes]] = []
    worker: Worker | None = None
    log = (tmp_path / "serve.log").open("wb")
    try:
        port = free_port()
        env = {
            **python_env(),
            "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
            "SIGNOFF_TEST_RECORDS": str(records),
        }
        argv = ["serve", "tests._worker_procs:runtime", "--port", str(port)]
        argv += ["--store", f"{url}?pool_timeout=2", "--token", "alice-token=alice"]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "signoff", *argv], cwd=ROOT, env=env, stdout=log, stderr=log
            )
        )
        worker = start_worker(url, tmp_path, "w", records, lease_ttl=2, idle_wait=0.2)
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, headers=auth("alice-token"), timeout=30) as c:
            for _ in range(300):
                with contextlib.suppress(httpx.TransportError):
                    if (await c.get("/v1/docs")).status_code == 200:
                        break
                await asyncio.sleep(0.05)
            r = await c.post("/v1/sessions", json={"agent": AGENT, "message": "Refund 1042"})
            assert r.status_code == 201, r.text
            sid = r.json()["session_id"]
            for _ in range(200):
                session = (await c.get(f"/v1/sessions/{sid}")).json()
                if session["pending"]:
                    break
                await asyncio.sleep(0.05)
            rid = session["pending"][0]["id"]

            async def stream() -> list[str]:
                types: list[str] = []
                async with c.stream("GET", f"/v1/sessions/{sid}/events") as s:
                    async for line in s.aiter_lines():
                        if line.startswith("event: "):
                            types.append(line[7:])
                            if types[-1] == "turn.completed":
                                return types
                return types

            following = asyncio.create_task(stream())
            await asyncio.sleep(0.3)
            await asyncio.to_thread(cluster.halt)
            r = await c.get(f"/v1/sessions/{sid}")
            assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
            assert r.headers["Retry-After"] == str(so.StoreUnavailable.retry_after)
            await asyncio.to_thread(cluster.resume)
            r = await c.post(
                f"/v1/sessions/{sid}/responses",
                json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
            )
            assert r.status_code == 200, r.text
            assert r.json()["outcomes"][0]["applied"] is True
            types = await asyncio.wait_for(following, 15)
            assert types[-1] == "turn.completed" and types.count("approval.settled") == 1
        runs = [what for what, _, _ in read_records(records)]
        assert runs == ["start", "done"]
        assert check_logs(url) == {sid: check_logs(url)[sid]}
        events, rows = settled_counts(url)
        assert events == rows == Counter({sid: 1})
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)
        if worker is not None:
            worker.close()
        log.close()
        cluster.stop()
