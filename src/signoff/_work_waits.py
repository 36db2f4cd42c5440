"""What a worker (`Workers.work`) waits with: retries logged once while the store fails, sleeps
and store calls that a stop cuts short, and a PostgreSQL pool grown to its turns."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from ._exceptions import StoreError

if TYPE_CHECKING:
    from .stores import Store

__all__ = ["Failing", "Stopped", "fit_pool", "sleep_unless", "unless_stopped"]

log = logging.getLogger("signoff.worker")

LONGEST_RETRY = 5.0  # seconds: the longest a worker waits between claims while they fail


class Failing:
    """A call repeated (a worker's claims and sweeps, a channel hub's reading of the trail) while
    the store fails it: logged when it starts failing and when it works again, not at every
    try, and retried less and less often."""

    def __init__(self, what: str, logger: logging.Logger = log) -> None:
        self.what = what
        self.log = logger
        self.since: float | None = None  # `time.monotonic()` of the first failure in a row
        self.backoff = 0.0

    def failed(self, exc: StoreError, first_wait: float) -> float:
        """Note a failure; returns the seconds to wait before the next try."""
        if self.since is None:
            self.since = time.monotonic()
            self.log.warning("%s failed, retrying (logged again once it works): %s", self.what, exc)
        else:
            self.log.debug("%s failed again: %s", self.what, exc)
        self.backoff = min(max(first_wait, self.backoff * 2), LONGEST_RETRY)
        return self.backoff

    def worked(self) -> None:
        if self.since is not None:
            self.log.info(
                "%s works again (it failed for %.1fs)", self.what, time.monotonic() - self.since
            )
        self.since = None
        self.backoff = 0.0


async def sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less if `stop` is set meanwhile."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(seconds):
            await stop.wait()


class Stopped(Exception):
    """An `unless_stopped` block was cut short: its worker was told to stop."""


@contextlib.asynccontextmanager
async def unless_stopped(stop: asyncio.Event) -> AsyncIterator[None]:
    """Run the block unless `stop` is set first, else raise `Stopped`: the block is cancelled
    where it waits (a claim or a sweep on a store that does not answer, its file locked or its
    server down), so an idle worker told to stop returns at once, not once the store answers."""
    if stop.is_set():
        raise Stopped
    loop = asyncio.get_running_loop()
    cut = asyncio.timeout(None)
    inside = False

    def cut_now(_: object) -> None:
        if inside and not waiter.cancelled():
            cut.reschedule(loop.time())

    waiter = asyncio.ensure_future(stop.wait())
    waiter.add_done_callback(cut_now)
    try:
        async with cut:
            inside = True
            try:
                yield
            finally:
                inside = False
    except TimeoutError:
        if cut.expired():
            raise Stopped from None
        raise
    finally:
        waiter.cancel()


POOL_SPARE = 2
"""Pooled connections a worker needs beside one per turn: its claims and sweeps, a renewal."""


async def fit_pool(store: Store, concurrency: int) -> None:
    """Grow a PostgreSQL store's pool to the worker's turns at once (`fit_pool`); a `pool_max`
    set below that is kept, and named: turns would wait on the pool for connections, and one
    waiting `pool_timeout` fails saying all were in use."""
    fit = getattr(store, "fit_pool", None)
    if fit is None:  # SQLite: no pool
        return
    wanted = concurrency + POOL_SPARE
    before, after = await fit(wanted)
    if after > before:
        log.info("PostgreSQL pool_max %d -> %d for concurrency %d", before, after, concurrency)
    elif after < wanted:
        log.warning(
            "concurrency %d needs %d PostgreSQL connections, but the store URL sets pool_max=%d: "
            "turns will wait for one (and fail after pool_timeout if none comes); raise "
            "pool_max or lower the concurrency",
            concurrency,
            wanted,
            after,
        )
