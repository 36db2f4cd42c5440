"""Reading a `signoff serve` child's stderr in the tests that signal it: a line it prints, and
all it prints once it ends."""

from __future__ import annotations

import asyncio

__all__ = ["ended", "line"]


async def line(child: asyncio.subprocess.Process, text: str) -> None:
    """Read `child`'s stderr up to a line holding `text`; it ending first fails the test."""
    assert child.stderr is not None
    while True:
        got = (await asyncio.wait_for(child.stderr.readline(), 30)).decode()
        assert got, f"it ended before printing {text!r}"
        if text in got:
            return


async def ended(child: asyncio.subprocess.Process) -> str | None:
    """`child`'s stderr to its end, once it ends within 10 s; None if it still runs then."""
    try:
        return (await asyncio.wait_for(child.communicate(), 10))[1].decode()
    except TimeoutError:
        return None
