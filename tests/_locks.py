"""Other processes on one SQLite file, for the tests of processes sharing it: one that holds the
write lock until told to let go, one that keeps the file open until told to close it, and several
that open a new file at the same moment."""

from __future__ import annotations

import multiprocessing
import multiprocessing.synchronize
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["NEW_TABLE", "STORE_ROW", "Holder", "Keeper", "holding", "kept_open", "open_together"]

NEW_TABLE = "CREATE TABLE IF NOT EXISTS other (x); INSERT INTO other VALUES (1)"
"""A write that makes a new file in rollback-journal mode (not WAL yet)."""

STORE_ROW = "UPDATE sessions SET updated_at = updated_at"
"""A write to a store's session rows, which leaves them as they were."""

_HOLD = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
create, _, write = sys.argv[2].rpartition(";")
if create:
    conn.execute(create)
conn.execute("BEGIN IMMEDIATE")
conn.execute(write)
print("holding", flush=True)
sys.stdin.readline()
conn.execute("COMMIT")
conn.close()
print("released", flush=True)
"""


class Holder:
    """Another process holding the write lock of a SQLite file (after `sql`) until `release()`."""

    def __init__(self, path: Path, sql: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLD, str(path), sql],
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


_KEEP = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
print("open", flush=True)
sys.stdin.readline()
conn.close()
print("closed", flush=True)
"""


class Keeper:
    """Another process with a SQLite file in WAL mode open (its -wal and -shm made if missing)
    until `close()`: meanwhile no other connection's close folds the WAL or deletes them."""

    def __init__(self, path: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _KEEP, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "open"

    def close(self) -> None:
        """Close its connection; the file's last (no reader elsewhere) folds the WAL into the
        file and deletes both."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "closed"


def _ended(proc: subprocess.Popen[str]) -> None:
    """Kill `proc` if it still runs, and close its pipes."""
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


@contextmanager
def holding(path: Path, sql: str = NEW_TABLE) -> Iterator[Holder]:
    """A `Holder` of `path`'s write lock, killed on the way out if it still holds it."""
    holder = Holder(path, sql)
    try:
        yield holder
    finally:
        _ended(holder.proc)


@contextmanager
def kept_open(path: Path) -> Iterator[Keeper]:
    """A `Keeper` of `path`, killed on the way out if it still has it open."""
    keeper = Keeper(path)
    try:
        yield keeper
    finally:
        _ended(keeper.proc)


def _at_once(
    open_at: Callable[[str], None], path: str, barrier: multiprocessing.synchronize.Barrier
) -> None:
    barrier.wait()
    open_at(path)


def open_together(open_at: Callable[[str], None], paths: list[str], n: int = 6) -> None:
    """For each of `paths` (a new file), `n` forked processes call `open_at` on it at the same
    moment; every one of them must exit 0."""
    ctx = multiprocessing.get_context("fork")
    for trial, path in enumerate(paths):
        barrier = ctx.Barrier(n)
        procs = [ctx.Process(target=_at_once, args=(open_at, path, barrier)) for _ in range(n)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=30)
        assert [p.exitcode for p in procs] == [0] * n, f"trial {trial}"
