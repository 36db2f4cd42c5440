"""`Runtime.close` while a call is in flight, in a real process that stays alive afterwards:
its call raises `UsageError`, the session's lease is given back (another process resumes the
turn at once, not after the 600 s TTL), nothing half-written is left, and what ran is not lost
(a plain step's result is journaled; an async tool body or a model call cut short runs again,
the tool with the same idempotency key). On both stores."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

import signoff as so

from ._close_child import WHAT, make_agent
from ._forks import python_env
from ._procs import ROOT, read_executions
from ._worker_procs import check_logs


@pytest.mark.parametrize("what", WHAT)
async def test_close_with_a_call_in_flight_gives_the_turn_back_at_once(
    store_url: str, tmp_path: Path, what: str
) -> None:
    records = tmp_path / "runs.jsonl"
    argv = [sys.executable, "-m", "tests._close_child", store_url, str(records), what]
    with (tmp_path / "child.err").open("w") as err:
        child = subprocess.Popen(
            argv, cwd=ROOT, env=python_env(), stdout=subprocess.PIPE, stderr=err, text=True
        )
    try:
        assert child.stdout is not None
        line = child.stdout.readline()  # the child's own timeouts bound this
        assert line, (tmp_path / "child.err").read_text()
        said = json.loads(line)
        assert said["raised"] == "UsageError: the runtime or client was closed while this call ran"
        assert said["after"] is None  # a call after close opens the store again
        assert said["took"] < 5  # the unwinding was not waited out
        assert child.poll() is None  # alive: its lease would still be live
        sid = said["session_id"]
        async with so.Runtime(
            [make_agent(str(records), what)], store=store_url, lease_wait=0
        ) as rt:
            state = await rt.state(sid)
            assert state.status == "running"  # left resumable, nothing half written
            began = time.monotonic()
            result = await rt.generate(session_id=sid)  # no wait for the lease: given back
            assert result.status == "completed", result
            assert result.text == "Paid."
            assert time.monotonic() - began < 30
        runs = [r["key"] for r in read_executions(records)]
        if what == "step":  # journaled at close: the resumed turn replays it
            assert runs == ["step", "model"]
        elif what == "tool":  # cut short: run again, with the same key
            assert len(runs) == 3 and runs[0] == runs[1] and runs[0].startswith("tool ")
            assert runs[2] == "model"
        else:  # the model call cut short is made again; the tool is not run again
            assert [r.split()[0] for r in runs] == ["tool", "model", "model"]
        check_logs(store_url)
    finally:
        child.kill()
        child.wait(timeout=10)
        if child.stdout is not None:
            child.stdout.close()
