"""The app's own work beside its requests (the in-process workers, or the deadline sweep and
the turns it drives), and how a stopping `serve` ends it."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

__all__ = ["Background"]


class Background:
    """The tasks the app's lifespan runs beside the requests. They stop by the lifespan's stop
    event, set as the server begins to stop (`stopping`) or at the latest at its shutdown: the
    in-process workers claim no more and their turns finish or park; the deadline sweep sweeps
    no more, and its turns finish or park within `grace` seconds, else are cut short (at once
    by default: under an app's own uvicorn or TestClient no second signal would force the
    stop). A forced stop (a second Ctrl-C or SIGTERM) cancels them, their turns' leases given
    back: the lifespan's shutdown waits for them, and uvicorn waits for it, or skips it and
    ends the process without cancelling them."""

    def __init__(self) -> None:
        self.tasks: set[asyncio.Task[None]] = set()
        self.forced = False
        # Seconds a graceful stop waits for the turns the deadline sweep drives: set by `serve`,
        # whose second signal cuts the wait short; read as the lifespan starts.
        self.grace = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    def stop_event(self) -> asyncio.Event:
        """A new event for the tasks to stop by (one per lifespan), set once the server begins
        to stop (`stopping`): the workers claim and the sweep sweeps no more, and their turns
        finish or park."""
        self._stop = asyncio.Event()
        return self._stop

    def stopping(self) -> None:
        """The server begins to stop: set the tasks' stop event, so a draining server claims
        and sweeps no new turns while it waits for its connections, not only once they all
        closed."""
        if self._stop is not None:
            self._stop.set()

    def start(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Run `work` as a task of this, cancelled at once on a forced stop."""
        self._loop = asyncio.get_running_loop()
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        if self.forced:
            task.cancel()
        return task

    def cut_short(self) -> None:
        """Cancel the tasks (a forced stop); safe from a signal handler."""
        self.forced = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        for task in list(self.tasks):
            task.cancel()
