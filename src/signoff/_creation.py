"""Creating a session: its first event and, for a call that brings its first message, the
events that start its first turn and the lease of the drive that runs it, all in one store
write (two round trips fewer than creating, starting and leasing apart; and no session left
without its message between them)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

from ._agent import Agent
from ._events import Event
from ._exceptions import IdempotencyKeyReused, StoreError, wrote_nothing
from ._idempotency import Keyed, records, seen, session_for
from ._prompts import next_turn
from ._recording import new_id, stored_status
from ._state import SessionState, fold
from ._types import Principal

if TYPE_CHECKING:
    from ._sessions import SessionRunner

__all__ = ["first_events", "made", "open_keyed", "turn_events"]


def first_events(
    session_id: str,
    agent: Agent,
    auth: Principal | None,
    idem: Keyed | None,
    now: float,
    first: tuple[str, str] | None,
) -> tuple[list[Event], SessionState]:
    """A new session's `session.created` and, given `first` (a checked prompt and its source),
    the events that start its first turn (as `_start_turn` records them); and the state they
    fold to. Both events carry the idempotency key, if any, as the two writes did."""
    data: dict[str, Any] = {
        "agent": agent.name,
        "initiator": None if auth is None else auth.model_dump(),
        "parent": None,
        "ttl": agent.limits.ttl_seconds,
    }
    if idem is not None:
        data["idem"] = list(idem)
    created = Event(session_id=session_id, seq=1, type="session.created", at=now, data=data)
    state = fold([created])
    events = [created]
    if first is not None:
        prompt, source = first
        events += turn_events(state, prompt, data["initiator"], source, idem, now)
    return events, state


def turn_events(
    state: SessionState,
    prompt: str,
    who: dict[str, Any] | None,
    source: str,
    idem: Keyed | None,
    now: float,
) -> list[Event]:
    """The events that start a turn on `prompt` in a session no write has reached since
    `state` (its next seq on), applied to `state`: for a session created with its first turn."""
    turn_id = new_id("trn")
    events: list[Event] = []
    for type_, spec in next_turn(state, prompt, who, source, idem):
        event = Event(
            session_id=state.id, seq=state.seq + 1, type=type_, at=now, turn_id=turn_id, data=spec
        )
        state.apply(event)
        events.append(event)
    return events


async def made(
    rt: SessionRunner,
    agent: Agent,
    auth: Principal | None,
    idem: Keyed | None,
    first: tuple[str, str] | None = None,
    owner: str | None = None,
) -> tuple[str, bool, int | None]:
    """Create a session (with its first turn started, given `first`, and leased to `owner`,
    given one); with an idempotency key, the one its id derives from, unless a call with the
    same key created it first. Whether this call created it (if not, nothing was written), and
    the token of the lease it took."""
    session_id = new_id("ses") if idem is None else session_for(idem)
    now = rt.now()
    ttl = agent.limits.ttl_seconds
    events, state = first_events(session_id, agent, auth, idem, now, first)
    for attempt in range(2):
        try:
            token = await rt.store.create_session(
                session_id,
                agent.name,
                events,
                None if ttl is None else now + ttl,
                status=stored_status(state),
                lease=None if owner is None else (owner, rt.lease_ttl, now),
            )
            break
        except StoreError as exc:
            # Its write may have gone through, told as failed; not when no lock or connection
            # came (`wrote_nothing`), where giving back would wait as long again.
            if owner is not None and not wrote_nothing(exc):
                await _give_back(rt, session_id, owner)
            if idem is None:
                raise
            if await rt.store.head(session_id) is not None:
                return session_id, False, None
            if attempt:
                raise
            # There and gone: deleted meanwhile. Made again, it is refused as such
            # (`SessionDeleted`), or made if it was never there (a write told as failed).
        except asyncio.CancelledError as exc:
            # Not when cancelled waiting for a SQLite file's lock (`wrote_nothing`), which it
            # would wait for again before the cancel came through.
            if owner is not None and not wrote_nothing(exc):
                await _give_back(rt, session_id, owner)
            raise
    rt._remember(state)
    if token is not None and owner is not None:
        # Its write waited long (for a pool connection, say): renewed first, as a grant is.
        if not await rt._confirmed(session_id, owner, token, now):
            token = None
    return session_id, True, token


async def _give_back(rt: SessionRunner, session_id: str, owner: str) -> None:
    """The lease a creation may have taken (token 1), given back when the call is stopped from
    outside (a caller's timeout, say) or told its write failed, which may have gone through all
    the same (a lost COMMIT): as a drive stopped so gives its own, so the session is driven or
    claimed at once, not after the lease's TTL. Only this owner's: a no-op otherwise."""
    with contextlib.suppress(StoreError):  # kept in `_unreleased` for this process's next drive
        await rt._release(session_id, owner, 1)


async def open_keyed(
    rt: SessionRunner,
    agent: Agent,
    auth: Principal | None,
    idem: Keyed,
    *,
    opens: bool = False,
    first: tuple[str, str] | None = None,
    owner: str | None = None,
) -> tuple[str, bool, bool, int | None]:
    """The session a call with this idempotency key starts, created if it is not there yet
    (with its first turn, given `first`, leased to `owner`, given one); whether the key
    recorded its first message already (the call is a repeat; a call that only `opens` the
    session repeats one that created it); whether this call created it, and its lease's token."""
    session_id, created, token = await made(rt, agent, auth, idem, first, owner)
    if created:
        return session_id, False, True, token
    state = await rt._state(session_id)
    if idem[0] in state.keys:
        return session_id, seen(state.keys, idem, session_id) or opens, False, None
    # Newer keys pushed it out of the state: the session's first event holds it.
    found = await rt.store.read_events(session_id, after=0, limit=1)
    if not found or not records(found[0].data.get("idem"), idem):
        raise IdempotencyKeyReused(
            f"this idempotency key started session {session_id!r} for another agent or "
            "prompt: use a new key for a new call",
            session_id,
        )
    return session_id, True, False, None
