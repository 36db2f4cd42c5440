"""That a `WebhookChannel` warned of a request's deadline (`request.expiring`), kept in the
runtime's store beside the hub's claim (memo `<hub>.<channel>:warned:<request>`) as well as in
the hub's state: a hub taking over on another machine (another state), or started again on a
state that lost the memo, does not warn of the same request again. Both are dropped when the
request closes. On a store without channel memos (one of your own, an earlier signoff's) it is
kept in the state only, as before.

A request whose row the store cannot read (`StoreDamaged`) is passed, logged once: the
others are warned of as due, and the channel's rounds of redelivery go on.

A warning is checked again as it is sent (`still_due`): one given up on while its receiver was
down and sent again by a round or a start after its request closed warns of nothing, and is
dropped instead, from the state and the store alike."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from .._exceptions import SchemaVersionError, StoreDamaged, StoreError
from ._base import logger, off_loop
from ._shared import Shared

if TYPE_CHECKING:
    from .._types import InputRequest
    from .webhooks import WebhookChannel

__all__ = [
    "WARNED",
    "drop_warned",
    "drop_warned_erased",
    "keep_warned",
    "may_be_warned",
    "still_due",
    "warn",
    "was_warned",
]

WARNED = "warned:"  # the memo, in the state and the store, per request warned of


def _shared(channel: WebhookChannel) -> Shared | None:
    if channel._runtime is None:
        return None
    shared = Shared(channel)
    return shared if shared.kept else None


async def was_warned(channel: WebhookChannel, request_id: str) -> bool:
    """Whether `request_id` was warned of: by the state's memo, else by the store's (a hub on
    another state, or this one's lost state, may have warned)."""
    key = f"{WARNED}{request_id}"
    if await off_loop(channel.recall, key):
        return True
    shared = _shared(channel)
    return shared is not None and bool(await shared.recall(key))


async def keep_warned(channel: WebhookChannel, request_id: str) -> None:
    """Keep that `request_id` was warned of, in the store first, then in the state."""
    key = f"{WARNED}{request_id}"
    shared = _shared(channel)
    if shared is not None:
        await shared.keep({key: True})
    await off_loop(channel.remember, key, True)


def may_be_warned(request: InputRequest) -> bool:
    """Whether a closed `request` may have been warned of: it had a deadline (escalation lifts
    it and names the group). Others keep no memo in the store to drop."""
    return request.expires_at is not None or request.escalated_to is not None


async def drop_warned_erased(channel: WebhookChannel, request_id: str) -> None:
    """Drop the memo of a request erased with its session, wherever one is kept: nothing else
    is left of the request to tell whether it had a deadline."""
    if await was_warned(channel, request_id):
        key = f"{WARNED}{request_id}"
        shared = _shared(channel)
        if shared is not None:
            await shared.keep({key: None})
        await off_loop(channel.forget, key)


async def drop_warned(channel: WebhookChannel, request: InputRequest) -> None:
    """Drop the memo of a closed request (it is never warned of again): from the store first
    (only where it may be warned of: a write saved on each other close), then from the
    state."""
    key = f"{WARNED}{request.id}"
    shared = _shared(channel)
    if shared is not None and may_be_warned(request):
        await shared.keep({key: None})
    await off_loop(channel.forget, key)


async def warn(channel: WebhookChannel, now: float) -> None:
    """Queue `request.expiring` for each request within `expiring_within` of its deadline. A
    row written by a newer signoff (`SchemaVersionError`) is tried again at the next tick, the
    others warned of first; any other store failure is raised at once (the next tick tries
    again)."""
    newer: SchemaVersionError | None = None
    for rid, r in list(channel._deadlines.items()):
        assert r.expires_at is not None
        if now < r.expires_at - channel.expiring_within:
            continue
        try:
            due = rid in channel._unkept or (
                now < r.expires_at
                and await _still_expiring(channel, r)
                and not await was_warned(channel, rid)
            )
        except SchemaVersionError as exc:
            newer = newer or exc
            continue
        if due:
            # Queued (and kept) before it counts as warned, in the store and the state: one
            # that fails in between leaves it for the next tick instead of losing it, which
            # keeps the memo without queuing the warning again.
            if rid not in channel._unkept:
                await channel.enqueue("request.expiring", r)
                channel._unkept.add(rid)
            await keep_warned(channel, rid)
            channel._unkept.discard(rid)
        channel._deadlines.pop(rid, None)
    if newer is not None:
        raise newer


async def _still_expiring(channel: WebhookChannel, request: InputRequest) -> bool:
    """Whether `request` is open with the deadline it was shown with, as stored now. An
    opening delivered late (one the hub gave up on, delivered again at its next start) can
    come after the request's close: it is not warned about, and no memo is left behind
    that its close (already delivered) would have dropped. A row the store cannot decode is
    not (logged, and passed for good: it reads the same at every tick)."""
    if channel._runtime is None:
        return True
    try:
        stored = await channel._runtime.store.get_request(request.id)
    except StoreDamaged as exc:
        logger.warning(
            "channel %s passes request %s (session %s): the store holds its row damaged: %s; "
            "no request.expiring is sent for it",
            channel.name,
            request.id,
            request.session_id,
            exc,
        )
        return False
    return (
        stored is not None
        and stored.status == "pending"
        and stored.request.expires_at == request.expires_at
    )


async def still_due(channel: WebhookChannel, raw: bytes) -> bool:
    """Whether the `request.expiring` body `raw` may still be sent: its request is open with
    the deadline it warns of, as stored now, and that deadline is still ahead (one passed and
    not yet recorded is no warning any more). A store that fails, or a body that does not name
    its request and deadline, sends it: it was due when it was queued."""
    if channel._runtime is None:
        return True
    try:
        request = json.loads(raw)["request"]
        rid, expires_at = request["id"], request["expires_at"]
    except (ValueError, KeyError, TypeError):
        return True
    if not isinstance(rid, str):
        return True
    try:
        stored = await channel._runtime.store.get_request(rid)
    except StoreError:
        return True
    return (
        stored is not None
        and stored.status == "pending"
        and stored.request.expires_at == expires_at
        and isinstance(expires_at, int | float)
        and channel._runtime.now() < expires_at
    )
