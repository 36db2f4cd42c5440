"""The worker's commands: `signoff db upgrade` and `signoff worker` (SIGINT, a bad target, a
factory that fails, started while PostgreSQL is down).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import signoff as so

from ._procs import ROOT

# -- the commands ---------------------------------------------------------------------------


def _signoff(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "signoff", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_db_upgrade_migrates_once_and_names_a_bad_store(pg_url: str) -> None:
    first = _signoff("db", "upgrade", "--store", pg_url)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("schema created (version ")
    again = _signoff("db", "upgrade", "--store", pg_url)
    assert again.returncode == 0 and again.stdout.startswith("schema is up to date")
    bad = _signoff("db", "upgrade", "--store", "postgresql://postgres@127.0.0.1:1/nowhere")
    assert bad.returncode == 1 and "StoreUnavailable: cannot connect" in bad.stderr


def test_worker_command_stops_gracefully_on_sigint(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'state.db'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "worker", "tests._worker_procs:runtime"]
        + ["--store", url, "--concurrency", "3"],
        cwd=ROOT,
        env={**os.environ, "SIGNOFF_TEST_RECORDS": str(tmp_path / "runs.jsonl")},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert "worker " in first and "concurrency 3" in first, first
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, rest
    assert "SIGINT: stopping after the running turns" in rest and "worker stopped" in rest


def test_worker_command_reports_a_bad_target() -> None:
    bad = _signoff("worker", "no_such_module_xyz:runtime", "--store", "sqlite:///:memory:")
    assert bad.returncode == 1 and "UsageError" in bad.stderr


def test_worker_command_reports_a_factory_that_fails() -> None:
    env = {k: v for k, v in os.environ.items() if k != "SIGNOFF_TEST_RECORDS"}
    bad = subprocess.run(  # the factory reads SIGNOFF_TEST_RECORDS: a KeyError without it
        [sys.executable, "-m", "signoff", "worker", "tests._worker_procs:runtime"]
        + ["--store", "sqlite:///:memory:"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and "Traceback" not in bad.stderr, bad.stderr
    assert "UsageError: tests._worker_procs:runtime() failed: KeyError" in bad.stderr


# -- started while the database is down ----------------------------------------------------


def _wait_for_log(worker: Any, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in worker.log():
        assert worker.proc.poll() is None, f"the worker exited:\n{worker.log()}"
        assert time.monotonic() < deadline, f"no {text!r} in the log:\n{worker.log()}"
        time.sleep(0.05)


async def test_a_worker_started_while_postgres_is_down_waits_for_it(tmp_path: Path) -> None:
    """`signoff worker` started before its database (as when both start together) waits for
    it, saying so, and then runs the turns; SIGTERM still stops it promptly while it waits."""
    from ._worker_procs import AGENT, Worker, make_agent
    from .conftest import PgCluster

    cluster = PgCluster.start()
    records = tmp_path / "runs.jsonl"
    workers: list[Worker] = []
    try:
        url = cluster.admin_url
        async with so.Runtime([make_agent(str(records))], store=url, inline=False) as front:
            r = await front.generate(AGENT, prompt="Refund order 1042")
            assert r.status == "running"
        await asyncio.to_thread(cluster.halt)

        waiting = Worker(url, tmp_path, "waiting", records, delay=0.0, idle_wait=0.2)
        workers.append(waiting)
        stopped = Worker(url, tmp_path, "stopped", records, delay=0.0)
        workers.append(stopped)
        for w in (waiting, stopped):
            _wait_for_log(w, "waiting for the store")
        assert "Traceback" not in waiting.log()

        stopped.proc.send_signal(signal.SIGTERM)
        assert stopped.proc.wait(timeout=5) == 0, stopped.log()
        assert "worker stopped" in stopped.log()

        await asyncio.to_thread(cluster.resume)
        _wait_for_log(waiting, "the store is up")
        async with so.Runtime([make_agent(str(records))], store=url, inline=False) as front:
            deadline = time.monotonic() + 30
            while (await front.state(r.session_id)).status != "waiting":
                assert time.monotonic() < deadline, waiting.log()
                await asyncio.sleep(0.1)
            assert [p.tool_name for p in await front.pending()] == ["issue_refund"]
        assert f"claimed session {r.session_id}" in waiting.log()
        waiting.proc.send_signal(signal.SIGTERM)
        assert waiting.proc.wait(timeout=10) == 0, waiting.log()
    finally:
        for w in workers:
            w.close()
        cluster.stop()
