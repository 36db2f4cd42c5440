"""What a Slack endpoint acknowledged and has still to do: saved in the channel state before
Slack hears back, done in the background, and done again by the next start if the process died
first (Slack never sends again what it had a 200 for).

The save runs off the event loop (a lock on the state file must not stall the server) and is
given `ACK_WITHIN` seconds; past them Slack gets a 503 and sends the delivery again.

Each piece of work is a memo `<prefix><id>`: pending (with the work, how often it was tried
and the token of the channel object that took it: a start leaves it to that object while its
`Presence` is held, so a hub taking over does not act on a standby's click a second time), then
done (kept for an hour, so a retry of the same delivery, in any process sharing the state, does
nothing).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..._exceptions import StoreError
from .._base import logger, off_loop, waiting_until

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from ._channel import SlackChannel

__all__ = ["ACK_WITHIN", "RESUME_AFTER", "RETRY_WINDOW", "Inbox", "seconds"]

ACK_WITHIN = 2.0  # seconds to save a delivery, well inside Slack's 3 s; past them, a 503
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
        self.ack_within = ACK_WITHIN
        self._tidied_at: float | None = None

    def key(self, work_id: str) -> str:
        return f"{self.prefix}{work_id}"

    def seen(self, work_id: str) -> bool:
        """Whether this work was taken before (by any process sharing the state)."""
        return self.channel.recall(self.key(work_id)) is not None

    async def admit(self, pick: Callable[[], tuple[str, T] | None]) -> None:
        """Run `pick` (what a delivery asks for: its work's id and the work, or None) and save
        that work as pending unless it was taken before, in a thread and within `ack_within`
        seconds, then start it. A `StoreError` if it was not saved in time, so that Slack is not
        told it was taken; a save that ends later starts its work all the same, and Slack's
        retry finds it taken."""
        deadline = time.monotonic() + self.ack_within
        saving = self.channel._spawn(off_loop(self._save, pick, deadline))
        try:
            taken = await asyncio.wait_for(asyncio.shield(saving), self.ack_within)
        except TimeoutError:
            saving.add_done_callback(self._late)
            raise StoreError(
                f"slack: the {self.what} was not saved within {self.ack_within:g}s"
            ) from None
        if taken is not None:
            self._start(*taken)

    def _late(self, saving: asyncio.Task[tuple[str, T] | None]) -> None:
        """Start the work of a save that ended after Slack had a 503 for it, or log its failure
        (nothing was taken: Slack sends it again)."""
        if saving.cancelled():
            return
        exc = saving.exception()
        if exc is not None:
            logger.warning("slack: the %s Slack had a 503 for was not saved: %s", self.what, exc)
            return
        taken = saving.result()
        if taken is not None:
            self._start(*taken)

    def _save(
        self, pick: Callable[[], tuple[str, T] | None], deadline: float
    ) -> tuple[str, T] | None:
        ch = self.channel
        with waiting_until(deadline):
            found = pick()
            if found is None:
                return None
            work_id, work = found
            if self.seen(work_id):
                logger.debug("slack: the %s %s was taken before", self.what, work_id)
                return None
            memo = {"state": "pending", "at": ch.clock(), "tries": 0, **asdict(work)}
            memo["by"] = ch.owner()  # while it lives, another hub's start leaves it the work
            ch.remember(self.key(work_id), memo)
        return found

    def _start(self, work_id: str, work: T) -> None:
        if work_id in self._busy:
            return
        self._busy.add(work_id)
        self.channel._spawn(self._deliver(work_id, work))

    async def resume(self, *, older_than: float | None = None) -> None:
        """Start the saved work no process finished (all of it, or what was saved more than
        `older_than` seconds ago), and drop the memos of work done more than an hour ago."""
        for work_id, work in await off_loop(self._unfinished, older_than):
            self._start(work_id, work)

    def _unfinished(self, older_than: float | None) -> list[tuple[str, T]]:
        """`resume`'s reading of the memos (in a thread): the work to start again."""
        ch = self.channel
        now = ch.clock()
        names = self.kind.__dataclass_fields__
        found: list[tuple[str, T]] = []
        for key, memo in ch.memos(self.prefix):
            if not isinstance(memo, dict):
                ch.forget(key)
            elif memo.get("state") == "done":
                if not seconds(memo.get("until")) > now:
                    ch.forget(key)
            elif older_than is None and (
                seconds(memo.get("at")) >= now - RESUME_AFTER and ch.elsewhere(memo.get("by"))
            ):
                continue  # a live channel object took it (a standby hub's): it finishes it
            elif older_than is None or seconds(memo.get("at")) < now - older_than:
                try:
                    work = self.kind(**{name: memo[name] for name in names})
                except (KeyError, TypeError):
                    logger.warning("slack: the saved %s %s is unreadable: %r", self.what, key, memo)
                    ch.forget(key)
                    continue
                found.append((key.removeprefix(self.prefix), work))
        return found

    def due(self) -> bool:
        """Whether it is time for another scan (every `TIDY_EVERY` seconds); notes it is."""
        now = self.channel.clock()
        if self._tidied_at is not None and now - self._tidied_at < TIDY_EVERY:
            return False
        self._tidied_at = now
        return True

    async def tick(self) -> None:
        """Now and then: resume work a process that died left, and drop old memos."""
        if self.due():
            await self.resume(older_than=RESUME_AFTER)

    async def _deliver(self, work_id: str, work: T) -> None:
        """Run saved work and mark it done; a failure of the store (or of the network) leaves
        it saved, to be run again later, up to `TRIES` times."""
        ch = self.channel
        key = self.key(work_id)
        try:
            tries = await off_loop(self._try, key)
            if tries is None:
                return  # done meanwhile (another process)
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
            await off_loop(ch.remember, key, {"state": "done", "until": ch.clock() + RETRY_WINDOW})
        except Exception:
            logger.exception("slack: the %s %s could not be saved", self.what, work_id)
        finally:
            self._busy.discard(work_id)

    def _try(self, key: str) -> int | None:
        """Count one more run of the work saved under `key`: which run this is, or None if it
        is no longer pending."""
        ch = self.channel
        memo = ch.recall(key)
        if not isinstance(memo, dict) or memo.get("state") != "pending":
            return None
        tries = int(memo.get("tries") or 0) + 1
        ch.remember(key, {**memo, "tries": tries, "by": ch.owner()})
        return tries


def seconds(value: Any) -> float:
    """A saved time, or 0 for one that is not a number (so its memo is dropped)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
