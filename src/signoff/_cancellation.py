"""What cancelling a turn records (`Runtime.cancel`): its open requests withdrawn, then the
cancellation itself, which leaves the session waiting for its next message."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextvars import ContextVar
from typing import Any

from ._events import CANCELLED, Event
from ._state_parts import load_principal
from ._types import InputRequest, Principal
from .stores import Resolve, Store

__all__ = [
    "cancel_specs",
    "cancelled_by",
    "cancelled_for_expiry",
    "expiring",
    "for_expiry",
    "stop_calls",
    "withdrawal",
]

expiring: ContextVar[frozenset[str]] = ContextVar("signoff_expiring", default=frozenset())
"""Child sessions whose delegated turn a cancel in this task ends because a session above them
passed its TTL: the cancel records what time did (`expiry` in its `turn.cancelled`)."""


def _withdrawn_because(reason: str | None) -> str:
    """The reason an open request of a cancelled turn closed: the cancel's own, when it gave
    one, which the audit trail of requests shows (the turn's event alone had it)."""
    return f"{CANCELLED}: {reason}" if reason else CANCELLED


def cancel_specs(
    pending: Sequence[InputRequest],
    reason: str | None,
    by: dict[str, Any] | None,
    children: Sequence[str] = (),
    *,
    expiry: bool = False,
) -> list[Any]:
    """The events of a turn's cancellation by `by`: its open requests withdrawn, then the
    cancellation, naming the `children` its delegate calls created and did not journal (owed,
    as the journaled ones are, for their spend), and marked `expiry` when a passed TTL above
    the session ends its delegated turn (no one did: `for_expiry`)."""
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
    if expiry:
        cancelled["expiry"] = True
    return [*specs, ("turn.cancelled", cancelled), ("session.waiting", {})]


def for_expiry(specs: Sequence[tuple[str, dict[str, Any]]]) -> bool:
    """Whether `specs` cancel a delegated turn because a session above it passed its TTL: a
    `turn.cancelled` marked `expiry` (`cancel_specs`), with what else that cancel records."""
    return any(t == "turn.cancelled" and d.get("expiry") is True for t, d in specs)


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


async def cancelled_by(
    store: Store, session_id: str, turn_id: str | None, began: int
) -> tuple[str | None, Principal | None] | None:
    """The reason and canceller of the turn `turn_id` (started at seq `began`) if it was
    cancelled, read from its `turn.cancelled`: the first after it began, as no other turn
    starts before it ends. None if it was not."""
    cancel = await _cancel_of(store, session_id, turn_id, began)
    if cancel is None:
        return None
    return cancel.data.get("reason"), load_principal(cancel.data.get("by"))


async def cancelled_for_expiry(store: Store, session_id: str, turn_id: str, began: int) -> bool:
    """Whether the turn `turn_id` (started at seq `began`) was cancelled because a session above
    it passed its TTL (`expiry` in its `turn.cancelled`): its subagents' turns end by time too."""
    cancel = await _cancel_of(store, session_id, turn_id, began)
    return cancel is not None and cancel.data.get("expiry") is True


async def _cancel_of(
    store: Store, session_id: str, turn_id: str | None, began: int
) -> Event | None:
    """The turn's `turn.cancelled`: the first after it began, as no other turn starts before it
    ends. None if it was not cancelled."""
    if turn_id is None:
        return None
    cancels = await store.read_events(
        session_id, max(began - 1, 0), limit=1, types=("turn.cancelled",)
    )
    return cancels[0] if cancels and cancels[0].turn_id == turn_id else None
