"""How a `WebhookChannel` stops: it sends what is queued for up to its `timeout`, or not at all
once a forced stop (`signoff serve`'s second Ctrl-C or SIGTERM) cut it short, also while it
waits, and says how many deliveries it left unsent. Those are kept in the hub's state and the
store until sent, so the next start sends them."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ._base import logger
from ._webhook_outbox import kept_in_store

if TYPE_CHECKING:
    from .webhooks import WebhookChannel

__all__ = ["Stop"]


class Stop:
    """A `WebhookChannel`'s stop: the wait for its queues to drain, and whether it was cut."""

    def __init__(self, channel: WebhookChannel) -> None:
        self.channel = channel
        self.cut = False
        self._draining: asyncio.Task[None] | None = None

    def cut_short(self) -> list[asyncio.Task[Any]]:
        """End the wait for the queues to drain, now or when it begins; the wait, if running."""
        self.cut = True
        draining = self._draining
        if draining is None or draining.done():
            return []
        draining.cancel()
        return [draining]

    async def drain(self) -> None:
        """Wait until every queued delivery was sent or given up, for at most the channel's
        `timeout` seconds, and not at all once the channel was cut short."""
        if self.cut:
            return
        self._draining = asyncio.ensure_future(self.channel.drain())
        try:
            await asyncio.wait({self._draining}, timeout=self.channel.timeout)
        finally:
            self._draining.cancel()
            self._draining = None

    def count_unsent(self) -> None:
        """Count the deliveries queued or being sent in `failed`, and log them as an error:
        sent when the hub next starts, or lost where nothing keeps them."""
        ch = self.channel
        lost = len(ch._sending) + sum(q.qsize() for q in ch._queues.values())
        if not lost:
            return
        ch.failed += lost
        kept = ch._state is not None and (ch._state.path != ":memory:" or kept_in_store(ch))
        logger.error(
            "webhooks: %s deliveries were not sent %s and %s",
            lost,
            "as the stop was forced" if self.cut else f"within {ch.timeout}s of closing",
            "are sent when the hub next starts" if kept else "are lost",
        )
