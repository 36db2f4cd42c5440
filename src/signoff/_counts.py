"""`Counts`: running totals of what one runtime did in this process, for a metrics endpoint.

Plain integers, bumped where the work is done and read only when scraped (`signoff[metrics]`,
`create_app(metrics=True)`): counting costs a turn an addition, with or without an exporter.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

from ._exceptions import (
    AnswerError,
    ConflictingAnswer,
    InvalidAnswer,
    RequestClosed,
    SessionError,
    SignoffError,
)

if TYPE_CHECKING:
    from ._results import Outcome

__all__ = [
    "CLOSED",
    "REFUSALS",
    "REFUSED_OUTCOMES",
    "Counts",
    "counted_answers",
    "counted_elsewhere",
    "refused_only",
    "settled_before_raising",
    "unawaited",
]

_Settle = TypeVar("_Settle", bound=Callable[..., Awaitable[list["Outcome"]]])
_Told = TypeVar("_Told", bound="Outcome | BaseException")

# Set while a settlement runs: answers to a subagent's requests are settled by nested calls,
# which the outermost one counts.
_settling: ContextVar[bool] = ContextVar("signoff_settling", default=False)

# What the settlement running returns or raises that another process counted (`counted_elsewhere`).
_elsewhere: ContextVar[list[object] | None] = ContextVar("signoff_elsewhere", default=None)

# What the settlement running committed before it raised (`settled_before_raising`).
_kept: ContextVar[list[Outcome] | None] = ContextVar("signoff_kept", default=None)


@dataclass(slots=True)
class Counts:
    """Drives of turns this process ran (a drive that recorded nothing is not one), those of
    them that failed (raised, or left the turn failed), answers it accepted, and answers it
    refused by error code (a stable, small set)."""

    drives: int = 0
    failed_drives: int = 0
    accepted: int = 0
    refused: Counter[str] = field(default_factory=Counter)

    def drove(self, *, failed: bool) -> None:
        self.drives += 1
        if failed:
            self.failed_drives += 1

    def answered(self, outcomes: Iterable[Outcome]) -> None:
        """Count the answers that took effect (not those repeating an earlier one), and those
        refused by an outcome rather than an error (`REFUSED_OUTCOMES`)."""
        for o in outcomes:
            if o.applied:
                self.accepted += 1
            elif o.outcome in REFUSED_OUTCOMES:
                self.refused[REFUSED_OUTCOMES[o.outcome]] += 1

    def refuse(self, exc: BaseException) -> None:
        """Count an answer refused with `exc` if it is a refusal (`REFUSALS`), by its class's
        code: a fixed set, so the metric's label stays bounded."""
        if isinstance(exc, REFUSALS):
            self.refused[type(exc).code] += 1

    @contextmanager
    def refusing(self) -> Iterator[None]:
        """Count the refusal raised inside, for a check a surface makes of an answer before the
        runtime settles it (the API's `UnknownSession` of a session the caller may not see)."""
        try:
            yield
        except SignoffError as exc:
            self.refuse(exc)
            raise


REFUSALS = (AnswerError, InvalidAnswer, SessionError)
"""What refuses an answer: the request's errors (`unknown_request`, `conflicting_answer`, ...),
a malformed answer, and its session's (`unknown_session`, `session_expired`, `session_busy`)."""


REFUSED_OUTCOMES = {
    "rejected": "response_rejected",
    "failed": "response_policy_failed",
    "timed-out": "response_policy_timed_out",
    "stale": "response_stale",
}
"""The code an answer refused by its outcome is counted under: a response policy's verdict, or
`stale` for one whose request's deadline passed while it was decided and escalated the request.
The request stays open and the call returns the outcome (`applied` false), raising nothing for
`refuse` to count. A fixed set, as the error codes are."""


CLOSED = (RequestClosed, ConflictingAnswer)
"""The refusals that say the request itself is closed (withdrawn, expired, cancelled, or
settled with another answer), as against who answered or what they sent. A settlement
`from_message` may raise them without refusing the message: `send` then delivers it as a
message instead of an answer."""


def refused_only(outcomes: Iterable[Outcome]) -> bool:
    """Whether answers that raised nothing were all refused by their outcome
    (`REFUSED_OUTCOMES`): nothing was settled, and no request closed."""
    got = list(outcomes)
    return bool(got) and all(not o.applied and o.outcome in REFUSED_OUTCOMES for o in got)


def counted_answers(settle: _Settle) -> _Settle:
    """Count what a settlement (`Answering._settle`) accepts and refuses (`REFUSALS`: a
    request's error, or its session's) in its runtime's `_counts`: the outermost call only, and
    no call that only checks (`check_only`)."""

    @functools.wraps(settle)
    async def counted(self: Any, *args: Any, **kwargs: Any) -> list[Outcome]:
        if kwargs.get("check_only") or _settling.get():
            return await settle(self, *args, **kwargs)
        told: list[object] = []
        kept: list[Outcome] = []
        token, told_token, kept_token = _settling.set(True), _elsewhere.set(told), _kept.set(kept)
        try:
            outcomes = await settle(self, *args, **kwargs)
        except BaseException as exc:
            self._counts.answered(o for o in kept if not any(o is t for t in told))
            # A message's answer closed or answered meanwhile: `send` delivers it as a message.
            anew = kwargs.get("from_message") and isinstance(exc, CLOSED)
            if isinstance(exc, SignoffError) and not (anew or any(exc is t for t in told)):
                self._counts.refuse(exc)
            raise
        finally:
            _settling.reset(token)
            _elsewhere.reset(told_token)
            _kept.reset(kept_token)
        self._counts.answered(o for o in outcomes if not any(o is t for t in told))
        return outcomes

    return cast(_Settle, counted)


def settled_before_raising(outcomes: Iterable[Outcome]) -> None:
    """`outcomes`, of answers the settlement running committed before another of its answers
    raised (answers settled one by one: through several mirrors, or judged by a response
    policy), counted by it though it raises: they took effect all the same."""
    kept = _kept.get()
    if kept is not None:
        kept.extend(outcomes)


def counted_elsewhere(told: _Told) -> _Told:
    """`told`, an answer's outcome or refusal that another process recorded and counted (it
    judged the answer again, taking this one for dead), left out of the count of the settlement
    that returns or raises it here, so the processes' sum counts the answer once."""
    elsewhere = _elsewhere.get()
    if elsewhere is not None:
        elsewhere.append(told)
    return told


def unawaited(counts: Counts) -> Callable[[Outcome | BaseException], None]:
    """What counts, in `counts`, an answer of the settlement running that goes on after its
    caller was cancelled (judged by a response policy: `Candidates._candidate`): the outcome it
    returns, or the refusal it raises, as the settlement would have counted it, unless another
    process counted it (`counted_elsewhere`); a request closed meanwhile (`CLOSED`) is no
    refusal of it."""
    elsewhere = _elsewhere.get()

    def count(told: Outcome | BaseException) -> None:
        if elsewhere is not None and any(told is t for t in elsewhere):
            return
        if isinstance(told, BaseException):
            if not isinstance(told, CLOSED):
                counts.refuse(told)
            return
        counts.answered([told])

    return count
