"""Waiting on a store call without being held by it: a database host that froze holds a call
for its timeout, and cancelling it can take as long again (psycopg asks the server to cancel the
query, which waits out its `connect_timeout`), so a probe or a stream gives up on the call
instead of waiting for it to wind down."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any, TypeVar

__all__ = ["drop", "within"]

T = TypeVar("T")


def drop(task: asyncio.Future[Any]) -> None:
    """Cancel `task` if it still runs, without waiting for it; an error it ended with is not
    logged as unretrieved."""
    if task.done():
        if not task.cancelled():
            task.exception()
        return
    task.cancel()
    task.add_done_callback(lambda done: done.cancelled() or done.exception())


async def within(call: Awaitable[T], seconds: float) -> T:
    """What `call` returns, or a `TimeoutError` once `seconds` have passed; the call is then
    cancelled and left to wind down by itself."""
    task = asyncio.ensure_future(call)
    try:
        await asyncio.wait((task,), timeout=seconds)
    finally:
        drop(task)
    if not task.done():
        raise TimeoutError
    return task.result()
