"""`LiveSession`, the client-side reducer: it folds a session's stream into its requests; an
answer it submits marks the request `responded` until the stream confirms it, and answering a
request the stream recorded closed fails locally, the answer not sent (one not read yet is read
first). Time is the server's (`AsyncClient.server_time`), the machine's clock may be off it.

It reads and answers through any `SessionRemote` (`AsyncClient` is the one), so this module
needs nothing of the client's and the client can make a `LiveSession` with no import cycle.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from . import _exceptions as errors
from ._answers import closed_text
from ._deadlines import EXPIRED, after_deadline
from ._events import Event, is_activity, keeps_activity
from ._live_follow import Following
from ._mirrors import FOLLOWED, MAX_HOPS
from ._payloads import RemoteResult, input_responses
from ._state_parts import candidate_applied, settled_applied
from ._types import InputRequest, InputResponse

__all__ = ["LiveSession", "RequestView", "SessionRemote"]


class SessionRemote(Protocol):
    """What a `LiveSession` needs of its client: a session's events, and a way to answer."""

    def events(
        self,
        session_id: str,
        after: int = 0,
        *,
        follow: bool = True,
        retries: int = 5,
        shown: Event | None = None,
    ) -> AsyncGenerator[Event, None]: ...

    async def respond(
        self, session_id: str, responses: Sequence[InputResponse | Mapping[str, Any]]
    ) -> RemoteResult: ...


@dataclass(slots=True, kw_only=True)
class RequestView:
    """A request as the client knows it: `pending`, `responded` (sent, not yet confirmed),
    or closed (`settled`, `expired`, `withdrawn`) with its outcome; `on_timeout`: what its
    passed deadline did when that closed it (`approve`: the call was approved to run, though a
    guardrail asked again as it would start may deny it), else None."""

    request: InputRequest
    status: str = "pending"
    outcome: str | None = None
    on_timeout: str | None = None


@dataclass(slots=True)
class LiveSession:
    """Client-side fold of one session's stream: its requests and how far it has read.

    A mirror (a subagent's request asked again here) shows the votes, escalation and deadline
    of the request it stands for, read from the subagent's session (`children`), whose stream
    records them: this session's never does. A request whose deadline passed by `clock` shows
    as that leaves it before the stream records it: escalated, or closed as `expired`; so do
    all once the session's TTL passed (from its last activity, as the server counts it).

    `clock` is the server's time: by default the client's reckoning of it (`server_time`, an
    `AsyncClient`'s; else this machine's clock), which an answer to a request it alone shows
    closed does not overrule: the answer is sent, for the server to judge. A `clock` given is
    taken to be the server's own (a test's `ManualClock`, shared with the runtime), and such
    an answer is refused here, as the server would."""

    client: SessionRemote
    session_id: str
    seq: int = 0
    requests: dict[str, RequestView] = field(default_factory=dict)
    children: dict[str, LiveSession] = field(default_factory=dict, repr=False)
    clock: Callable[[], float] | None = field(default=None, repr=False)
    # The session's TTL and last activity's time (read from its stream, as the server's fold
    # reads them), and whether its expiry is recorded.
    _ttl: float | None = field(default=None, init=False, repr=False)
    _updated_at: float = field(default=0.0, init=False, repr=False)
    _lapsed: bool = field(default=False, init=False, repr=False)
    # The last event folded: each read checks the server still has it (`EventsRewritten`).
    _last: Event | None = field(default=None, init=False, repr=False)
    # Each request as the stream (and this session's answers) left it: `requests` shows it
    # with what passed since applied (a deadline, the TTL, its subagent's request), again
    # at each read, so a view the session's later events overtake is shown anew.
    _recorded: dict[str, _Recorded] = field(default_factory=dict, init=False, repr=False)
    # What the last showing of every request (`_refresh`) left: the earliest time passing
    # may show one anew (a deadline, a subagent's), and whether the session showed lapsed;
    # until either changes, an event shows anew only the requests it touched.
    _due: float = field(default=math.inf, init=False, repr=False)
    _shown_lapsed: bool = field(default=False, init=False, repr=False)
    # The requests (mirrors) that stand for each subagent session's.
    _mirrors: dict[str, list[str]] = field(default_factory=dict, init=False, repr=False)
    # Events a `follow()` folded but, stopped before it yielded them (a caller's timeout),
    # did not yield: the next `follow()` yields them first (`_live_follow`).
    _unsent: list[Event] = field(default_factory=list, init=False, repr=False)

    def apply(self, event: Event) -> None:
        """Fold one event in; one at or before `seq` was already folded and is skipped. One
        that does not hold what its type says is a `RemoteError` (`http_error`), as the
        client's other calls say an answer not a signoff server's, and nothing of it is folded."""
        touched = self._folded(event)
        if touched is not None:
            self._refresh(touched)

    def _folded(self, event: Event) -> tuple[str, ...] | None:
        """`apply` but for showing the result (`_refresh`): the requests the event touched,
        or `None` if it was not folded."""
        if event.seq <= self.seq:
            return None
        try:
            fold = self._folding(event)
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise errors.RemoteError(
                f"the event stream sent a {event.type!r} event (seq {event.seq}) that is not a "
                f"signoff event ({type(exc).__name__}: {str(exc)[:200]})",
                "http_error",
                200,
            ) from None
        self.seq = event.seq
        prior = None if self._last is None else self._last.type
        if is_activity(event.type, event.data) and not keeps_activity(
            event.type, event.data, prior
        ):  # as the server's fold counts it
            self._updated_at = event.at
        self._last = event
        return fold()

    def _folding(self, event: Event) -> Callable[[], tuple[str, ...]]:
        """What folding `event` changes, checked whole first and applied by the call, which
        says which requests it touched."""
        d = event.data
        if event.type == "session.created":
            ttl = d.get("ttl")
            if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))):
                raise TypeError(f"its ttl is {ttl!r}, not seconds")
            seconds = None if ttl is None else float(ttl)  # 10**400: an OverflowError, here

            def created() -> tuple[str, ...]:
                self._ttl = seconds
                return ()

            return created
        if event.type == "input.requested":
            raws = d.get("requests", [])
            if not isinstance(raws, list):
                raise TypeError(f"its requests are {type(raws).__name__}, not a list")
            requests = [InputRequest.model_validate(raw) for raw in raws]

            def ask() -> tuple[str, ...]:
                for r in requests:
                    self.requests[r.id] = RequestView(request=r)
                    self._recorded[r.id] = _Recorded(r, "pending", None)
                    if r.child is not None:
                        self._mirrors.setdefault(r.child.session_id, []).append(r.id)
                return tuple(r.id for r in requests)

            return ask
        if event.type not in ("approval.candidate", "approval.settled", "input.resolved"):
            return tuple
        request_id = d.get("request_id", "")
        if not isinstance(request_id, str):
            raise TypeError(f"its request_id is {request_id!r}")
        was = self._recorded.get(request_id)
        if was is None:
            return tuple
        if event.type != "input.resolved":  # a quorum's vote, an escalation, or its settling
            if was.status not in ("pending", "responded"):  # closed on the server
                return tuple
            if not isinstance(d.get("to"), str | None):
                raise TypeError(f"it escalates to {d.get('to')!r}")
            # As the server's fold: a quorum's settling holds every vote, the last one too.
            applied = settled_applied if event.type == "approval.settled" else candidate_applied
            request = applied(was.request, d)

            def candidate() -> tuple[str, ...]:
                self._record(request_id, request=request)
                return (request_id,)

            return candidate
        status, outcome = d.get("status") or "settled", d.get("outcome")
        if not isinstance(status, str) or not isinstance(outcome, str | None):
            raise TypeError(f"it closes the request as {status!r} ({outcome!r})")
        on_timeout = d.get("on_timeout")  # what its deadline did, if that closed it
        on_timeout = on_timeout if isinstance(on_timeout, str) else None

        request = settled_applied(was.request, d)  # a mirror's close: its subagent's votes

        def resolve() -> tuple[str, ...]:
            self._record(
                request_id, request=request, status=status, outcome=outcome, on_timeout=on_timeout
            )
            if was.request.child is None and d.get("reason") == EXPIRED:
                self._lapsed = True  # as the server's fold: the session expired
            return (request_id,)

        return resolve

    def _record(self, request_id: str, **changes: Any) -> None:
        self._recorded[request_id] = self._recorded[request_id]._replace(**changes)

    async def sync(self) -> None:
        """Read and fold everything the server has after `seq`, and the subagent sessions' its
        open mirrors stand for."""
        await self._sync(MAX_HOPS)

    async def _sync(self, hops: int) -> None:
        try:
            shown = self._last_folded()
            async for event in self.client.events(
                self.session_id, self.seq, follow=False, shown=shown
            ):
                self._folded(event)  # shown once all are read: once, not at each
            for child in self._mirrored() if hops > 0 else []:
                live = self._child(child)
                with contextlib.suppress(errors.UnknownSession):  # deleted: shown as it was
                    await live._sync(hops - 1)
        finally:
            self._refresh()  # what was read, even if the stream then failed

    def _last_folded(self) -> Event | None:
        """The last event folded, for a read after it to check (None if `seq` was set by hand)."""
        last = self._last
        return last if last is not None and last.seq == self.seq else None

    def _now(self) -> float:
        """The time `clock` says, or by default the server's, as the client reckons it."""
        if self.clock is not None:
            return self.clock()
        server_time = getattr(self.client, "server_time", None)
        return float(server_time()) if callable(server_time) else time.time()

    def _expired(self, now: float) -> bool:
        """Whether the session's TTL passed by `now`, or its expiry is recorded."""
        if self._lapsed:
            return True
        return self._ttl is not None and now >= self._updated_at + self._ttl

    def _mirrored(self) -> list[str]:
        """The subagent sessions that this session's open mirrors stand for, once each: open
        as recorded (one shown closed by what passed since may show open again)."""
        recorded = self._recorded.values()
        refs = [r.request.child for r in recorded if r.status in ("pending", "responded")]
        return list(dict.fromkeys(ref.session_id for ref in refs if ref is not None))

    def _refresh(self, touched: Iterable[str] | None = None) -> None:
        """Show each request as it stands now (`_shown`), its subagents' sessions' first; or,
        given the requests an event `touched`, those alone (their subagents' first), unless
        what passed since the last such showing (a deadline, the TTL) may show others anew."""
        now = self._now()
        lapsed = self._expired(now)
        whole = touched is None or now >= self._due or lapsed != self._shown_lapsed
        if whole:
            for live in self.children.values():
                live._refresh()
            self._due, self._shown_lapsed = math.inf, lapsed
        for request_id in self.requests if whole or touched is None else touched:
            view, recorded = self.requests.get(request_id), self._recorded.get(request_id)
            if view is None or recorded is None:
                continue
            ref = recorded.request.child
            child = None if ref is None else self.children.get(ref.session_id)
            if child is not None and ref is not None and not whole:
                child._refresh((ref.request_id,))
            shown = self._shown(recorded, now, lapsed)
            view.request, view.status, view.outcome, view.on_timeout = shown
            if shown.status in ("pending", "responded"):
                self._due = min(self._due, _due(shown.request, child, now))

    def _shown(self, recorded: _Recorded, now: float, lapsed: bool) -> _Recorded:
        """An open request as the server's reads show it before anyone records what passed:
        a mirror with the `FOLLOWED` fields of the request it stands for as its subagent's
        session says now (its deadline only while that request is open; closed once it
        closed); then, as nothing recorded yet, `expired` once the session's TTL passed, and
        escalated or `expired` once the request's deadline passed."""
        request, status, outcome, on_timeout = recorded
        if status not in ("pending", "responded"):
            return recorded
        ref = request.child
        child = None if ref is None else self.children.get(ref.session_id)
        current = None if ref is None or child is None else child.requests.get(ref.request_id)
        if current is not None:
            update = {f: _copied(getattr(current.request, f)) for f in FOLLOWED}
            if current.status not in ("pending", "responded"):
                update["expires_at"] = None  # closed: the mirror closes with it, not by this
                status, outcome, on_timeout = current.status, current.outcome, current.on_timeout
            request = request.model_copy(update=update)
        if status != "pending":
            return _Recorded(request, status, outcome, on_timeout)
        if lapsed:
            return _Recorded(request, "expired", "expired")
        shown = after_deadline(request, now)
        return (
            _Recorded(request, "expired", "expired", request.on_timeout)
            if shown is None
            else _Recorded(shown, status, outcome)
        )

    async def follow(self) -> AsyncGenerator[Event, None]:
        """Fold and yield live events until the caller stops: this session's, and those of the
        subagent sessions its open mirrors stand for that may change a mirror, a vote or an
        escalation (`approval.candidate`) or a request closing (`input.resolved`), their
        `session_id` telling whose. Each is folded as it is yielded (`_live_follow`), so the
        next `follow()` yields what this one read but did not yield."""
        async with contextlib.aclosing(Following(self).events()) as events:
            async for event in events:
                yield event

    def _child(self, session_id: str) -> LiveSession:
        """The view of a subagent session an open mirror stands for, made at its first read."""
        live = self.children.get(session_id)
        if live is None:
            live = self.children[session_id] = LiveSession(
                self.client, session_id, clock=self.clock
            )
        return live

    def open_requests(self) -> list[InputRequest]:
        """The requests still pending, as far as this session has read, in asked order; none
        whose deadline passed unless it escalated."""
        self._refresh()
        return [v.request for v in self.requests.values() if v.status == "pending"]

    async def respond(self, responses: Sequence[InputResponse | Mapping[str, Any]]) -> RemoteResult:
        """Answer requests; a request that is no longer open fails here, the answer not sent
        (one shown closed only by what passed since it was read, or not read yet, once the
        stream is read again). One shown closed only by the time passing since the stream
        recorded it (a deadline, the TTL, its subagent's) is sent all the same unless `clock`
        was given: the server's clock judges it, not the client's reckoning of it."""
        answers = input_responses(responses)
        self._refresh()
        if self._overtaken(answers):
            await self.sync()  # shown closed or unread as far as read: the sessions went on
        judged = self.clock is not None  # the server's own clock: refused here, as it would be
        if self._lapsed or (judged and self._expired(self._now())):
            # as the server does, but for a turn a live drive runs on
            left = [i for i, r in self._recorded.items() if r.status in ("pending", "responded")]
            raise errors.SessionExpired(self.session_id, left)
        for a in answers:
            view, recorded = self.requests.get(a.request_id), self._recorded.get(a.request_id)
            if view is None or recorded is None:
                raise errors.UnknownRequest(self.session_id, [a.request_id])
            if view.status != "pending" and (judged or self._closed_by_record(recorded)):
                told = closed_text(view.request, view.status, view.outcome, view.on_timeout)
                raise errors.RequestClosed(told, [a.request_id])
        for a in answers:
            self._mark(a.request_id, "pending", "responded")
        try:
            result = await self.client.respond(self.session_id, answers)
        except BaseException as exc:
            for a in answers:
                self._mark(a.request_id, "responded", "pending")
            if isinstance(
                exc, (errors.ConflictingAnswer, errors.RequestClosed, errors.SessionExpired)
            ):
                # Closed on the server meanwhile: learn how from the stream, so the request
                # is not shown open (and answered again) when it is not.
                with contextlib.suppress(errors.SignoffError):
                    await self.sync()
            raise
        for o in result.outcomes:
            if o.outcome not in ("approved", "cancelled", "answered"):
                # Refused, or a quorum's vote counted (applied, yet no stream event will
                # settle it): still open, and its voter may still deny it.
                self._mark(o.request_id, "responded", "pending")
        return result

    def _overtaken(self, answers: Sequence[InputResponse]) -> bool:
        """Whether the session, or a request answered, shows closed by what passed since it
        was read (a TTL, a deadline, its subagent's), with nothing recorded that says so; or a
        request answered was not read: asked since, it is open on the server."""
        if self._expired(self._now()) and not self._lapsed:
            return True
        for a in answers:
            view, recorded = self.requests.get(a.request_id), self._recorded.get(a.request_id)
            if view is None or recorded is None or view.status != recorded.status:
                return True
        return False

    def _closed_by_record(self, recorded: _Recorded) -> bool:
        """Whether a request is not open by what a stream recorded (or this session sent), not
        only by the time passing since: its own, or a mirror's, its subagent's request's."""
        if recorded.status != "pending":
            return True
        ref = recorded.request.child
        child = None if ref is None else self.children.get(ref.session_id)
        theirs = None if ref is None or child is None else child._recorded.get(ref.request_id)
        return (
            child is not None
            and theirs is not None
            and (child._lapsed or child._closed_by_record(theirs))
        )

    def _mark(self, request_id: str, was: str, status: str) -> None:
        """Mark a request `status` if the stream left it `was` (it may have closed it)."""
        recorded = self._recorded.get(request_id)
        if recorded is not None and recorded.status == was:
            self._record(request_id, status=status)
            self._refresh((request_id,))


class _Recorded(NamedTuple):
    request: InputRequest
    status: str
    outcome: str | None
    on_timeout: str | None = None


def _due(request: InputRequest, child: LiveSession | None, now: float) -> float:
    """The earliest time after `now` that passing may show an open request anew: its
    deadline (a mirror's, its subagent's request's), or what may change its subagent's."""
    times = [request.expires_at]
    if child is not None:
        times.append(child._due)
        if child._ttl is not None:
            times.append(child._updated_at + child._ttl)
    return min((t for t in times if t is not None and t > now), default=math.inf)


def _copied(value: Any) -> Any:
    return list(value) if isinstance(value, list) else value
