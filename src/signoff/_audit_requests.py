"""Request rows checked against the audit trail: a request's row (what the queue, the dashboard
and a repeated answer read) must say what its session's chained entries recorded of it."""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, field
from typing import Any

import pydantic

from ._types import InputRequest
from .stores import Store
from .stores._audit import AuditEntry
from .stores._base import RequestRow

__all__ = ["Found", "RequestTrail", "request_rows"]

PAGE = 1000  # rows read at once

_TYPES = frozenset({"input.requested", "approval.candidate", "approval.settled", "input.resolved"})
_FROM_RESOLVED = ("outcome", "by", "answer")
_FROM_SETTLED = ("edited_input", "approved_by")
"""What a resolution must carry whenever its entries record it (not null): who answered, how,
and the edit or the votes approved; other keys it holds must only agree with the entries."""


Found = tuple[int, str, int, str]
"""A request row that does not follow the trail, as `AuditProblem` fields `(id, stream, n,
reason)`: the entry of its session it disagrees with (`id` and `n` 0 if none asks it)."""


@dataclass(slots=True)
class _Asked:
    """The entries of one request, in their session's order: `(n, id, type, data)` each."""

    stream: str
    entries: list[tuple[int, int, str, dict[str, Any]]] = field(default_factory=list)


async def request_rows(store: Store, *, session_id: str | None = None) -> list[RequestRow]:
    """Every request row (of one session, if given), page by page in id order."""
    rows: list[RequestRow] = []
    after = ""
    while True:
        page = await store.stored_requests(session_id=session_id, after=after, limit=PAGE)
        rows += page
        if len(page) < PAGE:
            return rows
        after = page[-1].id


class RequestTrail:
    """What the audited entries of sessions record of each request, to check rows against."""

    def __init__(self) -> None:
        self.asked: dict[str, _Asked] = {}

    def see(self, e: AuditEntry) -> None:
        """Take in an entry of the trail (only a session's request entries matter)."""
        if e.seq is None or e.type not in _TYPES:
            return
        if e.type == "input.requested":
            for raw in e.data.get("requests", ()):
                rid = raw.get("id") if isinstance(raw, dict) else None
                if isinstance(rid, str):
                    self.asked.setdefault(rid, _Asked(e.stream)).entries.append(
                        (e.n, e.id, e.type, raw)
                    )
            return
        rid = e.data.get("request_id")
        found = self.asked.get(rid) if isinstance(rid, str) else None
        if found is not None and found.stream == e.stream:
            found.entries.append((e.n, e.id, e.type, e.data))

    def check(
        self,
        rows: list[RequestRow],
        heads: dict[str, tuple[int, str | None]],
        broken: Container[str] = (),
    ) -> list[Found]:
        """Each row that says other than the trail up to the entry its session's chain had when
        the row was read, and each request asked by an entry within `heads` (read before the
        rows) that has no row. Sessions whose chain is `broken` (named already) are left out:
        their entries no longer say what was recorded, so their rows cannot be checked."""
        problems = [
            p
            for row in rows
            if row.session_id not in broken and (p := self._row(row, broken)) is not None
        ]
        seen = {row.id for row in rows}
        for rid, asked in self.asked.items():
            n, entry_id = asked.entries[0][:2]
            if asked.stream in broken:
                continue
            if rid not in seen and n <= heads.get(asked.stream, (0, None))[0]:
                reason = f"request {rid} is asked by this entry but has no row in the store"
                problems.append((entry_id, asked.stream, n, reason))
        return problems

    def _row(self, row: RequestRow, broken: Container[str]) -> Found | None:
        rid = row.id
        asked = self.asked.get(rid)
        if asked is not None and asked.stream in broken:
            return None
        entries = [] if asked is None else [x for x in asked.entries if x[0] <= row.audit_n]
        if asked is None or not entries or entries[0][2] != "input.requested":
            reason = f"request {rid} has a row, but no entry of its session's trail asks it"
            return (0, row.session_id, 0, reason)
        n, entry_id = entries[-1][:2]
        if row.session_id != asked.stream:
            reason = f"request {rid} has its row in session {row.session_id}, not in this one"
        elif row.damage is not None:
            reason = f"request {rid}'s row cannot be read: {row.damage}"
        else:
            said = _said(row, entries)
            if not said:
                return None
            reason = f"request {rid}'s row differs from the trail: {said}"
        return (entry_id, asked.stream, n, reason)


def _said(row: RequestRow, entries: list[tuple[int, int, str, dict[str, Any]]]) -> str:
    """How `row` differs from what `entries` (its request's, up to the row's read) record."""
    raw = entries[0][3]
    try:
        request = InputRequest.model_validate(raw)
    except pydantic.ValidationError:
        return "the request its entry asks cannot be read"
    status, outcome = "pending", None
    settled: dict[str, Any] = {}
    resolved: dict[str, Any] | None = None
    for _, _, kind, d in entries[1:]:
        if kind == "approval.settled":
            settled = d
        elif kind == "input.resolved":
            resolved = d
            status, outcome = d.get("status") or "settled", d.get("outcome")
        elif status == "pending" and d.get("outcome") == "counted":
            by = d.get("by") or {}
            votes = [*request.approved_by, str(by.get("principal_id"))]
            request = request.model_copy(update={"approved_by": votes})
        elif status == "pending" and d.get("outcome") == "escalated":
            request = request.model_copy(update={"escalated_to": d.get("to"), "expires_at": None})
    said = []
    assert row.request is not None
    mine = row.request.model_dump(mode="json", exclude_defaults=True, exclude={"status"})
    theirs = request.model_dump(mode="json", exclude_defaults=True, exclude={"status"})
    keys = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
    if keys:
        said.append(f"its data ({', '.join(keys)}) is not what was asked")
    columns = {
        "agent": request.agent,
        "kind": request.kind,
        "tool": request.tool_name,
        "created_at": request.created_at,
    }
    keys = [k for k, v in columns.items() if getattr(row, k) != v]
    if keys:
        said.append(f"its {', '.join(keys)} column{'s' if len(keys) > 1 else ''} differ")
    if row.status == "pending" and row.deadline != row.request.expires_at:
        # What the sweep reads: another value there applies the deadline early, late or never.
        said.append("its expires_at column is not its request's deadline")
    if (row.status, row.outcome) != (status, outcome):
        said.append(
            f"it is {row.status} ({row.outcome}), but the trail has it {status} ({outcome})"
        )
    if resolved is None:
        if row.resolution is not None:
            said.append("it holds a resolution, but the trail has it unresolved")
    elif row.resolution is None:
        said.append("it holds no resolution")
    else:
        recorded = {**settled, **resolved}
        differ = {k for k, v in row.resolution.items() if k not in recorded or recorded[k] != v}
        required = [(k, resolved) for k in _FROM_RESOLVED] + [(k, settled) for k in _FROM_SETTLED]
        differ |= {
            k
            for k, source in required
            if source.get(k) is not None and row.resolution.get(k) != source[k]
        }
        if differ:
            said.append(f"its resolution's {', '.join(sorted(differ))} differ")
    return "; ".join(said)
