"""`ChannelState` shared by several processes, as two `signoff serve --channel-state` on one file
do: opening a new file together, and a lock held elsewhere. Each failure is a named
`StoreError`, never a raw `sqlite3` error."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import signoff as so
from signoff.channels import ChannelState

# Holds the write lock of a file (made in rollback-journal mode if new) until told to let go.
HOLD_WRITE_LOCK = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("CREATE TABLE IF NOT EXISTS other (x)")
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO other VALUES (1)")
print("holding", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
conn.close()
print("released", flush=True)
"""


class Holder:
    """Another process holding a lock on the file until `release()`."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLD_WRITE_LOCK, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "holding"

    def release(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "released"


@contextmanager
def holding(path: Path) -> Iterator[Holder]:
    holder = Holder(path)
    try:
        yield holder
    finally:
        proc = holder.proc
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()


def test_opening_waits_for_a_writer_elsewhere_instead_of_failing(tmp_path: Path) -> None:
    # SQLite refuses the switch to WAL at once while another process writes to a file not yet
    # in WAL, without its busy handler: the open must wait as a write would.
    path = tmp_path / "channels.db"
    with holding(path) as holder:
        opened: list[ChannelState] = []
        errors: list[BaseException] = []

        def open_it() -> None:
            try:
                opened.append(ChannelState(path, busy_timeout=10))
            except BaseException as exc:
                errors.append(exc)

        opener = threading.Thread(target=open_it)
        opener.start()
        opener.join(timeout=0.3)
        assert errors == [] and opener.is_alive(), errors
        holder.release()
        opener.join(timeout=10)
        assert not opener.is_alive() and errors == [], errors
    (state,) = opened
    state.set_position("hub:slack", 7)
    assert state.position("hub:slack") == 7
    state.close()


def _open_at(path: str, barrier: multiprocessing.synchronize.Barrier) -> None:
    barrier.wait()
    state = ChannelState(path)
    state.remember("slack", "msg:r1", {"ts": "1.2"})
    state.close()


def test_processes_opening_a_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    # Two `signoff serve --channel-state` (and more) started together on a file not there yet.
    ctx = multiprocessing.get_context("fork")
    n = 6
    for trial in range(40):
        path = str(tmp_path / f"channels-{trial}.db")
        barrier = ctx.Barrier(n)
        procs = [ctx.Process(target=_open_at, args=(path, barrier)) for _ in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=30)
        assert [p.exitcode for p in procs] == [0] * n, f"trial {trial}"


def test_a_write_locked_elsewhere_past_the_timeout_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "channels.db"
    state = ChannelState(path, busy_timeout=0.2)
    state.set_position("hub:slack", 1)
    state.remember("slack", "msg:r1", {"ts": "1.2"})
    with holding(path) as holder:
        with pytest.raises(so.StoreError, match=r"channel state .*save a position.*locked"):
            state.set_position("hub:slack", 2)
        with pytest.raises(so.StoreError, match=r"channel state .*save a memo.*locked"):
            state.remember("slack", "msg:r2", {"ts": "3.4"})
        with pytest.raises(so.StoreError, match=r"channel state .*delete a memo.*locked"):
            state.forget("slack", "msg:r1")
        assert state.position("hub:slack") == 1  # WAL: reads go on under another's write
        holder.release()
    state.set_position("hub:slack", 2)  # the lock is gone: it works again
    assert state.position("hub:slack") == 2
    assert state.recall("slack", "msg:r1") == {"ts": "1.2"}
    state.close()


def test_a_read_of_a_damaged_file_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "channels.db"
    state = ChannelState(path)
    state.set_position("hub:slack", 1)
    state.remember("slack", "msg:r1", {"ts": "1.2"})
    state.close()
    data = path.read_bytes()
    page = int.from_bytes(data[16:18], "big")  # the page size, from the header
    path.write_bytes(data[:page] + b"\xff" * (len(data) - page))  # the tables' pages ruined
    state = ChannelState(path)
    with pytest.raises(so.StoreError, match=r"channel state .*read a position"):
        state.position("hub:slack")
    with pytest.raises(so.StoreError, match=r"channel state .*read a memo"):
        state.recall("slack", "msg:r1")
    state.close()


def test_a_closed_state_is_a_store_error() -> None:
    state = ChannelState()
    state.close()
    with pytest.raises(so.StoreError, match="channel state"):
        state.position("hub:slack")
