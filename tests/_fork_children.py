"""What the fork tests of SQLite files (a store's, a channel state's) share: a child started by
multiprocessing that sends what it did through a pipe, and the files a process has open."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from multiprocessing.connection import Connection as Pipe
from typing import Any

import signoff as so

__all__ = ["FORK", "ended", "in_child", "open_files", "try_to"]

FORK = multiprocessing.get_context("fork")


def try_to(out: Pipe, call: Callable[[], Any]) -> None:
    """Send what `call` did: "done", or its error's class and message."""
    try:
        call()
        out.send(("done", ""))
    except so.SignoffError as exc:
        out.send((type(exc).__name__, str(exc)))


def open_files() -> set[str]:
    """The files this process has open."""
    found = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.add(os.readlink(f"/proc/self/fd/{fd}"))
        except FileNotFoundError:  # the listing's own descriptor, closed since
            pass
    return found


def in_child(target: Callable[..., None], *args: Any, ctx: Any = FORK) -> list[tuple[str, str]]:
    """Run `target(*args, pipe)` in a child started by `ctx`; what it sent."""
    read, write = ctx.Pipe(duplex=False)
    child = ctx.Process(target=target, args=(*args, write))
    child.start()
    write.close()
    sent = []
    try:
        while True:
            sent.append(read.recv())
    except EOFError:
        pass
    child.join(timeout=60)
    assert child.exitcode == 0
    return sent


def ended(child: Any) -> int | None:
    """`child`'s exit code once it ended, killing it if it has not within 30 s (a hung one)."""
    child.join(timeout=30)
    if child.is_alive():
        child.kill()
        child.join()
    code: int | None = child.exitcode
    return code
