"""`Backlog`: the requests open when the hub started (every open one at a first start) that the
Slack channel posts at the start and its ticks, as they stand then, rather than as the trail's
entries read past its position: one closed meanwhile, or whose session's TTL (or one's above
it) passed, is not posted.

A post Slack rate-limits (or that cannot reach the channel) waits its Retry-After. One that
fails otherwise goes behind the others, which go on a second later, the wait doubling while
posts fail in a row; after `ATTEMPTS` in a row (about two minutes) it is logged as an error and
they are tried once every `REDO_EVERY` seconds while the hub runs, as the entries the hub gave
up on are: none is dropped until the next start, and none holds back the others."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ..._types import InputRequest
from .. import _given_up as given_up
from .._announcements import lapsed
from .._base import ChannelUnreachable, RateLimited, logger

if TYPE_CHECKING:
    from ._channel import SlackChannel

__all__ = ["ATTEMPTS", "Backlog"]

ATTEMPTS = 8  # posts failing in a row, 1 s apart doubling, before they wait `REDO_EVERY`


class Backlog:
    """The requests open at start not posted yet, in the order they are tried."""

    def __init__(self, channel: SlackChannel) -> None:
        self.channel = channel
        self.requests: list[InputRequest] = []
        self.at = 0.0  # monotonic time the next may be posted
        self.failures = 0  # posts failed in a row

    def start(self, open_requests: Sequence[InputRequest]) -> None:
        self.requests = list(open_requests)
        self.at = 0.0
        self.failures = 0

    async def post(self) -> None:
        """Post the requests that are still open, as they are now, until Slack rate-limits
        (tried again after its Retry-After) or fails (see the module)."""
        while self.requests and time.monotonic() >= self.at:
            request = self.requests[0]
            try:
                rt = self.channel.runtime
                stored = await rt.store.get_request(request.id)
                if (
                    stored is not None
                    and stored.status == "pending"
                    and not await lapsed(rt.store, stored.request, rt.now())
                ):
                    await self.channel.on_requested(stored.request)
            except RateLimited as exc:
                wait = min(max(0.0, exc.retry_after), 3600.0)
                self.at = time.monotonic() + wait
                if isinstance(exc, ChannelUnreachable):
                    level = logging.DEBUG if exc.logged else logging.WARNING  # logged: told
                    logger.log(level, "%s; posting %s again in %gs", exc, request.id, wait)
                else:
                    logger.warning("slack: rate limited; posting %s again later", request.id)
                return
            except Exception:
                self._failed(request)
                return
            self.failures = 0
            self.requests.pop(0)

    def _failed(self, request: InputRequest) -> None:
        """Put `request`, whose post failed (called in the `except`), behind the others, and
        wait before the next post."""
        self.failures += 1
        self.requests.append(self.requests.pop(0))
        if self.failures < ATTEMPTS:
            delay = 2.0 ** (self.failures - 1)
            level = logging.WARNING
        else:
            delay = given_up.REDO_EVERY
            level = logging.ERROR if self.failures == ATTEMPTS else logging.WARNING
        self.at = time.monotonic() + delay
        logger.log(
            level,
            "slack: posting %s, open at start, failed (%s posts failed in a row); it is tried "
            "again after the others, the next in %gs, while the hub runs",
            request.id,
            self.failures,
            delay,
            exc_info=True,
        )
