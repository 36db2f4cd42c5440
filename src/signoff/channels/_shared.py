"""`Shared`: memos a channel keeps in the runtime's store beside its hub's claim, for whichever
hub delivers to the channel next: one on another machine (with another state) goes on from
what the first did, e.g. updates the Slack messages it posted rather than post them again.

They are rows of the store's `channel_claims` named `<hub>.<channel>:<key>` (a claim's name has
no `:`), so a store that never runs a hub pays nothing for them. A store without them (one of
your own, an earlier signoff's) keeps nothing there, as before.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ._base import logger

if TYPE_CHECKING:
    from ._base import Channel

__all__ = ["Shared"]


class Shared:
    """The memos `channel` shares with the hubs of its name on other states, through the store
    (JSON values, as its state's)."""

    def __init__(self, channel: Channel) -> None:
        self.channel = channel

    def _store(self) -> Any:
        store = self.channel.runtime.store
        return store if hasattr(store, "channel_memo") else None

    def _name(self, key: str) -> str:
        ch = self.channel
        return f"{ch._hub}.{ch.name}:{key}"

    async def recall(self, key: str) -> Any:
        """The value under `key`, or None (none, no store keeping them, or unreadable)."""
        store = self._store()
        if store is None:
            return None
        raw = await store.channel_memo(self._name(key))
        if raw is None:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            logger.warning("the channel memo %s in the store is unreadable", self._name(key))
            return None

    @property
    def kept(self) -> bool:
        """Whether the runtime's store keeps these memos (not one of your own without them)."""
        return self._store() is not None

    async def listed(self, prefix: str) -> list[tuple[str, Any, float]]:
        """The memos whose key starts with `prefix`: each key, value and how many seconds ago
        (by the runtime's clock, the database's on PostgreSQL) it was kept, oldest first (an
        unreadable one's value None)."""
        store = self._store()
        if store is None or not hasattr(store, "channel_memos"):
            return []
        rows = await store.channel_memos(self._name(prefix))
        now = self.channel.runtime.now()
        found: list[tuple[str, Any, float]] = []
        for name, raw, at in rows:
            try:
                value = json.loads(raw)
            except ValueError:
                logger.warning("the channel memo %s in the store is unreadable", name)
                value = None
            found.append((name.removeprefix(self._name("")), value, now - at))
        return found

    async def keep(self, memos: Mapping[str, Any], *, durable: bool = False) -> None:
        """Keep each value under its key, or drop the memo where it is None, at once
        (`durable`: synced to disk before it returns, as an answer is)."""
        store = self._store()
        if store is None or not memos:
            return
        texts = {
            self._name(key): None if value is None else json.dumps(value, separators=(",", ":"))
            for key, value in memos.items()
        }
        now = self.channel.runtime.now()
        if durable:
            await store.keep_channel_memos(texts, now, durable=True)
        else:  # a store of an earlier signoff's may not take `durable`
            await store.keep_channel_memos(texts, now)
