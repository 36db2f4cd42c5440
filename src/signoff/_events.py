"""Event types, their JSON form and the schema version.

The event log is the truth: every session is an append-only, gap-free sequence of these.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

from ._exceptions import SchemaVersionError, StoreDamaged, TooLarge, UsageError

__all__ = [
    "BOOKKEEPING",
    "CANCELLED",
    "EVENT_TYPES",
    "EXPIRED",
    "SCHEMA_VERSION",
    "Event",
    "EventType",
    "FITS_BITS",
    "check_digits",
    "check_shown_event",
    "dumps",
    "event_of_row",
    "int_digits",
    "is_activity",
    "keeps_activity",
    "loads",
]

SCHEMA_VERSION: Final = 1
"""Version of the event and snapshot format this signoff writes and the newest it reads."""

EventType = Literal[
    "session.created",
    "turn.started",
    "turn.message",
    "model.completed",
    "model.paused",
    "tool.started",
    "tool.step",
    "tool.completed",
    "input.requested",
    "turn.waiting",
    "approval.candidate",
    "approval.settled",
    "input.resolved",
    "turn.completed",
    "turn.failed",
    "turn.resumed",
    "turn.cancelled",
    "session.waiting",
    "subagent.spent",
    "model.spent",
    "input.repeated",
]

EVENT_TYPES: Final[frozenset[str]] = frozenset(EventType.__args__)  # type: ignore[attr-defined]

BOOKKEEPING: Final[frozenset[str]] = frozenset({"subagent.spent", "model.spent"})
"""Events that count what was spent after the turn that spent it ended: the session was not
active, so its TTL runs on from the event before (the store's row keeps its deadline)."""


def is_activity(type_: str, data: dict[str, Any]) -> bool:
    """Whether an event of `type_` holding `data` is the session's activity, which its TTL and
    its `updated_at` run from: not `BOOKKEEPING`, nor a passed deadline's escalation, which time
    made, not anyone (the session waits on people as before, whoever recorded it and when)."""
    if type_ in BOOKKEEPING:
        return False
    return not (type_ == "approval.candidate" and data.get("outcome") == "escalated")


EXPIRED: Final = "session expired"
"""The `reason` of the events that record a session's passed TTL (`expiry_specs`): folded, the
session is lapsed (`SessionState.lapsed`)."""

CANCELLED: Final = "turn cancelled"
"""The `reason` a cancel's withdrawals start with (`cancel_specs`): its own follows, after ': '."""


def keeps_activity(type_: str, data: dict[str, Any], before: str | None) -> bool:
    """Whether an event that `is_activity` still leaves the session's last activity where it
    was, as its commit leaves the store's row (`records_expiry`), because time made it, not
    anyone: a passed TTL's record (requests expired, the turn failed; not a mirror's close that
    copies its subagent's, which lets the delegate call go on), and a delegated turn's cancel for
    a TTL passed above it (`expiry`). A cancel's withdrawals, and the `session.waiting` right
    after its `turn.cancelled` (`before`: the type of the event before), are committed with
    that `turn.cancelled`, which decides for them."""
    if type_ in ("input.resolved", "turn.failed"):
        reason = data.get("reason")
        if reason == EXPIRED:
            return "child_request_id" not in data
        # Not a mirror's close, which copies its subagent's withdrawal: a person's cancel there.
        return (
            type_ == "input.resolved" and "child_request_id" not in data and _cancels(data, reason)
        )
    if type_ == "turn.cancelled":
        return data.get("expiry") is True
    return type_ == "session.waiting" and before == "turn.cancelled"


def _cancels(data: dict[str, Any], reason: Any) -> bool:
    """Whether an `input.resolved` is a cancel's withdrawal (`cancel_specs`)."""
    return (
        data.get("status") == "withdrawn"
        and data.get("outcome") == "cancelled"
        and isinstance(reason, str)
        and (reason == CANCELLED or reason.startswith(CANCELLED + ": "))
    )


def dumps(value: Any) -> str:
    """Compact, deterministic JSON used for every stored document."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=False)


_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads(text: str | bytes) -> Any:
    """`json.loads`, taking a shorter way for text with nothing around the value (what `dumps`
    writes): half the time of a stored event's small document. Anything else goes the usual
    way, so what is accepted and refused, and how, is `json.loads`'s."""
    if isinstance(text, str):
        try:
            value, end = _SCAN(text, 0)  # `raw_decode`, without its frame
        except (StopIteration, ValueError):
            pass  # leading white space, or not JSON: json.loads says which
        else:
            if end == len(text):
                return value
    return json.loads(text)


FITS_BITS: Final = 3 * sys.int_info.str_digits_check_threshold
"""An integer of at most this many bits has fewer digits than any limit Python may set (at
least 640 digits; 2**bits < 10**digits): no need to count them."""


def int_digits() -> int:
    """How many digits an integer may have to be stored: Python's limit on turning one into
    text (or its default, when lifted or set higher, so that every process can read it back)."""
    default = sys.int_info.default_max_str_digits
    return min(sys.get_int_max_str_digits() or default, default)


def check_digits(value: int) -> None:
    """Raise `TooLarge` if `value` has more digits than `int_digits()`: json.dumps would raise
    a bare ValueError for it, in the middle of recording a result."""
    limit = int_digits()
    size = abs(value)
    if size < 10**limit:
        return
    digits = int(math.log10(size)) + 1  # a float estimate, set right below
    while size >= 10**digits:
        digits += 1
    while size < 10 ** (digits - 1):
        digits -= 1
    raise TooLarge(
        f"an integer of {digits} digits, over the limit of {limit} digits a stored number may "
        "have (sys.get_int_max_str_digits); return it as text, or return less"
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One entry of a session's log; `seq` is gap-free per session and is the SSE id."""

    session_id: str
    seq: int
    type: EventType
    at: float
    turn_id: str | None = None
    data: dict[str, Any] = field(default_factory=dict)
    v: int = SCHEMA_VERSION

    @property
    def id(self) -> str:
        """Globally unique id, derived rather than stored: the log never re-numbers."""
        return f"{self.session_id}:{self.seq}"

    def to_dict(self) -> dict[str, Any]:
        """The event's JSON form, `{id, session_id, seq, turn_id, type, at, data, v}`."""
        return {
            "id": self.id,
            "session_id": self.session_id,
            "seq": self.seq,
            "turn_id": self.turn_id,
            "type": self.type,
            "at": self.at,
            "data": self.data,
            "v": self.v,
        }

    @classmethod
    def from_row(
        cls,
        *,
        session_id: str,
        seq: int,
        type: str,
        at: float,
        turn_id: str | None,
        data: dict[str, Any],
        v: int,
    ) -> Event:
        """Rebuild a stored event, refusing versions newer than this signoff understands."""
        if cls is Event:
            return event_of_row(session_id, seq, type, at, turn_id, data, v)
        _check_row(session_id, seq, type, at, turn_id, data, v)
        return cls(
            session_id=session_id,
            seq=seq,
            type=type,  # type: ignore[arg-type]
            at=at,
            turn_id=turn_id,
            data=data,
            v=v,
        )


def _check_row(
    session_id: str, seq: int, type: str, at: float, turn_id: str | None, data: Any, v: int
) -> None:
    """Refuse a stored event's fields unless they are of their types (else `StoreDamaged`: the
    row reads the same again), its version one this signoff reads and its type one it knows
    (else `SchemaVersionError`) (`Event.from_row`)."""
    fields = (  # `_is_int` inline, and a float `at` (what the stores give) told first
        isinstance(session_id, str)
        and isinstance(seq, int)
        and not isinstance(seq, bool)
        and isinstance(type, str)
        and isinstance(v, int)
        and not isinstance(v, bool)
        # finite: `at - at` is NaN for an infinity and for NaN (what PostgreSQL and SQLite keep
        # if a hand edit puts it there), which failed the event's JSON and its time shown
        and ((at.__class__ is float and at - at == 0.0) or _is_time(at))
        and (turn_id is None or isinstance(turn_id, str))
        and isinstance(data, dict)
    )
    if not fields:
        raise StoreDamaged(
            f"event {session_id!r}:{seq!r} is malformed: seq and v must be integers, at a "
            "finite number, session_id, type and turn_id strings and data an object"
        )
    if v > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"event {session_id}:{seq} has schema version {v}; this signoff reads up to "
            f"{SCHEMA_VERSION}. Upgrade signoff to read this store."
        )
    if type not in EVENT_TYPES:
        raise SchemaVersionError(f"event {session_id}:{seq} has unknown type {type!r}")


def event_of_row(
    session_id: str, seq: int, type: str, at: float, turn_id: str | None, data: Any, v: int
) -> Event:
    """`Event.from_row`, its arguments by position: the stores build one per event row read."""
    _check_row(session_id, seq, type, at, turn_id, data, v)
    # The fields set through their slots, as the frozen dataclass's `__init__` does by
    # `object.__setattr__` in twice the time: a journal read back builds one per step.
    event = _new(Event)
    _set_session_id(event, session_id)
    _set_seq(event, seq)
    _set_type(event, type)
    _set_at(event, at)
    _set_turn_id(event, turn_id)
    _set_data(event, data)
    _set_v(event, v)
    return event


_new = object.__new__
_FIELDS = ("session_id", "seq", "type", "at", "turn_id", "data", "v")
assert tuple(f.name for f in fields(Event)) == _FIELDS, "Event.from_row sets every field"
_set_session_id, _set_seq, _set_type, _set_at, _set_turn_id, _set_data, _set_v = (
    Event.__dict__[name].__set__ for name in _FIELDS
)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_time(value: object) -> bool:
    """An event's time other than a plain float: an int, or a finite float of a subclass."""
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def check_shown_event(shown: object, session_id: str, after: int) -> None:
    """A follower's `shown` is None or the session's event at `after`: the one a read after it
    checks is still the store's (another would be checked in its place, or raise for nothing)."""
    if shown is None:
        return
    if not isinstance(shown, Event) or (shown.session_id, shown.seq) != (session_id, after):
        raise UsageError(
            f"shown must be None or the session's event at after={after} (an Event read "
            f"before), not {shown!r:.200}"
        )
