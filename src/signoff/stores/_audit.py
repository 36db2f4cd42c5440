"""The audit trail: entries derived from events in the same commit, hash-chained per stream.

A stream is a session id, or `tools:<agent>.<tool>` for changes of a tool's approval setting,
or `dashboard:sign-outs` for the dashboard's sign-ins signed out (`server._sign_ins`),
or `store:deletions` for sessions deleted (`_deletions`).
Each entry's hash covers the previous entry's hash of its stream, so altering, removing or
reordering a stored entry breaks the chain at that point (`Runtime.verify_audit`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .._events import Event
from .._exceptions import StoreDamaged
from ._codec import Stored, event_text, parse, stored_type, type_name, unpack_snapshot

__all__ = [
    "AUDITED_STORED",
    "AUDIT_TYPES",
    "AuditEntry",
    "AuditRow",
    "DAMAGED",
    "LogShape",
    "StoredSnapshot",
    "audit_rows",
    "chain_hash",
    "chain_parts",
    "chain_session",
    "entry_stream",
    "entry_type",
    "int_time_hash",
    "loaded_data",
    "numbered_on",
    "stored_snapshot",
]

AUDIT_TYPES = frozenset(
    {
        "input.requested",
        "approval.candidate",
        "approval.settled",
        "input.resolved",
        "tool.started",
        "tool.completed",
        "turn.cancelled",
    }
)
"""Event types that enter the audit trail: requests, evaluations, decisions, executions."""

AUDITED_STORED = tuple(sorted({*AUDIT_TYPES, *map(stored_type, AUDIT_TYPES)}))
"""How an event row may keep an audited type: its code, or its name (rows written before codes)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditRow:
    """An entry before it is stored: the store chains and numbers it."""

    stream: str
    type: str
    at: float
    seq: int | None
    data: dict[str, Any]
    after: int | None = None
    """If given, the entry is written only if its stream then ends at entry `after` (0: it is
    empty), and skipped otherwise: someone else recorded first, from the same state."""


DAMAGED = -1
"""An entry's `n` or `seq` as read where the store holds no whole number (SQLite keeps what a
hand edit puts in a column): no entry has it, so verification names that entry and goes on."""


def numbered_on(page: Sequence[tuple[int, object]], past: int) -> bool:
    """Whether a page of one stream's entries, `(id, n)` each, read by `n` past its entry `past`,
    numbers them on from it one by one with their ids rising, as a stream holds them unless a
    hand edit moved an `n` (made it text, which SQLite sorts after every number, or another
    number): the entry moved is then missing from such a read, which must be read by id."""
    ids = [i for i, _ in page]
    return [n if type(n) is int else None for _, n in page] == list(
        range(past + 1, past + 1 + len(page))
    ) and all(a < b for a, b in zip(ids, ids[1:], strict=False))


@dataclass(frozen=True, slots=True, kw_only=True)
class StoredSnapshot:
    """A session's snapshot as `Store.snapshots` reads it for verification: the event it was
    taken after and its value read back (None, and `damage` saying why, if it cannot be)."""

    seq: int
    data: Any
    damage: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class LogShape:
    """A session's event log as `Store.log_shapes` reads it for verification: the last event
    its session row keeps (`head`), and of its event rows the highest seq (`last`), how many
    there are (`count`), the lowest seq (`low`) and the sum of their seqs (`total`); 0 each
    for a log of none, -1 for what a hand edit left that is no whole number. A whole log holds
    each event from 1 to `last` once and ends at `head`."""

    head: int
    last: int
    count: int
    low: int
    total: int


def stored_snapshot(session_id: str, seq: object, data: Stored) -> StoredSnapshot:
    """A snapshot row read back for verification: one a hand edit left unreadable (a `seq`
    that is no whole number, data that does not unpack) says so, rather than stop it."""
    if isinstance(seq, bool) or not isinstance(seq, int):
        return StoredSnapshot(seq=DAMAGED, data=None, damage=f"its seq is {seq!r:.40}")
    try:
        return StoredSnapshot(seq=seq, data=unpack_snapshot(data, session_id, seq))
    except StoreDamaged as exc:
        return StoredSnapshot(seq=seq, data=None, damage=str(exc))


@dataclass(frozen=True, slots=True, kw_only=True)
class AuditEntry:
    """A stored entry; `n` counts from 1 within its stream, `id` across all streams (`DAMAGED`
    for an `n` or `seq` the store holds no whole number for)."""

    id: int
    stream: str
    n: int
    type: str
    at: float
    seq: int | None
    data: dict[str, Any]
    prev: str | None
    hash: str

    def to_dict(self) -> dict[str, Any]:
        """The entry as the JSON object an export line holds."""
        return {
            "id": self.id,
            "stream": self.stream,
            "n": self.n,
            "type": self.type,
            "at": self.at,
            "seq": self.seq,
            "data": self.data,
            "prev": self.prev,
            "hash": self.hash,
        }


def audit_rows(events: Sequence[Event]) -> list[AuditRow]:
    return [
        AuditRow(stream=e.session_id, type=e.type, at=e.at, seq=e.seq, data=e.data)
        for e in events
        if e.type in AUDIT_TYPES
    ]


def chain_hash(
    prev: str | None, *, stream: str, n: int, type: str, at: float, seq: int | None, data: Any
) -> str:
    """SHA-256 over the previous hash and the canonical JSON of the entry, its time as a float:
    the stores keep it so, and a clock's int (whole seconds) would read back as other text."""
    return _digest(prev, stream=stream, n=n, type=type, at=float(at), seq=seq, data=data)


def int_time_hash(
    prev: str | None, *, stream: str, n: int, type: str, at: float, seq: int | None, data: Any
) -> str | None:
    """The hash of an entry of whole-second time as signoff recorded it from a clock giving
    int seconds, before times were hashed as floats (None for another time)."""
    if not float(at).is_integer():
        return None
    return _digest(prev, stream=stream, n=n, type=type, at=int(at), seq=seq, data=data)


def _digest(prev: str | None, **entry: Any) -> str:
    body = json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    # surrogatepass: a lone surrogate in recorded data hashes too (valid text is unaffected)
    return hashlib.sha256(f"{prev or ''}\n{body}".encode("utf-8", "surrogatepass")).hexdigest()


def chain_parts(
    *, stream: str, type: str, at: float, seq: int | None, data: Any
) -> tuple[bytes, bytes]:
    """The bytes `chain_hash` hashes after the previous hash and a newline, before and after
    the entry's number `n`: so a store can chain an entry from a head it reads only when it
    writes (PostgreSQL, `_sql.AUDIT_APPEND`). Sorted, `n` falls between `data` and `seq`."""
    head = _canonical({"at": float(at), "data": data})
    tail = _canonical({"seq": seq, "stream": stream, "type": type})
    return f'{head[:-1]},"n":'.encode("utf-8", "surrogatepass"), f",{tail[1:]}".encode(
        "utf-8", "surrogatepass"
    )


def _canonical(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def loaded_data(stored: Stored | None, earlier: Sequence[Stored | None] = ()) -> dict[str, Any]:
    """An entry's data as read back from its stored form (`earlier` as for `event_text`); a
    missing or unreadable one (removed or damaged) reads as `{}`, which no longer matches its
    hash, so verification names that entry instead of failing on it."""
    if stored is None:
        return {}
    try:
        data = parse(event_text(stored, earlier))
    except StoreDamaged:
        return {}
    return data if isinstance(data, dict) else {}


def entry_stream(stored: object, entry_id: object) -> str:
    """An entry's stream as read back: one a hand edit left that is no text (its session's key
    and its stream both NULL, a BLOB) reads as a text naming it, which matches no chain, so
    verification names that entry instead of failing on it."""
    if isinstance(stored, str):
        return stored
    if stored is None:
        return f"entry #{entry_id} (of no session or stream)"
    return f"{stored!r:.60} (not text)"


def entry_type(stored: object) -> str:
    """An entry's event type as read back; a type code this signoff does not know (a damaged
    row) reads as itself, which no longer matches the entry's hash."""
    if stored is None:
        return ""
    try:
        return type_name(stored)
    except StoreDamaged:
        return str(stored)


def chain_session(
    n: int, digest: bytes | None, events: Sequence[Event]
) -> list[tuple[int, int | None, bytes]]:
    """The audit entries of a commit's events chained onto the session's stream from its head
    `(n, digest)`: `(n, seq, hash)` each; they keep no copy of the events, only place and hash."""
    entries = []
    for row in audit_rows(events):
        n += 1
        digest = bytes.fromhex(
            chain_hash(
                None if digest is None else digest.hex(),
                stream=row.stream,
                n=n,
                type=row.type,
                at=row.at,
                seq=row.seq,
                data=row.data,
            )
        )
        entries.append((n, row.seq, digest))
    return entries
