"""Output that cannot be written (a full disk, an I/O error, as `> /dev/full` makes it): one
red line naming the error and exit status 1, never a traceback, buffered output or not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

import signoff as so
from signoff.cli._app import fail
from signoff.cli._commands import _unwritable
from tests._cli import ROOT, park

COMMANDS = [
    ["--version"],
    ["--help"],
    ["pending", "--help"],
    ["pending", "--json"],
    ["pending"],
    ["sessions"],
    ["events", "SESSION"],
    ["db", "status"],
]


@pytest.mark.parametrize("unbuffered", ["1", None], ids=["unbuffered", "buffered"])
@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_output_that_cannot_be_written_is_one_line_and_status_1(
    command: list[str], unbuffered: str | None, tmp_path: Path
) -> None:
    """The write's OSError went up as a traceback of some sixty lines (and `--version`, written
    to a buffer, ended 120 from Python's flush at exit): a script's log held no error line."""
    url = f"sqlite:///{tmp_path}/state.db"
    session_id, _ = park(url)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered is not None:
        env["PYTHONUNBUFFERED"] = unbuffered
    env["SIGNOFF_STORE"] = url
    args = [session_id if a == "SESSION" else a for a in command]
    with open("/dev/full", "w") as full:  # every write to it fails: ENOSPC
        done = subprocess.run(
            [sys.executable, "-m", "signoff", *args],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=60,
        )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0] == "error: OSError: [Errno 28] No space left on device", lines


CLOSED = [
    *COMMANDS,
    ["events", "SESSION", "--follow"],
    ["serve", "examples.support:runtime", "--port", "0"],
]


@pytest.mark.parametrize("command", CLOSED, ids=" ".join)
def test_output_closed_is_one_line_and_status_1(command: list[str], tmp_path: Path) -> None:
    """`>&-` (Python's stdout None): the commands exited 0 having written nothing, and
    `events --follow` (and `serve --port 0`, its banner printed once listening) ended in a
    traceback. As for a full disk: one line, status 1."""
    url = f"sqlite:///{tmp_path}/state.db"
    session_id, _ = park(url)
    args = [session_id if a == "SESSION" else a for a in command]
    done = subprocess.run(
        [sys.executable, "-m", "signoff", *args],
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "SIGNOFF_STORE": url},
        preexec_fn=lambda: os.close(1),
        timeout=60,
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == ["error: OSError: [Errno 9] standard output is closed"]


def test_serve_whose_banner_cannot_be_written_stops_with_one_line(tmp_path: Path) -> None:
    """`serve --port 0 > /dev/full`: its banner, printed once listening, failed inside uvicorn's
    start-up, which logged it as a traceback of some 37 lines; the server stops, and the error
    is one line, status 1, as for any command's output."""
    url = f"sqlite:///{tmp_path}/state.db"
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "signoff", "serve", "examples.support:runtime", "--port", "0"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env={**os.environ, "SIGNOFF_STORE": url},
            timeout=60,
        )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines()[-1] == "error: OSError: [Errno 28] No space left on device"


@pytest.mark.parametrize("unbuffered", ["1", None], ids=["unbuffered", "buffered"])
def test_output_cut_short_in_one_write_is_status_141(
    unbuffered: str | None, tmp_path: Path
) -> None:
    """With PYTHONUNBUFFERED=1 (as container images set it), what one write could not hand over
    when the reader went was dropped unseen: `pending --json | head -c 100` ended 0, as if all of
    it had been read. It ends 141, as with buffered output."""
    url = f"sqlite:///{tmp_path}/state.db"
    for _ in range(120):  # some 150 kB of JSON: more than a pipe holds
        park(url)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if unbuffered is not None:
        env["PYTHONUNBUFFERED"] = unbuffered
    with subprocess.Popen(
        [sys.executable, "-m", "signoff", "pending", "--json", "--limit", "1000", "--store", url],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env,
    ) as proc:
        assert proc.stdout is not None and proc.stderr is not None
        assert proc.stdout.read(100)
        proc.stdout.close()
        err = proc.stderr.read()
        assert proc.wait(timeout=60) == 141, err
    assert err == b"", err


def test_an_error_is_one_line_with_its_notes(capsys: pytest.CaptureFixture[str]) -> None:
    """A note added to an error (a prune's sync that failed after the deletion that stopped it)
    was dropped: only the error's own message was printed."""
    exc = so.StoreError("the disk is full\nwhile deleting")
    exc.add_note("the 2 deletion(s) before it may not be on disk")
    with pytest.raises(typer.Exit) as exited:
        fail(exc)
    assert exited.value.exit_code == 1
    said = " ".join(capsys.readouterr().err.split())
    assert said == (
        "error: StoreError: the disk is full while deleting; the 2 deletion(s) before it may not "
        "be on disk"
    )


def test_an_output_error_is_printed_as_it_is(capsys: pytest.CaptureFixture[str]) -> None:
    """Its text went through Rich's `escape`, which left `\\[` before a non-tag to print as
    `[`: the error line read otherwise than the error (`printable` keeps it)."""
    with pytest.raises(SystemExit) as ended:
        _unwritable(OSError(5, r"I/O error on C:\[Backup] at \[1]"))
    assert ended.value.code == 1
    assert (
        capsys.readouterr().err.strip()
        == r"error: OSError: [Errno 5] I/O error on C:\[Backup] at \[1]"
    )
