"""The `signoff` commands' help reads as the README writes the command line, with no Python type
placeholders; output whose reader has gone ends the command quietly with status 141."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer import _click
from typer.core import TyperArgument, TyperGroup, TyperOption
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app
from signoff.cli._app import out
from signoff.testing import reply, scripted_agent
from tests._cli import invoke, log, park

ROOT = Path(__file__).resolve().parents[1]

METAVAR = re.compile(r"[A-Z][A-Z0-9_]*([:=][A-Z][A-Z0-9_]*)?")
"""A value's placeholder as the README writes one: `N`, `REQUEST_ID`, `AUTHENTICATOR:ID`."""

TYPE_PLACEHOLDER = re.compile(r"<[a-z_\[\]|]+( range)?>")
"""What Typer writes where a metavar is missing: `<str>`, `<bool>`, `<int range>`, `<list[str]>`."""


def commands(
    command: _click.Command, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], _click.Command]]:
    """Every command and group under `command`, with the words that name it."""
    yield path, command
    if isinstance(command, TyperGroup):
        for name, sub in command.commands.items():
            yield from commands(sub, (*path, name))


ALL = list(commands(typer.main.get_command(app)))
IDS = [" ".join(path) or "signoff" for path, _ in ALL]


def params(command: _click.Command) -> list[_click.Parameter]:
    with _click.Context(command, info_name="signoff") as ctx:
        return command.get_params(ctx)


def usage(command: _click.Command, path: tuple[str, ...]) -> str:
    with _click.Context(command, info_name=" ".join(("signoff", *path))) as ctx:
        return command.get_usage(ctx)


@pytest.mark.parametrize(("path", "command"), ALL, ids=IDS)
def test_every_help_names_values_by_their_metavar(
    path: tuple[str, ...], command: _click.Command
) -> None:
    shown = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert not TYPE_PLACEHOLDER.search(shown.output), shown.output
    line = usage(command, path)
    assert "{" not in line and "}" not in line, line
    assert line in " ".join(shown.output.split()), (line, shown.output)
    for param in params(command):
        if isinstance(param, TyperOption) and param.is_flag:
            assert param.metavar == "", param.opts
        elif isinstance(param, TyperOption):
            assert param.metavar and METAVAR.fullmatch(param.metavar), (param.opts, param.metavar)
        else:
            assert isinstance(param, TyperArgument)
            assert METAVAR.fullmatch(param.display_name_raw), param.display_name_raw


@pytest.mark.parametrize(("path", "command"), ALL, ids=IDS)
def test_every_argument_and_option_says_what_it_is(
    path: tuple[str, ...], command: _click.Command
) -> None:
    """`approve --help` listed REQUEST_ID with nothing but `[required]`, and `events --help`
    SESSION_ID likewise: each parameter now has a help line."""
    for param in params(command):
        assert isinstance(param, TyperOption | TyperArgument)
        assert (param.help or "").strip(), (path, param.name)


def readme_command_lines() -> dict[str, str]:
    """The README's command-line summary: each `signoff ...` line (continuations joined) by
    the words naming its command."""
    text = (ROOT / "README.md").read_text()
    block = text.split("## Command line", 1)[1].split("```bash\n", 1)[1].split("```", 1)[0]
    joined = re.sub(r"\\\n\s*", " ", block)
    lines: dict[str, str] = {}
    for line in joined.splitlines():
        words = line.split("#", 1)[0].split()
        if not words or words[0] != "signoff":
            continue
        name = " ".join(w for w in words[1:3] if w.isalpha() and w.islower())
        lines[name.split()[0] if name.split()[0] != "db" else name] = " ".join(words)
    return lines


def test_the_readme_writes_each_command_as_its_help_does() -> None:
    """Each command is in the README's summary; what follows an option there is the option's
    metavar, and the arguments come in the usage line's order, written the same way."""
    lines = readme_command_lines()
    for path, command in ALL:
        if isinstance(command, TyperGroup):
            continue
        name = " ".join(path)
        assert name in lines, name
        line = lines[name]
        options = {
            opt: param
            for param in params(command)
            if isinstance(param, TyperOption)
            for opt in param.opts
        }
        for opt, value in re.findall(r"(--[a-z-]+)(?:[ =]([^\s\]\[|()]+))?", line):
            assert opt in options, (name, opt)
            param = options[opt]
            if param.is_flag:
                assert not value or value.startswith("--"), (name, opt, value)
            else:
                assert value == param.metavar, (name, opt, value, param.metavar)
        pieces = usage(command, path).split("[OPTIONS]", 1)[1].split()
        arguments = [p for p in pieces if "MODULE:RUNTIME" not in p or "[" in p]
        at = 0
        for piece in arguments:
            found = line.find(piece, at)
            assert found >= 0, (name, piece, line)
            at = found + len(piece)


def test_a_closed_output_pipe_ends_the_command_quietly_with_141(tmp_path: Path) -> None:
    """`signoff events ID | head -c 100`: the reader goes before the log is written out. The
    command stops with status 141, as git and ls end there (128 + SIGPIPE), and writes nothing
    to stderr: no traceback, no "Exception ignored" from Python's flush at exit."""
    url = f"sqlite:///{tmp_path}/state.db"
    rt = so.Runtime([scripted_agent("a", [reply("x" * 400_000)])], store=url)
    try:
        sid = rt.generate_sync("a", "hi").session_id
    finally:
        rt.close_sync()
    with subprocess.Popen(
        [sys.executable, "-m", "signoff", "events", sid, "--store", url, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(100)
        proc.stdout.close()  # 400 kB are more than the pipe holds: the write meets EPIPE
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 141, err
    assert err == b"", err


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["pending", "--help"], []])
def test_help_and_version_to_a_closed_pipe_are_status_141_too(args: list[str]) -> None:
    """Help (written by Rich, which exits 1 on a broken pipe) and `--version` (written before any
    command runs) ended with status 1, as for an error, when their reader had gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before a byte is written
    try:
        done = subprocess.run(
            [sys.executable, "-m", "signoff", *args],
            stdout=write_end,
            stderr=subprocess.PIPE,
            cwd=ROOT,
            timeout=60,
        )
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert done.stderr == b"", done.stderr


def test_rich_output_to_a_closed_pipe_is_status_141_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tables and lines printed through Rich meet the same end: Rich's own reaction to a
    broken pipe is exit status 1, as for an error."""

    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(sys, "stdout", Closed())
    with pytest.raises(typer.Exit) as ended:
        out().print("ses_1  waiting")
    assert ended.value.exit_code == 141


def test_nothing_but_a_closed_pipe_is_status_141(tmp_path: Path) -> None:
    """Whatever the command prints, when its reader stays, exits 0 as before."""
    url = f"sqlite:///{tmp_path}/state.db"
    rt = so.Runtime([scripted_agent("a", [reply("x" * 400_000)])], store=url)
    try:
        sid = rt.generate_sync("a", "hi").session_id
    finally:
        rt.close_sync()
    done = subprocess.run(
        [sys.executable, "-m", "signoff", "events", sid, "--store", url, "--json"],
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert len(done.stdout) > 400_000


@pytest.mark.parametrize(("path", "command"), ALL, ids=IDS)
def test_the_usage_line_brackets_an_optional_argument_only(
    path: tuple[str, ...], command: _click.Command
) -> None:
    pieces = usage(command, path).split()
    for param in params(command):
        if isinstance(param, TyperArgument):
            name = param.display_name_raw
            assert (name if param.required else f"[{name}]") in pieces, (name, pieces)
    if path == ("approve",):
        assert pieces[-2:] == ["REQUEST_ID", "[MODULE:RUNTIME]"]


def test_events_after_a_seq_past_the_log_is_refused_not_waited_for(tmp_path: Path) -> None:
    """`--after` past the session's last event would print nothing, and with `--follow` wait
    for ever in silence (a mistyped seq): it is refused, as the HTTP stream refuses it."""
    url = f"sqlite:///{tmp_path}/state.db"
    sid, _ = park(url)
    head = log(url, sid)[-1].seq
    for extra in ([], ["--follow"]):
        result = invoke("events", sid, "--store", url, "--after", str(head + 1), *extra)
        assert result.exit_code == 1, result.output
        assert result.stderr == (
            f"error: UsageError: --after {head + 1} is past the session's last event ({head}); "
            "start from a seq it has\n"
        )
    last = invoke("events", sid, "--store", url, "--after", str(head - 1), "--json")
    assert last.exit_code == 0 and [json.loads(x)["seq"] for x in last.stdout.splitlines()] == [
        head
    ]
    assert invoke("events", sid, "--store", url, "--after", str(head)).stdout == ""


def test_the_as_help_gives_the_answering_rule_as_a_default(tmp_path: Path) -> None:
    """`--as`'s help said requests may be answered only by the principal whose turn asked: a
    turn asked with no principal is answered by anyone, and a response policy or `approvers=`
    decides otherwise, so the help says the rule is a default."""
    from tests._cli import invoke, log, park

    for command in (["approve"], ["deny"], ["answer"], ["chat"]):
        shown = " ".join(invoke(*command, "--help").stdout.replace("│", " ").split())
        assert "Requests may be answered only" not in shown, command
        assert "By default only the principal whose turn asked may answer its requests" in shown
        assert "(anyone, for a turn asked with no principal)" in shown, command
    url = f"sqlite:///{tmp_path}/state.db"
    session_id, request_id = park(url)  # asked with no principal
    done = invoke("approve", request_id, "--store", url, "--as", "web:someone-else")
    assert done.exit_code == 0, done.output
    settled = next(e for e in log(url, session_id) if e.type == "approval.settled")
    assert settled.data["by"]["principal_id"] == "someone-else"
