"""Waiting for a database that is down when `signoff worker` or `signoff serve` starts, as
when it and the database start together: a store that is only unavailable is waited for, any
other store error still ends the command."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from .._exceptions import StoreUnavailable
from .._logs import one_line
from .._runtime import Runtime

__all__ = ["open_when_up"]

FIRST_WAIT = 0.5
LONGEST_WAIT = 5.0


async def open_when_up(runtime: Runtime, stop: asyncio.Event, say: Callable[[str], None]) -> bool:
    """Open `runtime`'s store, retrying (each wait longer, up to 5 s) while it raises
    `StoreUnavailable`, and telling `say` so each time; False if `stop` was set meanwhile."""
    wait = FIRST_WAIT
    waited = False
    while not stop.is_set():
        try:
            await runtime.open()
        except StoreUnavailable as exc:
            # A driver's message spans lines, and quotes the URL (escapes and all) as given.
            why = one_line(" ".join(str(exc).split()))
            say(f"waiting for the store (retrying in {wait:.1f}s): {why}")
            waited = True
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await stop.wait()
            wait = min(wait * 2, LONGEST_WAIT)
            continue
        if waited:
            say("the store is up")
        return True
    return False
