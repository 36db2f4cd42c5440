"""Request rows as the stores write and read them: where a new request is held (its
`input.requested` event or a copy of its own), and a stored row read back into a request."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pydantic

from .._events import SCHEMA_VERSION
from .._exceptions import SchemaVersionError, StoreDamaged, StoreError
from .._types import InputRequest
from ._audit import DAMAGED
from ._base import Commit, RequestRow
from ._codec import unpack_event

__all__ = [
    "REQUEST_ROW_COLUMNS",
    "request_row",
    "request_rows",
    "stored_request",
    "stored_resolution",
]


def request_rows(
    commit: Commit, pack: Callable[[Any], Any]
) -> list[tuple[InputRequest, tuple[int | None, int | None], Any]]:
    """Each new request of a commit with where its `input.requested` event holds it (seq, index)
    and, only if no event of the commit holds exactly it, a packed copy to store instead."""
    held: dict[str, tuple[int, int, dict[str, Any]]] = {}
    for event in commit.events:
        if event.type == "input.requested":
            for i, raw in enumerate(event.data.get("requests", ())):
                held[raw["id"]] = (event.seq, i, raw)
    rows: list[tuple[InputRequest, tuple[int | None, int | None], Any]] = []
    for req in commit.new_requests:
        dumped = req.model_dump(mode="json", exclude_defaults=True)
        found = held.get(req.id)
        if found is not None and found[2] == dumped:
            rows.append((req, (found[0], found[1]), None))
        else:
            rows.append((req, (None, None), pack(dumped)))
    return rows


REQUEST_ROW_COLUMNS = (
    "r.id, s.id, s.audit_n, r.agent, r.kind, r.tool, r.created_at, r.status, r.outcome, "
    "r.resolution, r.expires_at"
)
"""What `request_row` reads before a store's request columns (data, event data, index, status,
earlier events)."""


def request_row(row: Sequence[Any], unpack: Callable[[Any], Any]) -> RequestRow:
    """A row of `REQUEST_ROW_COLUMNS` and the request columns read back; what cannot be read
    (damaged by hand) is named in `damage` rather than raised, so verification reports it."""
    damage = []
    request = resolution = None
    try:
        request = stored_request(*row[11:16], unpack, *row[16:])
    except StoreError as exc:
        damage.append(f"its request: {exc}")
    if row[9] is not None:
        try:
            resolution = unpack(row[9])
        except StoreError as exc:
            damage.append(f"its resolution: {exc}")
        if resolution is not None and not isinstance(resolution, dict):
            damage.append("its resolution is not an object")
            resolution = None
    return RequestRow(
        id=str(row[0]),
        session_id=str(row[1]),
        # A session's chain length a hand edit made text (SQLite keeps it): named by its head.
        audit_n=row[2] if isinstance(row[2], int) and not isinstance(row[2], bool) else DAMAGED,
        agent=row[3],
        kind=row[4],
        tool=row[5],
        created_at=row[6],
        status=row[7],
        outcome=row[8],
        request=request,
        resolution=resolution,
        deadline=row[10],
        damage="; ".join(damage) or None,
    )


def stored_resolution(
    request_id: str, raw: Any, unpack: Callable[[Any], Any]
) -> dict[str, Any] | None:
    """A request's stored resolution read back, or None if it is not an object (an old or
    hand-edited store): every reader of `StoredRequest` then copes as with none recorded. One
    that does not unpack is `StoreDamaged` naming the request."""
    try:
        resolution = None if raw is None else unpack(raw)
    except StoreError as exc:
        raise StoreDamaged(f"request {request_id}: its resolution: {exc}") from exc
    return resolution if isinstance(resolution, dict) else None


def stored_request(
    request_id: str,
    own: Any,
    event_data: Any,
    index: int | None,
    status: str,
    unpack: Callable[[Any], Any],
    *earlier: Any,
) -> InputRequest:
    """A request row read back: its own copy if it has one, else its place in the
    `input.requested` event that recorded it (`earlier`: the stored events before that one,
    nearest first, which it may be kept on). What cannot be read is `StoreDamaged` naming the
    request, so a damaged row that fails a whole listing can be found (and is not retried)."""
    try:
        return _stored_request(own, event_data, index, status, unpack, *earlier)
    except SchemaVersionError:
        raise
    except StoreError as exc:
        raise StoreDamaged(f"request {request_id}: {exc}") from exc


def _stored_request(
    own: Any,
    event_data: Any,
    index: int | None,
    status: str,
    unpack: Callable[[Any], Any],
    *earlier: Any,
) -> InputRequest:
    try:
        if own is not None:
            raw = unpack(own)
        elif event_data is None or index is None:
            raise StoreDamaged("a request row refers to an event that is not in the log")
        else:
            raw = unpack_event(event_data, *earlier)["requests"][index]
        if raw.get("v", SCHEMA_VERSION) > SCHEMA_VERSION:
            raise SchemaVersionError(f"request {raw.get('id')} was written by a newer signoff")
        raw["status"] = status
        return InputRequest.model_validate(raw)
    except (KeyError, IndexError, TypeError, AttributeError, pydantic.ValidationError) as exc:
        raise StoreDamaged(f"a stored request cannot be read: {exc}") from exc
