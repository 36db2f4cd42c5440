"""What a Slack endpoint acknowledged and has still to do: saved in the channel state before
Slack hears back, done in the background, and done again by the next start if the process died
first (Slack never sends again what it had a 200 for).

Each piece of work is a memo `<prefix><id>`: pending (with the work and how often it was
tried), then done (kept for an hour, so a retry of the same delivery, in any process sharing
the state, does nothing).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..._exceptions import StoreError
from .._base import logger

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from ._channel import SlackChannel

__all__ = ["RESUME_AFTER", "RETRY_WINDOW", "Inbox", "seconds"]

RETRY_WINDOW = 3600.0  # seconds a handled delivery is remembered, for Slack's retries of it
RESUME_AFTER = 600.0  # seconds after which pending work is taken for work a process lost
TRIES = 5  # runs of one piece of work at most (a store down for a while, say)
TIDY_EVERY = 300.0  # seconds between the scans that resume lost work and drop old memos

T = TypeVar("T", bound="DataclassInstance")


class Inbox(Generic[T]):
    """Durable background work of one kind (`kind`, a dataclass), done by `run(work, again)`;
    `again` says an earlier run of it began (and may have finished) before it was marked done.

    `run` raising a `StoreError` (or `OSError`) leaves the work pending, to be run again later,
    up to `TRIES` times; anything else it raises is logged and the work is done."""

    def __init__(
        self,
        channel: SlackChannel,
        prefix: str,
        kind: type[T],
        run: Callable[[T, bool], Awaitable[None]],
        what: str,
    ) -> None:
        self.channel = channel
        self.prefix = prefix
        self.kind = kind
        self.run = run
        self.what = what  # how log lines name one piece of work: "reply of event", ...
        self._busy: set[str] = set()  # ids being run by this process
        self._tidied_at: float | None = None

    def key(self, work_id: str) -> str:
        return f"{self.prefix}{work_id}"

    def seen(self, work_id: str) -> bool:
        """Whether this work was taken before (by any process sharing the state)."""
        return self.channel.recall(self.key(work_id)) is not None

    def take(self, work_id: str, work: T) -> None:
        """Save the work as pending, then start it; a `StoreError` if it cannot be saved, so
        that Slack is not told it was taken."""
        ch = self.channel
        ch.remember(
            self.key(work_id), {"state": "pending", "at": ch.clock(), "tries": 0, **asdict(work)}
        )
        self._start(work_id, work)

    def _start(self, work_id: str, work: T) -> None:
        if work_id in self._busy:
            return
        self._busy.add(work_id)
        self.channel._spawn(self._deliver(work_id, work))

    def resume(self, *, older_than: float | None = None) -> None:
        """Start the saved work no process finished (all of it, or what was saved more than
        `older_than` seconds ago), and drop the memos of work done more than an hour ago."""
        ch = self.channel
        now = ch.clock()
        names = self.kind.__dataclass_fields__
        for key, memo in ch.state.memos(ch.name, self.prefix):
            if not isinstance(memo, dict):
                ch.forget(key)
            elif memo.get("state") == "done":
                if not seconds(memo.get("until")) > now:
                    ch.forget(key)
            elif older_than is None or seconds(memo.get("at")) < now - older_than:
                try:
                    work = self.kind(**{name: memo[name] for name in names})
                except (KeyError, TypeError):
                    logger.warning("slack: the saved %s %s is unreadable: %r", self.what, key, memo)
                    ch.forget(key)
                    continue
                self._start(key.removeprefix(self.prefix), work)

    def due(self) -> bool:
        """Whether it is time for another scan (every `TIDY_EVERY` seconds); notes it is."""
        now = self.channel.clock()
        if self._tidied_at is not None and now - self._tidied_at < TIDY_EVERY:
            return False
        self._tidied_at = now
        return True

    def tick(self) -> None:
        """Now and then: resume work a process that died left, and drop old memos."""
        if self.due():
            self.resume(older_than=RESUME_AFTER)

    async def _deliver(self, work_id: str, work: T) -> None:
        """Run saved work and mark it done; a failure of the store (or of the network) leaves
        it saved, to be run again later, up to `TRIES` times."""
        ch = self.channel
        key = self.key(work_id)
        try:
            memo = ch.recall(key)
            if not isinstance(memo, dict) or memo.get("state") != "pending":
                return  # done meanwhile (another process)
            tries = int(memo.get("tries") or 0) + 1
            ch.remember(key, {**memo, "tries": tries})
            try:
                await self.run(work, tries > 1)
            except (StoreError, OSError):
                if tries < TRIES:
                    logger.warning(
                        "slack: the %s %s failed; it is tried again later",
                        self.what,
                        work_id,
                        exc_info=True,
                    )
                    return
                logger.exception("slack: the %s %s failed", self.what, work_id)
            except Exception:
                logger.exception("slack: the %s %s failed", self.what, work_id)
            ch.remember(key, {"state": "done", "until": ch.clock() + RETRY_WINDOW})
        except Exception:
            logger.exception("slack: the %s %s could not be saved", self.what, work_id)
        finally:
            self._busy.discard(work_id)


def seconds(value: Any) -> float:
    """A saved time, or 0 for one that is not a number (so its memo is dropped)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
