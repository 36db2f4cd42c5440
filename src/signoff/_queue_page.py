"""One page of the queue as of now (`Runtime.pending_page`) and, for a listing that shows a
total, how many requests the store's listing holds in all, read in the same snapshot as the
page: a request closing or opening meanwhile cannot set the total and the page apart."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, TypeVar

from ._deadlines import after_deadline, is_due, is_lapsed
from ._exceptions import StoreDamaged, StoreError
from ._mirrors import followed
from ._sweeps import STORE_FAILING, one_of_many
from ._types import InputRequest
from .stores import PendingFilter, Store
from .stores._pending import cursor_past, first_seen

if TYPE_CHECKING:
    from ._work import Workers

__all__ = [
    "as_left",
    "counted_listing",
    "counted_page",
    "keyed_page",
    "passing_page",
    "queue_page",
    "readable_followed",
    "readable_pending",
    "record_closed",
]

T = TypeVar("T")
Read = Callable[[PendingFilter], Awaitable[tuple[list[InputRequest], T]]]
Listed = tuple[int, tuple[float, str] | None]
"""How many rows a page's read listed, and the `PendingFilter.after` past them (None: none)."""
log = logging.getLogger("signoff.worker")
_LEFT_OUT = "left out of the listing"
_DUE_PAGE = 500  # open requests past their deadline read at a time (`record_closed`)


async def queue_page(rt: Workers, flt: PendingFilter) -> tuple[list[InputRequest], bool]:
    """The page `Runtime.pending_page` shows, and whether the store may hold more past it."""
    shown, _, (listed, _) = await _page(rt, flt, partial(readable_pending, rt.store), None)
    return shown, listed >= flt.limit


async def keyed_page(
    rt: Workers, flt: PendingFilter, *, passing: tuple[logging.Logger, str] | None = None
) -> tuple[list[InputRequest], tuple[float, str] | None]:
    """`queue_page`, and the `PendingFilter.after` of the next page (None after the last): the
    last request the store listed, shown or not. Unlike an offset, it shifts no request out of
    the next page when one on this page or an earlier one closes before that page is read.
    `passing` (a logger, and what is left undone), for a reader in the background (a hub's
    start): a request that cannot be read is logged and left out (`passing_page`)."""
    read = partial(readable_pending, rt.store)
    if passing is not None:
        read = partial(passing_page, rt.store, log=passing[0], what=passing[1])
    # A chunk of a longer read (the server's scan under an app's own rule, a hub's start), not
    # a page shown: the turns an earlier listing left are gone on with for the page it shows.
    shown, _, (listed, last) = await _page(rt, flt, read, None, passing, left=False)
    return shown, last if listed >= flt.limit else None


async def passing_page(
    store: Store,
    flt: PendingFilter,
    *,
    log: logging.Logger,
    what: str,
    passed: type[StoreError] = StoreError,
) -> tuple[list[InputRequest], Listed]:
    """`store.pending(flt)` for a reader in the background (a sweep, a hub's start), with how
    many rows the store listed and the cursor past them. A page the store cannot read (a
    damaged row) is read again in halves, where the store tells each row's key (`pending_keys`),
    down to the row that fails: it is logged with its session and `what` is left undone, and
    passed, so the others are read all the same, in a few reads a damaged row (not one a row,
    at every sweep while it stays). The store failing as a whole is raised; so is any failure
    but `passed` (a listing people read passes only `StoreDamaged`, a row that reads the same
    again: one that failed otherwise, it fails with its error rather than leave a row out)."""
    try:
        page = await store.pending(flt)
    except STORE_FAILING:
        raise
    except passed:
        keys = getattr(store, "pending_keys", None)
        if keys is None:
            raise
    else:
        return page, (len(page), cursor_past(page[-1], flt.after) if page else None)
    rows: list[tuple[float, str, str]] = await keys(flt)
    if not rows:
        return [], (0, None)
    last = rows[-1][:2]  # past `flt.after`: the keys are listed past it, as the page is
    shown = await _around(store, flt, rows, 0, len(rows), (log, what, passed))
    return shown, (len(rows), last)


async def _around(
    store: Store,
    flt: PendingFilter,
    rows: list[tuple[float, str, str]],
    lo: int,
    hi: int,
    passing: tuple[logging.Logger, str, type[StoreError]],
) -> list[InputRequest]:
    """The requests of `rows[lo:hi]` the store can read, in order: read whole, else in halves.
    `passing`: `passing_page`'s `log`, `what` and `passed`."""
    log, what, passed = passing
    # The first row is the one at `flt.offset` past `flt.after`; each later one, past its
    # predecessor's key.
    after, offset = (rows[lo - 1][:2], 0) if lo else (flt.after, flt.offset)
    try:
        page = await store.pending(replace(flt, after=after, limit=hi - lo, offset=offset))
    except STORE_FAILING:
        raise
    except passed as exc:
        if hi - lo > 1:
            mid = (lo + hi) // 2
            head = await _around(store, flt, rows, lo, mid, passing)
            return head + await _around(store, flt, rows, mid, hi, passing)
        _, request_id, session_id = rows[lo]
        log.warning("session %s: request %s, %s: %s", session_id, request_id, what, exc)
        return []
    by_id = {r.id: r for r in page}
    full = len(page) >= hi - lo  # a request made meanwhile may have taken a place of theirs
    out: list[InputRequest] = []
    for _, request_id, session_id in rows[lo:hi]:  # not one past them, nor one made meanwhile
        found = by_id.get(request_id)
        if found is None and full:
            with one_of_many(log, session_id, f"request {request_id}, {what}"):
                stored = await store.get_request(request_id)
                if stored is not None and flt.status in (None, stored.status):
                    found = stored.request
        if found is not None:
            out.append(found)
    return out


async def counted_page(rt: Workers, flt: PendingFilter) -> tuple[list[InputRequest], bool, int]:
    """`queue_page`, and the total of the store's listing in the snapshot the page came from.
    It counts what the page would show only when `flt.excluded` leaves out what the queue does
    not show (`_unlisted.unlisted`), as the server's listings and `signoff pending` do: the
    page is then judged at `flt.live_at`, the moment those were read at, so a deadline passing
    since does not leave out of the page a request its total counts."""
    shown, _, ((listed, _), total) = await _page(rt, flt, partial(_counted, rt.store), flt.live_at)
    return shown, listed >= flt.limit, total


async def counted_listing(store: Store, flt: PendingFilter) -> tuple[list[InputRequest], int]:
    """`store.pending(flt)` and `store.count_pending(flt)` of one snapshot (the store's
    `pending_counted`; a store without it is read twice, so a commit between the two reads can
    set them apart by a request)."""
    both = getattr(store, "pending_counted", None)
    if both is None:
        return await store.pending(flt), await store.count_pending(flt)
    page, total = await both(flt)
    return page, total


async def _counted(
    store: Store, flt: PendingFilter
) -> tuple[list[InputRequest], tuple[Listed, int]]:
    """`counted_listing`, and what its page listed: a row that does not read back is left out
    (`readable_pending`), and counted in the total, which is then read by itself."""
    try:
        page, total = await counted_listing(store, flt)
    except STORE_FAILING:
        raise
    except StoreDamaged:
        passed, listed = await readable_pending(store, flt)
        return passed, (listed, await store.count_pending(flt))
    return page, ((len(page), cursor_past(page[-1], flt.after) if page else None), total)


async def readable_pending(store: Store, flt: PendingFilter) -> tuple[list[InputRequest], Listed]:
    """`store.pending(flt)` for a listing people read: a row that does not read back
    (`StoreDamaged`: a hand edit, a half-restored copy) is logged and left out, so one damaged
    session does not fail every caller's queue; it keeps its place among those listed, so a
    page may show fewer than its limit while more follow (`passing_page`)."""
    return await passing_page(store, flt, log=log, what=_LEFT_OUT, passed=StoreDamaged)


async def _page(
    rt: Workers,
    flt: PendingFilter,
    read: Read[T],
    at: float | None,
    passing: tuple[logging.Logger, str] | None = None,
    *,
    left: bool = True,
) -> tuple[list[InputRequest], list[InputRequest], T]:
    """The page as of `at` (else now), as shown and as the store listed it: passed deadlines
    it holds are applied first, then the page (and its total) read again; a listing of every
    status shows an open request of a session whose TTL passed unrecorded `expired`. `passing`: as
    `keyed_page`'s, also for a mirror whose subagent's request cannot be read. `left`: as
    `Sweeps._go_on_listed`'s."""
    now = rt.now() if at is None else at
    recorded = await record_closed(rt, flt, now)
    page, total = await read(flt)
    # The turns of those the page lists whose deadlines it (or, left undriven, an earlier
    # listing) recorded are gone on with, as below.
    await rt._go_on_listed(recorded, page, left=left)
    due = [r for r in page if is_due(r, now)]
    if due and await rt._apply_deadlines(due, listing=True):
        page, total = await read(flt)
    # A mirror shows its subagent's request's votes, escalation and deadline, which that
    # deadline then leaves as it leaves the subagent's request; and once that subagent's
    # session passed its TTL, it shows as expired (it takes no answer): left out too.
    followed_page = page
    if flt.status == "pending":
        followed_page = await _followed(rt.store, page, now, passing)
        followed_page = [r for r in followed_page if r.status == "pending"]
    if flt.status is None:  # a listing of every status shows one closed so as closed
        lapsed = await _lapsed_on(rt, followed_page, now)
        shown = [as_left(r, now, lapsed.get(r.id)) for r in followed_page]
    else:
        shown = [a for r in followed_page if (a := after_deadline(r, now)) is not None]
    return shown, page, total


async def record_closed(rt: Workers, flt: PendingFilter, now: float) -> list[str]:
    """Before a listing of `expired` requests: the open ones it would match but for their
    status whose session's TTL (`_record_expiries`) or own deadline passed by `now`, recorded
    first where this runtime has their agent, so the listing and its total hold them as
    `state()` shows them. Returns the sessions whose deadlines it recorded: their turns are the
    listing's to go on with once it read its page (`Sweeps._go_on_listed`), not all of them
    before it (a 0.2 s model and 1,000 due after an outage: 52 s for a page of 10); an expiry
    ends its turn. Those of other agents are left to their process; while none is due nor
    lapsed, two indexed queries."""
    if flt.status != "expired" or not rt.agents:
        return []
    await _record_expiries(rt, flt, now)
    due: list[InputRequest] = []
    seen: set[str] = set()  # a request listed again past a deleted one's cursor
    after = None
    while True:
        open_flt = replace(
            flt, status="pending", due_by=now, excluded=(), limit=_DUE_PAGE, offset=0, after=after
        )
        page, (listed, last) = await readable_pending(rt.store, open_flt)
        due += [r for r in first_seen(page, seen) if r.agent in rt.agents and is_due(r, now)]
        if listed < _DUE_PAGE or last is None:
            break
        after = last
    return await rt._record_listed(list(dict.fromkeys(r.session_id for r in due)))


async def _record_expiries(rt: Workers, flt: PendingFilter, now: float) -> None:
    """`record_closed`'s expiries: those of the sessions of this runtime's agents whose TTL
    passed by `now` unrecorded and that hold an open request `flt` would match but for its
    status, as a sweep records them (`_checked`). Found in the store's range of lapsed
    sessions, as a sweep finds them (`Sweeps._lapsed`: none, mostly), then one listing of
    their open requests (`_holding`), not one count each (a lapsed session holding none, of
    another tool, say, stays unrecorded: every such listing asks about it again); a turn a
    live drive runs on past its TTL is left to it (`Sweeps._running_past`)."""
    agents = sorted(a for a in rt.agents if flt.agent in (None, a))
    if not agents:
        return
    rows = [
        row
        for row in await rt._lapsed(now, agents, passing=True)
        if is_lapsed(row, now) and row.agent in agents and flt.session_id in (None, row.id)
    ]
    held = await rt._running_past(rows, now) if rows else set[str]()
    ids = [row.id for row in rows if row.id not in held]
    probe = replace(flt, status="pending", excluded=(), offset=0, after=None)
    await rt._record_listed(await _holding(rt.store, probe, ids), what="passed TTL")


async def _holding(store: Store, flt: PendingFilter, sessions: list[str]) -> list[str]:
    """Those of `sessions` holding a request `flt` lists: their requests listed, `_DUE_PAGE`
    sessions a query (a session's requests past the first page read only while another of
    those sessions may hold one further on)."""
    found: set[str] = set()
    for start in range(0, len(sessions), _DUE_PAGE):
        some = sessions[start : start + _DUE_PAGE]
        async with contextlib.aclosing(_listed(store, replace(flt, session_ids=tuple(some)))) as it:
            async for page in it:
                found.update(r.session_id for r in page)
                if found.issuperset(some):
                    break
    return [sid for sid in sessions if sid in found]


async def _lapsed_on(rt: Workers, page: list[InputRequest], now: float) -> dict[str, str]:
    """The open requests of `page` (ids) the queue leaves out as its session's TTL passed by
    `now` unrecorded (any agent's: another process's, a store this one may only read), with
    the status that leaves them: `expired` for its own, `withdrawn` for one of a subagent's
    delegated turn below a session whose TTL passed (its expiry cancels that turn), as
    `state()` shows them. But those a live drive runs on past the TTL. One listing of the
    page's sessions' requests the queue shows (`live_at`), which holds them all, mostly;
    only those it leaves out are looked up (their sessions' lapsed rows, and whether they
    are open still)."""
    open_ = [r for r in page if r.status == "pending"]
    if not open_:
        return {}
    live = PendingFilter(
        status="pending",
        session_ids=tuple(dict.fromkeys(r.session_id for r in open_)),
        live_at=now,
    )
    listed: set[str] = set()
    async for shown in _listed(rt.store, live):
        listed.update(r.id for r in shown)
    left = [r for r in open_ if r.id not in listed]
    if not left:
        return {}
    sessions = tuple(dict.fromkeys(r.session_id for r in left))
    still: set[str] = set()  # not one closed since the page was read
    async for shown in _listed(rt.store, replace(live, session_ids=sessions, live_at=None)):
        still.update(r.id for r in shown)
    agents = sorted({r.agent for r in left})
    rows = [
        row
        for row in await rt._lapsed(now, agents, passing=True, ids=list(sessions))
        if row.id in sessions and is_lapsed(row, now)
    ]
    held = await rt._running_past(rows, now) if rows else set[str]()
    own = {row.id for row in rows}
    return {
        r.id: "expired" if r.session_id in own else "withdrawn"
        for r in left
        if r.id in still and r.session_id not in held
    }


async def _listed(store: Store, flt: PendingFilter) -> AsyncGenerator[list[InputRequest], None]:
    """Every request `flt` lists, `_DUE_PAGE` at a time by keyset (as `_unlisted._pages`); a
    row that does not read back is left out, logged, as the listing around it leaves it."""
    after = None
    seen: set[str] = set()  # a request listed again past a deleted one's cursor
    while True:
        page, (listed, last) = await readable_pending(
            store, replace(flt, limit=_DUE_PAGE, offset=0, after=after)
        )
        yield first_seen(page, seen)
        if listed < _DUE_PAGE or last is None:
            return
        after = last


def as_left(request: InputRequest, now: float, lapsed: str | None = None) -> InputRequest:
    """`request` as its passed deadline, or a passed TTL (`lapsed`: the status that leaves
    it, `_lapsed_on`), leaves it before anyone has recorded that (another agent's, a store
    this process may only read): escalated, or closed as `expired` (or `lapsed`)."""
    if lapsed is not None and request.status == "pending":
        return request.model_copy(update={"status": lapsed})
    shown = after_deadline(request, now)
    return request.model_copy(update={"status": "expired"}) if shown is None else shown


async def _followed(
    store: Store, page: list[InputRequest], now: float, passing: tuple[logging.Logger, str] | None
) -> list[InputRequest]:
    """`followed(store, page, now)`; `passing`, a mirror that fails is logged and left out
    (without it, a listing people read, one whose subagent's request does not read back)."""
    if passing is None:
        return await readable_followed(store, page, now)
    out: list[InputRequest] = []
    for r in page:
        with one_of_many(passing[0], r.session_id, f"request {r.id}, {passing[1]}"):
            out += await followed(store, [r], now)
    return out


async def readable_followed(
    store: Store, requests: list[InputRequest], now: float
) -> list[InputRequest]:
    """`followed(store, requests, now)` for a listing people read, each mirror on its own: one
    whose subagent's request does not read back (`StoreDamaged`) is logged and left out, so it
    fails no other request's listing (the page leaves it out too)."""
    out: list[InputRequest] = []
    for r in requests:
        try:
            out += await followed(store, [r], now)
        except StoreDamaged as exc:
            log.warning("session %s: request %s, %s: %s", r.session_id, r.id, _LEFT_OUT, exc)
    return out
