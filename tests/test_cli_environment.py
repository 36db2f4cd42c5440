"""The CLI's environment variables set but empty (`SIGNOFF_STORE=$DATABASE_URL` with the variable
unset): refused naming the variable, as the empty option is, never taken for the default."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from signoff.cli import app
from tests._cli import ROOT, TARGET, park, refused_usage, url

__all__ = ["url"]  # the fixture, used by name


@pytest.mark.parametrize(
    "command",
    [["db", "upgrade"], ["db", "status"], ["pending"], ["approve", "req_x"], ["chat", TARGET]],
)
def test_an_empty_store_variable_is_refused_not_the_default(
    command: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`db upgrade` created and migrated .signoff/state.db here and reported success, and `chat`
    talked into a new store there, while the database meant stayed untouched: Click takes an
    empty variable for an unset one, where `--store ""` is refused."""
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(app, command, env={"SIGNOFF_STORE": ""}, input="")
    message = refused_usage(result)
    assert "SIGNOFF_STORE is set but empty" in message, message
    assert not (tmp_path / ".signoff").exists()


def test_a_worker_with_an_empty_store_variable_does_not_start(tmp_path: Path) -> None:
    """`signoff worker` ran on a new, empty SQLite store in the current directory, claiming
    nothing of the database meant, with exit status 0 when stopped."""
    done = subprocess.run(
        [sys.executable, "-m", "signoff", "worker", TARGET],
        env={**os.environ, "SIGNOFF_STORE": "", "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}"},
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    boxed = " ".join(ln.strip("│ ") for ln in done.stderr.splitlines() if ln.startswith("│"))
    assert "SIGNOFF_STORE is set but empty" in boxed, done.stderr
    assert not (tmp_path / ".signoff").exists()


def test_an_empty_store_variable_gives_way_to_the_option(url: str) -> None:
    """`--store` wins over the variable, as it does over one set to a URL."""
    park(url)
    result = CliRunner().invoke(
        app, ["pending", "--json", "--store", url], env={"SIGNOFF_STORE": ""}
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("[")


def test_an_empty_principal_variable_is_refused_not_the_local_user(url: str) -> None:
    """`SIGNOFF_PRINCIPAL=$REVIEWER` with the variable unset answered as local:<user>, which the
    audit trail then records, where `--as ""` is refused; nothing is answered."""
    _, request_id = park(url)
    result = CliRunner().invoke(
        app, ["approve", request_id, "--store", url], env={"SIGNOFF_PRINCIPAL": ""}
    )
    message = refused_usage(result)
    assert "SIGNOFF_PRINCIPAL is set but empty" in message, message
    listed = CliRunner().invoke(app, ["pending", "--json", "--store", url])
    assert request_id in listed.stdout


@pytest.mark.parametrize("variable", ["SIGNOFF_SECRET", "SIGNOFF_TOKENS"])
def test_serve_refuses_an_empty_secret_or_tokens_variable(variable: str, url: str) -> None:
    """`SIGNOFF_SECRET=$SECRET` with the variable unset served with no secret, and
    `SIGNOFF_TOKENS=$TOKENS` in dev mode, where `--secret ""` and `--token ""` are refused.
    (The port is taken, so that a serve that does start ends at once.)"""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        result = CliRunner().invoke(
            app, ["serve", TARGET, "--store", url, "--port", port], env={variable: ""}
        )
    message = refused_usage(result)
    assert f"{variable} is set but empty" in message, message


_TOKEN = ["--token", "s3cret=alice"]


@pytest.mark.parametrize(
    ("variable", "option", "args", "env"),
    [
        ("SIGNOFF_METRICS_TOKEN", "--metrics-token", [*_TOKEN, "--metrics"], {}),
        ("SIGNOFF_METRICS_TOKEN", "--metrics-token", ["--metrics"], {}),  # dev mode
        ("SIGNOFF_METRICS", None, [], {}),
        ("SIGNOFF_WEBHOOK_SECRET", "--webhook-secret", ["--webhook", "https://h.example/x"], {}),
        (
            "SLACK_BOT_TOKEN",
            "--slack-token",
            ["--slack-channel", "C0123"],
            {"SLACK_SIGNING_SECRET": "s"},
        ),
        (
            "SLACK_SIGNING_SECRET",
            "--slack-signing-secret",
            ["--slack-channel", "C0123"],
            {"SLACK_BOT_TOKEN": "xoxb-1"},
        ),
        ("SIGNOFF_MAX_STREAMS", "--max-streams", [], {}),
        ("SIGNOFF_MAX_BODY_SIZE", "--max-body-size", [], {}),
        ("SIGNOFF_MAX_CONNECTIONS", "--max-connections", [], {}),
        ("SIGNOFF_KEEP_ALIVE_TIMEOUT", "--keep-alive-timeout", [], {}),
        ("SIGNOFF_LEASE_TTL", "--lease-ttl", [], {}),
        ("SIGNOFF_LOG_LEVEL", "--log-level", [], {}),
    ],
)
def test_serve_refuses_every_empty_variable_as_its_empty_option(
    variable: str,
    option: str | None,
    args: list[str],
    env: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`SIGNOFF_METRICS_TOKEN=$METRICS_TOKEN` with the variable unset served /metrics with no
    token of its own (401 to the scraper, said nowhere; in dev mode, to localhost), and an
    empty limit or log level served with the default, where each typed empty is refused (a
    channel's secret was refused as missing, never named). Nothing is served or stored."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self))
    command = ["serve", TARGET, "--store", f"sqlite:///{tmp_path}/s.db", "--port", "0", *args]
    if option is not None:  # a flag (`--metrics`) has no empty value to type
        assert refused_usage(CliRunner().invoke(app, [*command, option, ""], env=env))
    message = refused_usage(CliRunner().invoke(app, command, env={**env, variable: ""}))
    assert f"{variable} is set but empty: give it a value" in message, message
    assert served == [] and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("variable", ["SIGNOFF_LEASE_TTL", "SIGNOFF_LOG_LEVEL"])
def test_a_worker_refuses_an_empty_lease_ttl_or_log_level_variable(
    variable: str, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker took the runtime's lease TTL and the `info` level instead; the option typed
    wins over the empty variable, as over one with a value."""
    import signoff as so

    worked: list[so.Runtime] = []

    async def work(self: so.Runtime, **kw: Any) -> None:
        worked.append(self)

    monkeypatch.setattr(so.Runtime, "work", work)
    message = refused_usage(
        CliRunner().invoke(app, ["worker", TARGET, "--store", url], env={variable: ""})
    )
    assert f"{variable} is set but empty" in message, message
    assert worked == []
    option = {
        "SIGNOFF_LEASE_TTL": ["--lease-ttl", "5"],
        "SIGNOFF_LOG_LEVEL": ["--log-level", "debug"],
    }
    result = CliRunner().invoke(
        app, ["worker", TARGET, "--store", url, *option[variable]], env={variable: ""}
    )
    assert result.exit_code == 0, result.output
    assert len(worked) == 1


def test_serve_leaves_empty_secrets_of_what_it_does_not_run_unused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A channel's secret or the metrics token exported without the channel or `--metrics` is
    left unused, empty as with a value: it may be meant for another run."""
    import uvicorn

    served: list[Any] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, **kw: served.append(self))
    empty = ("SIGNOFF_METRICS_TOKEN", "SIGNOFF_WEBHOOK_SECRET", "SLACK_BOT_TOKEN")
    result = CliRunner().invoke(
        app,
        ["serve", TARGET, "--store", f"sqlite:///{tmp_path}/s.db", "--port", "0"],
        env={**dict.fromkeys(empty, ""), "SLACK_SIGNING_SECRET": ""},
    )
    assert result.exit_code == 0, result.output
    assert len(served) == 1
