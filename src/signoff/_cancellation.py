"""What cancelling a turn records (`Runtime.cancel`): its open requests withdrawn, then the
cancellation itself, which leaves the session waiting for its next message."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ._types import InputRequest
from .stores import Resolve

__all__ = ["cancel_specs", "stop_calls", "withdrawal"]


def cancel_specs(
    pending: Sequence[InputRequest], reason: str | None, by: dict[str, Any] | None
) -> list[Any]:
    """The events of a turn's cancellation by `by`: its open requests withdrawn, then the
    cancellation."""
    specs: list[Any] = [
        (
            "input.resolved",
            {
                "request_id": r.id,
                "outcome": "cancelled",
                "status": "withdrawn",
                "reason": "turn cancelled",
                "by": by,
            },
        )
        for r in pending
    ]
    return [*specs, ("turn.cancelled", {"reason": reason, "by": by}), ("session.waiting", {})]


def withdrawal(request_id: str, by: dict[str, Any] | None) -> Resolve:
    """The store's record of an open request the cancellation withdrew."""
    resolution = {"outcome": "cancelled", "reason": "turn cancelled", "by": by}
    return Resolve(
        request_id=request_id, status="withdrawn", outcome="cancelled", resolution=resolution
    )


def stop_calls(abort: asyncio.Event) -> None:
    """Set a session's abort signal, which the tool bodies of its drive wait on, from any thread:
    a `*_sync` call runs on a loop of its own, and an event set there wakes a body waiting on
    another loop only at that loop's next timer (seconds later, or never)."""
    loop: asyncio.AbstractEventLoop | None = getattr(abort, "_loop", None)  # its waiters' loop
    try:
        here = asyncio.get_running_loop()
    except RuntimeError:
        here = None
    if loop is None or loop is here or loop.is_closed() or not loop.is_running():
        abort.set()
    else:
        loop.call_soon_threadsafe(abort.set)
