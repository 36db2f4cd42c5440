"""The runtime's public calls that its `close` stops: each call counted on its task while it
runs, refused once a close is under way, and, cancelled by that close, raising `UsageError`
rather than `CancelledError` (its own caller did not cancel it)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Coroutine, Iterator
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, TypeVar

from ._exceptions import UsageError

if TYPE_CHECKING:
    from ._session_cache import SessionCache

__all__ = ["CLOSED_MIDWAY", "CLOSING", "closes_stop", "closes_begun", "running", "since_close"]

P = ParamSpec("P")
T = TypeVar("T")
C = TypeVar("C", bound="SessionCache")
CLOSED_MIDWAY = "the runtime or client was closed while this call ran"
CLOSING = (
    "the runtime is being closed: this call was not run; make it once close() has returned "
    "(the store is then opened again)"
)


def closes_stop(
    method: Callable[Concatenate[C, P], Coroutine[Any, Any, T]],
) -> Callable[Concatenate[C, P], Coroutine[Any, Any, T]]:
    """A public async call that `close` stops if it is still running (on another task, on any
    loop): cancelled, its lease given back, it raises `UsageError`. Left running, it would open
    the store again behind the close, and nothing would close it."""

    @functools.wraps(method)
    async def call(self: C, /, *args: P.args, **kwargs: P.kwargs) -> T:
        task = _entered(self)
        try:
            return await method(self, *args, **kwargs)
        except asyncio.CancelledError:
            if not _stopped(self, task):
                raise
            if not self._opened:  # unwound after the close (from a loop it blocked): reopened
                with contextlib.suppress(Exception):
                    await self.store.close()
            raise UsageError(CLOSED_MIDWAY) from None
        finally:
            _left(self, task)

    return call


@contextlib.contextmanager
def running(runtime: SessionCache, since: int | None = None) -> Iterator[None]:
    """Mark the block a call of `runtime` that its `close` stops (`closes_stop`); with `since`
    (`closes_begun`), one stretch of a call that spans its caller's code, refused once a
    close has begun since (`since_close`)."""
    if since is not None:
        since_close(runtime, since)
    task = _entered(runtime)
    try:
        yield
    except asyncio.CancelledError:
        if _stopped(runtime, task):
            raise UsageError(CLOSED_MIDWAY) from None
        raise
    finally:
        _left(runtime, task)


def closes_begun(runtime: SessionCache) -> int:
    """How many closes of `runtime` have begun: what a call that spans its caller's code (an
    `events` follower) takes at its start, to tell at each step whether one came since."""
    with runtime._per_session:
        return runtime._closes


def since_close(runtime: SessionCache, since: int) -> None:
    """Raise `UsageError` if `runtime` began a close after `closes_begun` gave `since`. A
    follower in its caller's code when `close` ran is no running call that close can stop:
    it went on reading, opening the store again behind the close (or after a later call
    opened it again) and following for ever."""
    with runtime._per_session:
        closed = runtime._closes != since
    if closed:
        raise UsageError(CLOSED_MIDWAY)


def _entered(runtime: SessionCache) -> asyncio.Task[Any]:
    """Count the running task a call of `runtime` (`closes_stop`); the task. A call begun while
    `close` is under way is refused: it ran on a store being closed under it, then opened it
    again behind the close (a connection or pool nothing closed). A call it makes is not."""
    task = asyncio.current_task()
    assert task is not None
    with runtime._per_session:
        if runtime._closing and task not in runtime._calls:
            raise UsageError(CLOSING)
        runtime._calls[task] = runtime._calls.get(task, 0) + 1
    return task


def _stopped(runtime: SessionCache, task: asyncio.Task[Any]) -> bool:
    """Whether `close` cancelled the call on `task` (its cancel then taken back: the call
    raises `UsageError`, not `CancelledError`, which would say its own caller cancelled it)."""
    with runtime._per_session:
        closed = runtime._stopped.pop(task, False)
    if closed:
        task.uncancel()
    return closed


def _left(runtime: SessionCache, task: asyncio.Task[Any]) -> None:
    """A call of `runtime` on `task` returned or raised."""
    with runtime._per_session:
        if runtime._calls[task] == 1:
            del runtime._calls[task]
            runtime._stopped.pop(task, None)  # one that ended before it saw the cancel
        else:
            runtime._calls[task] -= 1
