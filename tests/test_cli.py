"""What every `signoff` command shares (`_app`): one red line per error, usage and status 2 for
a misused command line, the store option and URL, the help text, `python -m signoff`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app

from ._cli import ROOT, TARGET, _free_port, invoke, log, park, refused_usage, url

__all__ = ["url"]  # the fixture, used by name


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["approve", "req_nope"], "UnknownRequest: no request 'req_nope'"),
        (["deny", "req_nope", "--reason", "x"], "UnknownRequest: no request 'req_nope'"),
        (["events", "ses_nope"], "UnknownSession: unknown session 'ses_nope'"),
        (["chat", "tests.no_such_module:runtime"], "UsageError: cannot import"),
        (["chat", "tests._cli:nothing"], "UsageError: module 'tests._cli' has no"),
        (["chat", "tests._cli:TARGET"], "UsageError: tests._cli:TARGET is a str"),
        (["chat", TARGET, "--agent", "billing"], "UnknownAgent: unknown agent 'billing'"),
        (["approve", "req_nope", TARGET], "UnknownRequest: no request 'req_nope'"),
        (["chat", TARGET, "--session", "ses_nope"], "UnknownSession: unknown session 'ses_nope'"),
    ],
)
def test_errors_are_one_red_line(url: str, args: list[str], error: str) -> None:
    park(url)
    result = invoke(*args, "--store", url)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith(f"error: {error}"), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "Traceback" not in result.output


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["chat", "no-colon"], "expected MODULE:RUNTIME"),
        (["worker", "no-colon"], "expected MODULE:RUNTIME"),
        (["serve", "no-colon"], "expected MODULE:RUNTIME"),
        (["approve", "req_nope", "no-colon"], "expected MODULE:RUNTIME"),
        (["chat", "tests._cli:sizer", "--as", "a:"], "--as takes"),
        (["approve", "req_nope", "--as", "a:"], "--as takes"),
        (["sessions", "--status", "bad"], "--status takes one of"),
        (["answer", "req_nope"], "answer takes exactly one of"),
    ],
)
def test_a_misused_command_line_is_its_usage_and_status_2(
    url: str, args: list[str], error: str
) -> None:
    """A value of the wrong form, or options that do not go together, found before anything
    runs, is refused as Click refuses a value out of range: the usage, the message, exit 2;
    the store is left as it was."""
    session_id, _ = park(url)
    before = log(url, session_id)
    result = invoke(*args, "--store", url)
    assert refused_usage(result).startswith(f"Invalid value: {error}"), result.stderr
    assert log(url, session_id) == before


def test_a_multi_line_error_is_still_one_red_line() -> None:
    store = f"postgresql://nobody@127.0.0.1:{_free_port()}/x"  # nothing listens there
    result = invoke("pending", "--store", store)
    assert result.exit_code == 1, result.output
    assert result.stderr.startswith("error: StoreUnavailable: cannot connect to PostgreSQL")
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_bad_store_url_is_a_usage_error() -> None:
    result = invoke("pending", "--store", "mysql://db/x")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: UsageError: unknown store URL 'mysql://db/x'")


def test_reading_commands_refuse_a_sqlite_store_that_does_not_exist(tmp_path: Path) -> None:
    typo = tmp_path / "sate.db"
    for args in (
        ["pending"],
        ["sessions"],
        ["events", "ses_x"],
        ["approve", "req_x"],
        ["deny", "req_x"],
        ["answer", "req_x", "--text", "hi"],
    ):
        result = invoke(*args, "--store", f"sqlite:///{typo}")
        assert result.exit_code == 1, (args, result.output)
        assert result.stderr.startswith(f"error: UsageError: no store at {typo}"), result.stderr
        assert not typo.exists(), args


def test_store_from_environment(url: str) -> None:
    _, request_id = park(url)
    result = CliRunner().invoke(app, ["pending", "--json"], env={"SIGNOFF_STORE": url})
    assert [r["id"] for r in json.loads(result.stdout)] == [request_id]


def test_python_dash_m_runs_the_cli() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "signoff", "--version"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"signoff {so.__version__}"


@pytest.mark.parametrize("command", ["chat", "serve", "worker", "db upgrade"])
def test_help_keeps_each_paragraph_of_a_docstring_whole(command: str) -> None:
    """`--help` rewraps a command's description to the terminal: the docstring's own line
    breaks are not kept, so no line ends mid-sentence, however wide the terminal."""
    import inspect

    from signoff.cli import _chat, _serve, _worker

    callback = {
        "chat": _chat.chat,
        "serve": _serve.serve,
        "worker": _worker.worker,
        "db upgrade": _worker.db_upgrade,
    }[command]
    doc = (inspect.getdoc(callback) or "").replace("\\[", "[")  # rich's escape of a `[`
    paragraphs = [" ".join(p.split()) for p in doc.split("\n\n")]
    shown = CliRunner().invoke(app, [*command.split(), "--help"], env={"COLUMNS": "1000"})
    assert shown.exit_code == 0, shown.output
    lines = [line.strip() for line in shown.output.splitlines()]
    for paragraph in paragraphs:
        assert paragraph in lines, (paragraph, shown.output)


def test_the_command_list_gives_each_command_a_short_summary() -> None:
    """`signoff --help` lists each command by its docstring's first paragraph: `pending` and
    `sessions` put their paging rules there and filled four lines each of the list. Each entry
    is now one sentence of at most two lines at 80 columns; the rest is the command's help."""
    import typer.core
    import typer.main

    group = typer.main.get_command(app)
    assert isinstance(group, typer.core.TyperGroup)
    for name, command in group.commands.items():
        summary = (command.help or "").split("\n\n")[0]
        assert len(" ".join(summary.split())) <= 110, (name, summary)
    shown = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"})
    assert "│ pending   List the open requests across sessions, oldest first.  " in shown.output
    assert "--offset" not in shown.output, shown.output


def test_store_option_replaces_only_the_store(url: str) -> None:
    """`--store` (or SIGNOFF_STORE) moves the runtime to another store and keeps the rest: a
    runtime that leaves its turns to workers (`inline=False`) still does under `signoff serve`."""
    from signoff.cli._loading import load_runtime

    moved = load_runtime("tests._cli:offline_runtime", url)
    assert moved.store.url == url
    assert moved.inline is False
    assert (moved.lease_ttl, moved.lease_wait, moved.poll_interval) == (7.0, 3.0, 0.3)
    assert moved.clock is time.time
    assert load_runtime("tests._cli:offline_runtime").inline is False


def test_the_store_password_is_never_printed(pg_store_url: str) -> None:
    """A PostgreSQL password, in the user part or as `?password=`, stays out of what the CLI
    prints (an unknown request's error, chat's header) and of the worker's log line."""
    host = pg_store_url.split("@", 1)[1]
    for store in (f"postgresql://postgres:s3cret@{host}", f"{pg_store_url}?password=s3cret"):
        result = invoke("approve", "req_nope", "--store", store)
        assert result.exit_code == 1, result.output
        assert "UnknownRequest: no request 'req_nope' in postgresql://" in result.stderr
        assert "s3cret" not in result.output, result.output
        chat = CliRunner().invoke(app, ["chat", TARGET, "--store", store], input="/exit\n")
        assert chat.exit_code == 0, chat.output
        assert "store postgresql://postgres@" in chat.output
        assert "s3cret" not in chat.output, chat.output
    from signoff.cli._app import shown_store  # what the worker logs

    for store in (f"postgresql://postgres:s3cret@{host}", f"{pg_store_url}?password=s3cret"):
        assert "s3cret" not in shown_store(store) and host.split("/")[0] in shown_store(store)
    assert shown_store("sqlite:///x/state.db") == "sqlite:///x/state.db"


def test_a_store_url_with_signoffs_own_options_is_shown_with_them() -> None:
    """`?schema=` and `?pool_max=` are signoff's, not libpq's: the worker's log line and the
    `--store` of a printed command show the store with them (a schema names another store),
    not as an unparsable URL, and still without the password."""
    from signoff.cli._app import shown_store

    url = "postgresql://app:s3cret@db.example:5433/prod?schema=tenant_a&pool_max=12"
    assert shown_store(url) == "postgresql://app@db.example:5433/prod?schema=tenant_a&pool_max=12"
    assert shown_store(f"{url}&password=s3cret") == shown_store(url)
