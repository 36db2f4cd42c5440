"""`Claims`: the claim a `ChannelHub` holds in the runtime's store on delivering to each of its
channels, so hubs in any processes sharing the store (on any machines, with any channel state)
deliver each entry to a channel once.
Beside it, in a memo of the store's (`delivered`), the hub keeps the entries it delivered above
the position saved in it (past a hole in the ids), which the hub that takes it next skips; it
writes both together, and only while the claim still names it (`renew`).

A claim names the hub and the channel (as the hub's file lock does), its owner (this hub) and
when it lapses; the delivering hub renews it at its polls, saving the position it reached, and
in the background while a poll goes on (`Standby._keeping`), and gives it back when it stops. A
hub that dies leaves it to lapse after `ttl` seconds; another
then takes it and goes on from that position (or its own state's, if further on), if the
claim was given back or lapsed within `FRESH` seconds (a hub without a position of its own
otherwise starts at the end, as on a first start). A hub that
holds the file lock next to its state file takes over at once a claim of a hub on the same file
by the same path (whose owner starts with the file's own id, `ChannelState.identity`, and that
path, not the machine's name and the path, which another machine's file can share): that lock
says the hub before is gone. A store without claims (an earlier signoff's) leaves each hub to
deliver on its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os
import secrets
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from ._base import logger

if TYPE_CHECKING:
    from .._runtime import Runtime

__all__ = ["FRESH", "MARGIN", "TRY_EVERY", "Claims"]

TRY_EVERY = 2.0  # seconds between a standby's tries for claims another hub holds
# The part of `ttl` before a claim's lapse (reckoned from when its last renewal was asked) in
# which the hub no longer delivers under it unless a renewal gets through: another may take it.
MARGIN = 0.1
# Seconds within which a claim given back or lapsed passes its position on to the hub that
# takes it next; a hub taking an older one (with no position of its own) starts at the end.
FRESH = 600.0
# The key of the memo (`<hub>.<channel>:hub:delivered`) of the entries delivered above the
# claim's position; no channel's own memo key starts with `hub:`.
DELIVERED = "hub:delivered"


class Claims:
    """The claims of one hub (`hub`, the hub's name) in the store of `runtime`: on PostgreSQL
    timed by the database's clock at each statement (every process agrees on it, whatever its
    own reckoning of it), on SQLite by the runtime's clock (the machine's, shared)."""

    def __init__(self, runtime: Runtime, hub: str, ttl: float) -> None:
        self.runtime = runtime
        self.hub = hub
        self.ttl = ttl
        # The hubs on this hub's state file (`bind`): the one holding its lock succeeds the others.
        self.family = f"unbound-{secrets.token_hex(16)}|"
        self._me = f"{os.getpid()}|{secrets.token_hex(6)}"
        self.held: set[str] = set()  # channels claimed
        self.saved: dict[str, int | None] = {}  # the position each claim held when taken
        # monotonic time each claim's last renewal (or take) was asked at, and the position saved
        self._renewed: dict[str, tuple[float, int | None]] = {}
        self._tried_at: float | None = None  # monotonic time of the last try for free claims
        self._writing = asyncio.Lock()  # renewals (the poll's, the keeper's) and give-backs
        self._checked: bool | None = None  # whether the store's renewals name their owner

    def bind(self, state_id: str, state_path: str) -> None:
        """Name the state this hub is on: its file's own id (`ChannelState.identity`) and the
        path it is opened by, which names the lock next to it. The hubs with both, and only
        those, contend for that lock, so the one holding it succeeds the others at once; a hub
        on another machine's file at the same path, or on this file by another path (another
        lock), does not."""
        where = "memory" if state_path == ":memory:" else os.path.abspath(state_path)
        # Hashed: a `|` in the path cannot make one family a prefix of another's.
        self.family = f"{state_id}|{hashlib.sha256(os.fsencode(where)).hexdigest()[:16]}|"

    @property
    def owner(self) -> str:
        """This hub's name in its claims: its state's (`bind`), its process and a token."""
        return f"{self.family}{self._me}"

    @property
    def store(self) -> Any:
        return self.runtime.store

    def now(self) -> float:
        return self.runtime.now()

    @property
    def kept(self) -> bool:
        """Whether the store keeps claims (not one of an earlier signoff)."""
        return hasattr(self.store, "claim_channel")

    def name(self, channel: str) -> str:
        return f"{self.hub}.{channel}"

    def due(self) -> bool:
        """Whether a standby may try for claims now: at most every `TRY_EVERY` seconds (or a
        third of `ttl`, if less), so hubs standing by (with no file lock to wait on) do not
        write to the store at every poll."""
        at = time.monotonic()
        if self._tried_at is not None and at - self._tried_at < min(self.ttl / 3, TRY_EVERY):
            return False
        self._tried_at = at
        return True

    async def take(self, channel: str, *, locked: bool) -> bool:
        """Claim `channel`; `locked`: this hub holds the file lock of its state, so a claim of
        a hub on the same file (`bind`) is taken over at once."""
        if not self.kept:
            self.held.add(channel)
            return True
        asked, now = time.monotonic(), self.now()
        held, saved, since = await self.store.claim_channel(
            self.name(channel),
            self.owner,
            self.ttl,
            now,
            succeeds=self.family if locked else None,
        )
        if held:
            self.held.add(channel)
            # Passed on from a hub gone within `FRESH` seconds; an older one's is not.
            fresh = since is not None and since >= now - FRESH
            self.saved[channel] = saved if fresh else None
            self._renewed[channel] = (asked, saved)
        return bool(held)

    def live(self, channel: str) -> bool:
        """Whether this hub may deliver to `channel` now: it holds the claim, renewed within
        `ttl` less a `MARGIN` of it (a renewal late, the store unreachable or this process
        stalled, may let another hub take the claim: nothing more is delivered under it until
        a renewal gets through or finds it taken)."""
        if channel not in self.held:
            return False
        if not self.kept:
            return True
        at, _ = self._renewed.get(channel, (0.0, None))
        return time.monotonic() - at < self.ttl * (1 - MARGIN)

    def due_in(self, channels: Iterable[str]) -> float:
        """Seconds until the first claim of `channels` is due for renewal (a third of `ttl`
        after the last), 0 if one is overdue: when a busy hub renews them (`Standby._keep`)."""
        times = [self._renewed[ch][0] for ch in channels if ch in self._renewed]
        if not times:
            return self.ttl / 3
        return max(0.0, min(times) + self.ttl / 3 - time.monotonic())

    async def renew(
        self,
        channel: str,
        position: int,
        *,
        force: bool = False,
        delivered: list[int] | None = None,
    ) -> bool:
        """Keep the claim on `channel`, saving `position` in it, when a third of `ttl` has
        passed since the last renewal or the position moved (or `force`, or `delivered` is
        given: the ids delivered above `position`, kept beside it in the same write); False
        if another hub took it meanwhile (this one stalled past `ttl`), even one that gave it
        back since, or it was lost or given back before (only `take` claims it again)."""
        if not self.kept:
            return True
        memos = None
        if delivered is not None and self._memos() is not None:
            text = json.dumps(delivered, separators=(",", ":")) if delivered else None
            memos = {f"{self.name(channel)}:{DELIVERED}": text}
        async with self._writing:  # one at a time: a second one finds the first's done
            if channel not in self.held:
                return False
            at, kept = self._renewed.get(channel, (0.0, None))
            recent = time.monotonic() - at < self.ttl / 3
            if not force and memos is None and kept == position and recent:
                return True
            asked = time.monotonic()
            # Only while the claim still names this hub: one that took it meanwhile went on
            # from its position and memo, which this one's must not overwrite.
            held, _, _ = await self.store.claim_channel(
                self.name(channel),
                self.owner,
                self.ttl,
                self.now(),
                after_id=position,
                **self._renewing(memos),
            )
            if not held:
                self.held.discard(channel)
                self._renewed.pop(channel, None)
                return False
            if channel not in self.held:  # given back meanwhile (`release` waits for this)
                return False
            self._renewed[channel] = (asked, position)
            return True

    async def release(self, channel: str, position: int | None) -> None:
        """Give back the claim on `channel`, saving `position` in it first (if known)."""
        if channel not in self.held:
            return
        self.held.discard(channel)  # no renewal begun from now on takes it again
        self._renewed.pop(channel, None)
        if not self.kept:
            return
        async with self._writing:  # after a renewal under way, not before it
            if position is not None:
                await self.store.claim_channel(
                    self.name(channel),
                    self.owner,
                    self.ttl,
                    self.now(),
                    after_id=position,
                    **self._renewing(None),
                )
            await self.store.release_channel(self.name(channel), self.owner, self.now())

    def _renewing(self, memos: dict[str, str | None] | None) -> dict[str, Any]:
        """`claim_channel`'s keywords for a renewal: kept only while the claim names this hub,
        `memos` in the same write; none for a store class of an application's own written
        before they were (its renewals as then, and no memo kept: a takeover on another state
        may deliver again what this hub delivered past a hole)."""
        if self._checked is None:
            try:
                params = list(inspect.signature(self.store.claim_channel).parameters.values())
            except (TypeError, ValueError):  # its signature cannot tell: take it as current
                params = [inspect.Parameter("renewing", inspect.Parameter.KEYWORD_ONLY)]
            self._checked = any(
                p.name == "renewing" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params
            )
        return {"renewing": True, "memos": memos} if self._checked else {}

    def _memos(self) -> Any:
        """The store, if it keeps memos beside the claims (not one of an earlier signoff)."""
        store = self.store
        return store if self.kept and hasattr(store, "keep_channel_memos") else None

    async def delivered(self, channel: str) -> list[int]:
        """The ids the hubs holding the claim on `channel` before delivered above the position
        they saved in it (`renew`'s `delivered`); none if the store keeps none, or unreadable."""
        store = self._memos()
        if store is None or not hasattr(store, "channel_memo"):
            return []
        name = f"{self.name(channel)}:{DELIVERED}"
        raw = await store.channel_memo(name)
        if raw is None:
            return []
        try:
            ids = json.loads(raw)
        except ValueError:
            ids = None
        if not isinstance(ids, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in ids
        ):
            logger.warning("the channel memo %s in the store is unreadable", name)
            return []
        return ids
