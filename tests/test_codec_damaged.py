"""What a store cannot read back of a stored event, snapshot or document is `StoreDamaged`, the
class that says reading it again gives the same (it was a plain `StoreError`, which is also what
a read that failed for a moment raises, so callers could not tell the two apart)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import signoff as so
from signoff._events import Event
from signoff.stores._codec import (
    DEFLATE_ON_PREVIOUS,
    EventTexts,
    event_text,
    pack_bytes,
    pack_event,
    type_name,
    unpack,
    unpack_event,
    unpack_snapshot,
)

PROSE = " ".join(["the parcel arrived damaged and the customer asks for a refund"] * 8)


def _on_previous() -> bytes:
    """An event stored on the one before it (which reading it then needs)."""
    _, after = pack_event({"message": PROSE}, None)
    second, _ = pack_event({"message": PROSE, "n": 2}, after)
    assert isinstance(second, bytes) and second[0] == DEFLATE_ON_PREVIOUS, second
    return second


READS: dict[str, Callable[[], Any]] = {
    "empty": lambda: unpack(b""),
    "unknown format": lambda: unpack(b"\x07abc"),
    "not deflate": lambda: unpack(b"\x01not deflate at all"),
    "truncated": lambda: unpack(pack_bytes({"message": PROSE})[:40]),
    "garbage after": lambda: unpack(pack_bytes({"message": PROSE}) + b"tail"),
    "not UTF-8": lambda: unpack(b"\xff\xfe{}"),
    "not JSON": lambda: unpack("{not json"),
    "neither text nor bytes": lambda: unpack(5),  # type: ignore[arg-type]
    "the event before it missing": lambda: unpack_event(_on_previous()),
    "the chain missing": lambda: event_text(_on_previous(), [None]),
    "in a run, the event before it missing": lambda: EventTexts(lambda seq: [None]).value(
        2, _on_previous()
    ),
    "a snapshot": lambda: unpack_snapshot(b"\x01garbage", "ses_1", 64),
    "a type that is not text": lambda: type_name(5),
    "an unknown type code": lambda: type_name("?"),
}


@pytest.mark.parametrize("damage", sorted(READS))
def test_what_a_stored_value_cannot_be_read_back_as_is_store_damaged(damage: str) -> None:
    with pytest.raises(so.StoreError) as info:
        READS[damage]()
    assert type(info.value) is so.StoreDamaged, info.value


def test_an_event_row_of_the_wrong_types_is_store_damaged_and_a_newer_one_is_not() -> None:
    """Fields of the wrong types are damage; a version or type only a newer signoff writes
    stays `SchemaVersionError`, which says to upgrade."""
    row: dict[str, Any] = {
        "session_id": "ses_1",
        "seq": 1,
        "type": "session.created",
        "at": 1.0,
        "turn_id": None,
        "data": {},
        "v": 1,
    }
    assert Event.from_row(**row).type == "session.created"
    for damaged in ({"data": [1]}, {"at": "noon"}, {"turn_id": 5}):
        with pytest.raises(so.StoreError, match="is malformed") as info:
            Event.from_row(**{**row, **damaged})
        assert type(info.value) is so.StoreDamaged, (damaged, info.value)
    for newer in ({"v": 99}, {"type": "session.renamed"}):
        with pytest.raises(so.SchemaVersionError):
            Event.from_row(**{**row, **newer})
