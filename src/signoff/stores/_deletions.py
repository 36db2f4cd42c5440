"""Deleting a session from a store: what both stores check before, and the audit entry they
write with it, in the same transaction, on a stream of its own (`DELETIONS_STREAM`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._exceptions import SessionBusy, SessionWaiting, SubagentSession, UnknownSession
from ._audit import AuditRow, loaded_data
from ._codec import stored_type, unpack, unpack_event

__all__ = [
    "DELETIONS_STREAM",
    "FINISHED",
    "LIVE",
    "MAX_ERASED",
    "RESOLVED_STORED",
    "SESSION_DELETED",
    "Doomed",
    "StaleKey",
    "deletion_row",
    "erased_requests",
    "refuse",
]

DELETIONS_STREAM = "store:deletions"
"""The audit stream of deletions: one entry per `delete_session`, chained like tool settings'."""

SESSION_DELETED = "session.deleted"
"""The type of a deletion's audit entry, and the fault hook's label of `delete_session`."""

FINISHED = ("idle", "failed", "cancelled")
"""The statuses of a session `prune` deletes whatever its TTL: its turn over (or none yet)."""

LIVE = ("running", "waiting")
"""The statuses of a session `prune` deletes once its TTL has passed (it can go on no more)."""

StaleKey = tuple[float, int]
"""A session's place in the order `stale_sessions` lists them in (its last activity, its row
key): the next page starts after it, so a prune goes on past the sessions it had to skip."""

RESOLVED_STORED = (stored_type("input.resolved"), "input.resolved")
"""How an event row may keep the type `input.resolved` (its code, or its name before codes):
the closes a deletion reads to name, for each request it erases, the entry that closed it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Doomed:
    """A session about to be deleted, as its row kept it: its id, agent, last event and the
    head of its audit chain (entries, last hash), which the deletion's entry records. `damaged`:
    those of them a hand edit left unreadable (None here; only a forced deletion takes such a
    row), by the entry's name for each (`events`, `audit_n`, `audit_hash`), with what the row
    held, as text."""

    id: str
    agent: str
    head: int | None
    audit_n: int | None
    audit_hash: bytes | None
    damaged: tuple[tuple[str, str], ...] = ()


MAX_ERASED = 10_000
"""The most requests a deletion's entry names for the hubs: the open ones, then those whose
close was recorded last (a hub far enough behind to miss an older close is not told of it);
it keeps the entry, and what each hub reads of it, bounded."""


def erased_requests(
    requests: Iterable[Sequence[Any]], closes: Iterable[Sequence[Any]]
) -> dict[str, list[dict[str, Any]]]:
    """The requests a deletion erases that channels may show, by session: each one's `id` and
    `closed`, the id of the audit entry that recorded its close (erased with it; None for one
    still open, which only a forced deletion erases), in the order they closed, the open last;
    at most `MAX_ERASED` of them. A hub that never read that entry tells its channels of the
    close from the deletion's.

    `requests`: rows of the session's id and `REQUEST_COLUMNS` (a store's); `closes`: rows of
    an `input.resolved` entry's id, its event's stored data and the events it may be kept on.
    A subagent's request mirrored on its parent is left out, as channels show the child's own;
    one that cannot be read back (a damaged row, which `force` deletes) is kept in."""
    closed: dict[str, int] = {}
    for entry_id, data, *earlier in closes:
        request_id = loaded_data(data, earlier).get("request_id")
        if isinstance(request_id, str):
            closed.setdefault(request_id, int(entry_id))
    events: dict[Any, list[Any]] = {}  # each event holding requests unpacked once, not per row
    listed: list[tuple[str, dict[str, Any]]] = []
    for session_id, request_id, own, event_data, index, _status, *earlier in requests:
        if not _mirrored(own, event_data, index, earlier, events):
            rid = str(request_id)
            listed.append((str(session_id), {"id": rid, "closed": closed.get(rid)}))
    listed.sort(key=lambda r: (r[1]["closed"] is None, r[1]["closed"] or 0, r[1]["id"]))
    found: dict[str, list[dict[str, Any]]] = {}
    for session_id, request in listed[-MAX_ERASED:]:
        found.setdefault(session_id, []).append(request)
    return found


def _mirrored(
    own: Any, event_data: Any, index: Any, earlier: list[Any], events: dict[Any, list[Any]]
) -> bool:
    """Whether a request row is a subagent's request mirrored on its parent (its `child`),
    read without validating the request: False when it cannot be read."""
    try:
        if own is not None:
            raw = unpack(own)
        else:
            key = (event_data, *earlier)
            held = events.get(key)
            if held is None:
                held = events[key] = unpack_event(event_data, *earlier)["requests"]
            raw = held[index]
        return isinstance(raw, dict) and raw.get("child") is not None
    except Exception:  # a damaged row, which `force` deletes: kept in, as a request
        return False


def deletion_row(
    doomed: Sequence[Doomed],
    *,
    at: float,
    by: dict[str, Any] | None,
    reason: str | None,
    force: bool = False,
    requests: Mapping[str, list[dict[str, Any]]] | None = None,
) -> AuditRow:
    """The deletion's audit entry: which sessions (the one asked for first, then its subagents'),
    who deleted them, when and why, where each one's event log and audit chain ended, the
    requests each held that channels may show (`erased_requests`), whether it was forced
    (unfinished, `force`; said only then), and what of a session's row could not be read
    (`Doomed.damaged`; said only then)."""
    return AuditRow(
        stream=DELETIONS_STREAM,
        type=SESSION_DELETED,
        at=at,
        seq=None,
        data={
            "session_id": doomed[0].id,
            "by": by,
            "reason": reason,
            **({"force": True} if force else {}),
            "sessions": [
                {
                    "id": d.id,
                    "agent": d.agent,
                    "events": d.head,
                    "audit_n": d.audit_n,
                    "audit_hash": None if d.audit_hash is None else d.audit_hash.hex(),
                    "requests": (requests or {}).get(d.id, []),
                    **({"damaged": dict(d.damaged)} if d.damaged else {}),
                }
                for d in doomed
            ],
        },
    )


def refuse(
    session_id: str,
    *,
    found: bool,
    parent: str | None,
    leased: str | None,
    waiting: Sequence[tuple[str, str]],
    running: Sequence[str] = (),
) -> None:
    """Raise why the session may not be deleted, if it may not: unknown, a subagent's whose
    parent exists, a turn of it (or of a subagent under it) running under a lease, open
    requests in it (or under it), or a turn of it (or under it) with work to do and no lease
    (`running`, the sessions of each such turn: answered and not yet taken up again, a message
    just sent, a drive that died) or waiting (with no request open: on a subagent that ended
    and has yet to be read back) before its TTL passed, which a worker would go on with. A
    refusal for open requests names those too (`SessionWaiting.unfinished`): recording a
    passed TTL that closes the requests would not end them."""
    if not found:
        raise UnknownSession(session_id)
    if parent is not None:
        raise SubagentSession(session_id, parent)
    if leased is not None:
        whose = "its" if leased == session_id else f"subagent session {leased!r}'s"
        raise SessionBusy(
            f"session {session_id!r} is running: {whose} turn holds the lease; cancel it first",
            session_id,
        )
    if waiting:  # (request id, the session holding it)
        requests, holders = [r for r, _ in waiting], [h for _, h in waiting]
        raise SessionWaiting(session_id, requests, holders, unfinished=running)
    if running:
        whose = "its" if running[0] == session_id else f"subagent session {running[0]!r}'s"
        raise SessionBusy(
            f"session {session_id!r} is not finished: {whose} turn has work to do or waits on "
            "a subagent; cancel it first",
            session_id,
        )
