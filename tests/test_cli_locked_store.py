"""Ctrl-C while a command waits on a store another process holds locked for writing: it ends at
once with status 130 and one line, and nothing of it is written. On SQLite the wait (its busy
timeout, 30 s) was inside SQLite, where no Python signal handler runs; it is on the event loop
now. A worker's first Ctrl-C cuts its claim short there; a turn it cuts short on its second
signal (or `serve`'s) gives its lease back there, out of reach of a cancel, so that signal,
Ctrl-C or SIGTERM, ends it by the watch of `signoff.cli._stuck`."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import signoff as so
from tests._cli import ROOT, ctrl_c_timed, log, park
from tests.test_cli_interrupts import napper

# As the console script runs `main`, saying "recording" on stderr as the answer is about to be
# written: the test's SIGINT comes while the write waits for the lock.
_SCRIPT = """
import sys
import signoff._runtime
from signoff.cli import main

respond = signoff._runtime.Runtime.respond

async def announced(self, *args, **kwargs):
    print("recording", file=sys.stderr, flush=True)
    return await respond(self, *args, **kwargs)

signoff._runtime.Runtime.respond = announced
sys.argv = ["signoff", *sys.argv[1:]]
sys.exit(main())
"""

# As the console script runs `main`, saying "waiting" on stderr as a store's set-up is about to
# wait inside SQLite for the file's lock (counted by `waiting_for_lock`): the test's SIGINT comes
# while the upgrade waits, however long the interpreter took to start and import.
_UPGRADE_SCRIPT = """
import sys
from signoff.stores.sqlite import _transactions
from signoff.cli import main

begin = _transactions._begin

def announced(conn):
    if _transactions.waiting_for_lock():
        print("waiting", file=sys.stderr, flush=True)
    return begin(conn)

_transactions._begin = announced
sys.argv = ["signoff", *sys.argv[1:]]
sys.exit(main())
"""


@contextlib.contextmanager
def _write_locked(url: str) -> Iterator[None]:
    """Hold the store's writes back from another connection (another process's long write)."""
    if url.startswith("sqlite:///"):
        holder = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            yield
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        return
    with psycopg.connect(url, autocommit=True) as pg:
        pg.execute("BEGIN")
        pg.execute(
            "LOCK TABLE signoff.requests, signoff.sessions, signoff.events IN EXCLUSIVE MODE"
        )
        try:
            yield
        finally:
            pg.execute("ROLLBACK")


def _status(url: str, request_id: str) -> str:
    async def read() -> str:
        async with so.Runtime([], store=url) as rt:
            stored = await rt.store.get_request(request_id)
            assert stored is not None
            return stored.status

    return asyncio.run(read())


def test_ctrl_c_while_an_answer_waits_on_a_locked_store_ends_at_once(store_url: str) -> None:
    """On SQLite the Ctrl-C went unseen until the busy timeout ran out: 30 s later the command
    exited 1 with `StoreError: ... database is locked`, as if nothing had been typed. The write
    waits on the event loop now, where the Ctrl-C cancels it as it does on PostgreSQL."""
    _, request_id = park(store_url)
    with _write_locked(store_url):
        argv = [sys.executable, "-c", _SCRIPT, "approve", request_id, "--store", store_url]
        status, out, err, took = ctrl_c_timed(argv, "recording\n", cwd=ROOT, timeout=60)
    assert status == 130, err
    assert took < 10, took
    assert out == ""
    assert err == f"interrupted: {request_id} is still pending\n", err
    assert _status(store_url, request_id) == "pending"


def test_a_ctrl_c_stops_an_idle_worker_whose_claim_waits_on_a_locked_sqlite_store(
    tmp_path: Path,
) -> None:
    """An idle worker's claim waiting for another process's lock: its first Ctrl-C, a graceful
    stop, waited for that claim (up to the busy timeout, 30 s), and a second one was needed. It
    cuts the claim short: exit 0 within a second or so, nothing written."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    park(url)
    argv = [sys.executable, "-m", "signoff", "worker", "tests._cli:agent", "--store", url]
    with _write_locked(url):
        proc = _worker(argv)
        try:
            assert proc.stderr is not None
            started = proc.stderr.readline()
            assert "signoff.worker: worker " in started, started + proc.stderr.read()
            time.sleep(2)  # its first claim waits on the lock
            pressed = time.monotonic()
            proc.send_signal(signal.SIGINT)
            rest = proc.communicate(timeout=60)[1]
            took = time.monotonic() - pressed
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert proc.returncode == 0, rest
    assert took < 5, took
    assert "Traceback" not in rest and rest.endswith("worker stopped\n"), rest


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_second_signal_stops_a_worker_held_in_a_locked_sqlite_store_at_once(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """A worker stops on its first Ctrl-C or SIGTERM after its running turns, and at once on a
    second: with the turn it cuts short giving its lease back on the store another process holds
    locked (on the event loop, up to the busy timeout), the second Ctrl-C was not seen for 30 s,
    and two SIGTERMs (a supervisor's stop) did not end it in a minute."""
    _two_signals_while_napping(tmp_path, ["worker"], signum)


def _worker(argv: list[str]) -> subprocess.Popen[str]:
    """`signoff worker` started as from a shell, its log on a pipe."""
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as at a shell
    )


def test_ctrl_c_while_an_upgrade_waits_on_a_locked_file_ends_it_at_once_unwritten(
    tmp_path: Path,
) -> None:
    """An upgrade waits for the file's lock inside SQLite, in a thread: the Ctrl-C printed
    "interrupted" only once the other process let go (up to 30 s), and the upgrade committed
    after all, locking out the older processes. It ends at once, the file as it was."""
    fixture = ROOT / "tests" / "fixtures" / "upgrade" / "sqlite-c6a7afd.db"
    db = tmp_path / "state.db"
    db.write_bytes(fixture.read_bytes())
    before = db.read_bytes()
    url = f"sqlite:///{db}"
    argv = [sys.executable, "-c", _UPGRADE_SCRIPT, "db", "upgrade", "--store", url]
    with _write_locked(url):
        status, out, err, took = ctrl_c_timed(argv, "waiting\n", cwd=ROOT, timeout=60)
    assert status == 130, err
    assert took < 10, took
    assert out == "" and "Traceback" not in err
    assert err.endswith("what this command was writing is not recorded\n"), err
    with contextlib.closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("3",)
    assert db.read_bytes() == before


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_second_signal_stops_serve_held_in_a_locked_sqlite_store_at_once(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """`serve`'s second signal, Ctrl-C or SIGTERM, while its in-process worker's turn it cuts
    short gives its lease back on a SQLite file another process holds locked: the lifespan's
    shutdown waited for that give-back (the busy timeout, then again as the runtime closed), so
    the server ran on past a minute. It ends at once, as a worker's second signal does."""
    _two_signals_while_napping(tmp_path, ["serve", "--port", "0"], signum)


def _two_signals_while_napping(tmp_path: Path, command: list[str], signum: signal.Signals) -> None:
    """Run `signoff COMMAND` on a napping turn, then send two `signum`s a second apart while
    another process holds the store's file locked: it must exit 130 within 10 s, saying what
    it was writing is not recorded, with no traceback."""
    url = f"sqlite:///{tmp_path / 'state.db'}"
    rt = so.Runtime([napper], store=url, inline=False)
    try:
        session_id = rt.generate_sync("napper", "Take a nap").session_id
    finally:
        rt.close_sync()
    name, *options = command
    argv = [sys.executable, "-m", "signoff", name, "tests.test_cli_interrupts:napper", *options]
    proc = _worker([*argv, "--store", url])
    try:
        deadline = time.monotonic() + 30
        while "tool.started" not in [e.type for e in log(url, session_id)]:
            assert time.monotonic() < deadline and proc.poll() is None, "the nap never began"
            time.sleep(0.05)
        with _write_locked(url):
            proc.send_signal(signum)  # it waits for the nap (60 s)
            time.sleep(1)
            pressed = time.monotonic()
            proc.send_signal(signum)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
            took = time.monotonic() - pressed
    finally:
        if proc.poll() is None:
            proc.kill()
        rest = proc.communicate()[1]
    assert proc.returncode == 130, rest
    assert took < 10, took
    assert "Traceback" not in rest
    assert rest.endswith("what this command was writing is not recorded\n"), rest
