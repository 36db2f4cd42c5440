"""The copies of a `WebhookChannel`'s unsent deliveries in the runtime's store (`Shared`): the
hub that delivers to the channel next on another state (another machine) sends those a lost
machine's state kept, instead of losing them with that state.

Each is a memo `outbox:<digest of the URL> <delivery>` (a digest: a password in the URL stays
out of the store), kept before the delivery is queued and dropped once it is sent or refused.
A start keeps in its own state the copies of deliveries to its URLs that the state lacks, and
sends them with its own: a delivery can then arrive twice, as receivers already expect. One
that the state records as refused is not sent again but dropped (a crash or a store outage
kept it), and a copy the store failed to drop is dropped at a later tick (`DROPPING`).
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from .._exceptions import SignoffError
from ._base import logger, off_loop
from ._shared import Shared
from ._webhook_refusals import refused
from ._webhook_urls import endpoint, masked, spellings

if TYPE_CHECKING:
    from .webhooks import WebhookChannel

__all__ = [
    "DROPPING",
    "OUTBOX",
    "by_digest",
    "digest",
    "drop_copy",
    "drop_pending",
    "keep_copies",
    "kept_in_store",
    "readable",
    "take_copies",
    "unsent",
]

OUTBOX = "outbox:"  # memo key prefix of a delivery not yet sent: "outbox:{url} {delivery}"
DROPPING = "dropping:"  # in the state: "dropping:{url} {delivery}", done, its store copy kept


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


async def drop_copy(channel: WebhookChannel, url: str, delivery: str, outcome: str) -> None:
    """Drop the store's copy of a delivery `outcome` (delivered or refused). A store that fails
    leaves it, logged, and noted in the state (`DROPPING`) for a later tick to drop: until
    then a hub taking over on another state may send it again."""
    shared = _shared(channel)
    if shared is None:
        return
    try:
        await shared.keep({f"{OUTBOX}{digest(url)} {delivery}": None})
    except SignoffError as exc:
        logger.warning(
            "webhook %s: %s was %s, but the store's copy of it stays (dropped at a later poll; "
            "until then a hub on another state may send it again): %s",
            masked(url),
            delivery,
            outcome,
            exc,
        )
        channel._undropped = True
        try:
            await off_loop(channel.remember, f"{DROPPING}{url} {delivery}", True)
        except SignoffError as again:  # the state fails too: this run's ticks do not see it
            logger.warning("webhook %s: keeping that in the state failed: %s", masked(url), again)


async def drop_pending(channel: WebhookChannel) -> None:
    """Drop the store's copies the store failed to drop when their deliveries were done
    (`DROPPING`); a store still failing raises, for the next tick to try again."""
    shared = _shared(channel)
    pending = await off_loop(channel.memos, DROPPING)
    if shared is not None and pending:
        gone = [key.removeprefix(DROPPING).rpartition(" ") for key, _ in pending]
        await shared.keep({f"{OUTBOX}{digest(url)} {delivery}": None for url, _, delivery in gone})
    for key, _ in pending:
        await off_loop(channel.forget, key)
    channel._undropped = False


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
    urls = by_digest(channel.urls)

    def keep_absent() -> tuple[int, dict[str, Any]]:
        have = {key for key, _ in channel.memos(OUTBOX)}
        done = refused(channel)
        taken = 0
        rekeyed: dict[str, Any] = {}
        for key, kept, _ in copies:
            named, _, delivery = key.removeprefix(OUTBOX).partition(" ")
            url = urls.get(named)
            if url is not None and f"{url} {delivery}" in done:
                rekeyed[key] = None  # refused, its copy kept by a crash or an outage
                continue
            if url is None or not readable(kept):
                continue
            if named != digest(url):  # an earlier spelling's: kept again under the URL's own
                rekeyed[f"{OUTBOX}{digest(url)} {delivery}"] = kept
                rekeyed[key] = None
            if f"{OUTBOX}{url} {delivery}" not in have:
                channel.remember(f"{OUTBOX}{url} {delivery}", kept)
                have.add(f"{OUTBOX}{url} {delivery}")
                taken += 1
        return taken, rekeyed

    taken, rekeyed = await off_loop(keep_absent)
    await shared.keep(rekeyed)  # one write: a crash loses neither key's copy
    if taken:
        logger.warning(
            "channel %s: sending %s deliveries another state kept in the store unsent",
            channel.name,
            taken,
        )


def by_digest(urls: list[str]) -> dict[str, str]:
    """Each URL by the `digest` its deliveries' copies and waits are kept under in the store,
    and by that of the spelling an earlier signoff kept them under (`spellings`)."""
    return {digest(spelled): url for url in urls for spelled in reversed(spellings(url))}


def readable(kept: Any) -> bool:
    """Whether `kept` is a delivery as kept: its event and body."""
    return (
        isinstance(kept, dict)
        and isinstance(kept.get("event"), str)
        and isinstance(kept.get("body"), str)
    )


def unsent(channel: WebhookChannel) -> list[tuple[str, str, dict[str, Any]]]:
    """The deliveries an earlier run kept and did not send (`url`, `delivery`, the memo);
    those of a URL no longer configured are dropped, and so are those the state records as
    refused (a crash between the two writes kept them). One kept under another spelling of a
    URL (an earlier version's key: `https://Example.com:443/x`) is kept again under its
    `endpoint` first, so it is sent once and then forgotten. One kept damaged (no event and
    body) is dropped, logged; one that is not JSON is passed by the state, logged."""
    found: dict[str, tuple[str, str, dict[str, Any]]] = {}
    done = refused(channel)
    for key, kept in channel.memos(OUTBOX):
        spelled, _, delivery = key.removeprefix(OUTBOX).rpartition(" ")  # a URL may hold " "
        url = endpoint(spelled)
        if url not in channel.urls:
            logger.warning("webhook %s is no longer configured; dropping %s", masked(url), delivery)
            channel.forget(key)
        elif not readable(kept):  # damaged: no event and body to send
            logger.warning("webhook %s: dropping %s, kept damaged", masked(url), delivery)
            channel.forget(key)
        elif f"{url} {delivery}" in done:
            channel.forget(key)
        else:
            if url != spelled:  # kept again before the old key goes: a crash loses neither
                channel.remember(f"{OUTBOX}{url} {delivery}", kept)
                channel.forget(key)
            found.setdefault(f"{url} {delivery}", (url, delivery, kept))  # one of two spellings
    return list(found.values())
