"""Every error signoff raises, in one hierarchy.

    SignoffError
    ├── UsageError                 misuse by the developer: bad definitions or arguments
    │   ├── IdempotencyKeyReused   an idempotency key given again for another call
    │   ├── InvalidAnswer          an answer or decision of the wrong shape or type
    │   ├── TooLarge               text or data over a documented size limit
    │   ├── UnknownAgent           an agent the runtime does not have (named, or a session's)
    │   ├── UnknownTool            an answer for a delegate call whose tool its agent lost
    │   └── ReplayError            a workflow tool stepped or asked differently on replay
    ├── SessionError               about a session as a whole          (.session_id)
    │   ├── UnknownSession         no such session
    │   │   └── SessionDeleted     it was deleted: its idempotency key starts nothing again
    │   ├── SessionExpired         its TTL passed; reopening it fails loudly
    │   ├── SessionBusy            another drive is running its turn right now
    │   ├── SessionWaiting         it waits on people: not deleted (.request_ids)
    │   ├── SubagentSession        a subagent's, deleted only with its parent (.parent_id)
    │   ├── SubagentOrphaned       a subagent's failed turn no one waits on: no retry (.parent_id)
    │   └── SessionLimitReached    a token, cost or step limit was hit
    ├── AnswerError                an answer that cannot be applied    (.request_ids)
    │   ├── UnknownRequest         ids never requested in this session (typos, other sessions)
    │   ├── PartialAnswer          a batch that leaves pending requests unanswered
    │   ├── ConflictingAnswer      a second, different answer to a settled request
    │   ├── RequestClosed          the request is no longer open (withdrawn, expired, ...)
    │   ├── StaleAnswer            the answer was given for another version of the call
    │   └── NotAllowed             the responder may not settle this request
    ├── ModelError                 the model failed or answered nonsense
    │   └── BudgetSpent            its reply stopped at what the session's budgets had left
    ├── StepFailed                 a journaled step's exception, on replay, when it cannot be
    │                              raised again as it was
    ├── RemoteError                a signoff server reported an error this client cannot name
    ├── InvalidSignature           a signed Slack request or webhook failed verification
    ├── RateLimited                a channel's service asked to be called again later
    │   └── ChannelUnreachable     a channel cannot deliver until a person mends it
    ├── SlackPayloadError          a signed Slack payload signoff cannot read
    ├── SlackUserUnknown           a Slack user the channel cannot map to a principal
    └── StoreError                 the store failed or holds something unusable
        ├── SchemaVersionError     data written by a newer signoff
        ├── StoreDamaged           a stored row that cannot be read back: it reads the same again
        ├── StoreGone              the store's file (or schema) was deleted or replaced under it
        ├── AppendConflict         someone else appended to the session first
        ├── LeaseLost              our lease on the session was taken over
        │   └── ChildHeld          internal: a call gave up on a subagent another drive holds
        ├── EventsRewritten        events a follower showed were lost and written anew
        ├── StoreUnavailable       the database server is down, unreachable or not answering
        └── StoreBusy              no free connection to the database in time; retry soon

`ReplayError` is defined in `_tool_context.py`, the channel errors in
`signoff.channels` (`SlackPayloadError` and `SlackUserUnknown` in `signoff.channels.slack`).
Every error that is about an answer leaves the store unchanged: nothing is claimed.
`ApprovalRequired` is not here on purpose: it is a control-flow signal, not a failure.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from ._types import Usage

__all__ = [
    "AnswerError",
    "AppendConflict",
    "BudgetSpent",
    "ConflictingAnswer",
    "EventsRewritten",
    "IdempotencyKeyReused",
    "InvalidAnswer",
    "LeaseLost",
    "ModelError",
    "NotAllowed",
    "PartialAnswer",
    "RemoteError",
    "RequestClosed",
    "SchemaVersionError",
    "SessionBusy",
    "SessionDeleted",
    "SessionError",
    "SessionExpired",
    "SessionLimitReached",
    "SessionWaiting",
    "SignoffError",
    "StaleAnswer",
    "StepFailed",
    "StoreBusy",
    "StoreDamaged",
    "StoreError",
    "StoreGone",
    "StoreUnavailable",
    "SubagentOrphaned",
    "SubagentSession",
    "TooLarge",
    "UnknownAgent",
    "UnknownRequest",
    "UnknownSession",
    "UnknownTool",
    "UsageError",
]


class SignoffError(Exception):
    """Base class of every error signoff raises."""

    code = "signoff_error"
    idempotency_key: str | None = None
    """On an error of a client call that sends a message or opens a session (`AsyncClient.send`,
    `generate` with a prompt or for a new session): its key, to call again with, which the
    server applies once; None otherwise."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt without calling `__init__`: most subclasses take other arguments than the
        # message their `args` hold, so `cls(*args)` failed or garbled the message.
        return (rebuild_error, (type(self), self.args, self.__dict__))


def rebuild_error(cls: type[SignoffError], args: tuple[Any, ...], state: dict[str, Any]) -> Any:
    """Unpickle a `SignoffError`: its args and attributes as they were (a journaled step's
    failure is built again so too)."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class UsageError(SignoffError):
    """The developer used signoff wrongly: a bad definition, argument or combination."""

    code = "usage_error"


class IdempotencyKeyReused(UsageError):
    """An idempotency key given again for another call (another agent, prompt, message or turn
    policy) than the one it was first given for: nothing was recorded."""

    code = "idempotency_key_reused"

    def __init__(self, message: str, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class InvalidAnswer(UsageError):
    """An answer, decision or response of the wrong shape or type."""

    code = "invalid_answer"

    def __init__(self, message: str, request_ids: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.request_ids = list(request_ids)


class TooLarge(UsageError):
    """Text or data over a documented size limit (a prompt, a step's result): refused before
    it is stored, as a store or a model could never take it back."""

    code = "payload_too_large"


class UnknownAgent(UsageError):
    """An agent this runtime does not have: one named to start a session, or the agent of a
    session (started by another process's runtime) that this one was asked to continue."""

    code = "unknown_agent"


class UnknownTool(UsageError):
    """An answer given through a parent session to its subagent's request, whose delegate call's
    tool the parent's agent no longer has (a deploy renamed or removed it): nothing could take
    the subagent's result, so the answer would not be acted on. Nothing was recorded."""

    code = "unknown_tool"


class SessionError(SignoffError):
    """Something about a session as a whole."""

    code = "session_error"

    def __init__(self, message: str, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class UnknownSession(SessionError):
    """No session with this id exists in the store."""

    code = "unknown_session"

    def __init__(self, session_id: str) -> None:
        super().__init__(f"unknown session {session_id!r}", session_id)


class SessionDeleted(UnknownSession):
    """The session was deleted (`Runtime.delete_session`): a call repeating the idempotency key
    that started it does not start it again under the id of the erased one."""

    code = "session_deleted"

    def __init__(self, session_id: str) -> None:
        SessionError.__init__(
            self,
            f"session {session_id!r} was deleted: the idempotency key that started it starts "
            "nothing again; use a new key for a new session",
            session_id,
        )


class SessionExpired(SessionError):
    """The session's TTL passed; it is not silently restarted."""

    code = "session_expired"

    def __init__(self, session_id: str, pending: Iterable[str] = ()) -> None:
        self.pending = list(pending)
        detail = f" with pending requests {', '.join(self.pending)}" if self.pending else ""
        super().__init__(f"session {session_id!r} expired{detail}", session_id)


class SessionBusy(SessionError):
    """Another process, or another call in this one, holds the session's lease and is running
    its turn."""

    code = "session_busy"


class SessionWaiting(SessionError):
    """The session (or a subagent session under it) has open requests, so it is not deleted:
    cancel the sessions holding them first (`Runtime.cancel`), which withdraws them. A
    subagent's own turn (a message sent to it) is not cancelled with its parent's:
    `held_by` names the session of each request. `unfinished`: the sessions of the tree whose
    turn is unfinished before their TTL passes, which would refuse it too (`SessionBusy`) once
    no request is open; None if the store did not say."""

    code = "session_waiting"
    unfinished: list[str] | None = None  # also for one an older signoff or the client built

    def __init__(
        self,
        session_id: str,
        request_ids: Iterable[str],
        held_by: Iterable[str] = (),
        unfinished: Iterable[str] | None = None,
    ) -> None:
        self.request_ids = list(request_ids)
        self.held_by = list(held_by) or [session_id] * len(self.request_ids)
        self.unfinished = None if unfinished is None else list(unfinished)
        listed = ", ".join(
            rid if holder == session_id else f"{rid} of subagent session {holder!r}"
            for rid, holder in zip(self.request_ids, self.held_by, strict=False)
        )
        holders = {session_id, *self.held_by}
        super().__init__(
            f"session {session_id!r} waits on open requests ({listed}): cancel "
            f"{'it' if len(holders) == 1 else 'the sessions holding them'} first",
            session_id,
        )


class SubagentSession(SessionError):
    """The session is a subagent's whose parent session still exists: it is part of the
    parent's conversation, deleted only with it (delete the top session instead)."""

    code = "subagent_session"

    def __init__(self, session_id: str, parent_id: str) -> None:
        self.parent_id = parent_id
        super().__init__(
            f"session {session_id!r} is a subagent's of session {parent_id!r}: delete the "
            "top session instead",
            session_id,
        )


class SubagentOrphaned(SessionError):
    """A subagent's session its parent no longer waits on, asked to run: a retry of its failed
    delegated turn whose parent read the failure as its delegate call's result, or whose turn
    ended (run again, it would only spend, its result read by no one: send the subagent a
    message instead); or a message or prompt to it once its parent, or a session above that,
    passed its TTL with its turn unfinished (`lapsed`, that session's id): its conversation is
    over, as an expired session's is."""

    code = "subagent_orphaned"

    def __init__(self, session_id: str, parent_id: str, *, lapsed: str | None = None) -> None:
        self.parent_id = parent_id
        self.lapsed = lapsed
        if lapsed is None:
            message = (
                f"session {session_id!r} is a subagent's whose delegated turn failed, and its "
                f"parent session {parent_id!r} no longer waits on it (it read the failure as its "
                "delegate call's result, or its turn ended): a retry is not run; send the "
                "subagent a message to start a turn of its own"
            )
        else:
            above = "," if lapsed == parent_id else f", under session {lapsed!r},"
            message = (
                f"session {session_id!r} is a subagent's of session {parent_id!r}{above} which "
                "passed its TTL before its turn ended: the conversation is over, and the "
                "subagent takes no more messages; start a new conversation"
            )
        super().__init__(message, session_id)


class SessionLimitReached(SessionError):
    """The session hit one of its agent's limits (tokens, cost, steps)."""

    code = "session_limit_reached"


class AnswerError(SignoffError):
    """An answer that cannot be applied; nothing was claimed."""

    code = "answer_error"

    def __init__(self, message: str, request_ids: Iterable[str] = ()) -> None:
        super().__init__(message)
        self.request_ids = list(request_ids)


class UnknownRequest(AnswerError):
    """Request ids that were never requested in this session."""

    code = "unknown_request"

    def __init__(self, session_id: str, request_ids: Iterable[str]) -> None:
        ids = list(request_ids)
        super().__init__(f"unknown request id(s) in session {session_id!r}: {', '.join(ids)}", ids)


class PartialAnswer(AnswerError):
    """A batch of decisions that leaves pending requests of the session unanswered (`way_out`
    says what to do when no one batch can answer them all), or a prompt (`generate`,
    `schedule`) sent while requests are open (`prompt`), which must be answered first or
    steered past with `send`."""

    code = "partial_answer"

    def __init__(
        self,
        session_id: str,
        request_ids: Iterable[str],
        questions: Iterable[str] = (),
        *,
        prompt: bool = False,
        way_out: str | None = None,
    ) -> None:
        ids = list(request_ids)
        if prompt:  # no answer was given: say what the prompt waits on, and what to do
            message = (
                f"session {session_id!r} is waiting on {', '.join(ids)}: a prompt starts no "
                "turn while a request is open; answer it (generate(approvals=...) or "
                "respond()), or send() the message, which answers or steers the waiting turn"
            )
        else:
            message = (
                f"every pending request of session {session_id!r} must be answered in one "
                f"call{'' if way_out is None else f' ({way_out})'}; unanswered: {', '.join(ids)}"
            )
        # A decision cannot answer a question: say how it is answered, else the message
        # sends the caller to add a decision for it, which `InvalidAnswer` then refuses.
        if asked := [rid for rid in questions if rid in ids]:
            one = len(asked) == 1
            message += (
                f" ({', '.join(asked)} {'is a question' if one else 'are questions'}, which a"
                f" decision does not answer: answer {'it' if one else 'them'} first with"
                f" respond(), over HTTP POST /v1/sessions/{session_id}/responses)"
            )
        super().__init__(message, ids)


class ConflictingAnswer(AnswerError):
    """A second answer that differs from the one already recorded."""

    code = "conflicting_answer"


class RequestClosed(AnswerError):
    """The request is no longer open: withdrawn, expired, ignored or cancelled."""

    code = "request_closed"


class StaleAnswer(AnswerError):
    """The answer names an input hash that is not the request's: the reviewer saw another call."""

    code = "stale_answer"


class NotAllowed(AnswerError):
    """The responder is not allowed to settle this request."""

    code = "not_allowed"


class ModelError(SignoffError):
    """The model call failed or returned something unusable. `usage` is what a reply refused
    as unusable cost (it was billed, so the failed turn counts it against the session's
    budgets); None when no reply came. `context_tokens`, as `ModelResponse.context_tokens`:
    how much of that reply's input the next call reads again, when not all of it. `start_over`:
    the reply's paused parts (`ModelRequest.paused` and those journaled since) cannot be gone on
    from, so a retry of the turn asks the model afresh (they stay counted)."""

    code = "model_error"
    usage: Usage | None = None  # also for one built by an older signoff, or without __init__
    context_tokens: int | None = None
    start_over: bool = False

    def __init__(
        self,
        *args: object,
        usage: Usage | None = None,
        context_tokens: int | None = None,
        start_over: bool = False,
    ) -> None:
        super().__init__(*args)
        self.usage = usage
        self.context_tokens = context_tokens
        self.start_over = start_over


class BudgetSpent(ModelError):
    """The reply stopped at the output tokens the session's budgets had left
    (`ModelRequest.max_output_tokens`), or none was worth asking for: the turn asks to raise the
    budget (counting `usage`) rather than take half an answer. `needed`: the least output tokens
    the call must be left to be made at all (`Anthropic`'s thinking: 1,025), so the `continue`
    leaves at least that; None when one is enough."""

    needed: int | None = None  # also for one built by an older signoff, or without __init__

    def __init__(
        self,
        *args: object,
        usage: Usage | None = None,
        context_tokens: int | None = None,
        start_over: bool = False,
        needed: int | None = None,
    ) -> None:
        super().__init__(*args, usage=usage, context_tokens=context_tokens, start_over=start_over)
        self.needed = needed


class StepFailed(SignoffError):
    """Raised on replay of a journaled step that raised an exception signoff cannot raise
    again as it was (its class is not loaded, or not rebuilt from its arguments)."""

    code = "step_failed"

    def __init__(self, step: str, error_type: str, message: str) -> None:
        super().__init__(f"step {step!r} raised {error_type}: {message}")
        self.step = step
        self.error_type = error_type
        self.error_message = message


class StoreError(SignoffError):
    """The store failed or holds data signoff cannot use."""

    code = "store_error"


class SchemaVersionError(StoreError):
    """Stored data was written by a newer schema version; it is refused, not guessed at. Also
    a store of an older schema opened with `migrate=False`: `signoff db upgrade` upgrades it."""

    code = "schema_version"


class StoreDamaged(StoreError):
    """A stored row cannot be read back, as a hand edit or a half-restored copy left it: an
    event's or snapshot's data that does not decode (or names a format or type code this
    signoff does not know), an event's fields of the wrong types, a request row, or a number a
    SQLite session row keeps. Reading it again gives the same, so it is not retried, and a
    server's listing leaves its session out; the store failing, busy or down is a plain
    `StoreError` or one of its other classes, and so are the state's own checks that find a
    session's readable rows disagreeing. It is sent and told as a `StoreError` (no code of its
    own)."""


class StoreGone(StoreError):
    """The store's file was deleted or replaced (or its PostgreSQL schema dropped) after this
    process opened it: waiting does not help, only opening it anew (restarting the process). A
    table dropped from a schema at this signoff's version is a plain `StoreError` (damaged)."""

    code = "store_gone"


class AppendConflict(StoreError):
    """The session's head moved since it was read: someone else appended first."""

    code = "append_conflict"


class LeaseLost(StoreError):
    """The lease under which we appended (or ran a tool body) was taken over by another
    worker, or given up just before it lapsed, no renewal getting through."""

    code = "lease_lost"


class ChildHeld(LeaseLost):
    """A call's delegate call gave up waiting (`lease_wait`) for its subagent's session, which
    another drive holds: the parent's drive stops as if another held the parent's turn (the
    call answers `running`), recording nothing; never raised to a caller."""


class EventsRewritten(StoreError):
    """The event at `seq` that a follower of the session showed is gone from the store, or is
    another one: the store lost commits (a crash, a restore) and the session may have run on
    from before it. Read the session again from an earlier seq, or from the start."""

    code = "events_rewritten"

    def __init__(self, session_id: str, seq: int, message: str | None = None) -> None:
        super().__init__(
            message
            or f"session {session_id!r}: the event {seq} this follower showed is no longer in "
            "the store as it was (the store lost commits); read the session again"
        )
        self.session_id = session_id
        self.seq = seq


class StoreUnavailable(StoreError):
    """The database server has been down or unreachable longer than a restart takes (the call
    failed at once instead of waiting), or did not answer a call on its connection within the
    store's `operation_timeout` (the connection was dropped); try again later (`retry_after`
    seconds is a hint)."""

    code = "store_unavailable"
    retry_after = 5


class StoreBusy(StoreError):
    """Every connection to the database (or a SQLite file's lock) stayed in use for as long as a
    call made for an HTTP request waits (`stores.promptly()`), before the request wrote anything:
    nothing was written; try again soon (`retry_after` seconds is a hint)."""

    code = "store_busy"
    retry_after = 1


class RemoteError(SignoffError):
    """An error a signoff server reported with a code the client does not know (`.code`, the
    server's stable error code, and `.status`, the HTTP status), an answer that is not a signoff
    server's (`http_error`), or no answer at all (status 0: `unreachable`, `timeout`,
    `connection_lost`; a call that starts a conversation or sends a message then carries the
    `.idempotency_key` to send it again with, which the server applies once)."""

    def __init__(
        self, message: str, code: str, status: int, *, idempotency_key: str | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.idempotency_key = idempotency_key  # to retry a call that got no answer with


_E = TypeVar("_E", bound=StoreError | asyncio.CancelledError)


def unwritten(exc: _E) -> _E:
    """`exc`, marked as the failure of a store call that certainly wrote nothing: it waited for a
    SQLite file's lock or a pool's connection, and none came, or it was cancelled as it waited
    for the lock (`wrote_nothing`)."""
    vars(exc)["_unwritten"] = True  # the instance's own: a CancelledError has no such attribute
    return exc


def history_lost(exc: StoreError) -> StoreError:
    """`exc`, marked as the refusal of a drive's commit by a store that lost commits the drive
    had made (`record_fenced`)."""
    vars(exc)["_history_lost"] = True
    return exc


def record_fenced(exc: BaseException) -> bool:
    """Whether an outcome whose record `exc` refused is left to whichever drive goes on with
    the session (`Unrecorded.keep`): this one's lease was lost, or the store lost commits it
    had made (`history_lost`), so it cannot keep the session from running the call again."""
    return isinstance(exc, LeaseLost) or vars(exc).get("_history_lost") is True


def wrote_nothing(exc: BaseException) -> bool:
    """Whether the store call that raised `exc` certainly wrote nothing: refused as busy
    (`StoreBusy`), given up waiting for a lock or connection, or cancelled while it waited for a
    SQLite file's lock (`unwritten`). Any other failure, or cancel, may have been written all
    the same (a PostgreSQL COMMIT whose connection was lost, or whose wait was cancelled)."""
    if isinstance(exc, StoreBusy):
        return True
    marked = isinstance(exc, StoreError | asyncio.CancelledError) and vars(exc).get("_unwritten")
    return marked is True
