"""Idempotency keys an older signoff recorded in another form than `keyed` gives now (`Before`),
found again after an upgrade: a call repeated then replays instead of acting a second time. The
older form is taken only where the session's log shows the call recorded it: the same digest is
another person's key now (an issuer of None), or another call's ask (a `steer` message). A
key recorded with a vote through a subagent's mirror is the sender's whom the subagent's session
names, where the parent's record names no one."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._events import Event
from ._exceptions import UnknownSession
from ._idempotency import (
    KEYED_TYPES,
    Before,
    Keyed,
    before,
    held,
    key_reused,
    keyed,
    queued_before,
    same_ask,
    session_for,
)
from ._mirror_keys import voter
from ._state import SessionState
from ._state_parts import load_principal
from ._types import Principal
from .stores import Store

if TYPE_CHECKING:
    from ._session_cache import SessionCache

__all__ = ["as_recorded", "held_as", "keyed_in", "keyed_start", "looked_for"]


_SENDER = {"session.created": "initiator", "turn.started": "principal", "turn.message": "principal"}
"""The field naming who sent what an event recorded a key for; `by` on the others."""

_PAGE = 500


async def keyed_start(
    store: Store, key: str | None, principal: Principal | None, *asked: str
) -> Keyed | None:
    """`keyed`, for a call that starts a session: in its older scope (`Before.scope`) if no
    session derives from the key now and the one that derives from the older scope was created
    by this very principal with it (the call's first run, by an older signoff)."""
    idem, older = keyed(key, principal, *asked), before(key, principal, *asked)
    if idem is None or older is None or older.scope is None or principal is None:
        return idem
    if await store.head(session_for(idem)) is not None:
        return idem
    mark = (older.scope, idem[1])
    try:
        first = await store.read_events(session_for(mark), after=0, limit=1)
    except UnknownSession:
        return idem
    if not first or first[0].type != "session.created":
        return idem
    sent = first[0].data.get("idem")
    if not (isinstance(sent, list) and sent[:1] == [older.scope]):
        return idem
    return mark if principal.same_as(_sender(first[0])) else idem


async def keyed_in(
    rt: SessionCache, session_id: str, key: str | None, principal: Principal | None, *asked: str
) -> Keyed | None:
    """`keyed`, for a call to session `session_id`, in the form the session recorded it in
    (`as_recorded`); the session is read only where an older form may differ."""
    idem, older = keyed(key, principal, *asked), before(key, principal, *asked)
    if idem is None or older is None:
        return idem
    return await as_recorded(rt, await rt._state(session_id), idem, principal, older)


async def as_recorded(
    rt: SessionCache,
    state: SessionState,
    idem: Keyed | None,
    principal: Principal | None,
    older: Before | None,
) -> Keyed | None:
    """`idem`, the key of a call to the session `state` is of, in the form the session recorded
    it in: its older scope if only that is there and its record is this principal's, or, naming
    no one, the record of the vote in a subagent's session down the mirror it names (another's
    leaves `idem`: another call; naming no one there either, `IdempotencyKeyReused`); a `queue`
    message's older ask if the key was recorded with it for this message waiting in the queue
    (`turn.message` with `policy` `queue`), not for a `steer` one, which is recorded so still.
    The log is read only where the state holds an older form."""
    if idem is None or older is None:
        return idem
    found: Event | None = None
    digest = idem[0]
    if older.scope is not None and not _known(state, digest) and _known(state, older.scope):
        who = _held_by(state, older.scope)
        if who is None:
            found = await _recording(rt.store, state.id, older.scope)
            who = None if found is None else await _sender_of(rt, state, found, older.scope)
        if who is None:
            raise key_reused(state.id)  # recorded with no one named: not told apart
        if principal is None or not principal.same_as(who):
            return idem  # another person's key, who was scoped alike
        digest = older.scope
    mark = idem if digest == idem[0] else (digest, idem[1])
    known = state.keys.get(digest)
    if older.ask is None or known is None or known[0] != older.ask or same_ask(known[0], mark):
        return mark
    found = found or await _recording(rt.store, state.id, digest)
    if found is not None and found.type == "turn.message" and found.data.get("queued"):
        queued = (found.data.get("policy"), found.data.get("message"))
        if queued[0] == "queue" and isinstance(queued[1], str):
            if queued_before(queued[1]) == older.ask:
                return digest, older.ask
    return mark


def _known(state: SessionState, digest: str) -> bool:
    """Whether the session records the key `digest`, or holds it for an answer being judged."""
    return digest in state.keys or any(
        (c.get("message_idem") or [None])[0] == digest for c in state.candidates.values()
    )


def _held_by(state: SessionState, digest: str) -> Principal | None:
    """Who sent the message whose answer, being judged, holds the key `digest`, if one does."""
    for c in state.candidates.values():
        if (c.get("message_idem") or [None])[0] == digest and digest not in state.keys:
            return _principal(c.get("by"))
    return None


async def _recording(store: Store, session_id: str, digest: str) -> Event | None:
    """The last event of the session that recorded the key `digest` (`idem`, `held_idem`
    holding it, or among those a mirror's close `kept`), read from its log; None if none did."""
    found = None
    after = 0
    while True:
        page = await store.read_events(session_id, after, limit=_PAGE, types=KEYED_TYPES)
        for e in page:
            if _records(e, digest) or any(
                isinstance(k, list) and k[:1] == [digest] for k in e.data.get("kept") or []
            ):
                found = e
        if len(page) < _PAGE:
            return found
        after = page[-1].seq


def _records(event: Event, digest: str) -> bool:
    """Whether `event` recorded the key `digest` for its own message (not one it `kept`)."""
    return any((event.data.get(n) or [None])[:1] == [digest] for n in ("idem", "held_idem"))


def _sender(event: Event) -> Principal | None:
    """Who sent what `event` recorded a key for, as it names them; None if it names no one."""
    return _principal(event.data.get(_SENDER.get(event.type, "by")))


async def _sender_of(
    rt: SessionCache, state: SessionState, event: Event, digest: str
) -> Principal | None:
    """Who sent the message whose key `digest` `event`, of `state`'s session, recorded: as it
    names them; else, for a vote through a mirror it names (a `turn.waiting` or an
    `input.repeated` of an older signoff, a key a mirror's close `kept`), as the subagent's
    session down that mirror's way records the vote (`voter`). None if neither names them."""
    if _records(event, digest):
        who = _sender(event)
        if who is not None:
            return who
    ids = event.data.get("request_ids")
    ids = ids if isinstance(ids, list) else [event.data.get("request_id")]
    for rid in ids:
        if not isinstance(rid, str):
            continue
        live = state.requests.get(rid)
        stored = None if live is not None else await rt.store.get_request(rid)
        request = live.request if live is not None else None if stored is None else stored.request
        if request is not None and request.child is not None:
            who = _principal(await voter(rt, request.child, digest))
            if who is not None:
                return who
    return None


def looked_for(
    idem: Keyed | None, principal: Principal | None, older: Before | None
) -> list[tuple[Keyed, Principal | None]]:
    """The forms of `idem` (`as_recorded`'s) to look for in the sessions of a session's
    mirrors, each with whose record it must be there (None: anyone's, as `seen` takes it): the
    older scope, another person's too, only where that session names this principal."""
    if idem is None:
        return []
    if older is None or older.scope is None or principal is None:
        return [(idem, None)]
    if idem[0] == older.scope:
        return [(idem, principal)]
    return [(idem, None), ((older.scope, idem[1]), principal)]


def held_as(
    candidates: dict[str, dict[str, Any]], mark: Keyed, whose: Principal | None, session_id: str
) -> str | None:
    """`held`, of a key `looked_for` gives: with `whose`, only a candidate of theirs (`by`)."""
    if whose is None:
        return held(candidates, mark, session_id)
    mine = {
        cid: c
        for cid, c in candidates.items()
        if (who := _principal(c.get("by"))) is not None and whose.same_as(who)
    }
    return held(mine, mark, session_id)


def _principal(raw: Any) -> Principal | None:
    return load_principal(raw) if isinstance(raw, dict) else None
