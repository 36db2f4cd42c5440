"""Session rows as listings read them: `SessionSummary`, checked so that one damaged row names
itself (`StoreDamaged`) instead of failing a listing with a bare error."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast, get_args

from .._exceptions import StoreDamaged, UsageError
from .._settings import check_page
from .._text import is_utf8
from .._types import SessionStatus

__all__ = ["SessionSummary", "check_listing", "session_expiry", "session_summary"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionSummary:
    """One row of the session listing: enough to pick a session, not its history."""

    id: str
    agent: str
    status: SessionStatus
    head: int
    created_at: float
    updated_at: float
    expires_at: float | None


def check_listing(agent: object, status: object, limit: object = 0, offset: object = 0) -> None:
    """A session listing's filters and page, as every store takes them alike, else
    `UsageError`: SQLite matched `agent=5` as '5' where psycopg raised a bare TypeError, and
    took a negative limit as none where PostgreSQL refused it (`PendingFilter` checks alike)."""
    for name, text in (("agent", agent), ("status", status)):
        if text is not None and not isinstance(text, str):
            raise UsageError(f"{name} must be text or None, not {text!r}")
        if text is not None and not is_utf8(text):  # no store can look it up
            raise UsageError(f"{name} is not valid Unicode text: it holds a lone surrogate")
    check_page(limit, offset)


def session_summary(row: Sequence[Any]) -> SessionSummary:
    """A listing row read as `(id, agent, status, head, created_at, updated_at, expires_at)`."""
    i, a, st, h, c, u, x = row
    return SessionSummary(
        id=_text(i, i, "id"),
        agent=_text(a, i, "agent"),
        status=_status(st, i),
        head=int(_number(h, i, "head", whole=True)),
        created_at=float(_number(c, i, "created_at")),
        updated_at=float(_number(u, i, "updated_at")),
        expires_at=session_expiry(x, i),
    )


def session_expiry(value: Any, session_id: object) -> float | None:
    """A session row's `expires_at` (None: it never expires), checked as its other numbers, but
    for +infinity, which is never too: a signoff before 7c6bc9b4 wrote it for `Limits(ttl=inf)`,
    and an operator's `SET expires_at = 'infinity'` on PostgreSQL means as much."""
    if value is None or (isinstance(value, float) and value == math.inf):
        return None
    return float(_number(value, session_id, "expires_at"))


def _number(value: Any, session_id: object, what: str, *, whole: bool = False) -> Any:
    """A number a session row keeps, checked (else `StoreDamaged`): SQLite keeps whatever a
    hand edit puts in a column, and converting text would fail a whole listing with a bare
    ValueError. A time must be finite: PostgreSQL keeps 'infinity' and 'NaN', SQLite 9e999,
    which failed a listing's JSON and the command line's dates (no write of this signoff's
    makes one: a session that never expires keeps NULL; `session_expiry` reads +infinity so)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if not whole and isinstance(value, float) and math.isfinite(value):
        return value
    raise StoreDamaged(f"session {session_id!r:.60} is damaged: its {what} is {value!r:.40}")


def _status(value: Any, session_id: object) -> SessionStatus:
    """A session row's status, one signoff writes, else `StoreDamaged`: text a hand edit left
    was listed as the session's status, though its state reads another."""
    text = _text(value, session_id, "status")
    if text not in get_args(SessionStatus):
        raise StoreDamaged(f"session {session_id!r:.60} is damaged: its status is {text!r:.40}")
    return cast(SessionStatus, text)


def _text(value: Any, session_id: object, what: str) -> str:
    """A text column of a session row, else `StoreDamaged` (a BLOB a hand edit left in SQLite)."""
    if isinstance(value, str):
        return value
    raise StoreDamaged(f"session {session_id!r:.60} is damaged: its {what} is {value!r:.40}")
