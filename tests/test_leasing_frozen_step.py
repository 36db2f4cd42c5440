"""A worker frozen (SIGSTOP) inside a tool body before its journaled step, past its lease:
another worker takes the turn over and runs the step; the frozen one, woken, runs no step (its
lease is checked first, as before a tool body), so the step's effect happens once. Real
`signoff worker` processes and signals, on both stores."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import signoff as so

from ._forks import python_env
from ._frozen import is_stopped, wake
from ._procs import ROOT
from ._stall_step_procs import AGENT, make_agent
from ._worker_procs import check_logs, read_records

LEASE_TTL = 1.0


def _worker(url: str, tmp: Path, name: str) -> tuple[subprocess.Popen[bytes], Path]:
    env = {
        **python_env(),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
        "SIGNOFF_TEST_RECORDS": str(tmp / "runs.jsonl"),
        "SIGNOFF_TEST_HOLD": str(tmp / "go"),
    }
    argv = [sys.executable, "-m", "signoff", "worker", "tests._stall_step_procs:runtime"]
    argv += ["--store", url, "--lease-ttl", str(LEASE_TTL), "--idle-wait", "0.1"]
    argv += ["--sweep-every", "60"]
    log = tmp / f"{name}.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=out)
    return proc, log


async def _until(check: Callable[[], object], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"{what}: not within {timeout}s"
        await asyncio.sleep(0.02)


async def test_a_worker_woken_past_its_lease_runs_no_step_the_takeover_ran(
    store_url: str, tmp_path: Path
) -> None:
    """Before, the woken worker's body went on into `ctx.step` and ran the step's function a
    second time (its record came after the takeover's), though the renewal that found the lease
    taken over was due at the same moment; only its record was refused."""
    records = tmp_path / "runs.jsonl"
    procs: list[subprocess.Popen[bytes]] = []
    frozen: int | None = None
    try:
        agent = make_agent(str(records), str(tmp_path / "go"))
        async with so.Runtime([agent], store=store_url, inline=False) as front:
            sid = (await front.generate(AGENT, prompt="plan it")).session_id
            first, first_log = _worker(store_url, tmp_path, "first")
            procs.append(first)
            await _until(lambda: read_records(records), "the body began")
            frozen = first.pid
            os.kill(frozen, signal.SIGSTOP)
            await _until(lambda: is_stopped(frozen), "the worker stopped")
            (tmp_path / "go").touch()
            second, _ = _worker(store_url, tmp_path, "second")
            procs.append(second)

            async def completed() -> bool:
                turn = (await front.state(sid)).turn
                return turn is not None and turn.status == "completed"

            deadline = time.monotonic() + 30
            while not await completed():
                assert time.monotonic() < deadline, "the turn was not taken over"
                await asyncio.sleep(0.05)
            wake(frozen)
            await _until(lambda: "lost" in first_log.read_text(), "the woken worker's loss")
            steps = [(key, pid) for what, key, pid in read_records(records) if what == "step"]
            assert [pid for _, pid in steps] == [second.pid], steps
            turn = (await front.state(sid)).turn
            assert turn is not None and turn.text == "Planned."
        check_logs(store_url)
    finally:
        if frozen is not None:
            wake(frozen)
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
