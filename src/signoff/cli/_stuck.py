"""Ctrl-C (or a `worker`'s or `serve`'s second SIGTERM) for a command held by a SQLite file
another process holds locked: a write to it waits up to the busy timeout (30 s), on the event
loop, where a Ctrl-C cancels it like any other wait, unless what waits is out of reach of a
cancel (a turn a forced stop cut short giving its lease back) or a call into SQLite itself (a
store opening) holds the main thread, where no Python signal handler runs until it returns.

A thread watches the interpreter's signal wakeup pipe, which is written to the moment a signal
arrives; when a SQLite store call then still waits for the lock, or the main thread stays in one
call into the SQLite store, the command ends here with status 130. What that call waited to
write is not written.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Collection, Iterator

from ..stores.sqlite import waiting_for_lock

__all__ = ["ctrl_c_in_sqlite"]

_STUCK_FOR = 1.0
"""Seconds the main thread may stay in one SQLite call after a Ctrl-C before the command ends."""

# As the code objects name it: the path the package was imported from, symlinks and all.
_SQLITE_STORE = os.path.join(os.path.dirname(os.path.dirname(__file__)), "stores", "sqlite", "")


@contextlib.contextmanager
def ctrl_c_in_sqlite(
    presses: int = 1, *, stops: Collection[int] = (signal.SIGINT,)
) -> Iterator[None]:
    """While inside, the `presses`th signal of `stops` (and each after it) that finds the main
    thread held in a SQLite store call ends the process with status 130 and one line (`worker`
    and `serve` stop on their first Ctrl-C or SIGTERM cleanly, at their second at once). A
    wakeup fd set already (asyncio's, which dispatches the loop's signal handlers by it) gets
    each byte."""
    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        yield
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    previous = signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    done = threading.Event()
    watcher = threading.Thread(
        target=_watch,
        args=(read_end, previous, threading.main_thread().ident, done, presses, stops),
        name="signoff-ctrl-c",
        daemon=True,
    )
    watcher.start()
    try:
        yield
    finally:
        done.set()
        signal.set_wakeup_fd(previous)
        os.close(write_end)  # the watcher reads the end and stops
        watcher.join(timeout=1)


def _watch(
    read_end: int,
    previous: int,
    main: int | None,
    done: threading.Event,
    presses: int,
    stops: Collection[int],
) -> None:
    """Read signal numbers off the wakeup pipe until it closes, passing them on; from the
    `presses`th signal of `stops`, end the process if the main thread stays in one SQLite store
    call for `_STUCK_FOR` seconds."""
    pressed = 0
    try:
        while got := os.read(read_end, 512):
            if previous != -1:
                with contextlib.suppress(OSError):
                    os.write(previous, got)
            counted = sum(got.count(signum) for signum in stops)
            pressed += counted
            if pressed >= presses and counted and _held(main, done):
                _end()
    finally:
        os.close(read_end)


def _held(main: int | None, done: threading.Event) -> bool:
    """Whether, for `_STUCK_FOR` seconds, a SQLite store call waits for another connection's
    lock, or the main thread stays in one call (at one instruction of one frame) that is the
    SQLite store's; False once `done` is set."""
    frame, at, since = None, -1, time.monotonic()
    locked_since = None
    while not done.wait(0.05):
        now = time.monotonic()
        if not waiting_for_lock():
            locked_since = None
        elif locked_since is None:
            locked_since = now
        elif now - locked_since >= _STUCK_FOR:
            return True
        top = None if main is None else sys._current_frames().get(main)
        if top is None:
            return False
        if top is not frame or top.f_lasti != at:
            frame, at, since = top, top.f_lasti, now
        elif now - since >= _STUCK_FOR:
            return top.f_code.co_filename.startswith(_SQLITE_STORE)
    return False


def _end() -> None:
    """Say why the command stops, flush what it printed, and exit 130 as a Ctrl-C does."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    say = (
        "interrupted while waiting for the SQLite store (another process holding it locked "
        "makes a write wait up to its busy timeout): what this command was writing is not "
        "recorded\n"
    )
    with contextlib.suppress(OSError):
        os.write(2, say.encode())
    os._exit(130)
