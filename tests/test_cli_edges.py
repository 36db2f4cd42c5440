"""The CLI against bad input and awkward places: malformed or foreign store URLs, files that
are no store, narrow terminals and pipes, text that would steer a terminal, expired requests."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import io
import json
import os
import pty
import re
import select
import shlex
import signal
import socket
import sqlite3
import subprocess
import sys
import termios
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from rich.console import Console
from typer.testing import CliRunner

import signoff as so
from signoff.channels import TerminalChannel
from signoff.cli import app, local_principal
from signoff.cli._chat import _Chat
from signoff.stores import SessionSummary, SQLiteStore
from signoff.testing import call, call_tools, reply, scripted_agent
from tests._cli import (
    ROOT,
    TARGET,
    _free_port,
    agent,
    invoke,
    issue_refund,
    log,
    park,
    refused_usage,
    sizer,
)


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


@pytest.mark.parametrize("command", [["pending"], ["events", "ses_x"], ["db", "upgrade"]])
def test_a_malformed_postgresql_url_is_one_line_without_its_password(command: list[str]) -> None:
    """A URL the URL parser rejects (an unclosed IPv6 bracket) is a StoreError line, not a
    ValueError traceback, and the password in it is not printed."""
    result = invoke(*command, "--store", "postgresql://bob:s3cret@[::1:5432/x")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: StoreError: invalid PostgreSQL URL"), result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert "s3cret" not in result.output


@pytest.mark.parametrize("command", [["pending"], ["events", "ses_x"], ["db", "upgrade"]])
def test_a_postgresql_url_that_is_not_utf8_is_one_line(command: list[str]) -> None:
    """A URL holding a byte that is not UTF-8 (a lone surrogate once Python decodes argv) is a
    StoreError line, not a UnicodeEncodeError traceback from the driver, without its password."""
    result = invoke(*command, "--store", "postgresql://bob:s3cret@db\udcff.example/x")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: StoreError: invalid PostgreSQL URL"), result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert "s3cret" not in result.output


long_named = so.Agent(
    name="customer-support-escalations-for-the-emea-region", model=agent.model, tools=[issue_refund]
)


@pytest.mark.parametrize("columns", ["80", "60"])
def test_tables_print_ids_and_status_whole_at_any_width(url: str, columns: str) -> None:
    """The ids a person copies into `approve` or `events`, and a session's status, are never
    cut short by a long agent name or a narrow terminal (or the 80 columns of a pipe)."""
    rt = so.Runtime([long_named], store=url)
    try:
        parked = rt.generate_sync(long_named.name, "Refund order 1042")
    finally:
        rt.close_sync()
    (request,) = parked.pending
    env = {"COLUMNS": columns}
    listed = CliRunner().invoke(app, ["sessions", "--store", url], env=env)
    assert listed.exit_code == 0, listed.output
    assert parked.session_id in listed.output and "waiting" in listed.output, listed.output
    queue = CliRunner().invoke(app, ["pending", "--store", url], env=env)
    assert queue.exit_code == 0, queue.output
    assert request.id in queue.output and parked.session_id in queue.output, queue.output


_STEERING = "\x1b]0;owned\x07\x1b[2J\x9b31m\u202e"  # set the title, clear, C1 CSI, bidi override

steering = scripted_agent(
    "steering",
    [
        call_tools(
            call(
                "ask_question",
                question=f"Which?{_STEERING}",
                options=[
                    {"label": f"A{_STEERING}", "description": _STEERING},
                    {"label": "B", "description": "b"},
                ],
            )
        ),
        reply(f"done{_STEERING}"),
    ],
    tools=[so.ask_question()],
)


def test_text_from_a_model_cannot_steer_the_terminal(url: str) -> None:
    """A model's (or reviewer's) text is printed with its control characters shown as escapes
    (`\\x1b`): an escape sequence in it would otherwise retitle, clear or rewrite the terminal
    of whoever runs `pending`, `events`, `answer` or `chat`."""
    chat = CliRunner().invoke(
        app, ["chat", "tests.test_cli_edges:steering", "--store", url], input="hi\n1\n"
    )
    assert chat.exit_code == 0, chat.output
    assert "done\\x1b]0;owned" in chat.output and "Which?\\x1b]0;owned" in chat.output
    rt = so.Runtime([steering], store=url)
    try:
        parked = rt.generate_sync("steering", "again")
    finally:
        rt.close_sync()
    (request,) = parked.pending
    answered = invoke("answer", request.id, "--text", _STEERING, "--store", url)
    shown = [
        invoke("pending", "--store", url),
        answered,
        invoke("events", parked.session_id, "--store", url),
    ]
    for result in (chat, *shown):
        assert result.exit_code == 0, result.output
        for control in ("\x1b", "\x07", "\x9b", "\u202e"):
            assert control not in result.output, (control, result.output)
    as_json = invoke("events", parked.session_id, "--store", url, "--json")  # JSON escapes C0
    assert "\x1b" not in as_json.output and "\x07" not in as_json.output


def test_what_approve_prints_is_not_wrapped_into_a_pipe(url: str) -> None:
    """A line naming a request and its session stays one line when stdout is a pipe (80
    columns), so `grep` or a script finds the ids in it."""
    session_id, request_id = park(url)
    result = CliRunner().invoke(app, ["approve", request_id, "--store", url], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert f"approved {request_id} (issue_refund in session {session_id})" in result.output
    assert f"picks it up, e.g. signoff chat MODULE:RUNTIME --session {session_id}" in result.output


@pytest.mark.parametrize(
    "store",
    [
        "postgresql+psycopg://bob:s3cret@db.example/x",  # a SQLAlchemy URL
        "mysql://bob:s3cret@db.example/x",
        "pg://db.example/x?sslmode=require&password=s3cret",
    ],
)
def test_an_unknown_store_url_is_named_without_its_password(store: str) -> None:
    result = invoke("pending", "--store", store)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: UsageError: unknown store URL"), result.stderr
    assert "db.example" in result.stderr
    assert "s3cret" not in result.output


def test_reading_commands_leave_a_file_that_is_not_a_store_alone(tmp_path: Path) -> None:
    """An empty file, or another program's SQLite database, is refused by the reading and
    answering commands instead of getting signoff's tables written into it."""
    empty = tmp_path / "empty.db"
    empty.touch()
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE users (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    for path in (empty, other):
        before = path.read_bytes()
        for args in (["pending"], ["sessions"], ["events", "ses_x"], ["approve", "req_x"]):
            result = invoke(*args, "--store", f"sqlite:///{path}")
            assert result.exit_code == 1, (args, result.output)
            assert result.stderr.startswith(f"error: UsageError: {path} is not a signoff store")
            assert path.read_bytes() == before, args


def test_exit_statuses_are_the_documented_ones(url: str) -> None:
    """0 done, 1 an error (one line), 2 a command line the parser rejects (README)."""
    park(url)
    assert invoke("pending", "--store", url).exit_code == 0
    assert invoke("events", "ses_nope", "--store", url).exit_code == 1
    for args in (["pending", "--limit", "0"], ["pending", "--nope"], ["approve"], ["nope"]):
        assert invoke(*args, "--store", url).exit_code == 2, args


@so.tool(approval=so.always(expires_in=0.05))
async def refund_soon(order_id: str) -> dict[str, str]:
    """Refund an order, if someone decides soon."""
    return {"refunded": order_id}


hasty = so.Agent(
    name="hasty",
    model=so.models.Scripted(
        [
            so.ModelResponse(tool_calls=[so.ToolCall(name="refund_soon", input={"order_id": "1"})]),
            so.ModelResponse(text="Timed out."),
        ]
    ),
    tools=[refund_soon],
)


def test_recording_an_answer_to_an_expired_request_leaves_the_turn_alone(url: str) -> None:
    """`approve` without a runtime, on a request past its deadline, is refused and runs nothing
    (the deadline is applied, as by any reader): it used to drive the turn with its stand-in
    model, failing it with 'no model for agent'."""
    rt = so.Runtime([hasty], store=url)
    try:
        parked = rt.generate_sync("hasty", "refund order 1")
    finally:
        rt.close_sync()
    (request,) = parked.pending
    before = log(url, parked.session_id)
    time.sleep(0.1)
    result = invoke("approve", request.id, "--store", url)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: RequestClosed: "), result.stderr
    after = log(url, parked.session_id)
    assert [e.type for e in after[len(before) :]] == ["input.resolved"], after
    rt = so.Runtime([hasty], store=url)  # a process running the agent continues the turn
    try:
        assert rt.generate_sync(session_id=parked.session_id).text == "Timed out."
    finally:
        rt.close_sync()


def test_chat_retry_before_any_turn_is_not_sent_to_the_model(url: str) -> None:
    """`/retry` with no session yet has nothing to resume: it is not a message to the agent."""
    result = CliRunner().invoke(app, ["chat", "tests._cli:sizer", "--store", url], input="/retry\n")
    assert result.exit_code == 0, result.output
    assert "nothing to retry" in result.output
    assert "session " not in result.output.split("nothing to retry")[1]
    assert json.loads(invoke("sessions", "--store", url, "--json").stdout) == []


def test_answering_with_a_runtime_refuses_a_store_that_does_not_exist(tmp_path: Path) -> None:
    """`approve REQUEST_ID MODULE:RUNTIME` with a mistyped --store is refused like the same
    command without the runtime, instead of creating an empty store there."""
    typo = tmp_path / "sate.db"
    for args in (["approve", "req_x"], ["deny", "req_x"], ["answer", "req_x", "--text", "hi"]):
        result = invoke(*args, TARGET, "--store", f"sqlite:///{typo}")
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.startswith(f"error: UsageError: no store at {typo}"), result.stderr
        assert not typo.exists(), args


def test_the_command_chat_prints_for_a_request_left_pending_runs_as_printed(url: str) -> None:
    """Leaving a prompt with Ctrl-D prints how to answer later; that command carries the store
    and the principal the chat used (and the runtime a response policy needs), so it works."""
    chat = CliRunner().invoke(
        app, ["chat", TARGET, "--store", url, "--as", "web:alice"], input="Refund order 1042\n"
    )
    assert chat.exit_code == 0, chat.output
    later = re.search(r"answer it later with `signoff (approve [^`]+)`", chat.output)
    assert later, chat.output
    approved = invoke(*shlex.split(later.group(1)))
    assert approved.exit_code == 0, approved.output
    assert approved.output.startswith("approved req_"), approved.output
    # and so does the command approve prints to continue the turn, given the runtime
    resume = re.search(r"e\.g\. signoff (chat MODULE:RUNTIME [^\n]+)", approved.output)
    assert resume, approved.output
    args = [TARGET if a == "MODULE:RUNTIME" else a for a in shlex.split(resume.group(1))]
    resumed = CliRunner().invoke(app, args, input="")
    assert resumed.exit_code == 0, resumed.output
    assert "support: Refunded 180.00." in resumed.output, resumed.output

    gated = CliRunner().invoke(
        app, ["chat", "tests._cli:deployer", "--store", url], input="Deploy prod\n"
    )
    assert gated.exit_code == 0, gated.output
    later = re.search(r"answer it later with `signoff (approve [^`]+)`", gated.output)
    assert later and "tests._cli:deployer" in shlex.split(later.group(1)), gated.output


UNDECODABLE = "\udcff"  # how Python hands over a command-line byte that is not UTF-8 (0xff)


@pytest.mark.parametrize(
    "args",
    [
        ["approve", f"req_{UNDECODABLE}"],
        ["deny", f"req_{UNDECODABLE}"],
        ["answer", f"req_{UNDECODABLE}", "--text", "hi"],
        ["answer", "req_x", "--option", UNDECODABLE],
        ["events", f"ses_{UNDECODABLE}"],
        ["pending", "--agent", UNDECODABLE],
        ["pending", "--tool", UNDECODABLE],
        ["pending", "--session", UNDECODABLE],
        ["sessions", "--agent", UNDECODABLE],
        ["approve", "REQUEST", "--as", f"local:{UNDECODABLE}"],
        ["chat", "tests._cli:agent", "--session", f"ses_{UNDECODABLE}"],
        # free text too: it was an InvalidAnswer from the runtime (exit 1), not the usage
        ["approve", "REQUEST", "--reason", f"ok {UNDECODABLE}"],
        ["deny", "REQUEST", "--reason", f"no {UNDECODABLE}"],
        ["answer", "REQUEST", "--text", f"large {UNDECODABLE}"],
    ],
)
def test_a_command_line_value_that_is_not_utf8_is_one_line(url: str, args: list[str]) -> None:
    """An id, filter or principal holding a byte that is not UTF-8 (a mistyped or mis-encoded
    argument) is refused as one UsageError line naming it, not a UnicodeEncodeError traceback
    from the store, and nothing is recorded under it."""
    session_id, request_id = park(url)
    before = log(url, session_id)
    result = invoke(*[request_id if a == "REQUEST" else a for a in args], "--store", url)
    message = refused_usage(result)
    assert message.startswith("Invalid value: ") and "not valid UTF-8" in message, message
    assert log(url, session_id) == before


unpaired = so.Agent(
    name="unpaired",
    model=so.models.Scripted(
        [
            so.ModelResponse(
                tool_calls=[
                    so.ToolCall(
                        name="issue_refund",
                        input={"order_id": "1042", "amount": 180, "reason": f"bad{UNDECODABLE}"},
                    )
                ]
            ),
            so.ModelResponse(text=f"done {UNDECODABLE}"),
        ]
    ),
    tools=[issue_refund],
)


def _printed(url: str, *args: str) -> str:
    """What `python -m signoff ARGS --store URL` prints where stdout is strict UTF-8 (as on a
    terminal of a UTF-8 locale), read as UTF-8: it fails on any byte that is not."""
    done = subprocess.run(
        [sys.executable, "-m", "signoff", *args, "--store", url],
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode("utf-8")


def test_text_holding_a_lone_surrogate_prints_as_utf8(url: str) -> None:
    """A model's text may hold a lone surrogate (the store keeps it exactly): `pending`,
    `events` and `events --json` show it escaped, as valid UTF-8, instead of failing on a UTF-8
    terminal with a UnicodeEncodeError or writing a byte that is not UTF-8 into a pipe."""
    rt = so.Runtime([unpaired], store=url)
    try:
        parked = rt.generate_sync("unpaired", "refund")
        (request,) = parked.pending
        assert "bad\\udcff" in _printed(url, "pending")
        rt.respond_sync(
            parked.session_id, [so.InputResponse(request_id=request.id, option_id="approve")]
        )
    finally:
        rt.close_sync()
    assert "done \\udcff" in _printed(url, "events", parked.session_id)
    lines = _printed(url, "events", parked.session_id, "--json").splitlines()
    assert f"done {UNDECODABLE}" in [json.loads(line)["data"].get("text") for line in lines]


def test_serve_on_a_port_in_use_is_one_line(url: str) -> None:
    """A port another process listens on is one UsageError line naming the address, exit 1,
    before anything starts: not uvicorn's log of a failed startup and its exit status 3."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("serve", TARGET, "--store", url, "--port", str(port))
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: UsageError: cannot listen on 127.0.0.1:{port}: ")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("command", [["db", "upgrade"], ["pending"], ["approve", "req_x"]])
def test_an_empty_store_option_is_refused_not_the_default(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--store "$DATABASE_URL"` with the variable unset is refused, as by chat, worker and
    serve: `db upgrade` used to create and migrate .signoff/state.db here instead, reporting
    success while the intended database stayed unmigrated."""
    monkeypatch.chdir(tmp_path)
    result = invoke(*command, "--store", "")
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: UsageError: unknown store URL ''"), result.output
    assert not (tmp_path / ".signoff").exists()


@pytest.mark.parametrize(
    ("tokens", "error"),
    [
        (["s3cret-1=alice", "s3cret-1=bob"], "--token gives one secret to two principals"),
        (["s3cret-1"], "--token takes SECRET=PRINCIPAL_ID"),
    ],
)
def test_serve_refuses_a_token_it_would_misread_without_printing_it(
    tokens: list[str], error: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One secret given to two principals (alice's token would act as bob) is refused rather
    than the last one silently winning, and no refusal prints the secret into a log."""
    import uvicorn

    started: list[object] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    args = [a for token in tokens for a in ("--token", token)]
    result = invoke("serve", TARGET, "--store", url, "--port", "0", *args)
    assert refused_usage(result).startswith(f"Invalid value: {error}"), result.output
    assert "s3cret" not in result.output and started == []


def test_db_upgrade_reports_a_path_that_is_not_utf8(tmp_path: Path) -> None:
    """A store path holding a byte that is not UTF-8 is a real file name: `db upgrade` creates
    the store there and says so, escaped, instead of a traceback after the work is done."""
    printed = _printed(f"sqlite:///{tmp_path}/{UNDECODABLE}.db", "db", "upgrade")
    assert printed.startswith("schema created") and "\\udcff.db" in printed, printed
    assert (tmp_path / f"{UNDECODABLE}.db").exists()


def test_serve_sets_the_dashboards_sign_in_lifetime(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--sign-in-lifetime SECONDS` is `create_app(sign_in_lifetime=)`; without it the default
    (12 hours) holds."""
    import uvicorn

    from signoff.server._sign_ins import SIGN_IN_LIFETIME

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self.config.app))
    for args, lifetime in (([], SIGN_IN_LIFETIME), (["--sign-in-lifetime", "900"], 900.0)):
        result = invoke("serve", TARGET, "--store", url, "--port", "0", *args)
        assert result.exit_code == 0, result.output
        assert served.pop().state.signoff.sign_in_lifetime == lifetime


def test_serve_webhook_backfill_is_the_channels_backfill(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--webhook-backfill` is `WebhookChannel(backfill=True)`; without it the channel starts
    from now."""
    import signoff.server
    from signoff.channels import WebhookChannel

    served: list[list[Any]] = []
    monkeypatch.setattr(signoff.server, "serve", lambda rt, **kw: served.append(kw["channels"]))
    hook = ["--webhook", "http://127.0.0.1:9/hook", "--webhook-secret", "s"]
    for args, backfill in (([], False), (["--webhook-backfill"], True)):
        result = invoke("serve", TARGET, "--store", url, "--port", "0", *hook, *args)
        assert result.exit_code == 0, result.output
        [channel] = served.pop()
        assert isinstance(channel, WebhookChannel) and channel.backfill is backfill


@pytest.mark.parametrize("bad", ["0", "-5", "inf", "nan"])
def test_serve_refuses_a_sign_in_lifetime_that_is_not_positive_and_finite(
    bad: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lifetime `create_app` would refuse is one UsageError line naming the option, before the
    server starts (not a traceback from building the app)."""
    import uvicorn

    started: list[object] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: started.append(self))
    result = invoke("serve", TARGET, "--store", url, "--port", "0", "--sign-in-lifetime", bad)
    message = refused_usage(result)
    assert message.startswith("Invalid value: --sign-in-lifetime must be"), result.output
    assert started == []


def test_serve_refuses_a_sign_in_lifetime_that_is_not_a_number(url: str) -> None:
    """A word where the seconds go is refused by the option's own parsing (exit 2)."""
    result = invoke("serve", TARGET, "--store", url, "--sign-in-lifetime", "12h")
    assert result.exit_code == 2, result.output
    assert "--sign-in-lifetime" in result.output


def test_an_async_runtime_factory_is_refused_by_the_commands_without_a_stray_warning(
    tmp_path: Path,
) -> None:
    """`signoff worker` (and chat, pending, serve) load their target with the CLI's own loader,
    which called an async factory and reported the coroutine as the wrong type, leaving it
    unawaited ("coroutine 'make' was never awaited" beside the error)."""
    from signoff.cli import load_runtime

    (tmp_path / "async_worker_factory.py").write_text("async def make():\n    return None\n")
    sys.path.insert(0, str(tmp_path))
    try:
        # filterwarnings = error: a coroutine left unawaited would fail the test at collection.
        with pytest.raises(so.UsageError, match=r"async_worker_factory:make\(\) is a coroutine"):
            load_runtime("async_worker_factory:make")
        import gc

        gc.collect()
    finally:
        sys.path.remove(str(tmp_path))


@pytest.mark.parametrize(
    ("ttl", "bound"), [("0.001", "0.1"), ("0.05", "0.1"), ("86401", "86400"), ("nan", "86400")]
)
def test_worker_refuses_a_lease_ttl_out_of_its_range_with_a_usage_error(
    url: str, tmp_path: Path, ttl: str, bound: str
) -> None:
    """Exit status 2 naming the option and the bound passed, before the store is touched: a TTL
    near one renewal's round trip would lose every lease on a store only a little slow."""
    result = invoke("worker", TARGET, "--store", url, "--lease-ttl", ttl)
    assert result.exit_code == 2, result.output
    assert "--lease-ttl" in result.output and bound in result.output, result.output
    assert not (tmp_path / "state.db").exists()


def test_worker_help_names_the_lease_ttl_range() -> None:
    result = invoke("worker", "--help")
    assert result.exit_code == 0, result.output
    assert "from 0.1 to 86400" in " ".join(result.output.split())


def test_serve_refuses_more_workers_than_a_worker_runs(url: str) -> None:
    result = invoke("serve", TARGET, "--store", url, "--workers", "100001")
    assert result.exit_code == 2, result.output
    assert "--workers" in result.output and "100000" in result.output, result.output


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
    url: str, preexec_fn: Callable[[], object]
) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """`signoff chat` of the test agent with a pseudo-terminal for its input and output: the
    terminal's end to type at and read from, and the process (killed if still running once
    the block ends; its stderr piped)."""
    terminal, tty = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "chat", TARGET, "--store", url],
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
    [(b"", b"you:"), (b"refund order 1042\n", b"(y/N)"), (b"", b"signoff chat")],
    ids=["message", "approval", "header"],
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

    with _chat_at_a_terminal(url, as_at_a_shell) as (terminal, proc):
        os.write(terminal, typed)
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


def test_serve_on_port_0_prints_the_port_it_listens_on(url: str) -> None:
    """`--port 0` (any free port) prints the port the system chose once it listens, not
    `http://127.0.0.1:0/_signoff`, which opens nothing."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "signoff", "serve", TARGET, "--port", "0", "--store", url],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        banner = proc.stdout.readline()
        found = re.search(r"dashboard at http://127\.0\.0\.1:(\d+)/_signoff ", banner)
        assert found is not None and found[1] != "0", banner
        reply = httpx.get(f"http://127.0.0.1:{found[1]}/v1/openapi.json", timeout=10)
        assert reply.status_code == 200
    finally:
        proc.terminate()
        proc.communicate(timeout=20)


@pytest.mark.parametrize(
    "command",
    [["pending"], ["events", "ses_x"], ["approve", "req_x"], ["db", "upgrade"], ["worker", TARGET]],
)
def test_a_store_path_that_is_a_directory_is_named_as_one(
    command: list[str], tmp_path: Path
) -> None:
    """`--store sqlite:///DIR` (a folder where the file was meant) says the path is a directory,
    not SQLite's "unable to open database file"; the folder is left as it was."""
    result = invoke(*command, "--store", f"sqlite:///{tmp_path}")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: StoreError: cannot open SQLite store {tmp_path}: it is a directory, not a file\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", [["db", "upgrade"], ["pending"], ["chat", TARGET]])
def test_a_store_path_ending_in_a_slash_is_refused(command: list[str], tmp_path: Path) -> None:
    """`--store sqlite:///DIR/` (a folder meant, or a file named with a slash after it): SQLite
    opened `DIR/` as the file `DIR`, so `db upgrade` or `chat` made a store file where a folder
    was meant, which `pending` with the same URL then said was no store."""
    (tmp_path / "old.db").write_bytes(b"")
    for path in (tmp_path / "new", tmp_path / "old.db"):
        result = CliRunner().invoke(app, [*command, "--store", f"sqlite:///{path}/"], input="")
        assert result.exit_code == 1, result.output
        assert result.stderr.startswith("error: StoreError: SQLite URL "), result.output
        assert "ends in '/'" in result.stderr, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.db"]
    assert (tmp_path / "old.db").read_bytes() == b""


@pytest.mark.parametrize(
    "command",
    [["pending"], ["events", "ses_x"], ["approve", "req_x"], ["db", "upgrade"], ["worker", TARGET]],
)
def test_a_store_path_that_is_a_fifo_is_named_as_one(command: list[str], tmp_path: Path) -> None:
    """A named pipe (or a device) where the store was meant is said to be no regular file, not
    "no signoff schema" nor SQLite's "disk I/O error" once it tried to write it."""
    fifo = tmp_path / "state.db"
    os.mkfifo(fifo)
    result = invoke(*command, "--store", f"sqlite:///{fifo}")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: StoreError: cannot open SQLite store {fifo}: it is no regular file "
        "(a named pipe, device or socket)\n"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["state.db"]


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


@pytest.mark.parametrize("command", [["pending"], ["sessions"], ["events", "SESSION"]])
def test_a_terminal_that_cannot_show_unicode_gets_escapes_not_a_traceback(
    url: str, command: list[str]
) -> None:
    """Output whose encoding is not UTF-8 (a Windows pipe's code page, a Latin-1 locale) cannot
    hold a Japanese agent name: Rich's write raised UnicodeEncodeError, a traceback instead of
    the table. What it cannot encode is now shown as a backslash escape."""
    rt = so.Runtime([kuma], store=url)
    try:
        session_id = rt.generate_sync("クマ", "返金 1042").session_id
    finally:
        rt.close_sync()
    args = [session_id if arg == "SESSION" else arg for arg in command]
    proc = subprocess.run(
        [sys.executable, "-m", "signoff", *args, "--store", url],
        cwd=ROOT,
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "ascii"},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr == b""
    assert b"\\u30af\\u30de" in proc.stdout, proc.stdout  # クマ


kuma = scripted_agent(
    "クマ",
    [
        call_tools(call("issue_refund", order_id="1042", amount=180, reason="壊れた")),
        reply("返金しました。"),
    ],
    tools=[issue_refund],
)


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
        [sys.executable, "-m", "signoff", "worker", "tests.test_cli_edges:napper"]
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
        [sys.executable, "-m", "signoff", "serve", "tests.test_cli_edges:napper"]
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


def _ctrl_c_twice(proc: subprocess.Popen[str], between: str) -> str:
    """Ctrl-C, and once the process logs `between` (it has begun to stop) a second one: what
    it then writes to stderr before it ends."""
    proc.send_signal(signal.SIGINT)
    _wait_for_line(proc, between)
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=10)[1]


def _lease_taken(url: str, session_id: str) -> bool:
    """Whether another worker can take the session's lease now (the last holder gave it back)."""

    async def take() -> int | None:
        store = SQLiteStore(url)
        try:
            return await store.acquire_lease(session_id, "another-worker", 30.0, time.time())
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


@pytest.mark.parametrize("command", ["approve", "deny"])
def test_approving_or_denying_a_question_says_to_answer_it(url: str, command: str) -> None:
    """`approve` or `deny` of a question names the command that answers it, not the option
    ('approve', 'cancel') the question lacks; nothing is recorded."""
    rt = so.Runtime([sizer], store=url)
    try:
        question = rt.generate_sync("sizer", "I want coffee").pending[0]
    finally:
        rt.close_sync()
    before = len(log(url, question.session_id))
    result = invoke(command, question.id, "--store", url)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: InvalidAnswer: {question.id} is a question (Which size?), not an approval: "
        f"signoff answer {question.id} --option ID or --text TEXT\n"
    )
    assert len(log(url, question.session_id)) == before


UPGRADE_FIXTURES = ROOT / "tests" / "fixtures" / "upgrade"
OLDER = "0c4a186"  # store schema 4 on SQLite, migrations 1-5 on PostgreSQL
READING = [["pending"], ["sessions"], ["events", "SESSION"]]
"""Every command that only reads the store; `SESSION` stands for a session the store holds."""


def _older_sqlite(tmp_path: Path) -> tuple[Path, str]:
    """A copy of a store an older signoff wrote (schema 4), and one of its session ids."""
    db = tmp_path / "state.db"
    db.write_bytes((UPGRADE_FIXTURES / f"sqlite-{OLDER}.db").read_bytes())
    manifest = json.loads((UPGRADE_FIXTURES / f"sqlite-{OLDER}.json").read_text())
    return db, manifest["sessions"]["one"]


def _sqlite_mark(db: Path) -> str:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return str(conn.execute("SELECT value FROM meta WHERE key='schema'").fetchone()[0])
    finally:
        conn.close()


@pytest.mark.parametrize("command", READING)
def test_a_reading_command_refuses_an_older_sqlite_store_and_changes_nothing(
    command: list[str], tmp_path: Path
) -> None:
    """`pending`, `sessions` and `events` never upgrade a store (which would lock out the older
    processes still using it): an older schema is one line saying what to run, and the file
    keeps every byte; `db upgrade` then lets them read it."""
    from signoff.stores.sqlite import STORE_SCHEMA

    db, session = _older_sqlite(tmp_path)
    before = db.read_bytes()
    args = [session if a == "SESSION" else a for a in command]
    result = invoke(*args, "--store", f"sqlite:///{db}")
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: SchemaVersionError: {db} is at store schema 4, this signoff needs "
        f"{STORE_SCHEMA}: run `signoff db upgrade` (once no older signoff uses it)\n"
    )
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.db"]
    assert invoke("db", "upgrade", "--store", f"sqlite:///{db}").exit_code == 0
    assert _sqlite_mark(db) == str(STORE_SCHEMA)
    result = invoke(*args, "--store", f"sqlite:///{db}")
    assert result.exit_code == 0, result.output


def test_a_writing_command_still_upgrades_an_older_sqlite_store(tmp_path: Path) -> None:
    """`approve` (like `deny`, `answer`, `chat`, `worker`, `serve`) opens the store as a runtime
    does: an older schema is upgraded, then the answer recorded."""
    from signoff.stores.sqlite import STORE_SCHEMA

    db, session = _older_sqlite(tmp_path)
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        (request,) = conn.execute(
            "SELECT r.id FROM requests r JOIN sessions s ON s.sk = r.sk "
            "WHERE s.id = ? AND r.status = 'pending'",
            (session,),
        ).fetchone()
    finally:
        conn.close()
    result = invoke("approve", request, "--store", f"sqlite:///{db}")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"approved {request}"), result.output
    assert _sqlite_mark(db) == str(STORE_SCHEMA)


def _pg_version(url: str) -> int:
    import psycopg

    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT MAX(version) FROM signoff.schema_version").fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("command", READING)
def test_a_reading_command_refuses_an_older_postgres_store_and_changes_nothing(
    command: list[str], pg_url: str
) -> None:
    """The same on PostgreSQL: the database stays at its migration, with its rows as they were."""
    import psycopg

    from signoff.stores.postgres._schema import STORE_SCHEMA
    from signoff.stores.postgres._url import describe
    from tests.conftest import PG_BIN

    restore = [str(PG_BIN / "psql"), "-q", "-v", "ON_ERROR_STOP=1", "-f", "-", pg_url]
    dump = (UPGRADE_FIXTURES / f"postgres-{OLDER}.sql").read_bytes()
    subprocess.run(restore, input=dump, check=True)
    session = json.loads((UPGRADE_FIXTURES / f"postgres-{OLDER}.json").read_text())["sessions"]
    tables = "SELECT table_name, column_name FROM information_schema.columns ORDER BY 1, 2"
    with psycopg.connect(pg_url) as conn:
        columns = conn.execute(tables).fetchall()
    args = [session["one"] if a == "SESSION" else a for a in command]
    result = invoke(*args, "--store", pg_url)
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        f"error: SchemaVersionError: PostgreSQL store {describe(pg_url)} is at store schema 5, "
        f"this signoff needs {STORE_SCHEMA}: run `signoff db upgrade` (once no older signoff "
        "uses it)\n"
    )
    assert _pg_version(pg_url) == 5
    with psycopg.connect(pg_url) as conn:
        assert conn.execute(tables).fetchall() == columns
    assert invoke("db", "upgrade", "--store", pg_url).exit_code == 0
    assert _pg_version(pg_url) == STORE_SCHEMA
    result = invoke(*args, "--store", pg_url)
    assert result.exit_code == 0, result.output
