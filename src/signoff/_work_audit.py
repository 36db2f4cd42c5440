"""`Runtime`'s audit-trail methods: the hash-chained entries read, verified and exported."""

from __future__ import annotations

from typing import IO

from . import _audit_export
from . import _audit_trail as _audit
from ._audit_trail import AuditEntries, AuditProblem
from ._call_guards import closes_stop
from ._exceptions import UnknownSession, UsageError
from ._settings import check_page
from ._sync import twin
from ._work import Workers

__all__ = ["Auditing"]


class Auditing(Workers):
    """The audit trail's reads, which `Runtime` offers beside its turns and answers."""

    @closes_stop
    async def audit(
        self, session_id: str | None = None, *, stream: str | None = None, limit: int = 10_000
    ) -> AuditEntries:
        """Audit entries (requests, evaluations, decisions, edits, expiries, executions and tool
        setting changes), oldest first; for one session or across all. At most `limit`: the
        list's `truncated` says whether more followed (`export_audit` writes them all). A session
        id the store knows nothing of, given either way, is `UnknownSession`, not an empty trail."""
        session_id = _audit.check_stream(session_id, "session_id")
        stream = _audit.check_stream(stream)
        if session_id is not None and stream is not None and session_id != stream:
            raise UsageError("give session_id or stream, not two different ones")
        check_page(limit, 0)
        await self.open()
        out = AuditEntries()
        # As many pages as `limit` takes, each a little longer: the entry past the limit, read
        # to tell whether one follows, comes in the last of them, not in a page of its own.
        pages = max(1, -(-limit // _audit.PAGE))
        page = -(-(limit + 1) // pages)
        stream = session_id if session_id is not None else stream
        async for e in _audit.entries(self.store, stream=stream, page=page):
            if len(out) >= limit:  # one more than asked for: the list says it was cut
                out.truncated = True
                break
            out.append(_audit.undamaged(e))
        if not out and stream is not None:  # a session named either way: a typo is refused
            await self._known(stream)
        return out

    @closes_stop
    async def verify_audit(self, session_id: str | None = None) -> list[AuditProblem]:
        """Recompute the hash chains; an empty list means nothing was altered. A session id
        the store knows nothing of (no session, no entry: a typo) is `UnknownSession`, not an
        empty list that reads as its trail verified."""
        session_id = _audit.check_stream(session_id, "session_id")
        await self.open()
        problems = await _audit.verify(self.store, stream=session_id)
        if not problems and session_id is not None:
            # With no session row, any entry of it is named (past the end of no chain): none.
            await self._known(session_id)
        return problems

    @closes_stop
    async def export_audit(self, out: IO[str], session_id: str | None = None) -> int:
        """Write the audit trail as JSON lines to `out`; returns the number of entries. A session id
        the store knows nothing of is `UnknownSession`, as for `audit` and `verify_audit`."""
        session_id = _audit.check_stream(session_id, "session_id")
        _audit_export.check_writable(out)
        await self.open()
        written = await _audit_export.export(self.store, out, stream=session_id)
        if not written and session_id is not None:
            await self._known(session_id)
        return written

    async def _known(self, session_id: str) -> None:
        """`UnknownSession` for a session id the store knows nothing of (a typo), asked of a
        trail found empty: an empty trail would read as that session's, with nothing in it."""
        if not _audit.own_stream(session_id) and await self.store.head(session_id) is None:
            raise UnknownSession(session_id)

    audit_sync = twin(audit)
    verify_audit_sync = twin(verify_audit)
    export_audit_sync = twin(export_audit)
