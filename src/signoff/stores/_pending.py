"""`PendingFilter`: which requests a store's `pending()` lists and `count_pending()` counts, as
one SQL condition both stores share, checked when it is made."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .._exceptions import StoreError, UsageError
from .._settings import finite
from .._text import is_utf8
from ._codec import stored_type
from ._initiators import InitiatorFilter

if TYPE_CHECKING:
    from .._types import InputRequest

__all__ = [
    "DEEPEST",
    "TIME_LIMIT",
    "PendingFilter",
    "created_before",
    "cursor_past",
    "first_seen",
    "listing_order",
    "tie_order",
]


TIME_LIMIT = 2**63
"""A filter's times lie within ±`TIME_LIMIT` seconds: SQLite binds no integer past 64 bits."""

DEEPEST = 8
"""How many sessions at most lie above a subagent's (`signoff._subagents.MAX_DEPTH`): how far
up `live_at` looks for one whose TTL passed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PendingFilter:
    """Which requests `pending()` lists; all fields optional, newest last."""

    agent: str | None = None
    tool_name: str | None = None
    kind: str | None = None
    status: str | None = "pending"
    session_id: str | None = None
    # Only requests of these sessions (ids; None: any session's): a runtime asks about many
    # sessions at once so, in one query, not one each.
    session_ids: tuple[str, ...] | None = None
    created_before: float | None = None
    created_after: float | None = None
    # Leave out requests of sessions whose TTL passed by then, and of subagents' delegated turns
    # below a session whose TTL passed (its expiry cancels them: they take no answer).
    live_at: float | None = None
    due_by: float | None = None  # only requests whose deadline passed by then (at it counts)
    initiated_by: InitiatorFilter | None = None  # only requests of the sessions it picks
    # Not these requests (ids): those a listing would leave out though the store holds them
    # open (`_unlisted.unlisted`), so its pages and its count skip the same ones.
    excluded: tuple[str, ...] = ()
    # Only requests past this one (its `created_at` and id) in the listing's order (its row
    # tells where it was asked): a cursor that, unlike `offset`, skips no request when one
    # before it closes between two pages.
    after: tuple[float, str] | None = None

    def where(self, ph: str, prefix: str = "") -> tuple[str, list[Any]]:
        """The SQL `WHERE` clause (over `requests r JOIN sessions s`) and its parameters, with
        `ph` as the driver's placeholder (`?` for SQLite, `%s` for psycopg) and `prefix` the
        tables' schema (`name.`; none for SQLite)."""
        where: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("r.status", self.status),
            ("r.agent", self.agent),
            ("r.tool", self.tool_name),
            ("r.kind", self.kind),
            ("s.id", self.session_id),
        ):
            if column == "r.status" and value == "pending":
                # Written out, so the planner may use the indexes of pending requests only.
                where.append("r.status='pending'")
            elif value is not None:
                where.append(f"{column}={ph}")
                params.append(value)
        for condition, moment in (
            (f"r.created_at<{ph}", self.created_before),
            (f"r.created_at>{ph}", self.created_after),
            (f"(s.expires_at IS NULL OR s.expires_at>{ph})", self.live_at),
            (f"r.expires_at<={ph}", self.due_by),
        ):
            if moment is not None:
                where.append(condition)
                params.append(moment)
        if self.live_at is not None:
            where.append(_above_live(ph, prefix))
            params += [self.live_at, self.live_at]
        if self.initiated_by is not None:
            condition, more = self.initiated_by.where(ph, "s")
            where.append(condition)
            params += more
        # One parameter however many: a JSON array (SQLite), an array (PostgreSQL).
        if self.session_ids is not None:
            if ph == "?":
                where.append("s.id IN (SELECT value FROM json_each(?))")
                params.append(json.dumps(list(self.session_ids)))
            else:
                where.append(f"s.id = ANY({ph}::text[])")
                params.append(list(self.session_ids))
        if self.excluded:
            if ph == "?":
                where.append("r.id NOT IN (SELECT value FROM json_each(?))")
                params.append(json.dumps(list(self.excluded)))
            else:
                where.append(f"NOT (r.id = ANY({ph}::text[]))")
                params.append(list(self.excluded))
        if self.after is not None:
            # `>=` on its own: the range the index of `created_at` serves (the rest, its ties,
            # past the cursor's request in the order asked, read from its row by its id; with
            # that row gone, its session deleted, its moment's others are listed again: none
            # is skipped).
            at, rid = self.after
            asked = f"(SELECT c.{{}} FROM {prefix}requests c WHERE c.id = {ph})"
            cursor = f"COALESCE({asked.format('seq')}, 0), COALESCE({asked.format('idx')}, 0)"
            where.append(
                f"r.created_at>={ph} AND (r.created_at>{ph} OR "
                f"({tie_order(ph)}) > ({cursor}, {ph}))"
            )
            params += [at, at, rid, rid, rid]
        return (" WHERE " + " AND ".join(where)) if where else "", params

    limit: int = 100
    offset: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Refused here, not read differently by each store: SQLite matched `agent=5` as '5'
        # where psycopg failed on it, and took a negative limit as none.
        for name in ("agent", "tool_name", "kind", "status", "session_id"):
            text = getattr(self, name)
            if text is not None and not isinstance(text, str):
                raise UsageError(f"PendingFilter({name}=...) must be text or None, not {text!r}")
            if text is not None and not is_utf8(text):  # no store can look it up
                raise UsageError(
                    f"PendingFilter({name}=...) is not valid Unicode text: "
                    "it holds a lone surrogate"
                )
        for name in ("created_before", "created_after", "live_at", "due_by"):
            moment = getattr(self, name)
            # An int no float holds overflowed; one past 64 bits, SQLite's binding of it.
            if moment is not None and not (finite(moment) and -TIME_LIMIT <= moment < TIME_LIMIT):
                raise UsageError(
                    f"PendingFilter({name}=...) must be a finite time (seconds) or None, "
                    f"not {moment!r}"
                )
        if not isinstance(self.excluded, tuple) or not all(
            isinstance(i, str) for i in self.excluded
        ):
            raise UsageError(
                f"PendingFilter(excluded=...) must be a tuple of request ids, not {self.excluded!r}"
            )
        ids = self.session_ids
        if ids is not None and (
            not isinstance(ids, tuple) or not all(isinstance(i, str) and is_utf8(i) for i in ids)
        ):
            raise UsageError(
                "PendingFilter(session_ids=...) must be a tuple of session ids or None, "
                f"not {ids!r}"
            )
        if self.after is not None and not _cursor(self.after):
            raise UsageError(
                "PendingFilter(after=...) must be a request's (created_at, id) or None, "
                f"not {self.after!r}"
            )
        if self.initiated_by is not None and not isinstance(self.initiated_by, InitiatorFilter):
            raise UsageError(
                "PendingFilter(initiated_by=...) must be an InitiatorFilter or None, "
                f"not {self.initiated_by!r}"
            )
        for name in ("limit", "offset"):
            count = getattr(self, name)
            if isinstance(count, bool) or not isinstance(count, int) or not 0 <= count < 2**63:
                raise UsageError(
                    f"PendingFilter({name}=...) must be a whole number from 0, not {count!r}"
                )


def tie_order(ph: str) -> str:
    """SQL: the order of requests made at one `created_at` (one model response's, or any of a
    clock that stands still): as asked, by the `input.requested` event holding each and its
    place there, then by id byte by byte. A row its event does not hold (one of schema 1, or
    its own copy) has neither and comes first, as 0; `ph` tells the store, as in `where`."""
    by_id = "r.id" if ph == "?" else 'r.id COLLATE "C"'
    return f"COALESCE(r.seq, 0), COALESCE(r.idx, 0), {by_id}"


def listing_order(ph: str) -> str:
    """SQL: the `ORDER BY` of `pending()` and its keyset (`PendingFilter.after`): oldest
    first, and those of one moment in the order asked (`tie_order`)."""
    return f"r.created_at, {tie_order(ph)}"


def _above_live(ph: str, prefix: str) -> str:
    """SQL: whether no session above `s` (its parent, grandparent, ...) passed its TTL by the
    time `ph` (given twice), as far up as each session from `s` is on its first turn: its
    delegated one, which its parent's expiry cancels (a later one, a message to it started, is
    its own). A session with no parent reads nothing, a subagent's of a live top-level session
    its parent's row; only past those are the rows above walked, and only below a session whose
    TTL passed the turns of those between read."""
    started = f"('{stored_type('turn.started')}', 'turn.started')"
    last = (
        f"(SELECT t.turn FROM {prefix}events t WHERE t.sk = b.sk AND t.type IN {started} "
        "ORDER BY t.seq DESC LIMIT 1)"
    )
    first = last.replace(" DESC", "")
    differs = "IS NOT" if ph == "?" else "IS DISTINCT FROM"
    return (
        # A lookup of the parent's row, not EXISTS: PostgreSQL would hash every row it matches.
        f"(s.parent IS NULL OR NOT (SELECT q.parent IS NOT NULL OR (q.expires_at IS NOT NULL "
        f"AND q.expires_at <= {ph}) FROM {prefix}sessions q WHERE q.sk = s.parent) "
        "OR NOT EXISTS (WITH RECURSIVE up(sk, parent, expires_at, n) AS "
        "(SELECT s.sk, s.parent, s.expires_at, 0 UNION ALL SELECT p.sk, p.parent, p.expires_at, "
        f"u.n + 1 FROM up u JOIN {prefix}sessions p ON p.sk = u.parent WHERE u.n < {DEEPEST}) "
        f"SELECT 1 FROM up a WHERE a.n > 0 AND a.expires_at <= {ph} "
        f"AND NOT EXISTS (SELECT 1 FROM up b WHERE b.n < a.n AND {last} {differs} {first})))"
    )


def _cursor(after: object) -> bool:
    """Whether `after` is a (time, id) pair a store can compare its requests with."""
    if not isinstance(after, tuple) or len(after) != 2:
        return False
    at, rid = after
    return (
        isinstance(at, int | float)
        and finite(at)  # not a bool either
        and -TIME_LIMIT <= at < TIME_LIMIT
        and isinstance(rid, str)
        and is_utf8(rid)
        and "\x00" not in rid  # no request's: PostgreSQL holds no NUL in text
    )


def created_before(now: float, older_than: float | None) -> float | None:
    """`PendingFilter.created_before` for requests at least `older_than` seconds old; an age
    reaching past the oldest time a filter takes matches no request there either."""
    if older_than is None:
        return None
    return max(now - older_than, float(-TIME_LIMIT))


def cursor_past(last: InputRequest, after: tuple[float, str] | None) -> tuple[float, str]:
    """The `PendingFilter.after` of the page after the one `last` ends, read past `after`;
    a StoreError if it is not past `after` (else the next page is this one or an earlier one
    again, and paging never ends). Of one moment, the order asked is the store's to tell."""
    cursor = (last.created_at, last.id)
    if after is not None and (cursor[0] < after[0] or cursor == after):
        raise StoreError(
            f"request {last.id!r}: its row is listed past {after!r}, but its data says it "
            f"was made at {last.created_at!r} (the row edited behind the runtime's back?)"
        )
    return cursor


def first_seen(page: Iterable[InputRequest], seen: set[str]) -> list[InputRequest]:
    """The requests of `page` whose ids are not in `seen`, which takes theirs: a reader paging
    by `after` reads each once, though a cursor whose request's row is gone (its session
    deleted between two pages) has the store list that moment's others again."""
    fresh = [r for r in page if r.id not in seen]
    seen.update(r.id for r in fresh)
    return fresh
