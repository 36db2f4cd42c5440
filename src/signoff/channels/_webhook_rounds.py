"""A `WebhookChannel`'s rounds of the deliveries it gave up on: every `REDO_EVERY` seconds the
oldest kept for a URL is sent again (a probe); once it gets through, the others kept for that
URL follow, oldest first, and one failing again holds back those queued behind it, so the next
round starts from it rather than each spending its attempts on a receiver down again."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from . import _given_up as given_up
from ._base import logger, off_loop
from ._retries import MAX_WAIT
from ._webhook_outbox import unsent
from ._webhook_urls import masked

if TYPE_CHECKING:
    from .webhooks import WebhookChannel

__all__ = ["Rounds"]


class Rounds:
    """Which URLs have deliveries given up on, and the round each is in."""

    def __init__(self, channel: WebhookChannel) -> None:
        self.channel = channel
        # URL -> monotonic time a delivery to it was last given up on (while some are kept),
        # and the one delivery sent to a URL to see whether it is back.
        self.given_up_at: dict[str, float] = {}
        self.probing: dict[str, str] = {}
        # URL -> the deliveries given up on that its round queued behind the one that got
        # through; "url delivery" of those to skip, one before them having failed again.
        self.redoing: dict[str, set[str]] = {}
        self.held_back: set[str] = set()

    async def redo(self) -> None:
        """Send again the oldest delivery given up on of each URL whose round is due."""
        for url, at in list(self.given_up_at.items()):
            if url in self.probing or time.monotonic() - at < given_up.REDO_EVERY:
                continue
            self.given_up_at[url] = time.monotonic()
            kept = await self.requeue(url, first_only=True)
            if kept is None:
                del self.given_up_at[url]  # none left (sent by a start, or no longer kept)
            else:
                self.probing[url] = kept

    async def requeue(self, url: str, *, first_only: bool = False) -> str | None:
        """Queue again the deliveries kept for `url` that are not queued (given up on), oldest
        first, or only the oldest; the id of the first queued, None if none was."""
        ch = self.channel
        first = None
        for spelled, delivery, kept in await off_loop(unsent, ch):
            key = f"{spelled} {delivery}"
            if spelled != url or key in ch._queued:
                continue
            ch._queued.add(key)
            ch._queues[url].put_nowait((delivery, kept["event"], kept["body"].encode()))
            first = delivery if first is None else first
            if first_only:
                break
            self.redoing.setdefault(url, set()).add(delivery)
        return first

    async def got_through(self, url: str) -> None:
        """The probe of `url` was answered: the others kept for it follow."""
        self.probing.pop(url, None)
        if await self.requeue(url) is None:
            self.given_up_at.pop(url, None)

    def skipped(self, url: str) -> None:
        """The probe of `url` was dropped unsent (a stale warning): the next tick's round sends
        the next one kept, rather than a minute later."""
        if url in self.given_up_at:
            self.given_up_at[url] = time.monotonic() - given_up.REDO_EVERY

    def gave_up(self, url: str, delivery: str) -> float:
        """`delivery` to `url` was given up on (and is kept): its round is due `REDO_EVERY`
        from now, plus what the receiver's `Retry-After` asks beyond that (returned)."""
        self._hold_back(url, delivery)
        asked = self.channel._answers.get(url, (None, "", None))[2]
        later = 0.0 if asked is None else max(0.0, min(asked, MAX_WAIT) - given_up.REDO_EVERY)
        self.given_up_at[url] = time.monotonic() + later
        return later

    def done(self, url: str, delivery: str, probe: bool) -> None:
        """A worker is done with `delivery` to `url`, whatever came of it."""
        if probe:
            self.probing.pop(url, None)
        self.redoing.get(url, set()).discard(delivery)

    def _hold_back(self, url: str, delivery: str) -> None:
        """A delivery of `url`'s round given up on again: the others the round queued behind
        it are skipped (still kept), so the next round starts from it, the oldest."""
        redoing = self.redoing.pop(url, set())
        if delivery not in redoing:
            if redoing:
                self.redoing[url] = redoing
            return
        redoing.discard(delivery)
        self.held_back.update(f"{url} {d}" for d in redoing)
        if redoing:
            logger.warning(
                "webhook %s: %s other deliveries given up on wait for the next round",
                masked(url),
                len(redoing),
            )
