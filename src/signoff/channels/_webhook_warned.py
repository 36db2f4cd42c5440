"""That a `WebhookChannel` warned of a request's deadline (`request.expiring`), kept in the
runtime's store beside the hub's claim (memo `<hub>.<channel>:warned:<request>`) as well as in
the hub's state: a hub taking over on another machine (another state), or started again on a
state that lost the memo, does not warn of the same request again. Both are dropped when the
request closes. On a store without channel memos (one of your own, an earlier signoff's) it is
kept in the state only, as before."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._base import off_loop
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
