"""How many event streams one caller may hold open in this process at once.

Each open stream polls the store for as long as its client keeps the connection, so a caller
opening streams without end (a loop, a client that never reads) made the store serve them all.
A caller past the bound is refused (429 `too_many_streams`) until one of its streams ends; the
slot is given back however a stream ends (closed by the client, by the server, cancelled).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from .._exceptions import UsageError
from .._idempotency import caller_parts
from .._types import Principal
from ._errors import ApiError

__all__ = ["MAX_STREAMS", "HeldStream", "StreamSlots", "max_streams_of"]

MAX_STREAMS = 100
"""Open streams one caller may hold in a process by default (`create_app(max_streams=)`): the
Python client follows at most 100 at once too (its connection pool)."""


def max_streams_of(value: object) -> int:
    """`value` as a bound on a caller's open streams: a whole number from 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"max_streams must be a whole number from 1, not {value!r}")
    return value


class StreamSlots:
    """The streams each caller holds open in this process, bounded per caller."""

    def __init__(self, per_caller: int, retry_after: int) -> None:
        self.per_caller = per_caller
        self.retry_after = retry_after
        self._held: dict[tuple[str, ...], int] = {}

    def held(self, principal: Principal) -> int:
        return self._held.get(caller_parts(principal), 0)

    def total(self) -> int:
        """The streams open in this process, every caller's."""
        return sum(self._held.values())

    def take(self, principal: Principal) -> Callable[[], None]:
        """A slot for one more stream of `principal`, and the function giving it back (once);
        429 `too_many_streams` when the caller holds all of theirs."""
        key = caller_parts(principal)
        held = self._held.get(key, 0)
        if held >= self.per_caller:
            raise ApiError(
                429,
                "too_many_streams",
                f"you hold {held} event streams open on this server, as many as it serves one "
                "caller: close one (or follow more sessions from fewer streams) and try again",
                headers={"Retry-After": str(self.retry_after)},
            )
        self._held[key] = held + 1
        given_back = False

        def release() -> None:
            nonlocal given_back
            if given_back:
                return
            given_back = True
            left = self._held.get(key, 1) - 1
            if left > 0:
                self._held[key] = left
            else:
                self._held.pop(key, None)

        return release


class HeldStream(StreamingResponse):
    """A streamed response that gives its stream slot back when it ends, however it ends: its
    generator may never start (the client gone first), so its own `finally` cannot."""

    def __init__(
        self,
        content: AsyncIterator[str],
        release: Callable[[], None],
        *,
        media_type: str,
        headers: dict[str, str],
    ) -> None:
        super().__init__(content, media_type=media_type, headers=headers)
        self._release = release

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._release()
