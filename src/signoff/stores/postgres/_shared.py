"""A task that the calls of one event loop asking for the same thing at the same time share: the
first starts it, the others wait on it. The outage probe (`Outage`) and the pool's test after a
lost connection (`Transactions._after_loss`) are each one such task."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

__all__ = ["settle", "shared"]


def shared(
    task: asyncio.Future[None] | None, start: Callable[[], Coroutine[Any, Any, None]]
) -> asyncio.Future[None]:
    """`task` if it is still running on this event loop, else a new task of `start()` (a future
    of another loop's task would not wake this one); the caller keeps it for the next call."""
    if task is None or task.done() or task.get_loop() is not asyncio.get_running_loop():
        task = asyncio.ensure_future(start())
        task.add_done_callback(_seen)
    return task


def _seen(task: asyncio.Future[None]) -> None:
    """A shared task ended: its failure is for the calls that waited on it to read (or to pass
    over), not for asyncio's log of exceptions never retrieved."""
    if not task.cancelled():
        task.exception()


async def settle(task: asyncio.Future[Any]) -> None:
    """Cancel `task` and wait for it to end: on this loop if it is this loop's; if it is another
    running loop's, the cancel is sent there and not waited for (its completion would never
    wake this loop); a stopped loop's task ends with that loop."""
    there = task.get_loop()
    if there is asyncio.get_running_loop():
        task.cancel()
        await asyncio.wait({task})
        return
    with contextlib.suppress(RuntimeError):  # that loop is closed
        there.call_soon_threadsafe(task.cancel)
