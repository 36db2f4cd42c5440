"""Reading a `signoff serve` child's stderr in the tests that signal it: its start, a line it
prints, and all it prints once it stops.

Only what serve does is timed. Its start (importing ~1,000 modules, about a second of CPU) and
its interpreter's teardown after a Ctrl-C (about 0.3 s of CPU) are not: a machine under load
slows them tenfold and more (30 s and 10 s were seen), whatever serve does. A child that hangs
there fails by pytest's timeout."""

from __future__ import annotations

import asyncio
import subprocess
import threading

__all__ = ["FINISHED", "STARTED", "ended", "line", "started", "stopped"]

STARTED = "Application startup complete"
"""Uvicorn's line once the app's lifespan started and the server listens."""

FINISHED = "Finished server process"
"""Uvicorn's line once its shutdown ended (the app's lifespan's with it, which waits for the
turns the app drives, and serve's forced stop, which cuts them short): serve has stopped, and
only the interpreter's exit is left."""

STOP_WITHIN = 10.0
"""Seconds a stop (the second signal's) may take to finish serving."""


async def started(child: asyncio.subprocess.Process) -> None:
    """Read `child`'s stderr up to uvicorn's start line, however long its start takes; it ending
    first fails the test."""
    assert child.stderr is not None
    while True:
        got = (await child.stderr.readline()).decode()
        assert got, f"it ended before printing {STARTED!r}"
        if STARTED in got:
            return


async def line(child: asyncio.subprocess.Process, text: str) -> None:
    """Read `child`'s stderr up to a line holding `text`; it ending first fails the test."""
    assert child.stderr is not None
    while True:
        got = (await asyncio.wait_for(child.stderr.readline(), 30)).decode()
        assert got, f"it ended before printing {text!r}"
        if text in got:
            return


async def ended(child: asyncio.subprocess.Process) -> str | None:
    """`child`'s stderr to its end, once it finished serving (or ended) within 10 s; None if it
    still serves then. Its exit after that is waited for, however long it takes."""
    assert child.stderr is not None
    stderr = child.stderr
    read: list[str] = []

    async def finishing() -> None:
        while got := (await stderr.readline()).decode():
            read.append(got)
            if FINISHED in got:
                return

    try:
        await asyncio.wait_for(finishing(), STOP_WITHIN)
    except TimeoutError:
        return None
    return "".join(read) + (await child.communicate())[1].decode()


def stopped(proc: subprocess.Popen[str]) -> str | None:
    """`ended` for a child run by `subprocess.Popen` (its stderr a text pipe)."""
    assert proc.stderr is not None
    stderr = proc.stderr
    read: list[str] = []

    def finishing() -> None:
        for got in stderr:
            read.append(got)
            if FINISHED in got:
                return

    reader = threading.Thread(target=finishing, daemon=True)  # ends at the child's end
    reader.start()
    reader.join(STOP_WITHIN)
    if reader.is_alive():
        return None
    return "".join(read) + proc.communicate()[1]
