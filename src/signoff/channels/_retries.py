"""When a hub tries a channel again: after a failure on an audit entry (with backoff, a number
of times before the entry is given up on) or after a rate limit (when the service says, without
spending an attempt)."""

from __future__ import annotations

import logging
import math
import time

from ._base import ChannelUnreachable, RateLimited, logger

__all__ = ["MAX_WAIT", "Outage", "Retries", "doubled"]

MAX_WAIT = 3600.0  # seconds: the longest a rate limit holds a channel back before it retries


class Retries:
    """A hub's retry times and failure counts, by channel name (monotonic clock)."""

    def __init__(self) -> None:
        self._failures: dict[tuple[str, int], int] = {}
        self._retry_at: dict[str, float] = {}
        self.redo: set[str] = set()  # channels whose redelivery a rate limit holds back
        # channel -> the entry given up on that its last round of redelivery failed on first,
        # and the one tried after it in turn (`_given_up`)
        self.stuck: dict[str, tuple[int, int | None]] = {}
        # (channel, entry) -> the requests of the entry the channel was told of by an attempt
        # that failed on another of them: not told again by a retry, nor by a later round
        self.shown: dict[tuple[str, int], set[str]] = {}

    def blocked(self) -> set[str]:
        """The channels not to be told anything now: waiting for their retry, or holding the
        feed behind a redelivery a rate limit stopped."""
        clock = time.monotonic()
        return {n for n, at in self._retry_at.items() if at > clock} | self.redo

    def redo_due(self, name: str) -> bool:
        """Whether the channel's redelivery a rate limit stopped may go on now."""
        return name in self.redo and self._retry_at.get(name, 0.0) <= time.monotonic()

    def rate_limited(self, name: str, entry_id: int, exc: RateLimited) -> None:
        """Hold the channel back for the delay the service names (at most `MAX_WAIT`)."""
        wait = min(max(0.0, exc.retry_after), MAX_WAIT)  # NaN: max() keeps the 0
        self._retry_at[name] = time.monotonic() + wait
        if isinstance(exc, ChannelUnreachable):  # its message says what a person must do
            logger.log(
                logging.DEBUG if exc.logged else logging.WARNING,
                "channel %s holds audit entry %s: %s; retrying in %.1fs",
                name,
                entry_id,
                exc,
                wait,
            )
            return
        logger.warning(
            "channel %s is rate limited on audit entry %s; retrying in %.1fs", name, entry_id, wait
        )

    def failed(self, name: str, entry_id: int, max_attempts: int, backoff: float) -> bool:
        """Count a failure on an entry (called while handling it, whose traceback is logged):
        True when the channel retries after `backoff * 2**n` seconds, False when `max_attempts`
        are spent and the entry is given up on."""
        key = (name, entry_id)
        self._failures[key] = self._failures.get(key, 0) + 1
        if self._failures[key] < max_attempts:
            self._retry_at[name] = time.monotonic() + doubled(backoff, self._failures[key] - 1)
            logger.warning(
                "channel %s failed on audit entry %s (attempt %s); it will retry",
                name,
                entry_id,
                self._failures[key],
                exc_info=True,
            )
            return True
        logger.exception(
            "channel %s gave up on audit entry %s after %s attempts; "
            "it is delivered again by a later poll and when the hub next starts",
            name,
            entry_id,
            self._failures[key],
        )
        return False

    def keep_shown(self, name: str, entry_id: int, shown: set[str]) -> None:
        """Keep the requests of an entry the channel was told of by an attempt that failed."""
        if shown:
            self.shown[(name, entry_id)] = shown

    def handled(self, name: str, entry_id: int) -> None:
        """The channel is done with the entry (told, or given up on): no retry is pending."""
        self._failures.pop((name, entry_id), None)
        self._retry_at.pop(name, None)


class Outage:
    """A call a channel makes again at each poll while it fails (its state file broken): logged
    when it starts failing, again when the error changes and once it works, not at every try."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None  # `time.monotonic()` of the first failure in a row
        self.error: str | None = None

    def failed(self, exc: Exception) -> None:
        if self.since is None:
            self.since = time.monotonic()
        if str(exc) != self.error:
            logger.warning(
                "%s failed, retrying at each poll (logged again if the error changes or once it "
                "works): %s",
                self.what,
                exc,
            )
        else:
            logger.debug("%s failed again: %s", self.what, exc)
        self.error = str(exc)

    def worked(self) -> None:
        if self.since is not None:
            logger.info(
                "%s works again (it failed for %.1fs)", self.what, time.monotonic() - self.since
            )
        self.since = None
        self.error = None


def doubled(backoff: float, times: int) -> float:
    """`backoff * 2**times`, or infinity past the largest float (from `times` 1024 on), where
    the product would raise an OverflowError; 0 stays 0, however many times."""
    try:
        return math.ldexp(backoff, times)
    except OverflowError:
        return math.inf
