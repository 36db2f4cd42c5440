"""What a follow-up message's call is told (`MessageResults`): the turn its message went to
(started, steered or was taken from the queue by), as its first call drove it (`_drive_after`)
or as a call repeated with its idempotency key finds it (`_replay`), never another person's
turn the drive went on to, or one it drove first."""

from __future__ import annotations

import contextlib
import dataclasses

from ._answering import Answering
from ._dropped_keys import place_of
from ._exceptions import SessionExpired, StoreError
from ._idempotency import Keyed, records, session_for, turn_of
from ._message_places import InTurn, Went, turn_taking
from ._recording import load_turn
from ._results import GenerateResult
from ._state import SessionState

__all__ = ["MessageResults"]


class MessageResults(Answering):
    """`Answering` plus the results of the calls that send follow-up messages."""

    async def _drive_after(
        self,
        session_id: str,
        went: Went,
        *,
        then_sender: bool = False,
        leased: tuple[str, int] | None = None,
    ) -> GenerateResult:
        """Drive the session after a message went to `went` (started or steered a turn, or
        joined the queue), then tell the call its message's turn: the one it started or steered,
        or took it from the queue, as it stands, not a turn left undriven ahead of it (which may
        end cancelled or failed) nor one the drive went on to past it. While the message still
        waits in the queue, the turn it waits behind, with `queued`. A prompt's call
        (`then_sender`: `generate`, `schedule`) whose turn completed is told the turn the drive
        went on to when its sender's own message started it (not a keyed call's: its repeat is
        told its own turn). `leased`: a new session's lease, taken with its first turn."""
        own = went.turn_id if isinstance(went, InTurn) else None
        result = await self._drive(session_id, own=own, leased=leased)
        at = await turn_taking(self.store, session_id, went)
        if at is not None and result.turn_id == at.turn_id:
            return dataclasses.replace(result, queued=False)
        state = await self._state(session_id)
        if at is None:  # a turn may have taken it since (another process's), up to that state
            at = await turn_taking(self.store, session_id, went)
            if at is not None and at.first_seq > state.seq:
                state = await self._state(session_id)
        current = None if state.turn is None else state.turn.id
        if at is None or at.turn_id == current:
            told = result if result.turn_id == current else self._result(state)
            return dataclasses.replace(told, queued=at is None)
        ended = await load_turn(self.store, session_id, *at)
        if then_sender and _sender_next(state, ended):
            return dataclasses.replace(
                result if result.turn_id == current else self._result(state), queued=False
            )
        return self._earlier_result(state, ended)

    async def _drive_first(
        self, session_id: str, idem: Keyed | None, leased: tuple[str, int] | None
    ) -> GenerateResult:
        """Drive a new session's first turn, which this call's prompt started (`leased` with
        it): a keyed call is told that turn, as its repeat is, not a later one its sender's own
        queued message started, which a call without a key is told (`_drive`)."""
        if idem is None:
            return await self._drive(session_id, leased=leased)
        try:
            state = await self._state(session_id)
            first = turn_of(state.keys, idem) or await self._first(state, idem)
        except BaseException:  # stopped (a caller's timeout) or failed before the drive took
            if leased is not None:  # the lease over: given back, not left to lapse undriven
                with contextlib.suppress(StoreError):
                    await self._release(session_id, *leased)
            raise
        if first is None:  # not recorded with its key (never so since keys were)
            return await self._drive(session_id, leased=leased)
        return await self._drive_after(session_id, InTurn(*first), leased=leased)

    async def _replay(
        self, session_id: str, idem: Keyed | None, went: Went | None = None
    ) -> GenerateResult:
        """What a call repeated with its idempotency key returns: the result of the turn its
        message started, steered, answered in or was taken from the queue by, as it stands (the
        session's turn driven as a first call would have, left to its process if one runs it;
        once the session's TTL passed, as it was left). A message still in the queue gets what
        its first call got: the turn it waits behind, `queued`, or, once the TTL passed, not
        `queued`: no turn will take it. `went` is where the message went as the state that found
        it a repeat said (`sent_before`), which a fresher one may not (newer keys pushed its key
        out); a key recorded before signoff kept its turn, the session as it stands."""
        state = await self._state(session_id)
        expired = False
        if state.expired(self.now()):
            try:
                state = await self._checked(session_id)  # its expiry recorded, if not yet
            except SessionExpired:
                expired = True
                state = await self._state(session_id)
        if went is None and idem is not None:
            went = place_of(state, idem)
            if went is None:
                first = await self._first(state, idem)
                went = None if first is None else InTurn(*first)
        at = None if went is None else await turn_taking(self.store, session_id, went)
        if at is not None and at.first_seq > state.seq:  # a turn took it since: it may run yet
            state = await self._state(session_id)
        if at is not None and (state.turn is None or state.turn.id != at.turn_id):
            result = await self._earlier(state, *at)
        elif expired or went is None:
            result = self._result(state) if expired else await self._drive(session_id)
            result = dataclasses.replace(result, queued=False)
        else:
            result = await self._drive_after(session_id, went)
        return dataclasses.replace(result, replayed=True)

    async def _first(self, state: SessionState, idem: Keyed) -> tuple[str, int] | None:
        """The first turn of a session its key created, when newer keys pushed the key out of
        the state: the turn that event 2 starts, if it recorded the key."""
        if idem[0] in state.keys or state.id != session_for(idem):
            return None
        second = await self.store.read_events(state.id, after=1, limit=1)
        if not second or second[0].type != "turn.started" or second[0].turn_id is None:
            return None
        if not records(second[0].data.get("idem"), idem):
            return None
        return second[0].turn_id, second[0].seq

    async def _earlier(self, state: SessionState, turn_id: str, first_seq: int) -> GenerateResult:
        """The result of a turn other than the session's current one, from its events; its
        requests still open are the ones pending now."""
        return self._earlier_result(
            state, await load_turn(self.store, state.id, turn_id, first_seq)
        )

    def _earlier_result(self, state: SessionState, ended: SessionState) -> GenerateResult:
        """The result of `ended`, a turn before `state`'s, with its requests still open in
        `state` pending; not `retryable`, though it failed so: a retry resumes only the
        session's turn (it would run `state`'s)."""
        result = self._result(ended)
        open_now = {r.id for r in state.pending_requests()}
        pending = [r for r in result.pending if r.id in open_now]
        return dataclasses.replace(result, pending=pending, retryable=False)


def _sender_next(state: SessionState, ended: SessionState) -> bool:
    """Whether `ended`'s turn completed and `state`'s turn, after it, serves the same person
    (by identity): one its sender's own message started."""
    turn, now = ended.turn, state.turn
    if turn is None or now is None or turn.status != "completed":
        return False
    if now.principal is None:
        return turn.principal is None
    return now.principal.same_as(turn.principal)
