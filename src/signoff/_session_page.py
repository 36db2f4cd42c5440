"""A page of the sessions and their total read in one snapshot of the store, for the listings
that show a total (`GET /v1/sessions`, the dashboard): a session created, or changing status,
meanwhile cannot set the total and the page apart. And `lapsed_page`, a page filtered by status
as a passed TTL no one recorded yet shows it (or passed deadlines, `freed_sessions`), and
`check_listing`, the filters' own checks."""

from __future__ import annotations

import logging
from collections.abc import Collection
from functools import partial
from typing import TYPE_CHECKING

from ._deadlines import (
    after_deadline,
    is_due,
    is_lapsed,
    state_after_deadlines,
    summary_after_expiry,
)
from ._exceptions import StoreDamaged, StoreError, UnknownSession, UsageError
from ._mirrors import followed_state
from ._queue_page import readable_followed, readable_pending
from ._text import is_utf8
from ._types import InputRequest
from .stores import InitiatorFilter, PendingFilter, SessionSummary, Store
from .stores._pending import first_seen

if TYPE_CHECKING:
    from ._work import Workers

__all__ = [
    "STATUSES",
    "check_listing",
    "counted_sessions",
    "freed_sessions",
    "lapsed_page",
    "passing_sessions",
    "session_page",
    "shown_total",
]

log = logging.getLogger("signoff.worker")

_LAPSING = ("running", "waiting", "failed")
"""The statuses a passed TTL left unrecorded reads otherwise than the store holds it."""

_FREEING = (None, "running", "waiting")
"""The filters a passed deadline left unrecorded lists otherwise than the store (`waiting`
shown `running`)."""

_LEFT_OUT = "left out of the listing"
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
    try:
        if both is not None:
            rows, total = await both(
                agent=agent, status=status, limit=limit, offset=offset, initiated_by=initiated_by
            )
            return rows, total
        page = await store.sessions(
            agent=agent, status=status, limit=limit, offset=offset, initiated_by=initiated_by
        )
    except StoreDamaged:  # a row left out (`passing_sessions`), counted in the total
        page, _ = await passing_sessions(
            store, agent=agent, status=status, limit=limit, offset=offset, initiated_by=initiated_by
        )
    return page, await store.count_sessions(agent=agent, status=status, initiated_by=initiated_by)


async def passing_sessions(
    store: Store,
    *,
    agent: str | None,
    status: str | None,
    limit: int,
    offset: int,
    initiated_by: InitiatorFilter | None = None,
) -> tuple[list[SessionSummary], int]:
    """`store.sessions(...)` for a listing people read, and how many rows the store listed: a
    row that does not read back (`StoreDamaged`: a hand edit, a half-restored copy) is logged
    and left out, so one damaged session does not fail every caller's listing. It keeps its
    place (offsets and totals count it), so a page may show fewer than `limit` while more
    follow. A page that fails is read again in halves, down to the row that fails: a few reads
    while the damage stays. Any other failure is raised."""

    async def read(at: int, size: int) -> tuple[list[SessionSummary], int]:
        try:
            rows = await store.sessions(
                agent=agent, status=status, limit=size, offset=at, initiated_by=initiated_by
            )
        except StoreDamaged as exc:
            if size == 1:
                log.warning("a session row is %s: %s", _LEFT_OUT, exc)
                return [], 1
            half = size // 2
            head, listed = await read(at, half)
            if listed < half:  # the listing ended there
                return head, listed
            tail, more = await read(at + half, size - half)
            return head + tail, listed + more
        return rows, len(rows)

    return await read(offset, limit)


async def lapsed_page(
    rt: Workers,
    agent: str | None,
    status: str | None,
    limit: int,
    offset: int,
    now: float,
    probes: dict[str, bool] | None = None,
    freed: Collection[str] = (),
) -> list[SessionSummary] | None:
    """The page of `Runtime.sessions` when a session it matches passed its TTL unrecorded (of
    an agent this runtime lacks, or a store it may only read): it reads `failed` though the
    store holds it `running` or `waiting`, so the store's own filter would list it under the
    wrong status; so does one `freed` by passed deadlines, `running` though held `waiting`.
    Lapsed ones of this runtime's agents are recorded first (deadlines never: only shown). None
    when the store's filter is right (no such session, or a status neither touches). `probes`
    keeps which drives hold a turn, for the caller to reuse (`Workers._busy`)."""
    if status not in _LAPSING:
        return None
    stale = await _stale(rt, agent, now)
    try:
        if stale and await rt._record_lapsed(stale, now, probes):
            stale = await _stale(rt, agent, now)
    except StoreError as exc:  # a store this process may only read, say
        log.warning("sessions whose TTL passed not recorded: %s", exc)
    held = await rt._running_past(stale, now, probes)  # shown as the store holds them
    moved = status in ("running", "waiting") and bool(freed)
    if not moved and not [r for r in stale if r.id not in held]:
        return None
    # `failed` ones are also those the store holds running or waiting, and `running` ones
    # those it holds waiting, deadlines freeing them: read them all.
    by_store = None if status == "failed" or (status == "running" and freed) else status
    page: list[SessionSummary] = []
    seen = read = 0
    while True:
        chunk, listed = await passing_sessions(
            rt.store, agent=agent, status=by_store, limit=CHUNK, offset=read
        )
        for row in chunk:
            shown = summary_after_expiry(row, now, held, freed)
            if shown.status != status:
                continue
            if offset <= seen < offset + limit:
                page.append(shown)
            seen += 1
        if listed < CHUNK or seen >= offset + limit:
            return page
        read += CHUNK


async def session_page(
    rt: Workers,
    agent: str | None,
    status: str | None,
    limit: int,
    offset: int,
    now: float,
    probes: dict[str, bool],
) -> list[SessionSummary]:
    """The page of `Runtime.sessions` (its arguments checked) as of `now`, passed deadlines
    shown as recording leaves them, unrecorded (`freed_sessions`). `probes` keeps which drives
    hold a turn, for `shown_total` to reuse: a lease probe is a round trip."""
    freed = await freed_sessions(rt, agent, now) if status in _FREEING else set[str]()
    lapsed = await lapsed_page(rt, agent, status, limit, offset, now, probes, freed)
    if lapsed is not None:
        return lapsed
    listing = partial(passing_sessions, rt.store, agent=agent, status=status)
    page, _ = await listing(limit=limit, offset=offset)
    try:
        if await rt._record_lapsed(page, now, probes):
            page, _ = await listing(limit=limit, offset=offset)
    except StoreError as exc:  # a store this process may only read, say
        log.warning("sessions whose TTL passed not recorded: %s", exc)
    held = await rt._running_past(page, now, probes)
    shown = [summary_after_expiry(r, now, held, freed) for r in page]
    return [r for r in shown if status is None or r.status == status]


async def shown_total(
    rt: Workers,
    agent: str | None,
    status: str | None,
    now: float,
    probes: dict[str, bool] | None = None,
) -> int:
    """How many sessions `Runtime.sessions` lists with these filters and no limit: the store's
    count (from its index of sessions by status), less or plus those a passed TTL left
    unrecorded, which it lists `failed` while the store holds them running or waiting (read
    from the store's range of those, as `lapsed_page` reads them: none, mostly), and those
    passed deadlines free (`freed_sessions`), listed `running` while held `waiting`. Of two
    reads, so a session another process records meanwhile can shift it by one."""
    counted = await rt.store.count_sessions(agent=agent, status=status)
    if status not in _LAPSING:
        return counted
    stale = await _stale(rt, agent, now)
    held = await rt._running_past(stale, now, probes)  # listed as the store holds them
    shown_failed = [r for r in stale if r.id not in held]
    if status == "failed":
        return counted + len(shown_failed)
    failed = {r.id for r in shown_failed}
    freed = len(await freed_sessions(rt, agent, now) - failed)
    moved = freed if status == "running" else -freed
    return counted + moved - sum(r.status == status for r in shown_failed)


async def freed_sessions(rt: Workers, agent: str | None, now: float) -> set[str]:
    """The live waiting sessions of `agent` (None: any) that passed deadlines no one recorded
    leave `running` (every open request closed: `on_timeout` deny or approve), as `rt.state`
    shows them: a read records none, so drives no turn. Read from the store's index of passed
    deadlines (none, mostly), and the state of each session found there."""
    # A request row that does not read back, or a mirror's subagent's, is logged and left out
    # (`readable_pending`, `readable_followed`): its session is listed as stored, the others
    # as their deadlines leave them.
    due = await _due(rt, agent, now)
    shown = await readable_followed(rt.store, due, now)  # a mirror's as its request stands
    closes = [r for r in shown if r.status == "pending" and after_deadline(r, now) is None]
    closing = {r.session_id for r in closes}
    freed: set[str] = set()
    for session_id in sorted(closing):
        try:
            state = await rt._state(session_id)
            if state.status != "waiting":
                continue
            after = state_after_deadlines(await followed_state(rt.store, state, now), now)
        except UnknownSession:  # deleted since its requests were read
            continue
        except StoreError as exc:
            # One session whose log does not read back (a hand edit, a newer signoff's event)
            # failed every caller's listing: it is listed as the store holds it, as sweeps
            # go on past it.
            log.warning("session %s is listed as stored, its state unread: %s", session_id, exc)
            continue
        if after.status != "waiting":
            freed.add(session_id)
    return freed


async def _due(rt: Workers, agent: str | None, now: float) -> list[InputRequest]:
    """The open requests of the live sessions of `agent` (None: any) past their deadline."""
    due: list[InputRequest] = []
    read: set[str] = set()  # a request listed again past a deleted one's cursor
    after: tuple[float, str] | None = None
    while True:
        flt = PendingFilter(agent=agent, live_at=now, due_by=now, limit=CHUNK, after=after)
        page, (listed, last) = await readable_pending(rt.store, flt)
        due += [r for r in first_seen(page, read) if is_due(r, now)]
        if listed < CHUNK or last is None:
            return due
        after = last


async def _stale(rt: Workers, agent: str | None, now: float) -> list[SessionSummary]:
    """The sessions of `agent` (None: any) whose TTL passed unrecorded (`rt._lapsed` lists a
    store's every running or waiting one when it cannot tell which)."""
    return [r for r in await rt._lapsed(now) if is_lapsed(r, now) and agent in (None, r.agent)]
