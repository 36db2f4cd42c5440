"""`Standby`: the part of a `ChannelHub` that decides which of its channels it delivers to.

A hub delivers to a channel while it holds both the OS lock next to its state file (`HubLease`,
against hubs on that file of this machine) and the claim in the runtime's store (`Claims`,
against hubs on any other state); for the others it stands by, and takes over at a poll once
the hub before let go of them or its claim lapsed. While it delivers (a poll, a start) it
renews its claims in the background, however long that takes (`_keeping`), and so it does while
it waits for its next poll (`_pause`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from .._exceptions import StoreError
from .._recording import own_cancel
from .._work_waits import Failing
from ._base import Channel, logger
from ._claims import Claims
from ._lease import HubLease
from ._stray_cancels import stray_cancels

__all__ = ["Standby"]


class Standby:
    """The locks and claims of a `ChannelHub`: taken, stood by for, taken over and let go."""

    name: str
    channels: list[Channel]
    _leases: dict[str, HubLease]  # by channel name; none for a state in memory
    _active: set[str]  # the channels this hub delivers to (holding their locks)
    _claims: Claims
    _unclaimed: set[str]  # channels locked here whose claim another hub holds
    _positions: dict[str, int]  # the last entry each channel delivered to handled
    _renewals: Failing  # the keeper's renewals (`_keep`), logged once while they fail
    _stopping: bool  # a stop under way: a cancel of the hub's task is its own

    async def _activate(self, channels: list[Channel]) -> None:
        """Start delivering to `channels`, whose locks and claims this hub holds (`ChannelHub`
        does)."""
        raise NotImplementedError

    async def _free(self, *, every: bool = True) -> list[Channel]:
        """The channels not delivered to yet whose lock and claim (`Claims`) this hub took.
        Those whose lock it took and whose claim another hub holds keep the lock (this hub is
        the one on its file to take over) and are tried again at most every `TRY_EVERY`
        seconds (`Claims.due`), unless `every`."""
        locked = self._lock_free()
        fresh = [ch for ch in locked if ch.name not in self._unclaimed]
        if not every and not fresh and not self._claims.due():
            return []
        free: list[Channel] = []
        try:
            for ch in locked:
                if await self._claims.take(ch.name, locked=ch.name in self._leases):
                    self._unclaimed.discard(ch.name)
                    free.append(ch)
                else:
                    self._unclaimed.add(ch.name)
        except BaseException:  # the store is down: nothing taken stays taken
            for ch in locked:
                with contextlib.suppress(Exception):
                    await self._claims.release(ch.name, None)
                if ch.name in self._leases:
                    self._leases[ch.name].release()
                self._unclaimed.discard(ch.name)
            raise
        return free

    def _lock_free(self) -> list[Channel]:
        """The channels not delivered to yet whose lock this hub could take (all, in memory)."""
        waiting = [ch for ch in self.channels if ch.name not in self._active]
        return [
            ch for ch in waiting if ch.name not in self._leases or self._leases[ch.name].acquire()
        ]

    async def _take_over(self) -> None:
        """For a standby: deliver to the channels whose lock and claim another hub let go of
        (or whose claim lapsed)."""
        free = await self._free(every=False)
        if not free:
            return
        try:
            async with self._keeping():  # a channel's start may take long (many open requests)
                await self._activate(free)
        except BaseException:  # e.g. the store is down: stand by again and retry on a poll
            for ch in free:
                await self._stand_by(ch)
            raise  # a StoreError is logged by `_follow` once while it keeps failing
        # Said once it is so: a try the state fails is retried at every poll.
        names = ", ".join(ch.name for ch in free)
        logger.warning("channel hub %s: took over delivery to %s", self.name, names)

    async def _stand_by(self, ch: Channel, *, lost: bool = False) -> None:
        """Stop delivering to `ch`: its object closed, then its claim and lock let go (or, when
        `lost` to another hub, the lock kept: this hub is its file's next to take over)."""
        self._active.discard(ch.name)
        # Before the lock goes: a channel started (webhooks sending what the hub before left
        # unsent) would go on beside the hub that takes the lock next.
        try:
            with stray_cancels(ch.name, "close"):
                await ch.close()
        except Exception:
            logger.exception("channel %s failed to close", ch.name)
        if lost:
            self._unclaimed.add(ch.name)
            return
        with contextlib.suppress(Exception):  # the store down: it lapses
            await self._claims.release(ch.name, None)
        if ch.name in self._leases:
            self._leases[ch.name].release()

    async def _renew(self, live: list[Channel]) -> list[Channel]:
        """Keep the claims of the channels delivered to (`Claims.renew`); those another hub
        took meanwhile (this one stalled past the claim's time, or could not renew it) are
        stood by for. The channels still delivered to."""
        kept = []
        for ch in live:
            if await self._claims.renew(ch.name, self._positions[ch.name]):
                kept.append(ch)
                continue
            logger.warning(
                "channel hub %s: its claim on %s lapsed and another hub took it (this one "
                "stalled past %gs, or could not renew it); standing by",
                self.name,
                ch.name,
                self._claims.ttl,
            )
            await self._stand_by(ch, lost=True)
        return kept

    @contextlib.asynccontextmanager
    async def _keeping(self, *, waiting: bool = False) -> AsyncIterator[None]:
        """Renew the claims of the channels delivered to while the body (a poll, a start)
        runs, whenever they fall due (`_keep`): a backlog, a slow channel or one delivery
        longer than `claim_ttl` keeps them, where renewing only between polls let a standby
        take over while this hub still delivered, and both did. A claim found taken meanwhile
        is no longer held (`Claims.live`): the body delivers nothing more under it.
        `waiting`: the body is the wait between polls (`_pause`), which a stop cancels."""
        if not self._claims.kept:
            yield
            return
        done = asyncio.Event()
        keeper = asyncio.create_task(self._keep(done), name=f"signoff-hub-{self.name}-claims")
        cut = False
        try:
            yield
        except asyncio.CancelledError:
            cut = waiting
            raise
        finally:
            done.set()
            if cut:
                # A stop is prompt, not held by a slow renewal under way. Cut off, it writes
                # nothing after the give-back that follows: `Claims.release` waits for it, and
                # a renewal is kept only while the claim still names this hub (`renewing`).
                keeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await keeper
            else:
                # Shielded: a poll cut off (a stop) waits for a renewal under way; but a stop
                # that comes once the wait between polls is over, while a renewal goes on, cuts
                # it off as one during the wait does.
                try:
                    await asyncio.shield(keeper)
                except asyncio.CancelledError:
                    if waiting:
                        keeper.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await keeper
                    raise

    async def _keep(self, done: asyncio.Event) -> None:
        """Renew the claims held as each falls due (`Claims.due_in`) until `done`; a failure
        (the store down) is logged once and tried again a sixth of `claim_ttl` later, while
        `Claims.live` stops the deliveries under a claim not renewed in time."""
        failing = self._renewals
        wait = self._claims.due_in(self._to_renew())
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await done.wait()
            if done.is_set():
                return
            try:
                for name in self._to_renew():
                    await self._claims.renew(name, self._positions[name])
            except StoreError as exc:
                failing.failed(exc, 0.0)
                wait = self._claims.ttl / 6
                continue
            except Exception:
                logger.exception("channel hub %s: renewing its claims failed", self.name)
                wait = self._claims.ttl / 6
                continue
            except asyncio.CancelledError as exc:
                # The store's own (something it awaited was cancelled), not this task's: a
                # failed renewal. Re-raised, it ended the keeper, and the hub's wait with it.
                if not own_cancel(exc):
                    raise
                logger.exception("channel hub %s: a renewal was cancelled from within", self.name)
                wait = self._claims.ttl / 6
                continue
            failing.worked()
            wait = self._claims.due_in(self._to_renew())

    async def _pause(
        self, seconds: float, wait: Callable[[None, float], Awaitable[Any]] | None
    ) -> None:
        """Wait `seconds` for the next poll (or less, for the store's word of a change: `wait`,
        a plain sleep if it fails), renewing the claims held meanwhile (`_keeping`): renewed
        only at the polls, a `poll_interval` past `claim_ttl` let them lapse between two, and
        hubs sharing the store took the channels from each other in turn."""
        try:
            async with self._keeping(waiting=True):
                if wait is not None:
                    try:
                        await wait(None, seconds)
                        return
                    except Exception:
                        pass
                    except asyncio.CancelledError as exc:  # the store's own: `wait` failed
                        if not own_cancel(exc):
                            raise
                await asyncio.sleep(seconds)
        except asyncio.CancelledError as exc:
            # As for a poll (`_follow`), only a cancel of the hub's task (a stop) ends it: a
            # stray one (of something the keeper awaited) ended it silently, for every channel.
            if self._stopping or not own_cancel(exc):
                raise
            logger.exception(
                "channel hub %s: its wait for the next poll was cancelled from within", self.name
            )

    def _to_renew(self) -> list[str]:
        """The channels whose claims the keeper renews: delivered to, and claimed still."""
        return [
            ch.name
            for ch in self.channels
            if ch.name in self._active and ch.name in self._claims.held
        ]
