"""What a channel is told of an audit entry: a request opened, counted a vote, escalated or
closed, as the channel shows it (a subagent's request is shown as the child's own, never as its
mirror on the parent).

A session's deletion erases its requests and their entries at once, so a hub may never read
a close, or read it and find the request gone: the deletion's own entry names each request it
erased and the entry that closed it, and a channel is told of those closes from it (`Erased`)."""

from __future__ import annotations

from collections.abc import Callable

from .._types import InputRequest
from ..stores import Store
from ..stores._audit import AuditEntry
from ..stores._deletions import DELETIONS_STREAM, SESSION_DELETED
from ._base import Channel, Erased, Escalation, Resolution

__all__ = ["announce"]


async def announce(
    store: Store, ch: Channel, entry: AuditEntry, told: Callable[[int], bool] | None = None
) -> None:
    """Tell one channel about one entry (nothing, for entries it does not care about).
    `told(entry_id)`: whether the hub delivered that entry to `ch` already (None: not known,
    taken as not delivered)."""
    if entry.type == "input.requested":
        for raw in entry.data.get("requests", ()):
            request = InputRequest.model_validate(raw)
            if request.child is not None or not ch.accepts(request):
                continue
            if ch.live_only:
                stored = await store.get_request(request.id)
                if stored is not None and stored.status != "pending":
                    continue  # it closed before we read it: nothing left to answer
            await ch.on_requested(request)
    elif entry.type == "approval.candidate" and entry.data.get("outcome") == "counted":
        stored = await store.get_request(str(entry.data.get("request_id")))
        if (
            stored is not None
            and stored.status == "pending"
            and stored.request.child is None
            and _shows(ch, stored.request)
        ):
            await ch.on_updated(stored.request)
    elif entry.type == "approval.candidate" and entry.data.get("outcome") == "escalated":
        stored = await store.get_request(str(entry.data.get("request_id")))
        if stored is None or stored.request.child is not None:
            return
        request = stored.request
        before, now = ch.accepts(_unescalated(request)), ch.accepts(request)
        if not (before or now) or (ch.live_only and stored.status != "pending"):
            return
        if now and not before and ch.live_only:
            await ch.on_requested(request)  # a channel of the group: it opens there now
        else:
            await ch.on_escalated(request, Escalation.from_event(entry.data, request, entry.at))
    elif entry.type == "input.resolved":
        stored = await store.get_request(str(entry.data.get("request_id")))
        if stored is not None and stored.request.child is None and _shows(ch, stored.request):
            await ch.on_resolved(stored.request, Resolution.from_event(entry.data, entry.at))
        elif stored is None and "child_request_id" not in entry.data:
            # Erased since it was read (a mirror's close names its child's request).
            resolution = Resolution.from_event(entry.data, entry.at)
            await ch.on_erased([Erased(session_id=entry.stream, resolution=resolution)])
    elif entry.type == SESSION_DELETED and entry.stream == DELETIONS_STREAM:
        erased = [
            e
            for e, closed in Erased.from_deletion(entry.data, entry.at)
            if ch.live_only or closed is None or told is None or not told(closed)
        ]
        if erased:
            await ch.on_erased(erased)


def _unescalated(request: InputRequest) -> InputRequest:
    """`request` as it stood before its escalation, as channels were first shown it."""
    return request.model_copy(update={"escalated_to": None})


def _shows(ch: Channel, request: InputRequest) -> bool:
    """Whether `ch` shows `request`: it takes it as it stands, or took it before its escalation
    (a first-line channel hears how the request it showed goes on in the group)."""
    if ch.accepts(request):
        return True
    return request.escalated_to is not None and ch.accepts(_unescalated(request))
