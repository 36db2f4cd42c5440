"""What a SQLite transaction killed halfway left on disk, for the tests that kill a process inside
one: child processes whose connections spill a transaction's pages to the WAL as it runs, and a
reader of the WAL's frames that shows they were written and never committed."""

from __future__ import annotations

import struct
from pathlib import Path

__all__ = ["SPILL", "uncommitted_frames"]

SPILL = '''
import functools as _functools, os as _os, signal as _signal, sqlite3 as _sqlite3, sys as _sys

def die():
    """Print the WAL's size (what the transaction wrote so far, checked on disk after), then
    SIGKILL this process; the database file is `sys.argv[1]`."""
    print(_os.path.getsize(_sys.argv[1] + "-wal"), flush=True)
    _os.kill(_os.getpid(), _signal.SIGKILL)

def at_commit(conn):
    """What the child does just before a COMMIT, inside the transaction; it may define its own."""

class _Spilling(_sqlite3.Connection):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Two pages of cache: a transaction's pages go to the WAL as it runs, not at its commit.
        super().execute("PRAGMA cache_size=2")

    def execute(self, sql, *args):
        if sql == "COMMIT":
            at_commit(self)
        return super().execute(sql, *args)

_sqlite3.connect = _functools.partial(_sqlite3.connect, factory=_Spilling)
'''
"""Code a child process runs first: every `sqlite3` connection it opens after spills its pages
(SQLite's default cache of about 2 MB keeps a small transaction in memory until it commits, so
killing it would prove nothing), and calls `at_commit(conn)` before each `COMMIT`; `die()`
prints the WAL's size and kills the child."""


def uncommitted_frames(wal: Path, start: int = 0) -> int:
    """How many frames the WAL file `wal` holds from byte `start` on (a frame boundary: 0, or
    its size before the transaction began); fails unless there is at least one, all are of the
    WAL's current generation (not left from before it was last restarted) and none commits."""
    data = wal.read_bytes()
    assert len(data) >= 32, f"{wal} holds no WAL header: nothing reached it"
    (page_size,) = struct.unpack(">I", data[8:12])
    salt = data[16:24]
    frame = 24 + page_size
    start = max(start, 32)
    assert (len(data) - start) % frame == 0 and (start - 32) % frame == 0, (start, len(data))
    count = 0
    for at in range(start, len(data), frame):
        (commit,) = struct.unpack(">I", data[at + 4 : at + 8])
        assert commit == 0, f"the frame at byte {at} commits a transaction"
        # SQLite zeroes the salt of frames after one the transaction rewrote, until it commits.
        assert data[at + 8 : at + 16] in (salt, bytes(8)), f"the frame at {at} is of an older WAL"
        count += 1
    assert count > 0, f"no frame in {wal} after byte {start}: the transaction wrote nothing there"
    return count
