"""Keys of messages still in the queue or in the session's current turn that newer keys pushed
out of the state (it keeps the last `KEPT`): found in the session's log, so a repeat of such a
message replays instead of being queued twice or steering its own turn again. The log is read
only when the key is not in the state and the state is full (some keys were dropped). Where
such a message went is told too (`Went`), so its repeat is told that turn, not the session's
latest."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._events import Event
from ._idempotency import KEPT, KEYED_TYPES, Before, Keyed, key_reused, records, seen, turn_of
from ._message_places import InTurn, Queued, Went
from ._state import SessionState
from ._types import Principal
from .stores import Store

__all__ = ["place_of", "sent_before"]


_PAGE = 500


def place_of(state: SessionState, idem: Keyed) -> Went | None:
    """Where the message keyed `idem` went, as `state` keeps its key: the turn it went to, or
    its place in the queue (which the key's turn is found from later: `turn_taking`); None if
    the state does not say."""
    at = turn_of(state.keys, idem)
    return _in_queue(state, idem) if at is None else InTurn(*at)


def _in_queue(state: SessionState, idem: Keyed) -> Queued | None:
    """The place of the message keyed `idem` waiting in the queue as of `state`, if it waits."""
    for ahead, q in enumerate(state.queued):
        if q.get("idem") == idem[0]:
            return Queued(state.seq, ahead)
    return None


async def sent_before(
    store: Store,
    state: SessionState,
    idem: Keyed | None,
    older: Before | None,
    sender: Principal | None,
    *,
    held: bool = False,
    went: list[Went] | None = None,
) -> bool:
    """Whether the message keyed `idem` (sent by `sender`) was sent to the session before: its
    key is in the state (`seen`; with `held`, `IdempotencyKeyReused` too if a candidate holds
    it aside for another message), or was pushed out of it (`_dropped`). `went` is given where
    it went, as `state` says (a fresher state may no longer keep its key), if it says."""
    if idem is not None and seen(state.keys, idem, state.id, state.candidates if held else None):
        place = place_of(state, idem)
    else:
        place = await _dropped(store, state, idem, older, sender)
        if place is None:
            return False
    if place is not None and went is not None:
        went.append(place)
    return True


async def _dropped(
    store: Store,
    state: SessionState,
    idem: Keyed | None,
    older: Before | None,
    sender: Principal | None,
) -> Went | None:
    """Where the message keyed `idem` (sent by `sender`) went if it was sent before and still
    waits in the queue or went to the session's current turn (started it, was taken from the
    queue by it, steered or answered in it), its key pushed out of `state.keys` by newer ones:
    a repeat. `IdempotencyKeyReused` if the key came with another message there. The whole log
    is read only for a key in the queue or a turn the queue gave its sender; else the turn's
    events."""
    if idem is None or idem[0] in state.keys or len(state.keys) < KEPT:
        return None
    place = _in_queue(state, idem)
    if place is not None:
        found = await _scan(store, state.id, 0, lambda e: _queued(e) and _recorded(e, idem[0]))
        return place if found is not None and _same(state, found, idem, older) else None
    turn = state.turn
    if turn is None or turn.status not in ("running", "waiting"):
        return None  # an ended turn's keys are forgotten past `KEPT`, as documented
    dequeued = False
    found = None
    after = max(turn.first_seq - 1, 0)
    while True:
        page = await store.read_events(state.id, after, limit=_PAGE, types=KEYED_TYPES)
        for e in page:
            if e.seq == turn.first_seq and e.type == "turn.started" and e.data.get("dequeued"):
                dequeued = _same_person(sender, turn.principal)  # its message, maybe
            if e.turn_id == turn.id and not _queued(e) and _recorded(e, idem[0]):
                found = e  # the last, as the state kept it
        if len(page) < _PAGE:
            break
        after = page[-1].seq
    if found is None and dequeued:
        found = await _taken_by(store, state.id, turn.first_seq)
        found = found if found is not None and _recorded(found, idem[0]) else None
    if found is None or not _same(state, found, idem, older):
        return None
    return InTurn(turn.id, turn.first_seq)


def _same_person(one: Principal | None, other: Principal | None) -> bool:
    if one is None or other is None:
        return one is None and other is None
    return one.same_as(other)


def _queued(e: Event) -> bool:
    return e.type == "turn.message" and bool(e.data.get("queued"))


def _recorded(e: Event, digest: str) -> bool:
    """Whether `e` recorded the key `digest` for its message, or kept it (a mirror's close)."""
    return _mark(e, digest) is not None


def _mark(e: Event, digest: str) -> list[Any] | None:
    """The record (`idem`, or an entry of `kept`) of the key `digest` in `e`, if any."""
    sent = e.data.get("idem")
    if isinstance(sent, list) and sent[:1] == [digest]:
        return sent
    for k in e.data.get("kept") or []:
        if isinstance(k, list) and k[:1] == [digest]:
            return k[:2]
    return None


def _same(state: SessionState, e: Event, idem: Keyed, older: Before | None) -> bool:
    """True if `e` recorded the key for `idem`'s message (or, waiting in the queue, for it as
    an older signoff digested a `queue` message: `Before.ask`); else `IdempotencyKeyReused`."""
    mark = _mark(e, idem[0])
    if records(mark, idem):
        return True
    ask = None if older is None else older.ask
    if ask is not None and mark is not None and mark[1:2] == [ask]:
        if _queued(e) and e.data.get("policy") == "queue":
            return True
    raise key_reused(state.id)


async def _scan(
    store: Store, session_id: str, after: int, match: Callable[[Event], bool]
) -> Event | None:
    """The last event of the session after `after` (of `KEYED_TYPES`) that `match`es."""
    found = None
    while True:
        page = await store.read_events(session_id, after, limit=_PAGE, types=KEYED_TYPES)
        found = next((e for e in reversed(page) if match(e)), found)
        if len(page) < _PAGE:
            return found
        after = page[-1].seq


async def _taken_by(store: Store, session_id: str, seq: int) -> Event | None:
    """The queued `turn.message` the turn started (`dequeued`) at `seq` took from the queue,
    which is first in, first out (`_event_handlers._turn_started`)."""
    waiting: list[Event] = []
    after = 0
    types = ("turn.started", "turn.message")
    while True:
        page = await store.read_events(session_id, after, limit=_PAGE, types=types)
        for e in page:
            if e.seq == seq:
                return waiting[0] if waiting else None
            if _queued(e):
                waiting.append(e)
            elif e.type == "turn.started" and e.data.get("dequeued"):
                waiting = waiting[1:]
        if len(page) < _PAGE or not page or page[-1].seq >= seq:
            return None
        after = page[-1].seq
