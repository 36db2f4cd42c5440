"""`Runtime.events`: a session's event log read or followed, which the HTTP stream, the
client and `signoff events --follow` build on; it ends when the session can have no more."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator

from . import stores
from ._call_guards import closes_begun, running, since_close
from ._deadlines import expiry_specs
from ._events import Event, check_shown_event
from ._exceptions import EventsRewritten, SessionExpired, StoreError, UnknownSession, UsageError
from ._session_cache import check_session_id
from ._settings import flag
from ._work_audit import Auditing

__all__ = ["EventStream"]

_RECHECK_FOLLOWED = 30.0
"""Seconds between checks that a followed session is still in the store (when idle, and until
its expiry is due): one deleted under a follower would otherwise be waited on for ever."""


class EventStream(Auditing):
    """The event log's reader, which `Runtime` offers beside its turns and answers."""

    async def events(
        self, session_id: str, after: int = 0, *, follow: bool = True, shown: Event | None = None
    ) -> AsyncIterator[Event]:
        """The session's events after `seq` (one past its last event is a `UsageError`); with
        `follow`, keeps waiting for new ones until the session can have no more: then, after its
        last event, it raises `SessionExpired` (its TTL passed; a turn it caught unfinished is
        recorded and read first) or `UnknownSession` (it was deleted from the store). Without
        `follow`, it is a snapshot as of the call: the events up to the last one stored when it
        began, none written after. Each read checks the last event yielded (first `shown`, the
        event at `after` read before) is still the store's: gone or another one (the store lost
        commits), it raises `EventsRewritten` rather than skip what was written anew."""
        if isinstance(after, bool) or not isinstance(after, int) or not 0 <= after < 2**63:
            # Anything else matched no event (a followed stream then waited for ever in
            # silence) or overflowed the store's integers.
            raise UsageError(f"after must be an event seq, a whole number from 0, not {after!r}")
        flag("follow", follow)
        check_session_id(session_id)
        check_shown_event(shown, session_id, after)
        # Each stretch between two events is a call `close` stops; a close while the caller
        # handles an event stops the follower at its next step, whatever opened the store since.
        closes = closes_begun(self)
        with running(self, closes):
            await self.open()
            head = await self.store.head(session_id)
        if head is None:
            raise UnknownSession(session_id)
        if after > head and shown is not None:
            raise EventsRewritten(session_id, after)  # the store lost it
        if after > head:
            # No event matches it: a follower waited in silence, skipping every event up to
            # `after`, and spun on the store once the TTL passed (as the HTTP stream refuses).
            raise UsageError(
                f"after={after} is past the session's last event ({head}); "
                "resume from a seq it sent"
            )
        expires_at = 0.0  # by self.now(); 0 until read from the state, and after new events
        checked = time.monotonic()  # when the session was last seen in the store
        expired: SessionExpired | None = None  # raised once the events its record wrote are read
        unchecked = shown is not None  # then the last event yielded, which each read checks
        while True:
            at_end = not follow and after >= head  # read up to the head read above
            if at_end and not unchecked:
                return  # no read to find the end (one of none but the check, unchecked)
            with running(self, closes):
                batch = await self.store.read_events(
                    session_id,
                    after=after,
                    limit=0 if at_end else 500,
                    max_bytes=stores.READ_BYTES,
                    shown=shown,
                )
            unchecked = False
            for event in batch:
                if not follow and event.seq > head:
                    return  # a snapshot: none written after the call began
                since_close(self, closes)  # not the rest of a batch read before a close
                yield event
                after, shown = event.seq, event
            if batch:
                expires_at = 0.0
                continue  # a read bounded by bytes may stop short of the log's end: read on
            if expired is not None:
                raise expired
            if not follow:
                return
            with running(self, closes):
                if self.now() >= expires_at or time.monotonic() - checked >= _RECHECK_FOLLOWED:
                    state = await self._state(session_id)  # UnknownSession once deleted
                    if state.seq < after:  # the store lost it, and no new event is read yet
                        raise EventsRewritten(session_id, after)
                    now = self.now()
                    if state.seq == after and state.expired(now):
                        expired = await self._ended(state, now)
                        if expired is None:  # a drive runs it on: followed till its events
                            expires_at, checked = math.inf, time.monotonic()
                            continue
                        if expiry_specs(state) and state.agent in self.agents:
                            # Record it as a listing would (its requests expire, its turn fails),
                            # then yield those events before raising.
                            with contextlib.suppress(SessionExpired, StoreError):
                                await self._checked(session_id)
                        continue
                    expires_at = math.inf if state.expires_at is None else state.expires_at
                    checked = time.monotonic()
                    if state.seq != after:
                        continue  # events came meanwhile: read them first
                wait = getattr(self.store, "wait_for_change", None)
                due = self._follow_wait(expires_at, checked + _RECHECK_FOLLOWED)
                if wait is not None:  # woken by the store (LISTEN/NOTIFY), polling as fallback
                    if await wait(session_id, due, after=after):
                        # A wake whose read finds no event looks at the state: the head may be
                        # behind `after` (a crash lost them), which a read with nothing shown
                        # cannot tell, and the wait would then return at once, over and over.
                        expires_at = 0.0
                else:
                    await asyncio.sleep(self.poll_interval)
