"""`Channel`: where people see open requests and answer them, and what a channel is told.

A `ChannelHub` follows the audit trail and calls `on_requested`, `on_updated`, `on_escalated`
and `on_resolved`; a channel answers through `submit`, which settles through `Runtime.respond`
with the responder's principal, so response policies decide exactly as they do for any other
caller.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .._exceptions import SignoffError, UsageError
from .._results import Outcome
from .._sync import is_async
from .._types import InputRequest, InputResponse, Principal
from ._state import ChannelState, off_loop, waiting_until

if TYPE_CHECKING:
    from .._runtime import Runtime
    from ..stores import Store
    from ..stores._audit import AuditEntry

__all__ = [
    "Channel",
    "ChannelState",
    "ChannelUnreachable",
    "DELETED",
    "Erased",
    "Escalation",
    "InvalidSignature",
    "QUEUED_NOTE",
    "RateLimited",
    "Resolution",
    "check_name",
    "closing_entry",
    "describe_principal",
    "off_loop",
    "plain_hooks",
    "waiting_until",
]

logger = logging.getLogger("signoff.channels")

QUEUED_NOTE = (
    "Your message waits for the end of the turn in progress, which does not read it; "
    "then it starts a turn of its own."
)
"""What a person whose message was queued (`GenerateResult.queued`) is told: the turn running
serves someone else, or messages wait their turn."""

SETTLED_OUTCOMES = frozenset({"approved", "cancelled", "answered"})
"""An answer's outcomes that settle its request: one not applied repeats the settlement
recorded, so the request is closed."""


def not_accepted(outcome: Outcome) -> str | None:
    """What a person is told of an answer that took no effect and left its request open: a
    response policy's refusal, or one spent (`stale`) as its deadline escalated the request to
    a group meanwhile. None for one applied, counted, or repeating the settlement recorded."""
    if outcome.applied or outcome.outcome == "counted" or outcome.outcome in SETTLED_OUTCOMES:
        return None
    why = f": {outcome.reason}" if outcome.reason else ""
    return f"Your answer was not accepted ({outcome.outcome}{why})."


class InvalidSignature(SignoffError):
    """A signed request (from Slack, or a webhook) failed verification: nothing was done."""

    code = "invalid_signature"


class RateLimited(SignoffError):
    """The channel's service asked to be called again later (an HTTP 429 with Retry-After).

    A channel raises it from a hook to have the hub try that entry again after `retry_after`
    seconds instead of its backoff; such tries do not count towards the hub's `max_attempts`.
    """

    code = "rate_limited"

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ChannelUnreachable(RateLimited):
    """The channel cannot reach where it delivers until a person mends it (a Slack bot removed
    from its channel, the channel archived); the message says what to do.

    The hub waits `retry_after` seconds and tries again, as after a rate limit (no attempt is
    spent, the channel's feed is held in order), and logs the message, not "rate limited".
    `logged`: the channel logs what to do itself, at a pace of its own (a Slack token refused
    is logged as an error, not at every try), so the hub notes each wait at DEBUG only.
    """

    code = "channel_unreachable"

    def __init__(self, message: str, retry_after: float, *, logged: bool = False) -> None:
        super().__init__(message, retry_after)
        self.logged = logged


DELETED = "deleted"
"""The outcome of a request closed by its session's deletion (`Runtime.delete_session`,
`prune`), as channels are told it: no `input.resolved` records it (status `withdrawn`)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Resolution:
    """How a request closed: its outcome, who decided (if a person did), when, and why.
    `on_timeout`: what its passed deadline did when that closed it (`approve`: the call was
    approved automatically, though a guardrail asked again as it would start may deny it;
    `deny`), None when no deadline closed it."""

    request_id: str
    outcome: str  # answered | approved | cancelled | ignored | expired | deleted
    status: str  # settled | expired | withdrawn
    at: float
    by: Principal | None = None
    reason: str | None = None
    answer: dict[str, Any] | None = None
    on_timeout: str | None = None

    @classmethod
    def from_event(cls, data: Mapping[str, Any], at: float) -> Resolution:
        """Read the data of an `input.resolved` event (or audit entry)."""
        by = data.get("by")
        answer = data.get("answer")
        reason = data.get("reason")
        on_timeout = data.get("on_timeout")
        return cls(
            request_id=str(data["request_id"]),
            outcome=str(data.get("outcome")),
            status=str(data.get("status") or "settled"),
            at=at,
            by=Principal.model_validate(by) if isinstance(by, dict) else None,
            reason=reason if isinstance(reason, str) else None,
            answer=answer if isinstance(answer, dict) else None,
            on_timeout=on_timeout if isinstance(on_timeout, str) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The resolution as JSON-ready data (as webhook deliveries carry it)."""
        return {
            "request_id": self.request_id,
            "outcome": self.outcome,
            "status": self.status,
            "at": self.at,
            "by": None if self.by is None else self.by.model_dump(mode="json"),
            "reason": self.reason,
            "answer": self.answer,
            "on_timeout": self.on_timeout,
        }

    def closed_at(self, request: InputRequest | None) -> float:
        """When to say it closed: `at`, when that was recorded, but for a close its deadline
        made (`expired` with an `on_timeout`) the deadline `request` was shown with if earlier:
        a lapse no worker recorded in time is recorded hours late, and the person was told the
        deadline, not that. A session's TTL closing it (no `on_timeout`) is no such deadline."""
        deadline = None if request is None else request.expires_at
        if self.outcome != "expired" or self.on_timeout is None or deadline is None:
            return self.at
        return min(self.at, deadline)

    @property
    def approved_on_timeout(self) -> bool:
        """Whether its passed deadline approved it (`on_timeout="approve"`): it closed as
        `expired`, and the call was approved all the same, by no one (a guardrail asked again
        as it would start may still deny it)."""
        return self.outcome == "expired" and self.on_timeout == "approve"

    @property
    def value(self) -> str | None:
        """The answer's value (an option's label or the typed text), for questions."""
        if self.answer is None:
            return None
        value = self.answer.get("value")
        return None if value is None else str(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class Erased:
    """A request erased with its session before its channels were told it closed: its session,
    and how it closed (`resolution`: outcome `deleted`, `by` and `reason` the deletion's, for
    one the hub learns closed from the deletion itself; its own close when the hub read that
    but found the request gone). Nothing else of it is left to read."""

    session_id: str
    resolution: Resolution

    @property
    def request_id(self) -> str:
        """The erased request's id."""
        return self.resolution.request_id

    @classmethod
    def from_deletion(cls, data: Mapping[str, Any], at: float) -> list[tuple[Erased, int | None]]:
        """The requests a `session.deleted` audit entry (its `data`, written `at`) names, each
        with the id of the entry that recorded its close (None: it was open)."""
        given = data.get("by")
        by = Principal.model_validate(given) if isinstance(given, dict) else None  # once
        reason = data.get("reason")
        found: list[tuple[Erased, int | None]] = []
        for session in data.get("sessions") or ():
            if not isinstance(session, dict) or not isinstance(session.get("id"), str):
                continue
            for request in session.get("requests") or ():
                if not isinstance(request, dict) or not isinstance(request.get("id"), str):
                    continue
                closed = request.get("closed")
                resolution = Resolution(
                    request_id=request["id"],
                    outcome=DELETED,
                    status="withdrawn",
                    at=at,
                    by=by,
                    reason=reason if isinstance(reason, str) else None,
                )
                erased = cls(session_id=session["id"], resolution=resolution)
                found.append((erased, closed if type(closed) is int else None))
        return found


@dataclass(frozen=True, slots=True, kw_only=True)
class Escalation:
    """How a request no one decided in time was handed on: to which group, when that was
    recorded, and why. Its deadline is lifted and it stays open for the group to answer."""

    request_id: str
    session_id: str
    to: str
    at: float
    reason: str | None = None

    @classmethod
    def from_event(cls, data: Mapping[str, Any], request: InputRequest, at: float) -> Escalation:
        """Read the data of an `approval.candidate` event (or audit entry) whose outcome is
        `escalated`, for `request` (the escalated request as stored)."""
        reason = data.get("reason")
        return cls(
            request_id=str(data["request_id"]),
            session_id=request.session_id,
            to=str(data.get("to") or request.escalated_to or ""),
            at=at,
            reason=reason if isinstance(reason, str) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        """The escalation as JSON-ready data (as webhook deliveries carry it)."""
        return {
            "request_id": self.request_id,
            "session_id": self.session_id,
            "to": self.to,
            "at": self.at,
            "reason": self.reason,
        }


def describe_principal(principal: Principal | None) -> str:
    """A short name for who acted: the principal id, or `the policy` when nobody did."""
    return "the policy" if principal is None else principal.principal_id


def settled_as(resolution: Mapping[str, Any] | None) -> tuple[str, str]:
    """How a stored resolution reads to someone who answers late: its outcome as a person says
    it (`approved`, `denied`, `answered`, ...) and who decided."""
    resolution = resolution or {}
    outcome = str(resolution.get("outcome") or "settled")
    by = resolution.get("by")
    who = describe_principal(Principal.model_validate(by) if isinstance(by, dict) else None)
    return ("denied" if outcome == "cancelled" else outcome), who


def check_name(what: str, name: object) -> str:
    """`name` if it can name a hub or a channel: a non-empty string without `:` or `.`, which
    join the two in positions (`<hub>:<channel>`) and locks, so that no two pairs share one."""
    if not isinstance(name, str) or not name:
        raise UsageError(f"{what} name must be a non-empty string, not {name!r}")
    if ":" in name or "." in name:
        raise UsageError(f"{what} name must not contain ':' or '.', not {name!r}")
    return name


class Channel:
    """Base class of channels: told when requests open, change and close; answers via `submit`.

    Override the `on_*` hooks you need. `accepts` (a predicate, e.g. on `request.agent`) picks
    the requests this channel shows. A channel that shows `live_only` requests is not told about
    a request that closed before the hub read its opening (a catching-up hub skips them), nor
    about one whose session's TTL, or one's above it, passed by then (it takes no answer).
    """

    name: str = "channel"
    live_only: bool = True

    def __init__(
        self,
        *,
        name: str | None = None,
        accepts: Callable[[InputRequest], bool] | None = None,
    ) -> None:
        if name is not None:
            self.name = check_name("a channel", name)
        if accepts is not None and not callable(accepts):
            raise UsageError(
                f"channel {self.name!r}: accepts must be a function of the request, not {accepts!r}"
            )
        if is_async(accepts):  # its coroutine, never awaited, took every request
            raise UsageError(
                f"channel {self.name!r}: accepts must be a plain function of the request, not "
                f"{accepts!r}, an async one: it is asked without awaiting (make it a plain def)"
            )
        self._accepts = accepts
        self._runtime: Runtime | None = None
        self._state: ChannelState | None = None
        self._hub = ""

    # -- wiring -------------------------------------------------------------------------------

    def bind(self, runtime: Runtime, state: ChannelState, *, hub: str = "") -> None:
        """Attach the runtime answers go to and the state memos live in, under the name of the
        `hub` the channel runs in (the hub does this)."""
        self._runtime = runtime
        self._state = state
        self._hub = hub

    @property
    def runtime(self) -> Runtime:
        """The runtime this channel answers through; a `UsageError` before a hub attaches it."""
        if self._runtime is None:
            raise UsageError(f"channel {self.name!r} is not attached: add it to a ChannelHub")
        return self._runtime

    @property
    def state(self) -> ChannelState:
        """The state this channel's memos live in; a `UsageError` before a hub attaches it."""
        if self._state is None:
            raise UsageError(f"channel {self.name!r} is not attached: add it to a ChannelHub")
        return self._state

    @property
    def routers(self) -> Sequence[Any]:
        """HTTP routers (FastAPI `APIRouter`s) to mount on the signoff server, if any."""
        return ()

    def accepts(self, request: InputRequest) -> bool:
        """Whether this channel shows `request` (all of them unless a predicate was given). An
        awaitable is no answer (a plain predicate that returns one, `lambda r: check(r)` of an
        async `check`): the request is not shown, where the awaitable's truth took them all."""
        if self._accepts is None:
            return True
        taken: object = self._accepts(request)
        if inspect.isawaitable(taken):
            if inspect.iscoroutine(taken):
                taken.close()  # never awaited, and never warned of
            if not getattr(self, "_told_awaitable", False):  # once: it is asked of each request
                self._told_awaitable = True
                logger.error(
                    "channel %r: accepts returned %s, not True or False: no request it is asked "
                    "about is shown (make accepts a plain function returning a bool)",
                    self.name,
                    taken,
                )
            return False
        return bool(taken)

    def recall(self, key: str) -> Any:
        """This channel's memo under `key` (None if none, or not JSON: logged). Memo calls wait
        while another process holds the state file's lock: a coroutine makes them in a thread
        (`await asyncio.to_thread(self.remember, key, value)`), so the event loop goes on."""
        return self.state.recall(self.name, key, hub=self._hub)

    def remember(self, key: str, value: Any) -> None:
        """Keep `value` (JSON) under `key` for this channel, synced to disk before it returns, so
        it survives a restart (e.g. which message shows a request)."""
        self.state.remember(self.name, key, value, hub=self._hub)

    def forget(self, key: str) -> None:
        """Drop this channel's memo under `key` (nothing if there is none)."""
        self.state.forget(self.name, key, hub=self._hub)

    def memos(self, prefix: str = "") -> list[tuple[str, Any]]:
        """This channel's memos whose key starts with `prefix`, oldest first (but for those not
        JSON, logged)."""
        return self.state.memos(self.name, prefix, hub=self._hub)

    # -- what the hub tells a channel ---------------------------------------------------------

    async def start(self, open_requests: Sequence[InputRequest]) -> None:
        """Called once when the hub starts, with the requests open now (that it accepts)."""

    async def on_requested(self, request: InputRequest) -> None:
        """A request opened: for a `live_only` channel as it stands when the hub reads the
        opening (still open, its votes and escalation so far in it), else as it opened."""

    async def on_updated(self, request: InputRequest) -> None:
        """An open request changed (a quorum approval was counted)."""

    async def on_escalated(self, request: InputRequest, escalation: Escalation) -> None:
        """A request's deadline passed and it was handed to `escalation.to` (its deadline lifted).

        `request` is as stored now: a channel that is not `live_only` is told also when it has
        closed since. By default an open one is shown anew, as by `on_updated`. A `live_only`
        channel whose `accepts` takes the request only as escalated gets `on_requested` instead
        (nothing, once its session's TTL, or one's above it, passed: it takes no answer).
        """
        if request.status == "pending":
            await self.on_updated(request)

    async def on_resolved(self, request: InputRequest, resolution: Resolution) -> None:
        """A request closed: answered, approved, denied, expired or withdrawn."""

    async def on_erased(self, erased: Sequence[Erased]) -> None:
        """Requests erased with their session (`Runtime.delete_session`, `prune`) before this
        channel was told they closed: the request is gone, so a channel closes what it kept of
        those it shows (their message, their place in a queue) and ignores the others. A
        `live_only` channel is handed every request a deletion erased, also ones it was told
        closed before (it shows none of those); one that is not (it keeps no message of the
        requests it was shown) only those whose close its hub did not deliver to it (the
        others: `on_erased_closed`). By default nothing."""

    async def on_erased_closed(self, erased: Sequence[Erased]) -> None:
        """Requests erased with their session whose close was delivered to this channel, one
        that is not `live_only` (`on_erased` has the others): it drops what it still keeps of
        them to send (a webhook's deliveries its receiver has not taken). By default nothing."""

    async def tick(self, now: float) -> None:
        """Called on every hub poll, for time-based work (e.g. expiry warnings)."""

    async def close(self) -> None:
        """Release resources; the hub calls it when it stops."""

    def cut_short(self) -> list[asyncio.Task[Any]]:
        """A forced stop (`signoff serve`'s second Ctrl-C or SIGTERM): cancel the work this
        channel runs in the background (a turn it resumed: cut short, its lease given back), so
        that `close` does not wait for it; the tasks still running, to be given a moment to end.
        Called on the event loop, before or during the hub's stop; by default nothing."""
        return []

    # -- answering ----------------------------------------------------------------------------

    async def submit(
        self, request: InputRequest, response: InputResponse, principal: Principal | None
    ) -> Outcome:
        """Answer `request` as `principal` through the runtime; returns what became of it.

        Raises the runtime's answer errors (`NotAllowed`, `RequestClosed`, ...), which change
        nothing. Once the answer is recorded the turn is resumed; if that fails (the model is
        down, say) the answer still stands and the failure is logged: the turn is retryable.
        An answer a response policy refused settles nothing and resumes nothing, as an error.
        """
        if response.request_id != request.id:
            raise UsageError(
                f"the response answers {response.request_id}, not the request {request.id}"
            )
        rt = self.runtime
        result = await rt.respond(request.session_id, [response], principal=principal, resume=False)
        try:
            if await rt._refused_idle(request.session_id, result.outcomes) is None:
                await rt.generate(session_id=request.session_id)
        except SignoffError:
            logger.warning(
                "channel %s: the turn of session %s did not resume after answering %s",
                self.name,
                request.session_id,
                request.id,
                exc_info=True,
            )
        for outcome in result.outcomes:
            if outcome.request_id == request.id:
                return outcome
        return Outcome(request_id=request.id, outcome="unknown", applied=False)


async def closing_entry(store: Store, session_id: str, request_id: str) -> AuditEntry | None:
    """The audit entry that recorded the close of `request_id`, read from its session's stream
    a page at a time (None: not there, its close not recorded yet or its session deleted)."""
    after = 0
    while True:
        page = await store.audit(stream=session_id, after_id=after, limit=_CLOSES_PAGE)
        for entry in page:
            if entry.type == "input.resolved" and entry.data.get("request_id") == request_id:
                return entry
        if len(page) < _CLOSES_PAGE:
            return None
        after = page[-1].id


_CLOSES_PAGE = 500  # audit entries `closing_entry` reads at once


_HOOKS = (
    "start",
    "on_requested",
    "on_updated",
    "on_escalated",
    "on_resolved",
    "on_erased",
    "on_erased_closed",
    "tick",
    "close",
    "submit",
)


def plain_hooks(ch: Channel) -> None:
    """Refuse a channel whose hooks (what the hub awaits) are plain methods: the hub awaited
    what one returned, a TypeError after its work was done ("object NoneType can't be used in
    'await' expression"), so it delivered the entry again, each attempt posting it once more,
    and on every later poll and start after giving up. And one whose `cut_short`, which nothing
    awaits, is an async def: it would cancel nothing."""
    for hook in _HOOKS:
        method = getattr(type(ch), hook, None)
        if method is not None and not inspect.iscoroutinefunction(method):
            raise UsageError(
                f"channel {ch.name!r}: {type(ch).__name__}.{hook} must be an async def, as "
                "Channel's is: the hub awaits it"
            )
    if inspect.iscoroutinefunction(getattr(type(ch), "cut_short", None)):
        raise UsageError(
            f"channel {ch.name!r}: {type(ch).__name__}.cut_short must be a plain def, as "
            "Channel's is: a forced stop calls it, awaiting nothing"
        )
