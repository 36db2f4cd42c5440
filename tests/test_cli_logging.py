"""What `signoff serve` and `signoff worker` log to stderr: the runtime's own lines (a turn an
in-process worker claimed and ran) timestamped beside uvicorn's, and `--log-level` (or
`SIGNOFF_LOG_LEVEL`) choosing the least level shown."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff.models import ModelRequest

from ._cli import ROOT, TARGET, _free_port, invoke, park, refused_usage

SIGNOFF = str(Path(sys.executable).with_name("signoff"))
LINE = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO signoff\.worker: "


def _completed(url: str, session_id: str, timeout: float = 30) -> None:
    rt = so.Runtime([], store=url)
    try:
        deadline = time.monotonic() + timeout
        while rt.state_sync(session_id).status != "idle":
            assert time.monotonic() < deadline, "the turn was not resumed"
            time.sleep(0.05)
    finally:
        rt.close_sync()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIGNOFF_")}
    return {**env, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]), **extra}


def test_serve_logs_what_its_in_process_workers_do(tmp_path: Path) -> None:
    """A turn answered from the command line and resumed by the server's in-process workers is
    in the server's log, timestamped: before, the runtime's INFO lines went nowhere."""
    url = f"sqlite:///{tmp_path}/state.db"
    session_id, request_id = park(url)
    port = _free_port()
    server = subprocess.Popen(
        [SIGNOFF, "serve", TARGET, "--port", str(port), "--store", url],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).raise_for_status()
                break
            except httpx.HTTPError:
                assert server.poll() is None and time.monotonic() < deadline, "no server"
                time.sleep(0.05)
        assert invoke("approve", request_id, "--store", url).exit_code == 0
        _completed(url, session_id)
    finally:
        server.send_signal(signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    assert re.search(LINE + f"claimed session {session_id} ", err), err
    assert re.search(LINE + f"session {session_id}: completed", err), err
    assert "Uvicorn running on" in err  # uvicorn's own lines are still there


@pytest.mark.parametrize("how", ["option", "environment"])
def test_worker_log_level_leaves_out_the_lines_below_it(tmp_path: Path, how: str) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    session_id, request_id = park(url)
    assert invoke("approve", request_id, "--store", url).exit_code == 0
    args = [SIGNOFF, "worker", TARGET, "--store", url, "--idle-wait", "0.05"]
    env = _env()
    if how == "option":
        args += ["--log-level", "WARNING"]  # any case
    else:
        env["SIGNOFF_LOG_LEVEL"] = "warning"
    worker = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        _completed(url, session_id)
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    assert " INFO " not in err, err


@pytest.mark.parametrize("command", [["serve", TARGET], ["worker", TARGET]])
def test_an_unknown_log_level_is_refused_naming_the_levels(command: list[str]) -> None:
    message = refused_usage(invoke(*command, "--log-level", "loud"))
    assert "--log-level" in message
    assert "'loud' is not one of critical, error, warning, info, debug, trace" in message


@pytest.mark.parametrize(("level", "shown"), [("info", False), ("debug", True)])
def test_the_database_driver_s_reconnection_warnings_show_only_at_debug(
    level: str, shown: bool
) -> None:
    """While PostgreSQL is down psycopg's pool warns of every failed reconnection, several a
    second, where signoff logs the outage once: they showed with no time or level, at every
    level. Its errors are still shown, timestamped."""
    code = (
        "import logging; from signoff._logs import log_to_stderr; "
        f"log_to_stderr({level!r}); "
        "logging.getLogger('psycopg.pool').warning('error connecting in pool'); "
        "logging.getLogger('psycopg.pool').error('the pool is broken'); "
        "logging.getLogger('signoff.worker').warning('claiming sessions failed')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=_env(), capture_output=True, text=True, check=True
    )
    lines = done.stderr.splitlines()
    assert ("WARNING psycopg.pool: error connecting in pool" in done.stderr) is shown, lines
    assert [ln.split(" ", 2)[2] for ln in lines if "error connecting" not in ln] == [
        "ERROR psycopg.pool: the pool is broken",
        "WARNING signoff.worker: claiming sessions failed",
    ]


class _Forging:
    """A model whose error message (a provider's response, say) holds escape sequences and a
    line break: it retitles the terminal, wipes the line and writes a log line of its own."""

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        raise so.ModelError(
            "upstream said: \x1b]0;owned\x07\x1b[2K\rINFO signoff.worker: all good\nforged line"
        )


forging = so.Agent(name="forging", model=_Forging())


def test_a_model_s_error_cannot_steer_the_terminal_or_forge_log_lines(tmp_path: Path) -> None:
    """A failed turn's error is logged with its control characters and line breaks shown as
    escapes (`\\x1b`, `\\n`): written as they are, they retitled the operator's terminal and
    made a line of the log that no logger wrote."""
    url = f"sqlite:///{tmp_path}/state.db"
    rt = so.Runtime([forging], store=url, inline=False)
    try:
        session_id = rt.generate_sync("forging", "hi").session_id
    finally:
        rt.close_sync()
    args = [SIGNOFF, "worker", "tests.test_cli_logging:forging", "--store", url]
    worker = subprocess.Popen(
        [*args, "--idle-wait", "0.05"],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        check = so.Runtime([], store=url)
        try:
            while check.state_sync(session_id).status != "failed":
                assert time.monotonic() < deadline, "the turn did not fail"
                time.sleep(0.05)
        finally:
            check.close_sync()
    finally:
        worker.send_signal(signal.SIGTERM)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err
    (failed,) = [ln for ln in err.splitlines() if f"session {session_id}: failed" in ln]
    assert "\\x1b]0;owned\\x07\\x1b[2K\\rINFO signoff.worker: all good\\nforged line" in failed
    assert "\x1b" not in err and "\x07" not in err and "\r" not in err, err
    assert "forged line" not in err.replace(failed, ""), err
