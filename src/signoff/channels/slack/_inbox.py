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

The work is saved in the runtime's store too before Slack hears back (`Shared`, with the state
it was taken on, its `home`), and dropped there once done: a machine lost after the 200 takes
its state with it, and the hub delivering to the channel on another state takes up what such a
state left undone for `ADOPT_AFTER` seconds (scanning at its start and every `ADOPT_EVERY`
seconds). Taking it up names the new home in the store; a run that resumes saved work first
checks the store still names its own (else another state took it, or finished it). A home is
the state file's own id (`SlackChannel.home`), so another file at the same path (a container's
of the same hostname) is another home; the name an older signoff gave (the machine's and the
path) still counts for the work this state took under it (`_names`). Work the
state did not take (Slack had a 503 for it) is dropped from the store again; only a process
that dies between the two saves, or a store that refuses the drop, leaves a copy there, taken
up as a lost machine's would be (the store cannot tell them apart).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from ..._exceptions import SignoffError, StoreDamaged, StoreError
from .._base import logger, off_loop, waiting_until
from .._shared import Shared

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

    from ._channel import SlackChannel

__all__ = [
    "ACK_WITHIN",
    "ADOPT_AFTER",
    "ADOPT_EVERY",
    "RESUME_AFTER",
    "RETRY_WINDOW",
    "Inbox",
    "damaged_note",
    "seconds",
]

ACK_WITHIN = 2.0  # seconds to save a delivery, well inside Slack's 3 s; past them, a 503
RETRY_WINDOW = 3600.0  # seconds a handled delivery is remembered, for Slack's retries of it
RESUME_AFTER = 600.0  # seconds after which pending work is taken for work a process lost
TRIES = 5  # runs of one piece of work at most (a store down for a while, say)
TIDY_EVERY = 300.0  # seconds between the scans that resume lost work and drop old memos
# Seconds after which work saved in the store from another state, not finished, is taken up
# (its machine lost, say): past the lookup (ten seconds at most) and answer of a live one.
ADOPT_AFTER = 60.0
ADOPT_EVERY = 30.0  # seconds between the delivering hub's scans of the store for such work

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
        self.shared = Shared(channel)
        self._adopted_at: float | None = None  # monotonic time of the last scan of the store

    def key(self, work_id: str) -> str:
        return f"{self.prefix}{work_id}"

    def seen(self, work_id: str) -> bool:
        """Whether this work was taken before (by any process sharing the state)."""
        return self.channel.recall(self.key(work_id)) is not None

    async def admit(
        self, pick: Callable[[], tuple[str, T] | None], *, deadline: float | None = None
    ) -> None:
        """Run `pick` (what a delivery asks for: its work's id and the work, or None) and save
        that work as pending unless it was taken before (`_save`), within `ack_within` seconds
        (or by `deadline`, a `time.monotonic()` time), then start it. A `StoreError` if it was
        not saved in time, so that Slack is not told it was taken; a save that ends later
        starts its work all the same, and Slack's retry finds it taken."""
        if deadline is None:
            deadline = time.monotonic() + self.ack_within
        saving = self.channel._spawn(self._save(pick, deadline))
        try:
            taken = await asyncio.wait_for(
                asyncio.shield(saving), max(0.0, deadline - time.monotonic())
            )
        except TimeoutError:
            saving.add_done_callback(self._late)
            raise StoreError(
                f"slack: the {self.what} was not saved within {self.ack_within:g}s"
            ) from None
        if taken is not None:
            self._start(*taken)

    def _late(self, saving: asyncio.Task[tuple[str, T] | None]) -> None:
        """Start the work of a save that ended after Slack had a 503 for it, or log its failure
        (nothing was taken, `_save` dropped its copy in the store: Slack sends it again, or the
        person acts again)."""
        if saving.cancelled():
            return
        exc = saving.exception()
        if exc is not None:
            logger.warning("slack: the %s Slack had a 503 for was not saved: %s", self.what, exc)
            return
        taken = saving.result()
        if taken is not None:
            self._start(*taken)

    async def _save(
        self, pick: Callable[[], tuple[str, T] | None], deadline: float
    ) -> tuple[str, T] | None:
        """Save the work `pick` names, unless taken before: in the store first (where a hub on
        another state finds it if this machine is lost), then in the state (where Slack's retry
        finds it taken, so only once both hold it), the state's calls in a thread and waiting
        for it until `deadline`. The state failing, in time or not, the store's copy is dropped
        again (`_unshare`): nothing is taken."""
        ch = self.channel
        picked = await off_loop(self._pick, pick, deadline)
        if picked is None:
            return None
        work_id, work, home = picked
        key = self.key(work_id)
        memo = {"state": "pending", "at": ch.clock(), "tries": 0, **asdict(work)}
        if not self.shared.kept:
            await off_loop(self._keep, key, memo, deadline)
            return work_id, work
        shared = {key: {**asdict(work), "home": home}}
        await self.shared.keep(shared, durable=True)  # acknowledged: an answer, synced
        # A resumed run checks the store still names this home (this signoff's name of it).
        memo.update(shared=True, home=home)
        try:
            await off_loop(self._keep, key, memo, deadline)
        except Exception:
            await self._unshare(key)
            raise
        return work_id, work

    async def _unshare(self, key: str) -> None:
        """Drop the store's copy of work the state did not take (Slack has a 503 for it), which
        the delivering hub would otherwise take up in a minute as work a lost machine left."""
        try:
            await self.shared.keep({key: None})
        except SignoffError as exc:
            logger.warning(
                "slack: the %s %s the state did not take stays in the store: %s",
                self.what,
                key.removeprefix(self.prefix),
                exc,
            )

    def _pick(
        self, pick: Callable[[], tuple[str, T] | None], deadline: float
    ) -> tuple[str, T, str] | None:
        """The work `pick` names, unless taken before, and this state's home (in this thread:
        the first read of a file's id waits for the file)."""
        with waiting_until(deadline):
            found = pick()
            if found is None:
                return None
            if self.seen(found[0]):
                logger.debug("slack: the %s %s was taken before", self.what, found[0])
                return None
            return *found, self.channel.home

    def _keep(self, key: str, memo: dict[str, Any], deadline: float | None = None) -> None:
        ch = self.channel
        with contextlib.nullcontext() if deadline is None else waiting_until(deadline):
            memo["by"] = ch.owner()  # while it lives, another hub's start leaves it the work
            ch.remember(key, memo)

    def _start(self, work_id: str, work: T, *, checked: bool = True) -> None:
        """Run saved work in the background; unless `checked`, its run first checks that the
        store still names this state's home (`_ours`)."""
        if work_id in self._busy:
            return
        self._busy.add(work_id)
        self.channel._spawn(self._deliver(work_id, work, checked))

    async def resume(self, *, older_than: float | None = None) -> None:
        """Start the saved work no process finished (all of it, or what was saved more than
        `older_than` seconds ago), and drop the memos of work done more than an hour ago."""
        for work_id, work in await off_loop(self._unfinished, older_than):
            self._start(work_id, work, checked=False)

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
        """Whether it is time for another scan (every `TIDY_EVERY` seconds); notes it is. A
        step back of the wall clock counts from the step: it held the scans off as long."""
        now = self.channel.clock()
        if self._tidied_at is not None and 0 <= now - self._tidied_at < TIDY_EVERY:
            return False
        if self._tidied_at is not None and now < self._tidied_at:
            self._tidied_at = now
            return False
        self._tidied_at = now
        return True

    async def tick(self) -> None:
        """Now and then: resume work a process that died left, and drop old memos; take up the
        work other states left in the store (`adopt`)."""
        if self.due():
            await self.resume(older_than=RESUME_AFTER)
        await self.adopt(due=True)

    async def adopt(self, *, due: bool = False) -> None:
        """Take up the work saved in the store from another state and not finished for
        `ADOPT_AFTER` seconds (its machine lost after Slack's 200), once: the store names this
        state its home from then on, so no other hub takes it up too, and its run counts as a
        second (`again`: the first may have begun). Work this state finished is dropped from
        the store (its drop failed then). A store that fails is logged: a later scan retries.
        With `due`, nothing if the last scan was less than `ADOPT_EVERY` seconds ago."""
        at = time.monotonic()
        last = self._adopted_at
        if not self.shared.kept or (due and last is not None and at - last < ADOPT_EVERY):
            return
        self._adopted_at = at
        try:
            for key, memo, age in await self.shared.listed(self.prefix):
                local, homes = await off_loop(self._local, key)
                if isinstance(local, dict) and local.get("state") == "done":
                    if isinstance(memo, dict) and memo.get("home") in homes:
                        await self.shared.keep({key: None})  # finished here, its drop failed
                elif local is not None or age < ADOPT_AFTER:
                    continue  # this state's own to run (`resume`), or its home's still
                else:
                    await self._adopt(key, memo, homes[0])
        except SignoffError as exc:
            logger.warning("slack: the %ss left in the store were not read: %s", self.what, exc)

    def _local(self, key: str) -> tuple[Any, tuple[str, ...]]:
        """The memo of the work under `key` in this state, and the names by which the store
        may call this state its home (`_names`)."""
        memo = self.channel.recall(key)
        return memo, self._names(memo)

    def _names(self, memo: Any) -> tuple[str, ...]:
        """The names by which the store may call this state the home of the work whose memo
        here is `memo`, this signoff's first (called in a thread: the first read of a file's id
        waits for the file). An older signoff's name (the machine's and the path, which another
        container of the same hostname with its own file at that path had too) counts only for
        work this state took under that signoff (its memo names no home): that work is not lost
        in an upgrade, and its run first renames it in the store (`_ours`). Work this state took
        since, the store naming it so, was taken up by an older signoff's hub on such a file:
        it is that hub's. Of work both states took under the older signoff, both may run it, as
        they could then (the store does not say which took it last)."""
        ch = self.channel
        old = ch.old_home
        if old is not None and isinstance(memo, dict) and "home" not in memo:
            return ch.home, old
        return (ch.home,)

    async def _adopt(self, key: str, memo: Any, home: str) -> None:
        ch = self.channel
        names = self.kind.__dataclass_fields__
        try:
            work = self.kind(**{name: memo[name] for name in names})
        except (KeyError, TypeError):
            logger.warning("slack: the %s %s in the store is unreadable: %r", self.what, key, memo)
            await self.shared.keep({key: None})
            return
        logger.warning(
            "slack: taking up the %s %s, saved on %s and unfinished",
            self.what,
            key.removeprefix(self.prefix),
            memo.get("home"),
        )
        await self.shared.keep({key: {**memo, "home": home}}, durable=True)
        saved = {"state": "pending", "at": ch.clock(), "tries": 1, "shared": True, "home": home}
        await off_loop(self._keep, key, {**saved, **asdict(work)})
        self._start(key.removeprefix(self.prefix), work)

    async def _deliver(self, work_id: str, work: T, checked: bool) -> None:
        """Run saved work and mark it done; a failure of the store (or of the network) leaves
        it saved, to be run again later, up to `TRIES` times. Work resumed (not `checked`) is
        run only while the store names this state its home."""
        ch = self.channel
        key = self.key(work_id)
        try:
            tried = await off_loop(self._try, key)
            if tried is None:
                return  # done meanwhile (another process)
            tries, shared, homes = tried
            if shared and not checked and not await self._ours(key, homes):
                logger.info("slack: the %s %s was taken up on another state", self.what, work_id)
                await off_loop(ch.remember, key, self._done(homes[0]))
                return
            try:
                await self.run(work, tries > 1)
            except StoreDamaged as exc:  # it reads the same every time: not tried again
                logger.error("slack: the %s %s cannot be done: %s", self.what, work_id, exc)
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
            await off_loop(ch.remember, key, self._done(homes[0]))
            if shared:
                try:
                    await self.shared.keep({key: None})
                except SignoffError as exc:  # the delivering hub's scan drops it later
                    logger.warning("slack: the %s %s stays in the store: %s", self.what, key, exc)
        except Exception:
            logger.exception("slack: the %s %s could not be saved", self.what, work_id)
        finally:
            self._busy.discard(work_id)

    def _done(self, home: str) -> dict[str, Any]:
        """The memo of work done (kept for Slack's retries), naming this signoff's home: a
        copy the store keeps of it under an older signoff's name is not dropped as this
        state's (`adopt`, `_names`)."""
        return {"state": "done", "until": self.channel.clock() + RETRY_WINDOW, "home": home}

    async def _ours(self, key: str, homes: tuple[str, ...]) -> bool:
        """Whether the store still names this state the home of the work under `key` (by one
        of `homes`, `_names`), which it then keeps, named by the first (its time renewed: no
        other state takes it up while it runs)."""
        memo = await self.shared.recall(key)
        if not isinstance(memo, dict) or memo.get("home") not in homes:
            return False
        await self.shared.keep({key: {**memo, "home": homes[0]}})
        return True

    def _try(self, key: str) -> tuple[int, bool, tuple[str, ...]] | None:
        """Count one more run of the work saved under `key`: which run this is, whether the
        store has the work too and the names it may give this state as its home (`_names`), or
        None if it is no longer pending."""
        ch = self.channel
        memo = ch.recall(key)
        if not isinstance(memo, dict) or memo.get("state") != "pending":
            return None
        tries = int(memo.get("tries") or 0) + 1
        ch.remember(key, {**memo, "tries": tries, "by": ch.owner()})
        return tries, memo.get("shared") is True, self._names(memo)


def damaged_note(request_id: str) -> str:
    """What a person is told whose click or reply reached a request whose stored row cannot be
    read (`StoreDamaged`): nothing was taken, and trying again does not help."""
    return (
        f"Request {request_id} cannot be read from the store (its stored data is damaged): "
        "nothing was taken, and trying again here does not help."
    )


def seconds(value: Any) -> float:
    """A saved time, or 0 for one that is not a number (so its memo is dropped)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
