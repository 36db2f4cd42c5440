"""What cancelling a turn records (`Runtime.cancel`): its open requests withdrawn, then the
cancellation itself, which leaves the session waiting for its next message."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from ._types import InputRequest
from .stores import Resolve

__all__ = ["cancel_specs", "stop_calls", "withdrawal"]


def _withdrawn_because(reason: str | None) -> str:
    """The reason an open request of a cancelled turn closed: the cancel's own, when it gave
    one, which the audit trail of requests shows (the turn's event alone had it)."""
    return f"turn cancelled: {reason}" if reason else "turn cancelled"


def cancel_specs(
    pending: Sequence[InputRequest],
    reason: str | None,
    by: dict[str, Any] | None,
    children: Sequence[str] = (),
) -> list[Any]:
    """The events of a turn's cancellation by `by`: its open requests withdrawn, then the
    cancellation, naming the `children` its delegate calls created and did not journal (owed,
    as the journaled ones are, for their spend)."""
    specs: list[Any] = [
        (
            "input.resolved",
            {
                "request_id": r.id,
                "outcome": "cancelled",
                "status": "withdrawn",
                "reason": _withdrawn_because(reason),
                "by": by,
            },
        )
        for r in pending
    ]
    cancelled: dict[str, Any] = {"reason": reason, "by": by}
    if children:
        cancelled["children"] = list(children)
    return [*specs, ("turn.cancelled", cancelled), ("session.waiting", {})]


def withdrawal(request_id: str, reason: str | None, by: dict[str, Any] | None) -> Resolve:
    """The store's record of an open request the cancellation withdrew."""
    resolution = {"outcome": "cancelled", "reason": _withdrawn_because(reason), "by": by}
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
