"""Ctrl-C and a closed standard input: one Ctrl-C at a chat prompt, while a reply prints or
midway through a message, and a second Ctrl-C stopping a worker or `signoff serve` at once."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from rich.console import Console

import signoff as so
from signoff.channels import TerminalChannel
from signoff.cli import local_principal
from signoff.cli._chat import _Chat
from signoff.stores import SessionSummary, SQLiteStore
from tests._cli import (
    ROOT,
    TARGET,
    _free_port,
    agent,
    log,
    url,
)

__all__ = ["url"]  # the fixture, used by name


def _read_until(fd: int, marker: bytes, timeout: float = 20) -> bytes:
    """What was printed to `fd` up to `marker` (a prompt, which ends no line)."""
    seen = b""
    deadline = time.monotonic() + timeout
    while marker not in seen:
        left = deadline - time.monotonic()
        assert left > 0, seen
        if select.select([fd], [], [], left)[0]:
            chunk = os.read(fd, 4096)
            assert chunk, seen  # it ended before prompting
            seen += chunk
    return seen


def _wait_until_blocked(pid: int, timeout: float = 20) -> None:
    """Wait until the process's main thread sleeps (in its read of the terminal, once its prompt
    is out). A signal that lands between the prompt and the read is Python's to handle only
    when the read returns: a person's Ctrl-C never comes that fast, a test's did (~1 run in 6)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return  # no /proc here: sent at once, as before
        if stat.rpartition(")")[2].split()[0] == "S":
            return
        assert time.monotonic() < deadline, stat
        time.sleep(0.01)


@contextlib.contextmanager
def _chat_at_a_terminal(
    url: str, preexec_fn: Callable[[], object], target: str = TARGET
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """`signoff chat` of the test agent with a pseudo-terminal for its input and output: the
    terminal's end to type at and read from, and the process (killed if still running once
    the block ends; its stderr piped)."""
    terminal, tty = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "chat", target, "--store", url],
        cwd=ROOT,
        stdin=tty,
        stdout=tty,
        stderr=subprocess.PIPE,
        preexec_fn=preexec_fn,
    )
    os.close(tty)
    try:
        yield terminal, proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        os.close(terminal)


def _assert_interrupted(proc: subprocess.Popen[bytes], stderr: bytes) -> None:
    """Chat ended as Ctrl-C ends it: status 130, and one line saying so, no traceback."""
    assert proc.returncode == 130, stderr
    assert stderr.decode().strip() == "interrupted"


@pytest.mark.parametrize("at_once", [False, True], ids=["in-its-read", "as-the-prompt-shows"])
@pytest.mark.parametrize(
    ("typed", "prompt"),
    [
        (b"", b"you:"),
        (b"refund order 1042\n", b"(y/N)"),
        (b"refund order 1042\n", b"Reason"),  # `n` typed at the approval's prompt
        (b"a bag of coffee\n", b"or your answer):"),
        (b"", b"signoff chat"),
    ],
    ids=["message", "approval", "reason", "question", "header"],
)
def test_one_ctrl_c_at_a_chat_prompt_ends_it(
    url: str, typed: bytes, prompt: bytes, at_once: bool
) -> None:
    """Ctrl-C at chat's prompt in a terminal, for a message or an approval, ends it at once with
    130 and no traceback: asyncio's handler only cancelled the task, which the terminal's line
    reading never sees, so the first Ctrl-C did nothing and a second one was needed. So does one
    sent the moment the prompt (or the header before it) shows: `input()` saw a SIGINT that
    came before its read began only at the next Enter, and asyncio's cancel not at all."""

    def as_at_a_shell() -> None:  # a test runner started in the background ignores SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    target = "tests._cli:sizer" if prompt == b"or your answer):" else TARGET
    with _chat_at_a_terminal(url, as_at_a_shell, target) as (terminal, proc):
        os.write(terminal, typed)
        if prompt == b"Reason":  # typed once the approval shows: typed before, it is discarded
            _read_until(terminal, b"(y/N)")
            os.write(terminal, b"n\n")
        _read_until(terminal, prompt)
        if not at_once:
            _wait_until_blocked(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=10)
    _assert_interrupted(proc, stderr)
    assert [s.status for s in _sessions(url)] == (["waiting"] if typed else [])


def _sessions(url: str) -> list[SessionSummary]:
    rt = so.Runtime([], store=url)
    try:
        return rt.sessions_sync()
    finally:
        rt.close_sync()


def test_a_ctrl_c_while_a_reply_prints_ends_chat_before_its_next_read(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """asyncio's SIGINT handler only cancels the task: a Ctrl-C landing after a turn's last
    await, while its reply prints, was seen only once the next message had been read and sent."""
    typed = iter(["refund order 1042", "y", "and order 1043"])
    prompts: list[str] = []

    def read(prompt: str) -> str | None:
        prompts.append(prompt)
        return next(typed)

    async def go() -> None:
        rt = so.Runtime([agent], store=url)
        async with rt:
            console = Console(file=io.StringIO())
            chat = _Chat(rt, agent, console, local_principal(), target=TARGET)
            chat.channel = TerminalChannel(console, read=read)
            report = chat.report

            def report_then_ctrl_c(result: so.GenerateResult) -> None:
                report(result)
                signal.raise_signal(signal.SIGINT)

            monkeypatch.setattr(chat, "report", report_then_ctrl_c)
            await chat.run(None)

    # As at a shell: asyncio.run installs its handler only over Python's default one.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(go())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(prompts) == 2, prompts
    [session] = _sessions(url)
    assert "and order 1043" not in json.dumps([e.data for e in log(url, session.id)])


def test_ctrl_c_typed_midway_through_a_message_ends_chat_without_sending_it(url: str) -> None:
    """A real Ctrl-C, typed at chat's controlling terminal halfway through a line: chat ends
    with 130 and the half-typed message is sent nowhere, while the one sent before it is kept."""

    def own_terminal() -> None:  # a shell's job: its own session, with this terminal
        os.setsid()
        fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    with _chat_at_a_terminal(url, own_terminal) as (terminal, proc):
        os.write(terminal, b"refund order 1042\n")
        _read_until(terminal, b"(y/N)")
        os.write(terminal, b"y\n")
        _read_until(terminal, b"you:")
        os.write(terminal, b"and order 10")
        _read_until(terminal, b"and order 10")  # echoed: the terminal holds it
        os.write(terminal, b"\x03")
        _, stderr = proc.communicate(timeout=10)
    _assert_interrupted(proc, stderr)
    [session] = _sessions(url)
    events = log(url, session.id)
    assert [e.type for e in events].count("turn.started") == 1
    assert session.status == "idle" and "refund order 1042" in json.dumps([e.data for e in events])
    assert "and order" not in json.dumps([e.data for e in events])


def test_chat_with_its_standard_input_closed_says_so(url: str) -> None:
    """`signoff chat ... <&-` was a RuntimeError traceback from `input()` at the first prompt;
    it is one error line, exit 1, before any store is made."""
    proc = subprocess.run(
        [sys.executable, "-m", "signoff", "chat", TARGET, "--store", url],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: os.close(0),
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == (
        "error: UsageError: chat reads what you type from standard input, which is closed\n"
    )
    assert not Path(url.removeprefix("sqlite:///")).exists()


def _wait_for_line(proc: subprocess.Popen[str], text: str) -> None:
    """Read `proc`'s stderr up to a line holding `text`; it ending first fails the test."""
    assert proc.stderr is not None
    while True:
        line = proc.stderr.readline()
        assert line, f"it ended before printing {text!r}"
        if text in line:
            return


@so.tool
async def nap(seconds: float) -> str:
    """Sleep a while."""
    await asyncio.sleep(seconds)
    return "rested"


napper = so.Agent(
    name="napper",
    model=so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="nap", input={"seconds": 60})]),
            so.ModelResponse(text="Rested."),
        ]
    ),
    tools=[nap],
)


def test_a_second_ctrl_c_stops_a_worker_at_once_and_gives_its_lease_back(url: str) -> None:
    """The first Ctrl-C waits for the turn in flight; a second stops the worker at once (130,
    no traceback), and the session's lease is given back, so another worker can take the
    session now rather than once the lease would have lapsed."""
    rt = so.Runtime([napper], store=url, inline=False)
    try:
        session_id = rt.generate_sync("napper", "Take a nap").session_id
    finally:
        rt.close_sync()
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "worker", "tests.test_cli_interrupts:napper"]
        + ["--store", url, "--lease-ttl", "600"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 30
        while "tool.started" not in [e.type for e in log(url, session_id)]:
            assert time.monotonic() < deadline and proc.poll() is None, "the nap never began"
            time.sleep(0.05)
        rest = _ctrl_c_twice(proc, "stopping after the running turns")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, rest
    assert "SIGINT again: stopping now" in rest and "Traceback" not in rest, rest
    assert _lease_taken(url, session_id)


def test_a_second_ctrl_c_stops_serve_at_once_without_a_traceback(url: str) -> None:
    """Ctrl-C twice while a request runs a turn stops the server at once (130): the turn it cuts
    short is no application error, so no traceback of its cancellation is printed, and the
    session's lease is given back."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "serve", "tests.test_cli_interrupts:napper"]
        + ["--port", str(port), "--store", url],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        # As typed at a shell: a test runner started in the background ignores SIGINT.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )

    def start_a_nap() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server stops before it answers
            body = {"agent": "napper", "message": "Take a nap"}
            httpx.post(f"http://127.0.0.1:{port}/v1/sessions", json=body, timeout=30)

    napping = threading.Thread(target=start_a_nap)
    try:
        assert proc.stderr is not None
        _wait_for_line(proc, "Application startup complete")
        napping.start()
        deadline = time.monotonic() + 30
        while not _napping(url):
            assert time.monotonic() < deadline, "the nap never began"
            time.sleep(0.05)
        rest = _ctrl_c_twice(proc, "Waiting for connections to close")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if napping.is_alive():
            napping.join()
    assert proc.returncode == 130, rest
    assert "Traceback" not in rest and "CancelledError" not in rest, rest
    assert _lease_taken(url, _napping(url) or "")


def test_a_second_sigterm_stops_serve_at_once_too(url: str) -> None:
    """SIGTERM twice (a supervisor that gave up waiting) while a request runs a turn stops the
    server at once, by that signal, as a second Ctrl-C does: uvicorn forced the stop only on a
    second SIGINT, so the server waited out the 60 s tool. The session's lease is given back."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "serve", "tests.test_cli_interrupts:napper"]
        + ["--port", str(port), "--store", url],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def start_a_nap() -> None:
        with contextlib.suppress(httpx.HTTPError):  # the server stops before it answers
            body = {"agent": "napper", "message": "Take a nap"}
            httpx.post(f"http://127.0.0.1:{port}/v1/sessions", json=body, timeout=30)

    napping = threading.Thread(target=start_a_nap)
    try:
        assert proc.stderr is not None
        _wait_for_line(proc, "Application startup complete")
        napping.start()
        deadline = time.monotonic() + 30
        while not _napping(url):
            assert time.monotonic() < deadline, "the nap never began"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _wait_for_line(proc, "Waiting for connections to close")
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=10)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if napping.is_alive():
            napping.join()
    assert proc.returncode == -signal.SIGTERM, rest  # 143 in a shell
    assert "Traceback" not in rest and "CancelledError" not in rest, rest
    assert _lease_taken(url, _napping(url) or "")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_second_signal_stops_serve_at_once_while_its_in_process_worker_runs_a_turn(
    url: str, sig: signal.Signals
) -> None:
    """A second Ctrl-C or SIGTERM while serve's in-process worker (no request) drives a turn
    stops it at once: the lifespan's shutdown waited for the worker unbounded, so the server
    ran the 60 s tool to its end. The session's lease is given back."""
    rt = so.Runtime([napper], store=url, inline=False)
    try:
        session_id = rt.generate_sync("napper", "Take a nap").session_id
    finally:
        rt.close_sync()
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "serve", "tests.test_cli_interrupts:napper"]
        + ["--port", str(_free_port()), "--store", url],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as at a shell
    )
    try:
        deadline = time.monotonic() + 30
        while "tool.started" not in [e.type for e in log(url, session_id)]:
            assert time.monotonic() < deadline and proc.poll() is None, "the nap never began"
            time.sleep(0.05)
        proc.send_signal(sig)
        _wait_for_line(proc, "Waiting for application shutdown")
        proc.send_signal(sig)
        rest = proc.communicate(timeout=10)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == (130 if sig == signal.SIGINT else -signal.SIGTERM), rest
    assert "Traceback" not in rest and "CancelledError" not in rest, rest
    assert "tool.completed" not in [e.type for e in log(url, session_id)]
    assert _lease_taken(url, session_id)


short_napper = so.Agent(
    name="short-napper",
    model=so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="nap", input={"seconds": 4})]),
            so.ModelResponse(text="Rested."),
        ]
    ),
    tools=[nap],
)


def nappers() -> so.Runtime:
    """A runtime of both nappers, served by `test_a_draining_serve_claims_no_new_turn`."""
    return so.Runtime([napper, short_napper])


def test_a_draining_serve_claims_no_new_turn(url: str) -> None:
    """Once SIGTERM begins serve's graceful stop, its in-process workers claim no more: a
    session with work recorded while a request's turn keeps the server draining is left to the
    next process, undriven and its lease free. The workers were told to stop only once every
    connection had closed, so the draining server took it and started its 60 s call."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "serve", "tests.test_cli_interrupts:nappers"]
        + ["--port", str(port), "--store", url],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )

    def start_a_short_nap() -> None:
        body = {"agent": "short-napper", "message": "Take a short nap"}
        httpx.post(f"http://127.0.0.1:{port}/v1/sessions", json=body, timeout=30)

    napping = threading.Thread(target=start_a_short_nap)
    try:
        _wait_for_line(proc, "Application startup complete")
        napping.start()
        deadline = time.monotonic() + 30
        while not _napping(url):
            assert time.monotonic() < deadline, "the short nap never began"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _wait_for_line(proc, "Waiting for connections to close")
        rt = so.Runtime([napper], store=url, inline=False)
        try:
            later = rt.generate_sync("napper", "Take a nap").session_id
        finally:
            rt.close_sync()
        rest = proc.communicate(timeout=15)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        napping.join()
    assert proc.returncode == -signal.SIGTERM, rest
    assert [e.type for e in log(url, later)] == ["session.created", "turn.started"], rest
    assert _lease_taken(url, later)


def _ctrl_c_twice(proc: subprocess.Popen[str], between: str) -> str:
    """Ctrl-C, and once the process logs `between` (it has begun to stop) a second one: what
    it then writes to stderr before it ends."""
    proc.send_signal(signal.SIGINT)
    _wait_for_line(proc, between)
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=10)[1]


def _lease_taken(url: str, session_id: str) -> bool:
    """Whether another worker can take the session's lease now (the last holder gave it back);
    given back at once, so that the turn can go on."""

    async def take() -> int | None:
        store = SQLiteStore(url)
        try:
            token = await store.acquire_lease(session_id, "another-worker", 30.0, time.time())
            if token is not None:
                await store.release_lease(session_id, "another-worker", token)
            return token
        finally:
            await store.close()

    return asyncio.run(take()) is not None


def _napping(url: str) -> str | None:
    """The session whose nap has begun, if one has."""
    rt = so.Runtime([], store=url)
    try:
        for row in rt.sessions_sync():
            if "tool.started" in [e.type for e in rt.events_sync(row.id)]:
                return row.id
        return None
    finally:
        rt.close_sync()


@so.tool(approval=so.always())
async def gated_nap(seconds: float) -> str:
    """Sleep a while, once a person approves."""
    await asyncio.sleep(seconds)
    return "rested"


gated_napper = so.Agent(
    name="napper",
    model=so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="gated_nap", input={"seconds": 60})]),
            so.ModelResponse(text="Rested."),
        ]
    ),
    tools=[gated_nap],
)


def test_ctrl_c_while_approve_runs_the_turn_ends_it_and_gives_the_lease_back(url: str) -> None:
    """`approve REQUEST_ID MODULE:RUNTIME` runs the approved call in its process: Ctrl-C while
    it runs ends the command (130, one line saying the approval stands and how the turn goes
    on, no traceback), the approval stays recorded, and
    the session's lease is given back, so `chat --session` or a worker resumes the turn now
    rather than once the lease would have lapsed."""
    rt = so.Runtime([gated_napper], store=url)
    try:
        result = rt.generate_sync("napper", "Take a nap")
    finally:
        rt.close_sync()
    session_id, request_id = result.session_id, result.pending[0].id
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "approve", request_id]
        + ["tests.test_cli_interrupts:gated_napper", "--store", url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as at a shell
    )
    try:
        deadline = time.monotonic() + 30
        while "tool.started" not in [e.type for e in log(url, session_id)]:
            assert time.monotonic() < deadline and proc.poll() is None, "the nap never began"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, stderr
    # Not a bare "interrupted": whether the approval stands, and how the turn goes on.
    assert stderr == (
        f"interrupted: {request_id} is approved, recorded; its turn stopped here and goes on "
        "in a signoff worker or serve of its runtime, or with signoff chat "
        f"tests.test_cli_interrupts:gated_napper --session {session_id} "
        f"--store {shlex.quote(url)}\n"
    ), stderr
    assert "approval.settled" in [e.type for e in log(url, session_id)]
    assert _lease_taken(url, session_id)
    # Run as printed, it resumes the turn in this store (without the typed --store it opened
    # another: UnknownSession, exit 1), and is stopped there.
    _, hint = stderr.split(", or with signoff ")
    env = {k: v for k, v in os.environ.items() if k != "SIGNOFF_STORE"}
    resumed = subprocess.Popen(
        [sys.executable, "-u", "-m", "signoff", *shlex.split(hint)],
        cwd=ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert resumed.stdout is not None
        said: list[str] = []
        while not said or f"session {session_id} (resumed)" not in said[-1]:
            said.append(resumed.stdout.readline())
            assert said[-1], "".join(said)
    finally:
        resumed.kill()
        resumed.communicate()
