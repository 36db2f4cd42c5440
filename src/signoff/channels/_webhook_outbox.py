"""The copies of a `WebhookChannel`'s unsent deliveries in the runtime's store (`Shared`): the
hub that delivers to the channel next on another state (another machine) sends those a lost
machine's state kept, instead of losing them with that state.

Each is a memo `outbox:<digest of the URL> <delivery>` (a digest: a password in the URL stays
out of the store), kept before the delivery is queued and dropped once it is sent or refused.
A start keeps in its own state the copies of deliveries to its URLs that the state lacks, and
sends them with its own: a delivery can then arrive twice, as receivers already expect.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from .._exceptions import SignoffError
from ._base import logger, off_loop
from ._shared import Shared
from ._webhook_urls import masked

if TYPE_CHECKING:
    from .webhooks import WebhookChannel

__all__ = [
    "OUTBOX",
    "digest",
    "drop_copy",
    "keep_copies",
    "kept_in_store",
    "readable",
    "take_copies",
]

OUTBOX = "outbox:"  # memo key prefix of a delivery not yet sent: "outbox:{url} {delivery}"


def digest(url: str) -> str:
    """A URL's name in the store's memos: a digest, so a password in it stays out."""
    return hashlib.sha256(url.encode()).hexdigest()[:24]


def _shared(channel: WebhookChannel) -> Shared | None:
    """The channel's memos in the store, if it runs in a hub whose store keeps them."""
    if channel._runtime is None:
        return None
    shared = Shared(channel)
    return shared if shared.kept else None


def kept_in_store(channel: WebhookChannel) -> bool:
    """Whether the channel's unsent deliveries have copies in the store."""
    return _shared(channel) is not None


async def keep_copies(
    channel: WebhookChannel, urls: list[str], delivery: str, kept: dict[str, Any]
) -> None:
    """Keep in the store a copy of `delivery` (`kept`: its event and body) for each URL."""
    shared = _shared(channel)
    if shared is not None:
        await shared.keep({f"{OUTBOX}{digest(url)} {delivery}": kept for url in urls})


async def drop_copy(channel: WebhookChannel, url: str, delivery: str) -> None:
    """Drop the store's copy of a delivery sent or refused; a store that fails leaves it (a
    hub taking over may send it again, which receivers dedupe), logged."""
    shared = _shared(channel)
    if shared is None:
        return
    try:
        await shared.keep({f"{OUTBOX}{digest(url)} {delivery}": None})
    except SignoffError as exc:
        logger.warning(
            "webhook %s: the store's copy of %s, sent, stays: %s", masked(url), delivery, exc
        )


async def take_copies(channel: WebhookChannel) -> None:
    """Keep in the channel's state the store's copies of deliveries to its URLs that the state
    lacks (kept by a hub on another state, whose machine may be lost), for the start to send
    with its own; copies for URLs it does not have are left to the hubs that have them."""
    shared = _shared(channel)
    if shared is None:
        return
    copies = await shared.listed(OUTBOX)
    if not copies:
        return
    urls = {digest(url): url for url in channel.urls}

    def keep_absent() -> int:
        have = {key for key, _ in channel.memos(OUTBOX)}
        taken = 0
        for key, kept, _ in copies:
            digest, _, delivery = key.removeprefix(OUTBOX).partition(" ")
            url = urls.get(digest)
            if url is None or not readable(kept) or f"{OUTBOX}{url} {delivery}" in have:
                continue
            channel.remember(f"{OUTBOX}{url} {delivery}", kept)
            taken += 1
        return taken

    taken = await off_loop(keep_absent)
    if taken:
        logger.warning(
            "channel %s: sending %s deliveries another state kept in the store unsent",
            channel.name,
            taken,
        )


def readable(kept: Any) -> bool:
    """Whether `kept` is a delivery as kept: its event and body."""
    return (
        isinstance(kept, dict)
        and isinstance(kept.get("event"), str)
        and isinstance(kept.get("body"), str)
    )
