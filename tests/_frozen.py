"""Frozen processes for the SIGSTOP tests: a child stops itself (SIGSTOP) at a chosen point,
having written its pid to a file, and the parent waits until it is really stopped, works on
the store meanwhile, then wakes it (SIGCONT)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

__all__ = ["is_stopped", "stopped_child", "wake"]


def is_stopped(pid: int) -> bool:
    """Whether process `pid` is stopped by a signal (state T in /proc)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] in ("T", "t")


async def _stopped(pid_file: Path, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while True:
        text = pid_file.read_text() if pid_file.exists() else ""
        if text.strip() and is_stopped(int(text)):
            return int(text)
        if time.monotonic() > deadline:
            raise AssertionError(f"no process stopped itself within {timeout}s ({text!r})")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def stopped_child(pid_file: Path, timeout: float = 20.0) -> AsyncIterator[int]:
    """The pid of the child that wrote `pid_file` and stopped itself, once it is stopped; it is
    woken when the block ends, whatever happened in it."""
    pid = await _stopped(pid_file, timeout)
    try:
        yield pid
    finally:
        wake(pid)


def wake(pid: int) -> None:
    """SIGCONT, if the process is still there."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
