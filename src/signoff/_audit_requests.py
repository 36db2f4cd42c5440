"""Request rows checked against the audit trail: a request's row (what the queue, the dashboard
and a repeated answer read) must say what its session's chained entries recorded of it."""

from __future__ import annotations

from collections.abc import Container, Iterable
from dataclasses import dataclass, field
from typing import Any

import pydantic

from ._types import InputRequest, same_json
from .stores import Store
from .stores._audit import AuditEntry
from .stores._base import RequestRow

__all__ = ["Found", "Leftovers", "RequestTrail", "request_rows"]

PAGE = 1000  # rows read at once

_TYPES = frozenset({"input.requested", "approval.candidate", "approval.settled", "input.resolved"})
_REQUIRED = ("outcome", "by", "answer", "edited_input", "approved_by", "on_timeout")
"""What a resolution must carry whenever its entries record it (not null): who answered, how,
the edit or the votes approved, and what a passed deadline did (what a late answer is told);
other keys it holds must only agree with the entries."""


Found = tuple[int, str, int, str]
"""A request row that does not follow the trail, as `AuditProblem` fields `(id, stream, n,
reason)`: the entry of its session it disagrees with (`id` and `n` 0 if none asks it)."""


@dataclass(slots=True)
class _Asked:
    """The entries of one request, in their session's order: `(n, id, type, data)` each."""

    stream: str
    entries: list[tuple[int, int, str, dict[str, Any]]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Ask:
    """A request asked by a session checked earlier without its row among that session's: its
    entries as `(n, id, type)`, and whether its session's chain is broken."""

    stream: str
    entries: tuple[tuple[int, int, str], ...]
    broken: bool


async def request_rows(
    store: Store, *, session_id: str | None = None, sessions: list[str] | None = None
) -> list[RequestRow]:
    """Every request row (of one session, or of `sessions`, if given), page by page in id
    order."""
    rows: list[RequestRow] = []
    after = ""
    scope: dict[str, Any] = {"session_id": session_id}
    if sessions is not None:
        scope["sessions"] = sessions
    while True:
        page = await store.stored_requests(**scope, after=after, limit=PAGE)
        rows += page
        if len(page) < PAGE:
            return rows
        after = page[-1].id


class Leftovers:
    """Rows and requests that sessions checked a page at a time could not pair with each other:
    a row whose session's trail does not ask it, a request asked without its row in its
    session. Healthy stores leave none; each left is named unless a later page pairs it (a row
    moved to another session, named once, as the request's)."""

    def __init__(self) -> None:
        self.rows: dict[str, tuple[str, int]] = {}  # request id -> (session, its audit_n)
        self.asks: dict[str, _Ask] = {}

    def paired(self) -> list[Found]:
        """The rows no entry asks, or that are asked in another session; the requests left
        after are those asked within their session's head whose row was not found."""
        problems: list[Found] = []
        for rid, (sid, audit_n) in self.rows.items():
            ask = self.asks.pop(rid, None)
            if ask is not None and ask.broken:
                continue
            entries = [] if ask is None else [x for x in ask.entries if x[0] <= audit_n]
            if ask is None or not entries or entries[0][2] != "input.requested":
                reason = f"request {rid} has a row, but no entry of its session's trail asks it"
                problems.append((0, sid, 0, reason))
                continue
            n, entry_id = entries[-1][:2]
            reason = f"request {rid} has its row in session {sid}, not in this one"
            problems.append((entry_id, ask.stream, n, reason))
        self.rows.clear()
        self.asks = {rid: ask for rid, ask in self.asks.items() if not ask.broken}
        return problems

    def found(self, ids: Iterable[str]) -> None:
        """Rows found elsewhere (in a session whose rows were not checked) for requests left."""
        for rid in ids:
            self.asks.pop(rid, None)

    def missing(self) -> list[Found]:
        """The requests still left: asked by an entry, with no row in the store."""
        problems: list[Found] = []
        for rid, ask in self.asks.items():
            n, entry_id = ask.entries[0][:2]
            reason = f"request {rid} is asked by this entry but has no row in the store"
            problems.append((entry_id, ask.stream, n, reason))
        self.asks.clear()
        return problems


class RequestTrail:
    """What the audited entries of sessions record of each request, to check rows against."""

    def __init__(self) -> None:
        self.asked: dict[str, _Asked] = {}

    def see(self, e: AuditEntry) -> None:
        """Take in an entry of the trail (only a session's request entries matter)."""
        if e.seq is None or e.type not in _TYPES:
            return
        if e.type == "input.requested":
            asked = e.data.get("requests")
            # An edit that left no list (a null) asks nothing: its hash no longer matches, and
            # the rows of its requests are named as asked by no entry.
            for raw in asked if isinstance(asked, list) else ():
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
        broken: Container[str],
        left: Leftovers,
    ) -> list[Found]:
        """Each row that says other than the trail up to the entry its session's chain had when
        the row was read. A row no entry seen asks, and a request asked by an entry within
        `heads` (read before the rows) that has no row among `rows`, are `left` to pair with
        the other sessions'. Sessions whose chain is `broken` (named already) are left out:
        their entries no longer say what was recorded, so their rows cannot be checked."""
        problems = []
        seen = set()
        for row in rows:
            seen.add(row.id)
            if row.session_id in broken:
                continue
            if row.id not in self.asked:
                left.rows[row.id] = (row.session_id, row.audit_n)
            elif (p := self._row(row, broken)) is not None:
                problems.append(p)
        for rid, asked in self.asked.items():
            n = asked.entries[0][0]
            if rid not in seen and n <= heads.get(asked.stream, (0, None))[0]:
                entries = tuple(x[:3] for x in asked.entries)
                left.asks[rid] = _Ask(asked.stream, entries, asked.stream in broken)
        return problems

    def _row(self, row: RequestRow, broken: Container[str]) -> Found | None:
        rid = row.id
        asked = self.asked[rid]
        if asked.stream in broken:
            return None
        entries = [x for x in asked.entries if x[0] <= row.audit_n]
        if not entries or entries[0][2] != "input.requested":
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
            by = d.get("by")
            who = by.get("principal_id") if isinstance(by, dict) else None
            votes = [*request.approved_by, str(who)]
            request = request.model_copy(update={"approved_by": votes})
        elif status == "pending" and d.get("outcome") == "escalated":
            request = request.model_copy(update={"escalated_to": d.get("to"), "expires_at": None})
    said = []
    assert row.request is not None
    final = {**settled, **(resolved or {})}.get("approved_by")  # a mirror's close has them
    if isinstance(final, list) and row.request.approved_by == final:
        # Its quorum's settlement records the last vote in the row too (a mirror's close, the
        # votes of its subagent's request); a row a signoff before that settled holds the
        # votes counted until then (as the trail's `counted` entries give: a mirror's, none).
        request = request.model_copy(update={"approved_by": final})
    mine = row.request.model_dump(mode="json", exclude_defaults=True, exclude={"status"})
    theirs = request.model_dump(mode="json", exclude_defaults=True, exclude={"status"})
    # `same_json`, not `!=`: a row's `true` where the trail has `1` is another value
    keys = sorted(
        k for k in mine.keys() | theirs.keys() if not same_json(mine.get(k), theirs.get(k))
    )
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
            f"it is {_closed(row.status, row.outcome)}, but the trail has it "
            f"{_closed(status, outcome)}"
        )
    if resolved is None:
        if row.resolution is not None:
            said.append("it holds a resolution, but the trail has it unresolved")
    elif row.resolution is None:
        said.append("it holds no resolution")
    else:
        recorded = {**settled, **resolved}
        differ = {
            k
            for k, v in row.resolution.items()
            if k not in recorded or not same_json(recorded[k], v)
        }
        # From either entry: a mirror's `input.resolved` carries its subagent's edit and votes,
        # with no `approval.settled` of its own.
        differ |= {
            k
            for k in _REQUIRED
            if recorded.get(k) is not None and not same_json(row.resolution.get(k), recorded[k])
        }
        if differ:
            said.append(f"its resolution's {', '.join(sorted(differ))} differ")
    return "; ".join(said)


def _closed(status: object, outcome: object) -> str:
    """A request's status and outcome as a phrase: `expired`, `pending`, `settled as approved`
    (an outcome the status already says is not said twice: `expired (expired)`)."""
    if outcome is None:
        return f"{status}" if status == "pending" else f"{status} with no outcome"
    return f"{status}" if outcome == status else f"{status} as {outcome}"
