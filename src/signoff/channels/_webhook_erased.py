"""What a `WebhookChannel` keeps unsent of a request erased with its session (`delete_session`,
`prune`: an erasure request) goes with it: its opening, escalation and warning are not sent (a
receiver that never heard of the request has nothing to close), and its close is sent as a
stub, `request` holding only its `id` and `session_id` and the resolution no `answer` nor
`edited_input` (`stripped`), under the same delivery id, where it was queued.

A hub delivering to the channel learns of the erasure from the deletion's audit entry
(`on_erased`, `on_erased_closed`): the queued deliveries, the state's outbox and the store's
copies are dropped or stripped then (`forget_erased`). One that was down at the erasure, or on
another state taking over the store's copies, checks each kept delivery's request in the store
before it queues it (`erased_among`): it reads the deletion only after its workers began.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any

from .._exceptions import StoreDamaged
from ._base import off_loop
from ._shared import Shared
from ._webhook_bodies import delivery_id, json_bytes
from ._webhook_outbox import OUTBOX, digest, kept_in_store, readable
from ._webhook_urls import endpoint

if TYPE_CHECKING:
    from .webhooks import WebhookChannel

__all__ = ["erased_among", "forget_erased", "stripped"]

_EVENTS = ("request.opened", "request.escalated", "request.expiring", "request.resolved")
_CONTENT = ("resolution.answer", "resolution.edited_input")  # what a stub's `clipped` leaves out


def stripped(body: dict[str, Any]) -> dict[str, Any] | None:
    """`body` as it may still go out once its request is erased: None for anything but its
    close, which keeps only the request's `id` and `session_id`, and no answer nor edited input
    (the erasure's subject: the call's input, the question and what was answered)."""
    if body.get("type") != "request.resolved":
        return None
    request = body.get("request")
    request = request if isinstance(request, dict) else {}
    left = {**body, "request": {k: request[k] for k in ("id", "session_id") if k in request}}
    resolution = body.get("resolution")
    if isinstance(resolution, dict):
        left["resolution"] = {**resolution, "answer": None, "edited_input": None}
    clipped = [
        c
        for c in body.get("clipped") or []
        if isinstance(c, str) and not c.startswith("request.") and c not in _CONTENT
    ]
    if clipped:
        left["clipped"] = clipped
    else:
        left.pop("clipped", None)
    return left


def _body(kept: Any) -> dict[str, Any] | None:
    """The body of a kept delivery (its memo), None if it cannot be read."""
    if not readable(kept):
        return None
    try:
        body = json.loads(kept["body"])
    except ValueError:
        return None
    return body if isinstance(body, dict) else None


async def erased_among(
    channel: WebhookChannel, found: Sequence[tuple[str, str, dict[str, Any]]]
) -> set[str]:
    """The requests of the kept deliveries `found` (as `unsent` gives them) that the store no
    longer has, each read once; a close already stripped is not read. A row the store cannot
    decode is a request it has; a read that fails raises (the start is tried again)."""
    if channel._runtime is None:
        return set()
    store = channel._runtime.store
    checked: dict[str, bool] = {}
    for _, _, kept in found:
        body = _body(kept)
        if body is None or stripped(body) == body:
            continue
        request = body.get("request")
        rid = request.get("id") if isinstance(request, dict) else None
        if not isinstance(rid, str) or rid in checked:
            continue
        try:
            checked[rid] = await store.get_request(rid) is None
        except StoreDamaged:
            checked[rid] = False
    return {rid for rid, gone in checked.items() if gone}


async def forget_erased(channel: WebhookChannel, request_ids: Collection[str]) -> bool:
    """Drop what `channel` keeps unsent of each of the erased `request_ids`, or keep it
    `stripped`: in its queues first (a worker skips it, or sends the stub, `_replaced`), then
    in the store's copies, then in its state's outbox, so a store that fails leaves the state
    as it was for the entry's retry (or the start's). Whether any was kept."""
    ids = {delivery_id(event, rid) for rid in request_ids for event in _EVENTS}
    if not ids or channel._state is None:
        return False
    copies: dict[str, Any] = {}
    memos: dict[str, Any] = {}
    for key, kept in await off_loop(channel.memos, OUTBOX):
        spelled, _, delivery = key.removeprefix(OUTBOX).rpartition(" ")
        body = _body(kept)
        if delivery not in ids or body is None:
            continue
        left = stripped(body)
        if left == body:
            continue
        raw = None if left is None else json_bytes(left)
        # Also where none has it queued: a round may be queuing it from the state just now.
        # Kept until the channel closes (a few bytes each): a store failing below leaves the
        # state's memo for a later round to queue again.
        channel._replaced[delivery] = raw
        now = None if raw is None else {"event": kept["event"], "body": raw.decode()}
        copies[f"{OUTBOX}{digest(endpoint(spelled))} {delivery}"] = now
        memos[key] = now
    if not memos:
        return False
    if kept_in_store(channel):
        await Shared(channel).keep(copies)
    await off_loop(_keep, channel, memos)
    return True


def _keep(channel: WebhookChannel, memos: dict[str, Any]) -> None:
    for key, kept in memos.items():
        if kept is None:
            channel.forget(key)
        else:
            channel.remember(key, kept)
