"""What the CLI prints in awkward places: narrow terminals and pipes, text that would steer a
terminal, values and paths that are not UTF-8, lone surrogates, a terminal without Unicode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app
from signoff.testing import call, call_tools, reply, scripted_agent
from tests._cli import (
    ROOT,
    TARGET,
    agent,
    invoke,
    issue_refund,
    log,
    park,
    refused_usage,
    sizer,
    treasurer,
    url,
)

__all__ = ["url"]  # the fixture, used by name


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


def _input_column(printed: str) -> list[str]:
    """The Input column of `signoff pending`'s table (its last), one entry a request: the text
    of its lines, joined as one line."""
    lines = printed.splitlines()
    header = next(i for i, line in enumerate(lines) if "Request / session" in line)
    assert "Input" in lines[header], printed
    at = lines[header].index("Input")
    shown: list[str] = []
    for line in lines[header + 2 :]:
        if line[:at].strip().startswith("req_"):
            shown.append("")
        if shown and line[at:].strip():
            shown[-1] = f"{shown[-1]} {line[at:].strip()}".strip()
    return shown


@pytest.mark.parametrize("columns", ["20", "50", "60", "64", "80"])
def test_pending_shows_every_input_at_any_width(url: str, columns: str) -> None:
    """What a reviewer approves is on the queue however narrow the terminal: the Input column
    was laid out at no width below about 70 columns (header, input and all, with nothing saying
    so) and in strips of a few characters just above; it is now at least its longest word wide,
    the table printed wider than the terminal if need be."""
    rt = so.Runtime([treasurer, sizer], store=url)
    try:
        rt.generate_sync("treasurer", "Pay ACME")
        rt.generate_sync("sizer", "Order coffee")
        requests = rt.pending_sync()
    finally:
        rt.close_sync()
    listed = CliRunner().invoke(app, ["pending", "--store", url], env={"COLUMNS": columns})
    assert listed.exit_code == 0, listed.output
    assert [r.id for r in requests] == [
        line.split()[0] for line in listed.output.splitlines() if line.startswith(" req_")
    ], listed.output
    assert _input_column(listed.output) == [
        '{"to": "ACME", "amount": 5000.0}',
        "Which size? (1=Small, 2=Large) or free text",
    ], listed.output


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
        app, ["chat", "tests.test_cli_output:steering", "--store", url], input="hi\n1\n"
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


def test_a_reason_with_line_breaks_cannot_print_a_made_up_event(url: str) -> None:
    """A deny's reason holding a line break printed a second line under `approval.settled` and
    `tool.completed`, and the reviewer had written it to read as `tool.started`: a denied call
    seen to run. Each event is one line, its breaks shown as `\\n`."""
    session_id, request_id = park(url)
    forged = "no\n   9  13:08:18  tool.started       issue_refund\r\u2028x"
    denied = invoke("deny", request_id, TARGET, "--reason", forged, "--store", url)
    assert denied.exit_code == 0, denied.output
    shown = invoke("events", session_id, "--store", url)
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert len(lines) == len(log(url, session_id))
    assert [ln.split()[2] for ln in lines].count("tool.started") == 0
    escaped = "no\\n   9  13:08:18  tool.started       issue_refund\\r\\u2028x"
    (settled,) = [ln for ln in lines if " approval.settled " in ln]
    (completed,) = [ln for ln in lines if " tool.completed " in ln]
    assert escaped in settled and escaped in completed


def test_events_json_cannot_steer_the_terminal_either(url: str) -> None:
    """`events --json` escapes C1 controls (`\\x9b` is a CSI on terminals that read them in
    UTF-8) and bidi overrides as `\\u009b`, as `pending --json` does; JSON escapes only C0 by
    itself. The same text parses back, and what is merely not ASCII stays readable."""
    rt = so.Runtime([steering], store=url)
    try:
        parked = rt.generate_sync("steering", "héllo")
    finally:
        rt.close_sync()
    as_json = invoke("events", parked.session_id, "--store", url, "--json")
    assert as_json.exit_code == 0, as_json.output
    for control in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert control not in as_json.stdout, (control, as_json.stdout)
    rows = [json.loads(line) for line in as_json.stdout.splitlines()]
    (asked,) = [r for r in rows if r["type"] == "input.requested"]
    assert asked["data"]["requests"][0]["question"] == f"Which?{_STEERING}"
    assert '"héllo"' in as_json.stdout  # not `h\\u00e9llo`


def test_what_approve_prints_is_not_wrapped_into_a_pipe(url: str) -> None:
    """A line naming a request and its session stays one line when stdout is a pipe (80
    columns), so `grep` or a script finds the ids in it."""
    session_id, request_id = park(url)
    result = CliRunner().invoke(app, ["approve", request_id, "--store", url], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert f"approved {request_id} (issue_refund in session {session_id})" in result.output
    assert "picks it up: a signoff worker or signoff serve of its runtime does so by itself" in (
        result.output
    )  # what an operator runs; chat is for one session by hand
    assert f"or signoff chat MODULE:RUNTIME --session {session_id}" in result.output


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


def test_db_upgrade_reports_a_path_that_is_not_utf8(tmp_path: Path) -> None:
    """A store path holding a byte that is not UTF-8 is a real file name: `db upgrade` creates
    the store there and says so, escaped, instead of a traceback after the work is done."""
    printed = _printed(f"sqlite:///{tmp_path}/{UNDECODABLE}.db", "db", "upgrade")
    assert printed.startswith("schema created") and "\\udcff.db" in printed, printed
    assert (tmp_path / f"{UNDECODABLE}.db").exists()


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


refunder = scripted_agent(
    "zoë",
    [call_tools(call("ask_question", question="Refund 40 € to Zoë?")), reply("Refunded.")],
    tools=[so.ask_question()],
)


# `events` names the agent: with only a store it shows a call's input masked (docs/events.md).
@pytest.mark.parametrize(
    "command",
    [["pending"], ["sessions"], ["events", "SESSION", "tests.test_cli_output:refunder"]],
)
def test_a_c_locale_gets_escapes_not_a_traceback(url: str, command: list[str]) -> None:
    """In a C or POSIX locale with UTF-8 mode off (`LC_ALL=C PYTHONUTF8=0`, as some cron jobs
    and containers run), stdout is ASCII with `surrogateescape`, which `run` left as it was: a
    "€" in a question (an "ë" in an agent's name) ended `pending` and `events` (`sessions`) with
    a UnicodeEncodeError and a traceback. It is shown as an escape, as on any output that cannot
    hold it."""
    rt = so.Runtime([refunder], store=url)
    try:
        session_id = rt.generate_sync("zoë", "Refund Zoë").session_id
    finally:
        rt.close_sync()
    args = [session_id if arg == "SESSION" else arg for arg in command]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIO"))}
    proc = subprocess.run(
        [sys.executable, "-m", "signoff", *args, "--store", url],
        cwd=ROOT,
        capture_output=True,
        env={**env, "LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    assert proc.stderr == b""
    assert b"zo\\xeb" in proc.stdout, proc.stdout  # the agent's name
    if command != ["sessions"]:
        assert b"40 \\u20ac" in proc.stdout and b"Zo\\xeb?" in proc.stdout, proc.stdout


kuma = scripted_agent(
    "クマ",
    [
        call_tools(call("issue_refund", order_id="1042", amount=180, reason="壊れた")),
        reply("返金しました。"),
    ],
    tools=[issue_refund],
)


@so.tool(approval=so.always())
async def pay(to: str) -> str:
    """Pay someone."""
    return f"paid {to}"


# Zero-width space, two tag characters (invisible: "ASCII smuggling"), word joiner, byte order
# mark, soft hyphen and the Arabic letter mark (a bidirectional control).
_INVISIBLE = "\u200b\U000e0061\U000e0074\u2060\ufeff\xad\u061c"

hider = scripted_agent(
    "hider", [call_tools(call("pay", to=f"ACME{_INVISIBLE}")), reply("Paid.")], tools=[pay]
)


def test_invisible_characters_in_a_tool_input_show_as_escapes(url: str) -> None:
    """What the terminal shows of a call to approve is what runs: a tool input's invisible
    characters (zero-width, tag characters, a byte order mark) printed as they are showed
    `{"to":"ACME"}` for a payee that is not ACME, in `chat`'s prompt, `pending` and `events`,
    where the dashboard and Slack show them as `\\u` escapes."""
    chat = CliRunner().invoke(
        app, ["chat", "tests.test_cli_output:hider", "--store", url], input="pay\n"
    )
    assert chat.exit_code == 0, chat.output
    rt = so.Runtime([hider], store=url)
    try:
        parked = rt.generate_sync("hider", "pay again")
    finally:
        rt.close_sync()
    wide = {"COLUMNS": "300"}  # the table's input column would wrap the escapes
    shown = [
        chat,
        CliRunner().invoke(app, ["pending", "--store", url], env=wide),
        # named, the agent shows its tool's input (with only a store it is masked)
        invoke("events", parked.session_id, "tests.test_cli_output:hider", "--store", url),
    ]
    escaped = "ACME\\u200b\\udb40\\udc61\\udb40\\udc74\\u2060\\ufeff\\u00ad\\u061c"
    for result in shown:
        assert result.exit_code == 0, result.output
        assert escaped in result.output.replace("\n", ""), result.output
        for hidden in _INVISIBLE:
            assert hidden not in result.output, (hidden, result.output)


_PATH = "C:\\Temp\\"  # a Windows folder, as a model may write one: it ends in a backslash
_RUN = "escaped \\\\\\"  # three backslashes at the end


def _refused(conversation: list[so.Message]) -> so.ModelResponse:
    raise so.ModelError(_RUN)


backslashed = scripted_agent("backslashed", [reply(_PATH), reply(_RUN), _refused])


def test_text_ending_in_backslashes_prints_as_it_is(url: str) -> None:
    """A model's text ending in backslashes keeps every one of them, and the line stays as it
    should be, wherever it is printed: at a line's end (`chat`'s replies), or inside a style
    (an error's red line), where Rich read them as escaping the style's end."""
    chat = CliRunner().invoke(
        app, ["chat", "tests.test_cli_output:backslashed", "--store", url], input="a\nb\nc\n"
    )
    assert chat.exit_code == 1, chat.output  # its last turn failed, never retried
    assert f"backslashed: {_PATH}\n" in chat.output
    assert f"backslashed: {_RUN}\n" in chat.output
    assert f"the turn failed: ModelError: {_RUN} (type /retry to resume it)\n" in chat.output
    store = url + "\\\\\\"  # a file whose name ends in three backslashes, at an error's end
    assert invoke("db", "upgrade", "--store", store).exit_code == 0
    missing = invoke("approve", "req_x", "--store", store)
    assert missing.exit_code == 1
    assert missing.stderr == f"error: UnknownRequest: no request 'req_x' in {store}\n"


def test_an_answer_recorded_for_an_agent_named_with_brackets_says_its_name(url: str) -> None:
    """`approve` without a runtime names the agent whose process continues the turn: its name,
    escaped for Rich and then quoted with `repr` (which doubled the escaping backslash), was
    read as markup, and a name such as `ops [eu] [/x]` ended the command in a traceback, the
    approval recorded."""
    bracketed_refunds = so.Agent(name="ops [eu] [/x]", model=agent.model, tools=[issue_refund])
    rt = so.Runtime([bracketed_refunds], store=url)
    try:
        (request,) = rt.generate_sync("ops [eu] [/x]", "Refund order 1042").pending
    finally:
        rt.close_sync()
    result = invoke("approve", request.id, "--store", url)
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "The turn continues when a process running agent 'ops [eu] [/x]' picks it up" in (
        result.stdout
    ), result.stdout


def test_events_of_another_day_show_their_date(tmp_path: Path) -> None:
    """A session waits for people for days: its events showed the time of day alone, so one of
    Monday and one of Thursday read alike. Today's still show the time alone."""
    from datetime import datetime

    url = f"sqlite:///{tmp_path}/state.db"
    then = 1_600_000_000.0  # 2020-09-13
    runtime = so.Runtime(
        agents=[scripted_agent("helper", [reply("hi")])], store=url, clock=lambda: then
    )
    sid = runtime.generate_sync("helper", prompt="hello").session_id
    runtime.close_sync()
    result = CliRunner().invoke(app, ["events", sid, "--store", url])
    assert result.exit_code == 0, result.output
    stamp = datetime.fromtimestamp(then).strftime("%Y-%m-%d %H:%M:%S")
    lines = result.stdout.splitlines()
    assert lines and all(f"  {stamp}  " in line for line in lines), lines
    today = so.Runtime(agents=[scripted_agent("helper", [reply("hi")])], store=url)
    sid = today.generate_sync("helper", prompt="hello").session_id
    today.close_sync()
    result = CliRunner().invoke(app, ["events", sid, "--store", url])
    assert result.exit_code == 0, result.output
    for line in result.stdout.splitlines():
        assert line.split()[1].count(":") == 2 and "-" not in line.split()[1], line


smiler = scripted_agent("smiler", [reply("Done \U0001f600 caf\xe9")])


@pytest.mark.parametrize("encoding", ["cp1252", "latin-1", "ascii"])
def test_events_json_is_json_on_an_output_that_cannot_hold_an_emoji(
    url: str, encoding: str
) -> None:
    """A model's emoji on a cp1252 or Latin-1 stdout: `events --json` wrote Python's escape
    (`\\U0001f600`), which no JSON parser reads, and exited 0. It is written as JSON's escape
    (a surrogate pair), so each line parses to the same text."""
    rt = so.Runtime([smiler], store=url)
    try:
        session_id = rt.generate_sync("smiler", "hi").session_id
    finally:
        rt.close_sync()
    proc = subprocess.run(
        [sys.executable, "-m", "signoff", "events", session_id, "--json", "--store", url],
        cwd=ROOT,
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": encoding},
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr.decode()
    said = [
        json.loads(line)["data"].get("text") for line in proc.stdout.decode(encoding).splitlines()
    ]
    assert "Done \U0001f600 caf\xe9" in said
