"""How `signoff serve --workers 0` stops the turns its deadline sweep drives in the background:
one signal (a graceful stop) waits for the turns already running and starts no queued one; a
second signal cuts them short at once, their leases given back."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time

import pytest

import signoff as so
from tests._cli import ROOT, _free_port, log, url
from tests._serve_lines import STARTED, stopped
from tests.test_cli_interrupts import _lease_taken, _sessions, _wait_for_line

__all__ = ["url"]  # the fixture, used by name


@so.tool(approval=so.always(expires_in=0.5, on_timeout="approve"))
async def timed_nap(seconds: float) -> str:
    """Sleep a while, approved once no one answers within half a second."""
    await asyncio.sleep(seconds)
    return "rested"


def _napper(seconds: float) -> so.Agent:
    """An agent that naps `seconds` once its approval's deadline passes, then says so."""
    return so.Agent(
        name="napper",
        model=so.models.Scripted(
            [
                so.ModelResponse(
                    tool_calls=[so.ToolCall(name="timed_nap", input={"seconds": seconds})]
                ),
                so.ModelResponse(text="Rested."),
            ]
        ),
        tools=[timed_nap],
    )


short_napper = _napper(3)
long_napper = _napper(60)


def _park(url: str, agent: so.Agent, count: int = 1) -> list[str]:
    """Park `count` turns of `agent` on their approval (its deadline half a second away)."""
    rt = so.Runtime([agent], store=url)
    try:
        results = [rt.generate_sync("napper", "Take a nap") for _ in range(count)]
    finally:
        rt.close_sync()
    assert [r.status for r in results] == ["waiting"] * count
    return [r.session_id for r in results]


def _serve(url: str, target: str) -> subprocess.Popen[str]:
    """`signoff serve --workers 0` of `target`: its deadline sweep drives the turns."""
    return subprocess.Popen(
        [sys.executable, "-m", "signoff", "serve", f"tests.test_serve_sweep_stop:{target}"]
        + ["--port", str(_free_port()), "--store", url, "--workers", "0"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as at a shell
    )


def _wait_for_naps(proc: subprocess.Popen[str], url: str, sessions: list[str], naps: int) -> None:
    """Wait until serve started, however long that takes (`_serve_lines`), then until `naps` of
    `sessions` have begun their nap (the app sweeps every 5 s)."""
    _wait_for_line(proc, STARTED)
    deadline = time.monotonic() + 30
    while _began(url, sessions) < naps:
        assert time.monotonic() < deadline and proc.poll() is None, "the naps never began"
        time.sleep(0.05)


def _began(url: str, sessions: list[str]) -> int:
    return sum("tool.started" in [e.type for e in log(url, s)] for s in sessions)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def test_one_sigterm_lets_serve_finish_the_turn_its_deadline_sweep_drives(url: str) -> None:
    """One SIGTERM while a turn the deadline sweep drives runs its tool waits for the turn, as
    for a request's: the sweep was cancelled, its turns with it, so the call was cut short,
    the session left running, and the next process ran the tool's body again."""
    (session_id,) = _park(url, short_napper)
    proc = _serve(url, "short_napper")
    try:
        _wait_for_naps(proc, url, [session_id], 1)
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=20)[1]
    finally:
        _stop(proc)
    assert proc.returncode == -signal.SIGTERM, rest
    assert "Traceback" not in rest, rest
    types = [e.type for e in log(url, session_id)]
    assert types.count("tool.started") == 1 and "tool.completed" in types, types
    assert [s.status for s in _sessions(url)] == ["idle"]
    assert _lease_taken(url, session_id)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_second_signal_stops_serve_at_once_while_it_waits_for_its_sweeps_turn(
    url: str, sig: signal.Signals
) -> None:
    """A second Ctrl-C or SIGTERM while the graceful stop waits for a turn the deadline sweep
    drives (a 60 s tool) stops serve at once, the call cut short and the lease given back."""
    (session_id,) = _park(url, long_napper)
    proc = _serve(url, "long_napper")
    try:
        _wait_for_naps(proc, url, [session_id], 1)
        proc.send_signal(sig)
        _wait_for_line(proc, "waiting up to 30s for 1 turn(s) its deadline sweep drives")
        proc.send_signal(sig)
        rest = stopped(proc)
        assert rest is not None, "serve still ran 10 s after its second signal"
    finally:
        _stop(proc)
    assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGTERM), rest
    assert "Traceback" not in rest and "CancelledError" not in rest, rest
    cut = "interrupting 1 turn(s) its deadline sweep drives, their leases given back"
    assert cut in rest and f"recorded): {session_id}" in rest, rest
    assert "tool.completed" not in [e.type for e in log(url, session_id)]
    assert _lease_taken(url, session_id)


def test_a_stopping_serve_starts_no_turn_its_deadline_sweep_queued(url: str) -> None:
    """The sweep drives 4 turns at once: with 5 deadlines passed together, a SIGTERM while the
    first 4 run lets them finish, and the fifth, queued, does not start in the stopping
    server. Its deadline is recorded and its lease free: the next process's sweep runs it."""
    sessions = _park(url, short_napper, 5)
    proc = _serve(url, "short_napper")
    try:
        _wait_for_naps(proc, url, sessions, 4)
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=20)[1]
    finally:
        _stop(proc)
    assert proc.returncode == -signal.SIGTERM, rest
    logs = {s: [e.type for e in log(url, s)] for s in sessions}
    done = [s for s in sessions if "tool.completed" in logs[s]]
    left = [s for s in sessions if "tool.started" not in logs[s]]
    assert len(done) == 4 and len(left) == 1, logs
    assert logs[left[0]][-1] == "input.resolved", logs  # its deadline, recorded
    rt = so.Runtime([short_napper], store=url)
    try:
        assert rt.expire_due_sync() == 1  # the next process's sweep goes on with it
    finally:
        rt.close_sync()
    assert "tool.completed" in [e.type for e in log(url, left[0])]
