"""`Runtime.delete_session`: a finished session erased from the store, with its subagents'
sessions, in one transaction that also records who deleted it and why in the audit trail."""

from __future__ import annotations

import contextlib

from ._answers import check_principal, check_text
from ._deadlines import expiry_specs
from ._event_stream import EventStream
from ._exceptions import SessionExpired, SessionWaiting, StoreError, UsageError
from ._session_cache import check_session_id, closes_stop
from ._sync import twin
from ._types import Principal

__all__ = ["Deletion"]


class Deletion(EventStream):
    """Session deletion, which `Runtime` offers beside its turns, answers and audit trail."""

    @closes_stop
    async def delete_session(
        self, session_id: str, *, by: Principal | None = None, reason: str | None = None
    ) -> list[str]:
        """Delete the session and everything the store keeps of it: events, snapshot, requests,
        lease, audit entries, and the same of its subagents' sessions; the deletion itself is
        recorded (by whom, why, where each chain ended) in the audit stream `store:deletions`.
        Returns the ids deleted, the session's first. Refused, nothing changed: a turn running
        or with work to do, under a lease or not, before its TTL passes (`SessionBusy`), or
        waiting on people (`SessionWaiting`): cancel it first; a subagent's
        session whose parent exists (`SubagentSession`); an unknown id (`UnknownSession`)."""
        check_session_id(session_id)
        if reason is not None and not isinstance(reason, str):
            raise UsageError(f"reason must be a string, not {type(reason).__name__}")
        if reason is not None:
            check_text(reason, "the reason")
        principal = check_principal(by, "by")
        await self.open()
        delete = getattr(self.store, "delete_session", None)
        if delete is None:  # a store written for an earlier signoff
            raise UsageError(f"{type(self.store).__name__} cannot delete sessions")
        who = None if principal is None else principal.model_dump()
        try:
            ids: list[str] = await delete(session_id, now=self.now(), by=who, reason=reason)
        except SessionWaiting:
            # Waiting on requests no one can answer any more (its TTL passed): recorded as a
            # listing would record it (they expire), then deleted.
            if not await self._expired_now(session_id):
                raise
            ids = await delete(session_id, now=self.now(), by=who, reason=reason)
        for sid in ids:
            self._cache.pop(sid, None)
        return ids

    async def _expired_now(self, session_id: str) -> bool:
        """Record the session's passed TTL, if it passed with its turn unfinished: whether it
        did (its requests are then expired, no longer open)."""
        state = await self._state(session_id)
        if not (state.expired(self.now()) and expiry_specs(state) and state.agent in self.agents):
            return False
        with contextlib.suppress(SessionExpired, StoreError):
            await self._checked(session_id)
        return True

    delete_session_sync = twin(delete_session)
