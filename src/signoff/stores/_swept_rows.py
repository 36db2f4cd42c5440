"""The rows of the listings only a sweep reads (`lapsed_sessions`, `orphaned_children`,
`running_unheld`): one a store cannot read (a hand edit) is listed in its place as a
`DamagedSession`, which the sweep logs and passes. Read whole, that one row failed the listing,
so every sweep stopped there: no deadline, expiry or orphan cancel of any other session."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .._exceptions import StoreError
from ._session_rows import SessionSummary, session_summary

__all__ = ["DamagedSession", "Swept", "readable_sessions", "swept_summary"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DamagedSession:
    """A row of a sweep's listing of sessions that could not be read, in its place: the
    session's id, its `expires_at` where that is a number (the lapsed sessions are paged by it)
    and what is wrong with the row."""

    id: str
    expires_at: float | None
    damage: str


Swept = SessionSummary | DamagedSession
"""A row of a sweep's listing of sessions."""


def swept_summary(row: Sequence[Any]) -> Swept:
    """A row of a sweep's listing, read as `session_summary` reads it, else a `DamagedSession`."""
    try:
        return session_summary(row)
    except StoreError as exc:
        x = row[6]
        number = isinstance(x, int | float) and not isinstance(x, bool)
        return DamagedSession(id=str(row[0]), expires_at=x if number else None, damage=str(exc))


def readable_sessions(
    rows: Iterable[Swept],
    log: logging.Logger | None = None,
    what: str = "",
) -> list[SessionSummary]:
    """The sessions of `rows` that could be read. One that could not is logged to `log`,
    naming its session and `what` is left undone, and passed (a sweep tries it again at its
    next); without `log` (a listing people read) it is raised, so the damage is seen."""
    out: list[SessionSummary] = []
    for row in rows:
        if isinstance(row, SessionSummary):
            out.append(row)
        elif log is None:
            raise StoreError(row.damage)
        else:
            log.warning("session %s: %s: %s", row.id, what, row.damage)
    return out
