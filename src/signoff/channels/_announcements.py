"""What a channel is told of an audit entry: a request opened, counted a vote, escalated or
closed, as the channel shows it (a subagent's request is shown as the child's own, never as its
mirror on the parent).

A session's deletion erases its requests and their entries at once, so a hub may never read
a close, or read it and find the request gone: the deletion's own entry names each request it
erased and the entry that closed it, and a channel is told of those closes from it (`Erased`).

What the store cannot read of an entry (its data, or a request row, as a hand edit or a
half-restored copy left it) is `Damaged`: the rest of the entry is told all the same, and the
hub passes the entry rather than retry what reads the same every time (`passed`). Of the
store's errors only `StoreDamaged` (a row it cannot decode) is that: every other `StoreError`
is a read that failed (PostgreSQL's pool busy, a statement cancelled, the connection lost, an
I/O error) and is raised, for the hub to try again."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pydantic

from .._exceptions import StoreDamaged
from .._types import InputRequest
from ..stores import PendingFilter, Store, StoredRequest
from ..stores._audit import AuditEntry
from ..stores._deletions import DELETIONS_STREAM, SESSION_DELETED
from ._base import Channel, Erased, Escalation, RateLimited, Resolution, logger
from ._stray_cancels import stray_cancels

__all__ = ["Damaged", "announce", "lapsed", "passed"]

T = TypeVar("T")


class Damaged(Exception):
    """What a channel could not be told of an entry, the store holding it unreadable (each part
    named): reading it again gives the same, so it is passed, not retried."""


async def announce(
    store: Store,
    ch: Channel,
    entry: AuditEntry,
    told: Callable[[int], bool] | None = None,
    *,
    shown: set[str] | None = None,
    every: bool = False,
) -> None:
    """Tell one channel about one entry (nothing, for entries it does not care about).
    `told(entry_id)`: whether the hub delivered that entry to `ch` already (None: not known,
    taken as not delivered). `Damaged` once the rest is told, for what cannot be read.
    For an entry opening several requests: `shown` holds those `ch` was told of (by an attempt
    that failed on another), which are not told again, and gets those told now; `every` tells
    each past one the channel fails on, then raises that failure (else it is raised at once).
    A `CancelledError` of the channel's own is its failure (`_stray_cancels`)."""
    with stray_cancels(ch.name, f"audit entry {entry.id}"):
        await _announce(store, ch, entry, told, set() if shown is None else shown, every)


async def _announce(
    store: Store,
    ch: Channel,
    entry: AuditEntry,
    told: Callable[[int], bool] | None,
    shown: set[str],
    every: bool,
) -> None:
    """`announce`, with `shown` given."""
    if entry.type == "input.requested":
        await _requested(store, ch, entry, shown, every)
    elif entry.type == "approval.candidate" and entry.data.get("outcome") == "counted":
        stored = await _stored(store, entry)
        if (
            stored is not None
            and stored.status == "pending"
            and stored.request.child is None
            and _shows(ch, stored.request)
        ):
            await ch.on_updated(stored.request)
    elif entry.type == "approval.candidate" and entry.data.get("outcome") == "escalated":
        stored = await _stored(store, entry)
        if stored is None or stored.request.child is not None:
            return
        request = stored.request
        before, now = ch.accepts(_unescalated(request)), ch.accepts(request)
        if not (before or now) or (ch.live_only and stored.status != "pending"):
            return
        if now and not before and ch.live_only:
            # A channel of the group: it opens there now, unless its session's TTL (or one's
            # above it) passed by the time the hub read this (it takes no answer), as for
            # an opening read late (`_requested`).
            if not await lapsed(store, request, ch.runtime.now()):
                await ch.on_requested(request)
        else:
            escalation = _read("escalation", Escalation.from_event, entry.data, request, entry.at)
            await ch.on_escalated(request, escalation)
    elif entry.type == "input.resolved":
        stored = await _stored(store, entry)
        if stored is not None and stored.request.child is None and _shows(ch, stored.request):
            resolution = _read("resolution", Resolution.from_event, entry.data, entry.at)
            await ch.on_resolved(stored.request, resolution)
        elif stored is None and "child_request_id" not in entry.data:
            # Erased since it was read (a mirror's close names its child's request).
            resolution = _read("resolution", Resolution.from_event, entry.data, entry.at)
            await ch.on_erased([Erased(session_id=entry.stream, resolution=resolution)])
    elif entry.type == SESSION_DELETED and entry.stream == DELETIONS_STREAM:
        named = _read("erased requests", Erased.from_deletion, entry.data, entry.at)
        erased, closed_told = [], []
        for e, closed in named:
            if ch.live_only or closed is None or told is None or not told(closed):
                erased.append(e)
            else:
                closed_told.append(e)
        if closed_told:
            await ch.on_erased_closed(closed_told)
        if erased:
            await ch.on_erased(erased)


def passed(ch: Channel, entry: AuditEntry, exc: Damaged) -> None:
    """Log, once, what `ch` was not told of `entry` (`Damaged`), which the hub passes."""
    logger.warning(
        "channel %s passes audit entry %s (%s of %s): the store holds it damaged: %s; it is "
        "not tried again (Runtime.verify_audit names the damage)",
        ch.name,
        entry.id,
        entry.type,
        entry.stream,
        exc,
    )


async def _requested(
    store: Store, ch: Channel, entry: AuditEntry, shown: set[str], every: bool
) -> None:
    """Tell `ch` of the requests an `input.requested` entry opened, each it takes and was not
    `shown` (a `live_only` channel each still open, as it stands now; any other as it opened);
    one that cannot be read (its data in the entry, or its row) is passed and the others told,
    and with `every` so is one the channel fails on, the failure raised after."""
    raws = entry.data.get("requests")
    if not isinstance(raws, list):  # data that cannot be read is read as {}
        raise Damaged("its requests cannot be read")
    damage = []
    failure: Exception | None = None
    for i, raw in enumerate(raws):
        try:
            request = InputRequest.model_validate(raw)
        except pydantic.ValidationError as exc:
            rid = raw.get("id") if isinstance(raw, dict) else None
            named = f"request {rid!r:.60}" if isinstance(rid, str) else f"its request #{i + 1}"
            damage.append(f"{named} cannot be read: {_first(exc)}")
            continue
        if request.id in shown or request.child is not None or not ch.accepts(request):
            continue
        if ch.live_only:
            try:
                stored = await _request(store, request.id)
            except Damaged as exc:
                damage.append(str(exc))  # its status unknown, and an answer could not be taken
                continue
            if stored is not None and stored.status != "pending":
                continue  # it closed before we read it: nothing left to answer
            if await lapsed(store, request, ch.runtime.now()):
                continue  # its session's TTL passed (or one's above it): it takes no answer
            if stored is not None:
                # As it stands now: the votes counted and an escalation recorded since (an
                # entry given up on and delivered again, or read late) were told to no message.
                request = stored.request
        try:
            with stray_cancels(ch.name, f"audit entry {entry.id}"):
                await ch.on_requested(request)
        except RateLimited:
            raise  # the service said when to come back: no more now
        except Exception as exc:
            if not every:
                raise
            failure = failure or exc
            continue
        shown.add(request.id)
    if failure is not None:
        raise failure
    if damage:
        raise Damaged("; ".join(damage))


async def lapsed(store: Store, request: InputRequest, now: float) -> bool:
    """Whether the session of open `request`, or one above it, passed its TTL by `now`: it
    takes no answer though nothing may have recorded that yet, so a channel of open requests
    does not show it, as the listing a hub starts with leaves it out (`live_at`)."""
    live = PendingFilter(session_id=request.session_id, live_at=now, limit=1)
    return not await store.count_pending(live)


async def _stored(store: Store, entry: AuditEntry) -> StoredRequest | None:
    """The request an entry names as it is stored now (None: erased); `Damaged` if the entry
    names none or its row cannot be read."""
    request_id = entry.data.get("request_id")
    if not isinstance(request_id, str):
        raise Damaged("it names no request")
    return await _request(store, request_id)


async def _request(store: Store, request_id: str) -> StoredRequest | None:
    """`store.get_request`: a row it cannot decode (`StoreDamaged`) is `Damaged`; any other
    failure (the store down or busy, a query cancelled) is raised as it is, to be tried again."""
    try:
        return await store.get_request(request_id)
    except StoreDamaged as exc:
        raise Damaged(str(exc)) from exc


def _read(what: str, make: Callable[..., T], *args: Any) -> T:
    """`make(*args)`, what a channel is told read from an entry's data: what a hand edit left
    of the wrong shape is `Damaged`, naming `what`."""
    try:
        return make(*args)
    except (KeyError, TypeError, ValueError) as exc:  # pydantic's ValidationError too
        detail = _first(exc) if isinstance(exc, pydantic.ValidationError) else repr(exc)
        raise Damaged(f"its {what} cannot be read: {detail}") from exc


def _first(exc: pydantic.ValidationError) -> str:
    """The first of pydantic's errors, on one line: where and what."""
    error = exc.errors()[0]
    where = ".".join(str(p) for p in error["loc"]) or "it"
    return f"{where}: {error['msg']}"


def _unescalated(request: InputRequest) -> InputRequest:
    """`request` as it stood before its escalation, as channels were first shown it."""
    return request.model_copy(update={"escalated_to": None})


def _shows(ch: Channel, request: InputRequest) -> bool:
    """Whether `ch` shows `request`: it takes it as it stands, or took it before its escalation
    (a first-line channel hears how the request it showed goes on in the group)."""
    if ch.accepts(request):
        return True
    return request.escalated_to is not None and ch.accepts(_unescalated(request))
