"""The checks a snapshot's session fields pass as it is read (`SessionState.from_snapshot`), and
the fold's of those it takes from a `session.created` (`text_of`, `ttl_of`, `budgets_of`) and a
`turn.failed` (`error_of`): a field of a type the fold never gives it (a hand edit, a
half-restored copy) is refused then, not left to fail later as a bare TypeError in whatever
reads it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._events import EVENT_TYPES, EventType
from ._settings import finite

__all__ = [
    "TURN_STATUSES",
    "budgets_of",
    "check_fields",
    "error_of",
    "ids_of",
    "last_of",
    "paused_of",
    "seq_of",
    "session_of",
    "text_of",
    "ttl_end",
    "ttl_of",
]


def check_fields(data: dict[str, Any]) -> None:
    """Refuse (`ValueError`) a snapshot whose session fields (not its requests'), and its
    turn's status and counts, are not of the types the fold gives them; one left out is read as
    its default. Each is looked at once, and the collections only one level down, so reading one
    costs what it holds."""
    for name, ok in _FIELDS.items():
        if name in data and not ok(value := data[name]):
            raise ValueError(f"a snapshot's {name} is {value!r:.100}")
    turn = data.get("turn")
    if type(turn) is dict:
        for name, ok in _TURN_FIELDS.items():
            if name in turn and not ok(value := turn[name]):
                raise ValueError(f"a snapshot's turn's {name} is {value!r:.100}")


def _text(v: object) -> bool:
    return type(v) is str


def _count(v: object) -> bool:
    return type(v) is int and v >= 0


def _number(v: object) -> bool:
    return type(v) is float or type(v) is int


def _time(v: object) -> bool:
    """A finite number: an infinite or NaN time fails the JSON of the state shown."""
    return (type(v) is float or type(v) is int) and finite(v)


def _ttl(v: object) -> bool:
    """None, or seconds: any float (a signoff that did not check `Limits(ttl=...)` yet could
    record an infinite one, which `ttl_end` takes as never), or an int a float holds."""
    return v is None or type(v) is float or (type(v) is int and finite(v))


def _flag(v: object) -> bool:
    return type(v) is bool


def _or_none(ok: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda v: v is None or ok(v)


def _texts(v: object) -> bool:
    return type(v) is list and all(type(x) is str for x in v)


def _owed(v: object) -> bool:
    """child session id -> the turn that delegated to it"""
    return type(v) is dict and all(type(x) is str for x in v.values())


def _short(v: object) -> bool:
    """child session id -> [the turn that delegated, what its call's end counted]"""
    return type(v) is dict and all(
        type(x) is list and len(x) == 2 and type(x[0]) is str and type(x[1]) is dict
        for x in v.values()
    )


def _budgets(v: object) -> bool:
    """a budget's name -> a number (`headroom`, `parent_spent`)"""
    return type(v) is dict and all(_number(x) for x in v.values())


def _queued(v: object) -> bool:
    """the messages waiting for the turn's end, each with its message"""
    return type(v) is list and all(type(x) is dict and "message" in x for x in v)


def _keys(v: object) -> bool:
    """an idempotency key's digest -> [what it asked, where its message went...], in the forms
    `_idempotency` lists: a turn's id (or "", or None), its first seq (or None), its hops"""
    return type(v) is dict and all(_key(x) for x in v.values())


def _key(x: object) -> bool:
    if type(x) is not list or not 2 <= len(x) <= 4 or not _or_none(_text)(x[1]):
        return False
    return (len(x) < 3 or _or_none(_count)(x[2])) and (len(x) < 4 or _count(x[3]))


def _candidates(v: object) -> bool:
    """a candidate's id -> its `approval.candidate` data and time"""
    return type(v) is dict and all(
        type(x) is dict and type(x.get("request_id")) is str and _number(x.get("at"))
        for x in v.values()
    )


_FIELDS: dict[str, Callable[[object], bool]] = {
    "id": _text,
    "agent": _text,
    "seq": _count,
    "created_at": _time,
    "updated_at": _time,
    "ttl": _ttl,
    "parent": _or_none(_text),
    "approved_tools": _texts,
    "model_responses": _count,
    "owed": _owed,
    "short": _short,
    "queued": _queued,
    "lapsed": _flag,
    "lapsed_at": _or_none(_time),
    "limit_grants": _count,
    "headroom": _budgets,
    "parent_spent": _budgets,
    "earlier_requests": _flag,
    "keys": _keys,
    "candidates": _candidates,
    "requests": lambda v: type(v) is list,
}


TURN_STATUSES = ("running", "waiting", "completed", "failed", "cancelled")
"""`TurnStatus`'s values (`_state_parts`, not below this module)."""

_TURN_FIELDS: dict[str, Callable[[object], bool]] = {
    "id": _text,
    "status": lambda v: v in TURN_STATUSES,
    "steps": _count,
    "first_seq": _count,
}


def text_of(value: Any, name: str) -> str:
    """`value`, a `session.created`'s `name` or a call's id or name; `TypeError` unless text."""
    if not isinstance(value, str):
        raise TypeError(f"its {name} is {type(value).__name__}, not text")
    return value


def ttl_of(value: Any) -> float | None:
    """A `session.created`'s ttl (`_ttl`); `TypeError` unless None or seconds."""
    if not _ttl(value):
        raise TypeError(f"its ttl is {type(value).__name__}, not seconds")
    return value  # type: ignore[no-any-return]


def budgets_of(value: Any, name: str) -> dict[str, float]:
    """A `session.created`'s budgets (`headroom`, `parent_spent`: a budget's name -> a number,
    as `budget_left` gives them); `TypeError` unless numbers."""
    budgets = dict(value or {})
    if not _budgets(budgets):
        raise TypeError(f"its {name} are not numbers: {budgets!r:.100}")
    return budgets


def error_of(value: Any) -> dict[str, Any] | None:
    """A failed turn's `error` (`code`, `message`), as a `turn.failed` or a snapshot holds it;
    `TypeError` unless None or an object, which every reader of a turn's error takes it for."""
    if value is not None and not isinstance(value, dict):
        raise TypeError(f"its error is {type(value).__name__}, not an object")
    return value


def ttl_end(start: float, ttl: float) -> float | None:
    """When a TTL of `ttl` seconds from `start` passes, None for never: an infinite (or NaN)
    TTL, as a signoff that did not check `Limits(ttl=...)` yet could record, passes no time,
    and a store's row keeps no such number (a damaged row's, `StoreDamaged`)."""
    end = start + ttl
    return end if end - end == 0.0 else None


def last_of(value: Any) -> tuple[EventType, float, str | None] | None:
    """The last event's type, time and turn as a snapshot keeps them; None if it does not (an
    older signoff's), which leaves them to be read from the store."""
    if value is None:
        return None
    kind, at, turn = value
    if (
        kind not in EVENT_TYPES
        or not isinstance(at, int | float)
        or not isinstance(turn, str | None)
    ):
        raise ValueError(f"a snapshot's last event is malformed: {value!r:.100}")
    return kind, float(at), turn


def paused_of(value: Any) -> tuple[dict[str, Any], ...]:
    """A turn's paused parts as a snapshot keeps them; `ValueError` unless a list of objects."""
    if not isinstance(value, list) or not all(isinstance(p, dict) for p in value):
        raise ValueError(f"a turn's paused parts are not a list of objects: {value!r:.100}")
    return tuple(value)


def ids_of(value: Any) -> list[str]:
    """A turn's answered request ids as a snapshot keeps them; `ValueError` unless a list of
    strings."""
    if not _texts(value):
        raise ValueError(f"a turn's answered requests are not a list of ids: {value!r:.100}")
    return list(value)


def session_of(value: Any) -> str | None:
    """A turn's subagent stopped on its share (`share_spent`) as a snapshot keeps it; `ValueError`
    unless a session id or None."""
    if value is not None and not isinstance(value, str):
        raise ValueError(f"a turn's share_spent is not a session id: {value!r:.100}")
    return value


def seq_of(value: Any) -> int:
    """The last event a turn's latest reply read (`read_seq`) as a snapshot keeps it;
    `ValueError` unless a position in the log."""
    if type(value) is not int or value < 0:
        raise ValueError(f"a turn's read_seq is not a position in the log: {value!r:.100}")
    return value
