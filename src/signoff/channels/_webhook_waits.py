"""What each receiver of a `WebhookChannel` last asked with `Retry-After`: not to be called
before a time. It is kept in the runtime's store beside the outbox (`asked:<digest of the URL>`,
the seconds asked, aged by the store's own time of keeping it, so machines whose clocks differ
agree), or in the hub's state on a store without channel memos. So a hub started again, or one
taking over on another machine, waits out the hour a receiver asked for instead of calling it
at once."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._exceptions import SignoffError
from ._base import logger, off_loop
from ._retries import MAX_WAIT
from ._shared import Shared
from ._webhook_outbox import by_digest, digest
from ._webhook_urls import endpoint, masked

if TYPE_CHECKING:
    from .webhooks import WebhookChannel

__all__ = ["ASKED", "Waits"]

ASKED = "asked:"  # memo key prefix: the store's "asked:{digest}", the state's "asked:{url}"


class Waits:
    """The time before which each URL asked not to be called, kept for other hubs."""

    def __init__(self, channel: WebhookChannel) -> None:
        self.channel = channel
        # By `time.monotonic()`: a step of the wall clock (the channel's `clock`, which stamps
        # signatures) held a receiver's deliveries back for as long as the step, past `MAX_WAIT`.
        self.until: dict[str, float] = {}

    def _shared(self) -> Shared | None:
        ch = self.channel
        if ch._runtime is None:
            return None
        shared = Shared(ch)
        return shared if shared.kept else None

    def left(self, url: str) -> float:
        """Seconds the receiver at `url` still asks to wait (0 for none)."""
        return max(0.0, self.until.get(url, 0.0) - time.monotonic())

    async def wait_out(
        self, url: str, delivery: str, sleep: Callable[[float], Awaitable[None]]
    ) -> None:
        """Before a delivery's first attempt, wait out what the receiver's last `Retry-After`
        still asks: one asked of an earlier delivery (given up on past `max_backoff`) holds
        back the deliveries after it too, rather than each calling at once, also when it was
        asked of an earlier run or of a hub on another machine."""
        wait = self.left(url)
        if wait <= 0:
            return
        logger.warning(
            "webhook %s asked to be called no sooner (Retry-After); %s waits %.0fs",
            masked(url),
            delivery,
            wait,
        )
        await sleep(wait)

    async def load(self) -> None:
        """Take up what receivers asked of an earlier run or another hub (a `StoreError` if it
        cannot be read: the caller tries again); memos whose wait is over are dropped."""
        ch = self.channel
        shared = self._shared()
        now = time.monotonic()
        if shared is not None:
            urls = by_digest(ch.urls)
            over: dict[str, Any] = {}
            moved: set[str] = set()
            for key, kept, age in await shared.listed(ASKED):
                wait = _seconds(kept) - age
                named = key.removeprefix(ASKED)
                url = urls.get(named)
                if wait <= 0:
                    over[key] = None
                elif url is not None:
                    self.until[url] = max(self.until.get(url, 0.0), now + min(wait, MAX_WAIT))
                    if named != digest(url):  # an earlier spelling's: kept under the URL's own
                        over[key] = None
                        moved.add(url)
            for url in moved:
                over[f"{ASKED}{digest(url)}"] = {"seconds": self.left(url)}
            if over:
                await shared.keep(over)
        elif ch._state is not None:
            respelled: dict[str, list[str]] = {}
            for key, kept in await off_loop(ch.memos, ASKED):
                spelled = key.removeprefix(ASKED)
                url = endpoint(spelled)  # an earlier signoff's spelling too (no path: no `/`)
                wait = _seconds(kept, "until") - ch.clock()  # kept as a time of the clock
                if url not in ch.urls:
                    continue
                if wait > 0:
                    self.until[url] = max(self.until.get(url, 0.0), now + min(wait, MAX_WAIT))
                if url != spelled:
                    respelled.setdefault(url, []).append(key)
            if respelled:
                await off_loop(self._respell, respelled)

    def _respell(self, respelled: dict[str, list[str]]) -> None:
        """Keep in the state what each URL still asks under its own spelling, then forget the
        keys of earlier spellings (`respelled`), so a later answer lifts it (as `unsent` does:
        a crash between the two writes loses neither)."""
        ch = self.channel
        for url, keys in respelled.items():
            if (left := self.left(url)) > 0:
                ch.remember(f"{ASKED}{url}", {"until": ch.clock() + left})
            for key in keys:
                ch.forget(key)

    async def note(self, url: str, asked: float | None) -> None:
        """Note until when `url`'s answer asks not to be called (its `Retry-After`, at most
        `MAX_WAIT`); an answer without one lifts what an earlier answer asked. Kept for other
        hubs; a store that fails leaves it to this run, logged."""
        ch = self.channel
        if asked is None or not asked > 0:
            if self.until.pop(url, None) is None:
                return
            wait = None
        else:
            wait = min(asked, MAX_WAIT)
            self.until[url] = time.monotonic() + wait
        shared = self._shared()
        try:
            if shared is not None:
                memo = None if wait is None else {"seconds": wait}
                await shared.keep({f"{ASKED}{digest(url)}": memo})
            elif ch._state is not None and wait is None:
                await off_loop(ch.forget, f"{ASKED}{url}")
            elif ch._state is not None and wait is not None:
                until = ch.clock() + wait  # a time another process's clock reads
                await off_loop(ch.remember, f"{ASKED}{url}", {"until": until})
        except SignoffError as exc:
            logger.warning(
                "webhook %s: what its Retry-After asks is not kept for another hub: %s",
                masked(url),
                exc,
            )


def _seconds(kept: Any, key: str = "seconds") -> float:
    """A memo's number of seconds (or time), 0 for one that is not a finite number."""
    value = kept.get(key) if isinstance(kept, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return float(value)
