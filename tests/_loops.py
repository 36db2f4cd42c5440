"""An event loop running in a thread of its own, as a runtime's `*_sync` bridge runs: for tests
of what one store or runtime does when two loops use it at once."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

__all__ = ["other_loop"]


@contextlib.asynccontextmanager
async def other_loop() -> AsyncIterator[asyncio.AbstractEventLoop]:
    """A loop running in another thread while the block runs; stopped, joined and closed after."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        await asyncio.to_thread(thread.join, 10)
        loop.close()
