"""The CLI's environment variables set but empty (`SIGNOFF_STORE=$DATABASE_URL` with the variable
unset): refused naming the variable, as the empty option is, never taken for the default."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

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
