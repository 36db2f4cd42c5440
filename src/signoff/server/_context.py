"""What every route needs: the runtime, the authenticator and the visibility rule."""

from __future__ import annotations

import logging
import math
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from functools import partial
from typing import cast

from starlette.requests import HTTPConnection

from .._deadlines import is_due, summary_after_expiry
from .._events import Event
from .._exceptions import StoreDamaged, StoreError, StoreGone, UnknownRequest, UnknownSession
from .._mirrors import followed_state
from .._queue_page import counted_page, keyed_page, readable_pending, record_closed
from .._request_session import session_of
from .._runtime import Runtime
from .._session_page import counted_sessions, freed_sessions, passing_sessions
from .._state import SessionState
from .._state_parts import load_principal
from .._sync import in_thread
from .._types import InputRequest, Principal
from .._unlisted import unlisted
from ..stores import InitiatorFilter, PendingFilter, SessionSummary, StoredRequest
from ..stores._pending import first_seen
from ._auth import (
    AccessRule,
    Authenticator,
    Naming,
    default_access,
    default_filter,
    may_see,
)
from ._background import Background
from ._callers import Callers
from ._open_requests import OpenRequests, digest
from ._request_reads import as_it_stands
from ._sign_ins import SIGN_IN_LIFETIME, Honoured, SignOuts
from ._stream_slots import MAX_STREAMS, StreamSlots
from ._throttle import Failures

__all__ = ["ServerContext", "get_context"]

_UNKNOWN = object()

log = logging.getLogger("signoff.server")

# How many of the most recently active matching sessions a listing looks through under an
# access rule the store cannot apply (a custom `access`, a tenant that is not text): each costs
# a read, so one call cannot read the whole store.
SESSION_SCAN = 10_000
SESSION_CHUNK = 500  # sessions read per store query while looking through them
# How many of the newest matching closed requests (settled, expired, withdrawn) a listing looks
# through under an access rule the store cannot apply: the history only grows, and each request
# read is decoded.
REQUEST_SCAN = 10_000
REQUEST_CHUNK = 500  # requests read per store query while filtering a caller's queue


@dataclass(slots=True, kw_only=True)
class ServerContext(OpenRequests, Callers):
    runtime: Runtime
    auth: Authenticator
    access: AccessRule
    secret: bytes
    poll_interval: float = 0.25
    heartbeat: float = 15.0
    sign_in_lifetime: float = SIGN_IN_LIFETIME
    max_streams: int = MAX_STREAMS
    # No secret keys the sign-ins: anyone can make a cookie for a token they guess (`_sign_ins`).
    keyless: bool = False
    # Set when the server begins to stop: open streams end at their next poll instead of
    # holding the shutdown, which waits for every response to finish.
    closing: bool = False
    # The in-process workers or the deadline sweep: cut short on a forced stop (`_background`).
    background: Background = field(default_factory=Background, repr=False)
    # Set when the store's SQLite file was deleted or replaced, or its PostgreSQL schema dropped,
    # under this process (a request, `/readyz` or the in-process workers met `StoreGone`): only
    # a restart mends that, so `/healthz` fails from then on.
    gone: StoreGone | None = None
    # The digest of `/metrics`'s own token (`Scraping`): refused elsewhere, but not a guess.
    scrape_digest: bytes | None = None
    # A session's initiator never changes (`initiator`).
    _initiators: dict[str, Principal | None] = field(default_factory=dict, repr=False)
    sign_outs: SignOuts = field(init=False, repr=False)
    # Failed sign-ins and unrecognised bearer tokens, per client address (`_throttle`).
    failures: Failures = field(init=False, repr=False)
    # The sign-in cookies this process made or honoured, which a held address may still use.
    honoured: Honoured = field(init=False, repr=False)
    # The event streams each caller holds open (`_stream_slots`).
    streams: StreamSlots = field(init=False, repr=False)
    # Refuses the authenticator's principals that name no one, logging it (`Naming`).
    naming: Naming = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.naming = Naming(self.auth)
        self.sign_outs = SignOuts(self.sign_in_lifetime)
        self.failures = Failures(self.runtime.clock)
        self.honoured = Honoured()
        self.streams = StreamSlots(self.max_streams, retry_after=math.ceil(self.heartbeat))

    def met(self, exc: BaseException | None) -> None:
        """Note a failure this process met, whoever turns it into an answer: a `StoreGone`, which
        only a restart mends, fails `/healthz` from then on."""
        if isinstance(exc, StoreGone):
            self.gone = exc

    async def session(
        self, session_id: str, caller: Principal, *, shown: bool = False
    ) -> SessionState:
        """The session's state, if the caller may see it; otherwise it does not exist for them.
        A state `shown` to a person (the session's read, its dashboard page) has a passed TTL
        and passed deadlines recorded first; an answer or a stream leaves that to the runtime's
        own checks, which report what the expiry closes."""
        await self._visible(session_id, caller)
        if not shown:
            return await self.runtime._state(session_id)
        # `Runtime.state` records a passed TTL first (or shows it so) and shows passed deadlines
        # as recorded; this read records those first (where it can), as the queue does.
        rt = self.runtime
        state = await rt.state(session_id)
        now = rt.now()
        held = await followed_state(rt.store, await rt._state(session_id), now)
        due = [r for r in held.pending_requests() if is_due(r, now)]
        if due and await rt._apply_deadlines(due, listing=True):
            state = await rt.state(session_id)
        elif state.status == "running" and (left := await rt._left_of([session_id])):
            # A turn whose deadline a listing recorded and left undriven: gone on with, as this
            # read would had it recorded that deadline (nothing else may, with no sweep).
            await rt._drive_listed((), left)
            state = await rt.state(session_id)
        return state

    async def _visible(self, session_id: str, caller: Principal) -> None:
        """`UnknownSession` unless the caller may see the session, decided from its first event
        without loading its state: a foreign session and a missing one then cost the same one
        read, so the time a 404 takes does not tell that a foreign session exists (an initiator
        remembered is read again when it refuses the caller, for the same reason)."""
        initiator = self._initiators.get(session_id, _UNKNOWN)
        if initiator is _UNKNOWN or not await self._may_see(caller, initiator):
            initiator = await self._read_initiator(session_id)
        if not await self._may_see(caller, initiator):
            raise UnknownSession(session_id)  # do not reveal that a foreign session exists

    async def request(self, request_id: str, caller: Principal) -> StoredRequest:
        """The stored request, if the caller may see its session; otherwise `UnknownRequest`.
        Only its session's id is read before that is decided (`session_of`), and a missing
        request costs the read a foreign one then makes (its session's first event), so the
        time a 404 takes does not tell that a foreign request exists, however large it is."""
        await self.runtime.open()
        store = self.runtime.store
        session_id, stored = await session_of(store, request_id)
        try:
            if session_id is None:
                await store.read_events(request_id, limit=1)  # no session's id
                raise UnknownSession("")
            await self._visible(session_id, caller)  # its state is not needed
            stored = stored or await store.get_request(request_id)
            if stored is None:  # deleted since its session's id was read
                raise UnknownSession("")
        except UnknownSession:
            raise UnknownRequest("", [request_id]) from None
        return await as_it_stands(self.runtime, stored)

    async def visible_requests(
        self, caller: Principal, flt: PendingFilter
    ) -> tuple[list[InputRequest], int]:
        """One page of the requests matching `flt` that the caller may see, and their total.

        Open requests of sessions whose TTL has passed are left out, as `Runtime.pending` does,
        and so are those past their deadline (`Runtime.pending_page`). Under the default rule
        the store picks the caller's by their sessions' initiators, and leaves out what the page
        would not show (`_listed`): one page and one count, in step. Under
        a rule the store cannot apply, the matching requests are read and filtered here: the whole
        open queue, but of closed requests only the `REQUEST_SCAN` newest (the history grows
        without end), and only the page is kept.
        """
        store = self.runtime.store
        await self.runtime.open()
        if flt.status == "pending" and flt.live_at is None:
            flt = replace(flt, live_at=self.runtime.now())
        everyone = self.sees_every_request(caller)
        picks = None if everyone else self._picks(caller)
        if everyone or picks is not None:
            flt = flt if picks is None else replace(flt, initiated_by=picks)
            flt = await self._listed(flt, record=True)
            # Passed deadlines applied first; the total read in the page's snapshot.
            picked, _, total = await counted_page(self.runtime, flt)
            return picked, total
        seen: dict[str, bool] = {}
        read_ids: set[str] = set()  # a request listed again past a deleted one's cursor
        page: list[InputRequest] = []
        total = 0
        start, end = 0, None
        recorded: list[str] = []  # sessions whose deadlines it recorded: their turns go on
        if flt.status != "pending":  # the newest closed ones: oldest first, as listed
            recorded = await record_closed(self.runtime, flt, self.runtime.now())
            end = await store.count_pending(flt)
            start = max(0, end - REQUEST_SCAN)
        # From `start` on by keyset: a request closing between two reads (its deadline applied
        # by a read, another process) shifts no later one out, as an offset would.
        read, after = start, flt.after
        while end is None or read < end:
            size = REQUEST_CHUNK if end is None else min(REQUEST_CHUNK, end - read)
            at = start if read == start else 0
            chunk, after = await keyed_page(self.runtime, _page(flt, size, at, after))
            seen.update(await self._sees(caller, {r.session_id for r in chunk} - seen.keys()))
            for request in first_seen(chunk, read_ids):
                if seen[request.session_id]:
                    if flt.offset <= total < flt.offset + flt.limit:
                        page.append(request)
                    total += 1
            if after is None:
                break
            read += size
        # The turns of those the page shows whose deadlines it (or, left undriven, an earlier
        # listing) recorded, as the store's own listing does.
        await self.runtime._go_on_listed(recorded, page)
        return page, total

    async def visible_sessions(
        self,
        caller: Principal,
        *,
        agent: str | None = None,
        status: str | None = None,
        limit: int,
        offset: int,
    ) -> tuple[list[SessionSummary], int]:
        """One page of the sessions (most recently active first) the caller may see, and their
        total, after recording the TTLs that passed (as `Runtime.sessions` does for its page).
        Under the default rule the store picks the caller's sessions by initiator (`picks`),
        so a page and its total are one read of one snapshot (`counted_sessions`), whatever the
        store holds; under another rule the `SESSION_SCAN` most recently active matching
        sessions are read and filtered here, so one call's reads stay bounded."""
        rt = self.runtime
        await rt.open()
        now = rt.now()
        stale = await self._record_lapsed(now)
        held = await rt._running_past(stale, now)  # a live drive runs them on: shown as held
        stale = [r for r in stale if r.id not in held]
        # As in `Runtime.sessions`, passed deadlines (left unrecorded: a listing drives no turn)
        # free a `waiting` session, which then reads `running`.
        moving = status in (None, "running", "waiting")
        freed = await freed_sessions(rt, agent, now) if moving else set[str]()
        # A lapsed session left unrecorded is still `running` or `waiting` in the store but reads
        # `failed`, so the store cannot filter by those while one of them matches the listing;
        # nor by `running` or `waiting` while a freed one does.
        lapsing = status in ("running", "waiting", "failed")
        trusted = not lapsing or not any(agent in (None, r.agent) for r in stale)
        trusted = trusted and not (status is not None and freed)
        everyone = self.sees_every_request(caller)
        picks = None if everyone else self._picks(caller)
        if not everyone and picks is None:
            return await self._scan_sessions(
                None, caller, agent, status, trusted, limit, offset, now, held, freed
            )
        if not trusted:
            return await self._scan_sessions(
                picks, None, agent, status, False, limit, offset, now, held, freed
            )
        rows, total = await counted_sessions(
            rt.store, agent=agent, status=status, limit=limit, offset=offset, initiated_by=picks
        )
        # Trusted: no row of a lapsed session unrecorded reads otherwise than its status.
        return [summary_after_expiry(row, now, held, freed) for row in rows], total

    def _picks(self, caller: Principal) -> InitiatorFilter | None:
        """The store filter of the sessions the caller may see: under the default rule, by who
        started them (`default_filter`); None when the store cannot apply the rule."""
        return default_filter(caller) if self._default_access() else None

    async def _record_lapsed(self, now: float) -> list[SessionSummary]:
        """Record the sessions whose TTL passed, as a sweep does, so the filters and counts
        see them `failed`; returns those still unrecorded (another process's agents, or a
        store this process may only read)."""
        rt = self.runtime
        lapsed = await rt._lapsed(now)
        if not lapsed:
            return []
        try:
            if not await rt._record_lapsed(lapsed, now):
                return lapsed
        except StoreError as exc:
            self.met(exc)
            log.warning("sessions whose TTL passed not recorded: %s", exc)
            return lapsed
        return await rt._lapsed(now)

    async def _scan_sessions(
        self,
        picks: InitiatorFilter | None,
        caller: Principal | None,
        agent: str | None,
        status: str | None,
        by_store: bool,
        limit: int,
        offset: int,
        now: float,
        held: Collection[str] = (),
        freed: Collection[str] = (),
    ) -> tuple[list[SessionSummary], int]:
        """The page and total of a listing read session by session: those the store `picks`
        (None: every one), and of them those `caller` may see under the access rule (None:
        every one; else only the `SESSION_SCAN` most recently active are read), filtered by
        `status` in the store if `by_store`, else as each is shown (those `held` by a live drive
        past their TTL as the store holds them, those passed deadlines `freed` as running).
        Only the page is kept, so memory stays that of one page and one chunk."""
        page: list[SessionSummary] = []
        total = scanned = 0
        previous: set[str] = set()  # pushed down a chunk by one active meanwhile: listed once
        while caller is None or scanned < SESSION_SCAN:
            size = SESSION_CHUNK if caller is None else min(SESSION_CHUNK, SESSION_SCAN - scanned)
            chunk, listed = await passing_sessions(
                self.runtime.store,
                agent=agent,
                status=status if by_store else None,
                limit=size,
                offset=scanned,
                initiated_by=picks,
            )
            rows = []
            for row in chunk:
                shown = summary_after_expiry(row, now, held, freed)  # as `Runtime.sessions` does
                if row.id in previous or (status is not None and shown.status != status):
                    continue
                rows.append(shown)
            if caller is not None:
                seen = await self._sees(caller, {row.id for row in rows})
                rows = [row for row in rows if seen[row.id]]
            for shown in rows:
                if offset <= total < offset + limit:
                    page.append(shown)
                total += 1
            if listed < size:
                break
            scanned += size
            previous = {row.id for row in chunk}
        return page, total

    async def _sees(self, caller: Principal, session_ids: Collection[str]) -> dict[str, bool]:
        """Whether a listing shows each session to the caller: not when it was deleted, nor when
        who started it cannot be read back (`StoreDamaged`: one damaged log must not fail every
        caller's listing; its own read names the damage); any other store error fails the
        listing rather than leave one out. The rule is asked of them all at once (`_judged`)."""
        initiators: dict[str, Principal | None] = {}
        for session_id in session_ids:
            try:
                initiators[session_id] = await self.initiator(session_id)
            except UnknownSession:
                pass
            except StoreDamaged as exc:
                log.warning("session %s left out of a listing: %s", session_id, exc)
        judged = await self._judged(caller, initiators)
        return {session_id: judged.get(session_id, False) for session_id in session_ids}

    async def initiator(self, session_id: str) -> Principal | None:
        """Who started a session, from its first event, remembered: a reviewer's queue is
        filtered by it, and loading every parked session's state made each page a scan."""
        if session_id in self._initiators:
            return self._initiators[session_id]
        return await self._read_initiator(session_id)

    async def _read_initiator(self, session_id: str) -> Principal | None:
        """Who started a session, read from its first event (one indexed read), and remembered;
        `UnknownSession` when it has none."""
        await self.runtime.open()
        first = await self.runtime.store.read_events(session_id, limit=1)
        if not first:
            raise UnknownSession(session_id)
        known, initiator = _created_by(first)
        if not known:  # a damaged log: its state says who started it, or what is wrong
            try:
                initiator = (await self.runtime._state(session_id)).initiator
            except StoreError as exc:
                if type(exc) is not StoreError:  # busy, down, gone, damaged: raised as it is
                    raise
                # The state's own checks: damage, as that first event is whatever they find.
                raise StoreDamaged(
                    f"session {session_id!r} is damaged: its first event does not say who "
                    f"started it, and its state cannot be read: {exc}"
                ) from exc
        if len(self._initiators) >= 100_000:
            self._initiators.clear()
        self._initiators[session_id] = initiator
        return initiator

    async def queue_version(self, caller: Principal) -> tuple[int, str]:
        """The caller's open-request count and a fingerprint that changes with the set.

        Under the default rule it costs a few indexed queries (count, what the queue leaves out,
        oldest, newest), not a scan; under another rule every open request the caller may see
        is read.
        """
        if self.sees_every_request(caller):
            return await self.open_requests_version()
        picks = self._picks(caller)
        if picks is not None:
            return await self.open_requests_version(picks)
        items, total = await self.visible_requests(caller, PendingFilter(limit=1_000_000))
        # With each request's votes: a quorum's card shows how many approved so far.
        return total, digest(total, [f"{r.id}/{len(r.approved_by)}" for r in items])

    def sees_every_request(self, caller: Principal) -> bool:
        """Whether the caller sees every session, so every open request (an admin under the
        default rule)."""
        return caller.attributes.get("admin") is True and self._default_access()

    async def _listed(self, flt: PendingFilter, *, record: bool = False) -> PendingFilter:
        """`flt` leaving out the open requests the queue does not show (`unlisted`: past a
        deadline, or a mirror whose subagent's request or session lapsed, nothing recorded
        yet), so a listing's offsets and its count skip the same ones; with `record`, the
        passed deadlines of this runtime's agents are recorded first, as a page of the queue
        records its own. Two indexed queries while nothing is past a deadline or a TTL."""
        if flt.status != "pending" or flt.live_at is None:
            return flt
        store = self.runtime.store
        now = flt.live_at
        if record:
            # As many as the page could show, as before: each one may drive a turn.
            size = min(flt.limit, REQUEST_CHUNK)
            due, _ = await readable_pending(store, replace(flt, due_by=now, limit=size, offset=0))
            if due:
                await self.runtime._apply_deadlines(due, listing=True)
        # A row that does not read back is left out, as the listing around it leaves it.
        hidden = await unlisted(store, flt, now, partial(readable_pending, store))
        return replace(flt, excluded=tuple(hidden)) if hidden else flt

    def _default_access(self) -> bool:
        return self.access is default_access

    async def _may_see(self, caller: Principal, initiator: object) -> bool:
        judged = await self._judged(caller, {"": cast(Principal | None, initiator)})
        return judged[""]

    async def _judged(
        self, caller: Principal, initiators: dict[str, Principal | None]
    ) -> dict[str, bool]:
        """The access rule's answer for each session's initiator: the default rule's on the
        loop, a rule of the application's in one thread for them all, so one that blocks (a
        directory asked) stalls no other request or stream, and a listing costs one thread."""
        access = self.access

        def judge() -> dict[str, bool]:
            return {sid: may_see(access, caller, who) for sid, who in initiators.items()}

        if self._default_access() or not initiators:
            return judge()
        return cast(dict[str, bool], await in_thread(judge))


def _created_by(events: list[Event]) -> tuple[bool, Principal | None]:
    """The initiator a session's first event names, and whether it is that event."""
    if not events or events[0].seq != 1 or events[0].type != "session.created":
        return False, None
    try:
        return True, load_principal(events[0].data.get("initiator"))
    except ValueError:
        return False, None


def _page(
    flt: PendingFilter, limit: int, offset: int, after: tuple[float, str] | None
) -> PendingFilter:
    return replace(flt, limit=limit, offset=offset, after=after)


def get_context(request: HTTPConnection) -> ServerContext:
    ctx = request.app.state.signoff
    assert isinstance(ctx, ServerContext)
    return ctx
