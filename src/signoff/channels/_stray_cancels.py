"""A `CancelledError` that a channel raises of its own (it awaited a task someone else
cancelled) while the hub's task is not being cancelled (`own_cancel`) is that channel's failure,
retried and logged like any other: re-raised, it ended the hub's task, silently, for every
channel, the hub still seeming started. A cancel of the hub's task itself goes on up."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager

from .._recording import own_cancel

__all__ = ["ChannelCancelled", "stray_cancels"]


class ChannelCancelled(RuntimeError):
    """A channel's hook raised a `CancelledError` of its own, the hub's task not cancelled."""


@contextmanager
def stray_cancels(channel: str, hook: str) -> Iterator[None]:
    """Raise a `CancelledError` of the channel's own from the body as `ChannelCancelled`."""
    try:
        yield
    except asyncio.CancelledError as exc:
        if not own_cancel(exc):
            raise
        raise ChannelCancelled(
            f"channel {channel} raised a CancelledError of its own ({hook}): it awaited "
            "something cancelled; taken as its failure"
        ) from exc
