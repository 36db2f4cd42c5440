"""A page of the sessions and their total read in one snapshot of the store, for the listings
that show a total (`GET /v1/sessions`, the dashboard): a session created, or changing status,
meanwhile cannot set the total and the page apart. And `session_page` and `shown_total`, a
page and a total as a passed TTL or deadline no one recorded yet shows its session (`Shown`),
and `check_listing`, the filters' own checks."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ._deadlines import after_deadline, is_lapsed, state_after_deadlines, summary_after_expiry
from ._exceptions import UsageError
from ._sweeps import one_of_many
from ._text import is_utf8
from ._types import InputRequest, SessionStatus
from .stores import InitiatorFilter, PendingFilter, SessionSummary, Store
from .stores._pending import cursor_past

if TYPE_CHECKING:
    from ._work import Workers

__all__ = [
    "STATUSES",
    "check_listing",
    "Shown",
    "counted_sessions",
    "record_page_deadlines",
    "session_page",
    "shown_at",
    "shown_total",
]

log = logging.getLogger("signoff.worker")

_LAPSING = ("running", "waiting", "failed")
"""The statuses a passed TTL left unrecorded reads otherwise than the store holds it (a passed
deadline moves a session from `waiting` to `running`, two of them)."""

CHUNK = 500  # sessions read per store query while filtering them as shown

STATUSES = ("idle", "running", "waiting", "failed", "cancelled")
"""The statuses a session listing filters by."""


def check_listing(agent: object, status: object) -> None:
    """A listing's filters: text every store looks up alike, and a status sessions have (any
    other matched nothing, or each store did otherwise), else `UsageError`."""
    if agent is not None and not isinstance(agent, str):
        raise UsageError(f"agent must be text or None, not {agent!r}")
    if agent is not None and not is_utf8(agent):  # no store can look it up
        raise UsageError("agent is not valid Unicode text: it holds a lone surrogate")
    if status is not None and status not in STATUSES:
        raise UsageError(f"status must be one of {', '.join(STATUSES)}, not {status!r}")


async def counted_sessions(
    store: Store,
    *,
    agent: str | None,
    status: str | None,
    limit: int,
    offset: int,
    initiated_by: InitiatorFilter | None,
) -> tuple[list[SessionSummary], int]:
    """`store.sessions()` and `store.count_sessions()` of one snapshot (the store's
    `sessions_counted`; a store without it is read twice, so a commit between the two reads can
    set them apart by a session)."""
    both = getattr(store, "sessions_counted", None)
    if both is None:
        page = await store.sessions(
            agent=agent, status=status, limit=limit, offset=offset, initiated_by=initiated_by
        )
        return page, await store.count_sessions(
            agent=agent, status=status, initiated_by=initiated_by
        )
    rows, total = await both(
        agent=agent, status=status, limit=limit, offset=offset, initiated_by=initiated_by
    )
    return rows, total


@dataclass(slots=True)
class Shown:
    """What a session listing at `now` shows otherwise than the store holds it, as nothing
    recorded it yet (an agent this runtime lacks, a store it may only read, or busy): a session
    whose TTL passed with its turn unfinished reads `failed`, unless a live drive runs it on
    (`held`); one whose passed deadlines let its turn go on reads as their record leaves it
    (`running`), never `waiting` with nothing to answer. `due` keeps the open requests past
    their deadline of each session, for a listing to record those of its page."""

    now: float
    held: set[str]
    lapsed: list[SessionSummary]  # those a passed TTL shows `failed`
    moved: dict[str, tuple[str, str, SessionStatus]]  # by deadlines: id -> agent, stored, shown
    due: dict[str, list[InputRequest]]

    def row(self, row: SessionSummary) -> SessionSummary:
        """`row` as the listing shows it."""
        if is_lapsed(row, self.now):
            return summary_after_expiry(row, self.now, self.held)
        moved = self.moved.get(row.id)
        if moved is not None and row.status == moved[1]:  # not one that moved on since
            return replace(row, status=moved[2])
        return row

    def moves(self, agent: str | None) -> list[tuple[str, str]]:
        """The stored and shown status of each session of `agent` (None: any) shown otherwise."""
        moves = [(r.status, "failed") for r in self.lapsed if agent in (None, r.agent)]
        return moves + [(s, t) for a, s, t in self.moved.values() if agent in (None, a)]

    def trusted(self, agent: str | None, status: str | None) -> bool:
        """Whether the store's own filter by `status` lists the sessions shown in it."""
        return status is None or not any(status in move for move in self.moves(agent))

    def total(self, counted: int, agent: str | None, status: str | None) -> int:
        """How many are shown in `status` of the `counted` the store holds in it."""
        moves = self.moves(agent) if status is not None else []
        return counted + sum((t == status) - (s == status) for s, t in moves)


async def shown_at(
    rt: Workers, agent: str | None, now: float, probes: dict[str, bool] | None = None
) -> Shown:
    """What a listing of the sessions of `agent` (None: any) shows at `now` otherwise than the
    store holds it. Read from the store's range of sessions past their TTL and its index of
    deadlines (none, mostly: two queries); a session whose passed deadlines would let its
    turn go on is read, to tell how their record would leave it. `probes`: see `Workers._busy`."""
    stale = await _stale(rt, agent, now)
    held = await rt._running_past(stale, now, probes)  # shown as the store holds them
    due: dict[str, list[InputRequest]] = {}
    flt = PendingFilter(agent=agent, due_by=now, live_at=now, limit=CHUNK)
    while True:
        page = await rt.store.pending(flt)
        for r in page:
            if r.child is None:  # a mirror: its subagent's deadline, recorded there
                due.setdefault(r.session_id, []).append(r)
        if len(page) < CHUNK:
            break
        flt = replace(flt, after=cursor_past(page[-1], flt.after))
    moved: dict[str, tuple[str, str, SessionStatus]] = {}
    for sid, requests in due.items():
        if all(after_deadline(r, now) is not None for r in requests):
            continue  # escalated: still waiting on people
        with one_of_many(log, sid, "its status as its passed deadlines leave it not shown"):
            state = await rt._state(sid)
            after = state_after_deadlines(state, now).status
            if after != state.status:
                moved[sid] = (state.agent, state.status, after)
    return Shown(now, held, [r for r in stale if r.id not in held], moved, due)


async def record_page_deadlines(rt: Workers, shown: Shown, page: list[SessionSummary]) -> bool:
    """Record the passed deadlines of the sessions of `page` of this runtime's agents, as a
    listing of the queue records its page's, and go on with their turns; returns whether
    there were any, for the listing to read its page again."""
    due = [r for row in page for r in shown.due.get(row.id, ()) if r.agent in rt.agents]
    return bool(due) and bool(await rt._apply_deadlines(due, listing=True))


async def session_page(
    rt: Workers,
    agent: str | None,
    status: str | None,
    limit: int,
    offset: int,
    now: float,
    probes: dict[str, bool],
) -> list[SessionSummary]:
    """The page of `Runtime.sessions` (its arguments checked) as of `now`: the passed TTLs
    and the page's passed deadlines recorded first; what is not, filtered and shown as they
    leave it (`Shown`). `probes` keeps which drives hold a turn, for `shown_total` to reuse: a
    lease probe is a round trip."""
    writable = await rt._listing_lapses(agent, now, probes)
    shown = await shown_at(rt, agent, now, probes)
    page = await _page(rt, agent, status, limit, offset, shown)
    if writable and await record_page_deadlines(rt, shown, page):
        shown = await shown_at(rt, agent, now, probes)
        page = await _page(rt, agent, status, limit, offset, shown)
    return page


async def _page(
    rt: Workers, agent: str | None, status: str | None, limit: int, offset: int, shown: Shown
) -> list[SessionSummary]:
    """The page as `shown`: the store's, unless a session is shown in or out of `status`
    otherwise than the store holds it; then the store's sessions are read and filtered here."""
    if shown.trusted(agent, status):
        rows = await rt.store.sessions(agent=agent, status=status, limit=limit, offset=offset)
        return [shown.row(r) for r in rows]
    # Those shown in `status` from another one are read with all the others.
    into = any(t == status != s for s, t in shown.moves(agent))
    by_store = None if into else status
    page: list[SessionSummary] = []
    seen = read = 0
    while True:
        chunk = await rt.store.sessions(agent=agent, status=by_store, limit=CHUNK, offset=read)
        for row in chunk:
            row = shown.row(row)
            if row.status != status:
                continue
            if offset <= seen < offset + limit:
                page.append(row)
            seen += 1
        if len(chunk) < CHUNK or seen >= offset + limit:
            return page
        read += CHUNK


async def shown_total(
    rt: Workers,
    agent: str | None,
    status: str | None,
    now: float,
    probes: dict[str, bool] | None = None,
) -> int:
    """How many sessions `Runtime.sessions` lists with these filters and no limit: the store's
    count (from its index of sessions by status), less or plus those it shows otherwise than
    the store holds them (`Shown`: none, mostly). Of two reads, so a session another process
    records meanwhile can shift it by one."""
    counted = await rt.store.count_sessions(agent=agent, status=status)
    if status not in _LAPSING:
        return counted
    return (await shown_at(rt, agent, now, probes)).total(counted, agent, status)


async def _stale(rt: Workers, agent: str | None, now: float) -> list[SessionSummary]:
    """The sessions of `agent` (None: any) whose TTL passed unrecorded (`rt._lapsed` lists a
    store's every running or waiting one when it cannot tell which)."""
    return [r for r in await rt._lapsed(now) if is_lapsed(r, now) and agent in (None, r.agent)]
