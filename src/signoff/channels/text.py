"""`TextChannel`: channels that show only text (SMS, email, issue comments, a terminal).

They show one request at a time, in the order a typed message answers them (a session-limit
prompt first, then the order the requests were opened), and post the next only once the current
one is answered, so a typed reply always answers the request the person sees.
`TerminalTextChannel` (in `_terminal_text`) puts the CLI's inline prompts behind the same
interface.
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from .._exceptions import (
    AnswerError,
    NotAllowed,
    SignoffError,
    UnknownRequest,
    UnknownSession,
    UsageError,
)
from .._option_names import how_to_choose, named_options, numbers_clash
from .._results import Outcome
from .._text import BIDI, escape_as_json, is_blank, utc_text
from .._types import InputRequest, InputResponse, Principal
from ._base import (
    DELETED,
    QUEUED_NOTE,
    Channel,
    Erased,
    Escalation,
    Resolution,
    describe_principal,
    not_accepted,
    off_loop,
    settled_as,
)
from ._retries import doubled
from ._text_replies import parse_reply
from ._text_shown import (
    adopt_shown,
    closed_on_show,
    keep_escalation,
    keep_shown,
    shown_in_store,
    told_escalation,
)
from .terminal import compact_json

if TYPE_CHECKING:
    pass

__all__ = ["TextChannel", "parse_reply"]

_MAX_RESHOW_WAIT = 60.0  # seconds: the longest a tick waits to show again what start could not
_AT_ONCE = -sys.float_info.max  # `_reshow_at` for the first tick (after the first poll's entries)
_ESCAPED = re.compile(f"{BIDI.pattern}|[\ud800-\udfff]")


def _shown(text: str) -> str:
    """`text` with its bidirectional controls and lone surrogates (in a request stored before
    `ctx.ask` refused them, which no UTF-8 transport sends) written as `\\u202e`-style escapes."""
    return _ESCAPED.sub(escape_as_json, text)


def _when(at: float) -> str:
    return utc_text(at, "%Y-%m-%d %H:%M UTC")


def _deadline(request: InputRequest) -> list[str]:
    """The line on a request's deadline: when it expires (and what then, unless it is just
    denied), or the group it was escalated to."""
    if request.escalated_to is not None:
        return [f"Escalated to {request.escalated_to}: no one decided before the deadline."]
    if request.expires_at is None:
        return []
    then = ""
    if request.on_timeout == "approve":
        then = "; then it is approved automatically"
    elif request.on_timeout == "escalate" and request.escalate_to:
        then = f"; then it is escalated to {request.escalate_to}"
    return [f"Expires {_when(request.expires_at)}{then}."]


class TextChannel(Channel):
    """Shows open requests one at a time, oldest first; `reply()` answers the one shown.

    Subclasses implement `send_text` (deliver one message to the person). A reply that answers
    nothing gets a hint back with `unmatched="hint"` (the default); with `"send"` it goes to the
    shown request's session as a message (`Runtime.send`), which steers the turn, unless the
    session would take it as the answer to another request than the one shown.
    """

    name = "text"

    def __init__(
        self,
        *,
        name: str | None = None,
        accepts: Callable[[InputRequest], bool] | None = None,
        unmatched: Literal["hint", "send"] = "hint",
    ) -> None:
        super().__init__(name=name, accepts=accepts)
        if unmatched not in ("hint", "send"):
            raise UsageError(f"unmatched must be 'hint' or 'send', not {unmatched!r}")
        self.unmatched = unmatched
        self._queue: list[InputRequest] = []
        self._lock = asyncio.Lock()
        self._started = False  # by a hub that delivers to it (else it stands by, or is not run)
        self._delivered: str | None = None  # the request whose message was last sent whole
        self._adopted = False  # the store's memo of the request shown is the state's since start
        # When `tick` shows again the request `start` failed to show, or tells again how the
        # one shown closed (the hub's clock; -inf: a second after the next tick), and how often
        # it failed since; None: nothing to do.
        self._reshow_at: float | None = None
        self._reshows = 0
        # The closes `on_resolved` failed to tell: the hub gives up on an entry, and the request
        # shown, closed, would stay on show for good (every reply refused, none other shown).
        self._untold: dict[str, tuple[InputRequest, Resolution]] = {}

    async def send_text(self, text: str) -> None:
        """Deliver one message to the person (SMS, comment, chat line...)."""
        raise NotImplementedError(f"{type(self).__name__} must implement send_text()")

    async def _say(self, text: str) -> None:
        """`send_text`, with bidirectional controls (a model's, another reviewer's) shown as
        `\\u202e` escapes, as on the dashboard and in Slack: they reorder what the person reads."""
        await self.send_text(_shown(text))

    @property
    def current(self) -> InputRequest | None:
        """The request the person sees now (the oldest open one), if any."""
        return self._queue[0] if self._queue else None

    @property
    def waiting(self) -> list[InputRequest]:
        """Every open request this channel holds, the shown one first."""
        return list(self._queue)

    # -- rendering ----------------------------------------------------------------------------

    def render(self, request: InputRequest) -> str:
        """The text that shows a request, with how to answer it (bidirectional controls, which
        reorder what the person reads, and lone surrogates as `\\u202e` escapes, as in every
        message sent)."""
        if request.kind == "tool-approval":
            lines = [
                f"{request.agent} wants to run {request.tool_name}({compact_json(request.input)})"
            ]
            if request.payload is not None:
                lines.append(f"It asks for approval of: {compact_json(request.payload)}")
            if request.approvers > 1:
                lines.append(f"Needs {request.approvers} approvals ({request.progress} so far).")
            lines += _deadline(request)
            lines.append("Reply yes to approve or no to deny (a reason may follow: no: why).")
            return _shown("\n".join(lines))
        lines = [request.question or f"{request.agent} asks for input"]
        lines += [
            f"{i}. {o.label}" + (f" - {o.description}" if o.description else "")
            for i, o in enumerate(request.options, 1)
        ]
        lines += _deadline(request)
        lines.append(self._hint(request))
        return _shown("\n".join(lines))

    def _hint(self, request: InputRequest) -> str:
        if request.kind == "tool-approval":
            return "Reply yes to approve or no to deny (a reason may follow: no: why)."
        n = len(request.options)
        if n and numbers_clash(request.options):  # a typed 2 may be a label: #2 is the second
            other = "your own answer" if request.allow_text else "an option's name"
            return f"Reply with # and a number (#1-#{n}) or {other}."
        if n and request.allow_text:
            return f"Reply with a number (1-{n}) or your own answer."
        if n:
            return f"Reply with a number (1-{n}) or an option's name."
        return "Reply with your answer."

    def render_resolution(self, request: InputRequest, resolution: Resolution) -> str:
        """The text that says how a request closed elsewhere (who, how, when); `_say` escapes
        its bidirectional controls as it sends it, as every message but `render`'s."""
        what = request.tool_name if request.kind == "tool-approval" else "the question"
        when = _when(resolution.closed_at(request))  # a lapse at its deadline, not when recorded
        by = describe_principal(resolution.by)
        if resolution.outcome == "approved":
            text = f"{what} was approved by {by} at {when}"
        elif resolution.outcome == "cancelled" and resolution.status == "settled":
            text = f"{what} was denied by {by} at {when}"
        elif resolution.outcome == "answered":
            text = f"{what} was answered by {by} at {when}: {resolution.value}"
        elif resolution.approved_on_timeout:  # approved by no one
            text = f"{what} was approved automatically when its deadline passed at {when}"
        elif resolution.outcome == "expired":
            text = f"{what} expired at {when}"
        elif resolution.outcome == DELETED:
            text = f"{what} was withdrawn at {when}: its session was deleted"
            text += "" if resolution.by is None else f" by {by}"
        else:
            text = f"{what} was withdrawn at {when}"
        if resolution.reason and resolution.outcome != "answered":
            text += f" ({resolution.reason})"
        return text + "."

    def render_escalation(self, request: InputRequest, escalation: Escalation, kept: bool) -> str:
        """The text that says the request shown was handed to a group (and, unless `kept`, that
        this channel no longer shows it); `_say` escapes its bidirectional controls."""
        what = request.tool_name if request.kind == "tool-approval" else "the question"
        text = f"{what} was escalated to {escalation.to}"
        if escalation.reason:
            text += f" ({escalation.reason})"
        return text + ("." if kept else "; it is no longer shown here.")

    # -- what the hub tells it ----------------------------------------------------------------

    async def start(self, open_requests: Sequence[InputRequest]) -> None:
        """Hold the open requests as they stand now, and the closed one on show (by the memo,
        also in a new process), whose close a poll tells, else the first tick (from the trail),
        or the one on show not listed though pending (its session's TTL passed unrecorded),
        whose close a poll tells when it is recorded; a channel started again after standing by
        (another hub delivered, and told of closes, meanwhile) drops the others that closed
        since, which no poll tells it of."""
        self._started = True
        self._adopted = False
        async with self._lock:
            now_open = {r.id: r for r in open_requests}
            self._queue = [now_open.get(r.id, r) for r in self._queue]
            known = {r.id for r in self._queue}
            for r in sorted(open_requests, key=lambda r: (r.created_at, r.index or 0)):
                if r.id not in known:
                    self._queue.append(r)
            if self._queue:
                self._reshow_at, self._reshows = -math.inf, 0  # no entry the hub retries shows it
            await self._put_in_order()  # adopts the store's memo of the one shown
            on_show = await closed_on_show(self, now_open)
            closed = None
            if on_show is not None:  # shown still, closed or lapsed unrecorded
                held, how = on_show
                self._queue = [held, *(r for r in self._queue if r.id != held.id)]
                if how is not None:  # told by the replayed `on_resolved`, else the first tick
                    closed = self._untold[held.id] = (held, how)
            if self._queue:
                shown = await off_loop(self.recall, "shown")
                self._queue = [r for r in self._queue if r.id in now_open or r.id == shown]
                await self._show_unseen()
                self._reshow_at, self._reshows = (None if closed is None else _AT_ONCE), 0

    async def tick(self, now: float) -> None:
        """Show the current request if `start` failed to, and tell how the one shown closed if
        `on_resolved` failed to (the service was down) or no poll told the close `start` found
        (at the first tick): the hub retries an entry only so many times, and no entry is left
        to retry a start. Tried a second after, then after 2 s,
        4 s... up to a minute while it keeps failing (the hub's retries may do it before)."""
        if self._reshow_at == -math.inf:
            self._reshow_at = now + 1.0
        if self._reshow_at is None or now < self._reshow_at:
            return
        try:
            for request, resolution in list(self._untold.values()):
                await self.on_resolved(request, resolution)
            async with self._lock:
                await self._put_in_order()  # if reading the request shown failed at `start`
                await self._show_unseen()
        except Exception:
            self._reshows += 1
            self._reshow_at = now + min(_MAX_RESHOW_WAIT, doubled(1.0, self._reshows))
            raise
        self._reshow_at, self._reshows = None, 0

    async def on_requested(self, request: InputRequest) -> None:
        async with self._lock:
            if not any(r.id == request.id for r in self._queue):
                self._queue.append(request)
                await self._put_in_order()
            await self._show_unseen()  # on the hub's retry too, if showing it failed before

    async def _put_in_order(self) -> None:
        """The order a typed message answers requests in: a session-limit prompt before any
        other, else the order they were asked; the request on show stays until answered, also
        when a start rebuilds the queue in the order they were asked and an older one joined it
        later (escalated to this channel's group): the person's next reply is meant for it,
        also when a hub on another state (another machine) showed it (`adopt_shown`)."""
        if not self._adopted:
            await adopt_shown(self)
            self._adopted = True
        shown = await off_loop(self.recall, "shown")
        head = [r for r in self._queue if r.id == shown][:1]
        rest = sorted(
            (r for r in self._queue if r.id != shown), key=lambda r: r.kind != "session-limit"
        )
        self._queue = head + rest

    async def on_updated(self, request: InputRequest) -> None:
        async with self._lock:
            for i, r in enumerate(self._queue):
                if r.id == request.id:
                    self._queue[i] = request

    async def on_escalated(self, request: InputRequest, escalation: Escalation) -> None:
        """The person is told if it is the request they see, once per group it went to (the
        hub's retry after a later send failed, or a hub started again, does not repeat it); one
        this channel no longer takes as escalated (`accepts`) leaves the queue and the next is
        shown."""
        async with self._lock:
            index = next((i for i, r in enumerate(self._queue) if r.id == request.id), None)
            if index is not None and request.status == "pending":
                kept = self.accepts(request)
                told = await told_escalation(self, request.id)
                if index == 0 and told != escalation.to:
                    # told before the queue changes, so the hub's retry of a failed send tells it
                    await self._say(self.render_escalation(request, escalation, kept))
                    await keep_escalation(self, request.id, escalation.to)
                if kept:
                    self._queue[index] = request
                else:
                    del self._queue[index]
                    await keep_escalation(self, request.id, None)  # it is not shown here again
            await self._show_unseen()

    async def on_resolved(self, request: InputRequest, resolution: Resolution) -> None:
        try:
            await self._resolved(request, resolution)
        except Exception:
            self._untold[request.id] = (request, resolution)  # for `tick` to tell again
            if self._reshow_at is None:
                self._reshow_at, self._reshows = -math.inf, 0
            raise
        self._untold.pop(request.id, None)

    async def _resolved(self, request: InputRequest, resolution: Resolution) -> None:
        async with self._lock:
            index = next((i for i, r in enumerate(self._queue) if r.id == request.id), None)
            if index == 0:  # told before it leaves the queue, so the hub's retry tells it again
                await self._say(self.render_resolution(request, resolution))
            if index is not None:
                del self._queue[index]
            if request.escalated_to is not None:
                await keep_escalation(self, request.id, None)
            await self._show_unseen()

    async def on_erased(self, erased: Sequence[Erased]) -> None:
        """Each erased request this channel holds closes as `on_resolved` closes it (the one
        shown told how, the next shown), from what the queue kept of it."""
        for gone in erased:
            held = next((r for r in self._queue if r.id == gone.request_id), None)
            if held is not None:
                await self.on_resolved(held, gone.resolution)

    async def _show_unseen(self) -> None:
        """Show the current request unless the person has seen it (its message may have failed:
        the service was down)."""
        current = self.current
        if current is None or await off_loop(self.recall, "shown") != current.id:
            await self._show_current()

    async def _show_current(self) -> None:
        current = self.current
        if current is None:
            if await off_loop(self.recall, "shown") is not None:
                await keep_shown(self, None)
            return
        await self.show(current)
        self._delivered = current.id  # it may be answered before its memo below is kept
        await keep_shown(self, current)

    async def show(self, request: InputRequest) -> None:
        """Put `request` in front of the person (by default: `send_text(render(request))`)."""
        await self.send_text(self.render(request))

    async def close(self) -> None:
        """Stand by: the hub stopped, or lost its claim to another that delivers now. Its queue
        is kept for a start again, but a reply no longer answers it (`reply`)."""
        self._started = False
        await super().close()

    # -- answers ------------------------------------------------------------------------------

    async def reply(self, text: str, principal: Principal | None) -> Outcome | None:
        """A message from the person: it answers the request shown now, or nothing.

        Returns what became of the answer, or None when it answered nothing (a hint was sent,
        or with `unmatched="send"` the message went to the session).
        """
        # Standing by, its queue is as it was when it stopped delivering: the memo names what
        # the delivering hub shows now.
        standby = not self._started
        request = await self._shown_elsewhere() if standby else self.current
        delivered = self._delivered  # as the reply came: one sent later it cannot answer
        if request is None:
            await self._say("Nothing is waiting for an answer.")
            return None
        if not standby and await off_loop(self.recall, "shown") != request.id:
            # Its message failed: never answer it unseen. Or it had reached the person and was
            # being recorded as shown as the reply came: under the lock, it is.
            async with self._lock:
                current = self.current
                seen = delivered == request.id and current is not None and current.id == request.id
                seen = seen and await off_loop(self.recall, "shown") == request.id
                if not seen:
                    await self._show_unseen()
            if not seen:
                return None
        response = parse_reply(request, text)
        if response is not None and await self._steers(request, response, principal):
            response = None  # a deny they may not give: sent on, as `Runtime.send` takes it
        if response is None:
            named = [] if request.kind == "tool-approval" else named_options(request.options, text)
            if len(named) > 1:  # told here, not sent on as a message (the runtime refuses it)
                await self._say(how_to_choose(request.options, named))
                return None
            if self.unmatched == "send" and not is_blank(text):
                try:
                    other = await self._answered_instead(request, text, principal)
                    if other is None:
                        sent = await self.runtime.send(
                            request.session_id, text, principal=principal
                        )
                except SignoffError as exc:  # refused before it was recorded: say so, as answers do
                    await self._say(f"Your message was not delivered: {exc}")
                    if isinstance(exc, UnknownSession | UnknownRequest):
                        await self._drop_erased(request)
                    return None
                if other is not None:  # the runtime would take it as the answer to that one
                    await self._say(
                        f"Your message was not delivered: it would answer another request"
                        f" ({other}), not the one shown here. {self._hint(request)}"
                    )
                    return None
                if sent.queued:  # else they would take it as read by the turn they see waiting
                    await self._say(QUEUED_NOTE)
                return None
            await self._say(self._hint(request))
            return None
        return await self.answer(request, response, principal)

    async def _shown_elsewhere(self) -> InputRequest | None:
        """For a channel standing by for another hub's: the open request that hub's channel of
        this name shows (the state's memo), which the person's reply reaching this process
        answers; the store's memo of it where it keeps one (that hub may be on another state)."""
        if self._state is None:
            return None
        kept, shown = await shown_in_store(self)
        if not kept:
            shown = await off_loop(self.recall, "shown")
        if not isinstance(shown, str):
            return None
        stored = await self.runtime.store.get_request(shown)
        if stored is None or stored.status != "pending" or not self.accepts(stored.request):
            return None
        return stored.request

    async def _steers(
        self, request: InputRequest, response: InputResponse, principal: Principal | None
    ) -> bool:
        """Whether `response`, with `unmatched="send"`, is a deny of an approval its sender may
        not give (four eyes excludes the requester) though the turn serves them: like any other
        message of theirs, it is sent on and steers; refused, it would withdraw nothing. Not one
        whose session was deleted (before the hub read it): answered, it is refused as such."""
        if self.unmatched != "send" or request.kind != "tool-approval":
            return False
        if response.option_id != "cancel":
            return False
        try:
            state = await self.runtime.state(request.session_id)
            serves = None if state.turn is None else state.turn.principal
            if serves is not None and (principal is None or not principal.same_as(serves)):
                return False
            return not await self.runtime._may_answer(request, principal)
        except (UnknownSession, UnknownRequest):
            return False

    async def _answered_instead(
        self, request: InputRequest, text: str, principal: Principal | None
    ) -> str | None:
        """The id of the request other than the one shown that `text`, sent to the session by
        `principal`, would answer (by `Runtime.send`'s own rule: one this channel does not show)."""
        state = await self.runtime.state(request.session_id)
        first = await self.runtime._answering(state, text, principal)
        return None if first is None or first.id == request.id else first.id

    async def answer(
        self, request: InputRequest, response: InputResponse, principal: Principal | None
    ) -> Outcome | None:
        """Submit `response` to `request` (the one shown) and show the next when it closed."""
        try:
            outcome = await self.submit(request, response, principal)
        except NotAllowed as exc:
            await self._say(f"You may not answer this request: {exc}")
            return None
        except AnswerError as exc:
            await self._say(f"This request can no longer be answered: {exc}")
            return None
        except SignoffError as exc:  # an answer of the wrong shape, an expired session, ...
            await self._say(f"Your answer was not accepted: {exc}")
            if isinstance(exc, UnknownSession | UnknownRequest):
                await self._drop_erased(request)
            return None
        if outcome.outcome == "counted":
            if outcome.applied:
                await self._say(f"Counted ({outcome.reason}); waiting for more approvals.")
            else:
                await self._say(f"You approved this request before ({outcome.reason}).")
            return outcome
        refused = not_accepted(outcome)
        if refused is not None:  # the request is open still: it stays shown (`on_escalated`)
            await self._say(refused)
            return outcome
        if not outcome.applied:  # settled the same way before: say by whom, as on_resolved would
            await self._say(await self._settled_before(request))
        async with self._lock:
            # Standing by, the delivering hub shows the next: its queue here is stale.
            if self._started and self._queue and self._queue[0].id == request.id:
                del self._queue[0]  # closed by this answer: the next one can be shown
                await self._show_current()
        return outcome

    async def _drop_erased(self, request: InputRequest) -> None:
        """Drop `request` when the store no longer has it (its session was deleted) and show
        the next: the hub tells of such a close from the deletion's entry, but one this channel
        missed would otherwise stay on show, every reply refused, no other request shown."""
        if await self.runtime.store.get_request(request.id) is not None:
            return
        async with self._lock:
            if self._queue and self._queue[0].id == request.id:
                del self._queue[0]
                await self._show_current()

    async def _settled_before(self, request: InputRequest) -> str:
        stored = await self.runtime.store.get_request(request.id)
        shown, who = settled_as(stored.resolution if stored is not None else None)
        what = request.tool_name if request.kind == "tool-approval" else "the question"
        return f"{what} was already {shown} by {who}."


def __getattr__(name: str) -> object:
    """`TerminalTextChannel`, which this module held, from `_terminal_text` (which imports
    this one), for code that imports it from here."""
    if name == "TerminalTextChannel":
        from ._terminal_text import TerminalTextChannel

        return TerminalTextChannel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
