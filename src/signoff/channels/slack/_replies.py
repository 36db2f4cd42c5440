"""Typed replies in the thread of a request's Slack message, read from Slack's Events API.

A reply goes to the request's session as a follow-up message from the person who typed it
(`Runtime.send`), so it answers the session's first open request when it names one of its
options or the request takes free text, and otherwise steers the turn or waits for its end, as
any follow-up message does. Only someone who may answer the thread's request, or the person
the turn serves (the requester four eyes excludes, say: `send` refuses their approve), is
heard: anyone else in the channel is told nothing was sent. Each event is saved in the channel
state before Slack is acknowledged and is sent with its event id as the idempotency key: one
acknowledged and then lost to a crash is sent by the next start, and one handled twice is
delivered once.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..._answers import closed_text, match
from ..._exceptions import SignoffError, StoreDamaged, StoreError
from ..._lapsed_trees import lapsed_in_tree
from ..._messages import first_open
from ..._results import Outcome
from ..._text import is_blank
from .._base import QUEUED_NOTE, logger, not_accepted, off_loop, waiting_until
from ._identity import SlackUserUnknown
from ._inbox import RESUME_AFTER, RETRY_WINDOW, Inbox, damaged_note, seconds
from ._payloads import SlackPayloadError, check_ids, envelope_of, member_of
from ._speakers import policy_refuses

if TYPE_CHECKING:
    from ..._state import SessionState
    from ...stores import StoredRequest
    from ._channel import SlackChannel

__all__ = [
    "CHECKS_PER_SWEEP",
    "KEEP_THREADS",
    "RETRY_WINDOW",
    "ThreadReplies",
    "outcome_note",
    "thread_key",
]

KEEP_THREADS = 7 * 86400.0  # seconds the thread of a closed request still takes replies
# Requests a sweep looks up whose thread the store keeps open past KEEP_THREADS (bounded: each
# is one read, and a request open that long is kept anew, so the next sweeps look at others).
CHECKS_PER_SWEEP = 100
_EVENT_ID = re.compile(r"[A-Za-z0-9_.-]{1,100}")  # it becomes part of an idempotency key
_LEADING_MENTION = re.compile(r"^\s*<@([A-Z0-9]+)(?:\|[^>]*)?>[\s:,]*")
# The subtypes of a message a person typed: none, a reply also sent to the channel
# (thread_broadcast), one with files attached (file_share: its text is what was typed) and
# one of /me (me_message). Others are edits, deletions, joins and bots' posts. A tuple: `in`
# compares, where a set would hash a subtype of the wrong type (a list) and raise.
_TYPED = (None, "thread_broadcast", "file_share", "me_message")


def _from_bot(event: dict[str, Any]) -> bool:
    """Whether an app posted the message: a bot's post carries `bot_id`; a file another app
    uploaded with its bot token carries its bot user and `bot_profile` or `display_as_bot`."""
    return (
        bool(event.get("bot_id") or event.get("bot_profile")) or event.get("display_as_bot") is True
    )


@dataclass(frozen=True, slots=True)
class TypedReply:
    """One message a person typed in a request's thread, as the Events API delivered it."""

    event_id: str
    request_id: str
    team: str
    user: str
    channel: str
    thread: str
    text: str


def thread_key(channel: str, ts: str) -> str:
    """The memo naming the request whose message is `ts` in `channel`."""
    return f"thread:{channel}:{ts}"


def _thread_of(envelope: dict[str, Any]) -> tuple[str, str] | None:
    """The channel and thread of the person's message in a thread an event carries, if it
    carries one (read as `_reply` reads it; what it refuses is refused there, and an id no
    store can look up is a `SlackPayloadError` here too)."""
    event = envelope.get("event")
    if not isinstance(event, dict) or event.get("type") != "message" or _from_bot(event):
        return None
    if event.get("subtype") not in _TYPED:
        return None
    thread, ts, where = event.get("thread_ts"), event.get("ts"), event.get("channel")
    if not isinstance(thread, str) or thread == ts or not isinstance(where, str):
        return None
    check_ids(thread=thread, channel=where)  # before the store is asked of them
    return where, thread


def outcome_note(outcome: Outcome) -> str | None:
    """What a person is told about an answer that did not settle its request as given."""
    if outcome.outcome == "counted" and outcome.applied:
        return f"Your approval was counted ({outcome.reason})."
    if outcome.outcome == "counted":
        return f"You approved this request before ({outcome.reason})."
    return not_accepted(outcome)


class ThreadReplies:
    """The Events API side of a `SlackChannel`: verifies, saves and sends typed replies."""

    def __init__(self, channel: SlackChannel) -> None:
        self.channel = channel
        self.inbox = Inbox(channel, "event:", TypedReply, self._sent, "reply of event")

    async def handle(self, body: bytes, headers: Mapping[str, str]) -> dict[str, Any] | None:
        """Verify and take one Events API request; the JSON to answer with (None: empty 200).

        A reply is saved before Slack hears back (a `StoreError` if it cannot be in time, see
        `Inbox.admit`) and sent in the background. What is not a person's reply in the thread
        of a request this channel posted is acknowledged and ignored, and so is an event seen
        before (Slack's retry, `X-Slack-Retry-Num`)."""
        ch = self.channel
        ch.verify(body, headers)
        envelope = envelope_of(body)
        kind = envelope.get("type")
        if kind == "url_verification":
            challenge = envelope.get("challenge")
            if not isinstance(challenge, str):
                raise SlackPayloadError("the url_verification challenge is not a string")
            return {"challenge": challenge}
        if kind != "event_callback":
            return None
        deadline = time.monotonic() + self.inbox.ack_within
        elsewhere, over = await self._thread_elsewhere(envelope, deadline)

        def pick() -> tuple[str, TypedReply] | None:  # reads the thread memos: in the thread
            found = None if over else self._reply(envelope, elsewhere)
            return None if found is None else (found.event_id, found)

        await self.inbox.admit(pick, deadline=deadline)
        return None

    async def _thread_elsewhere(
        self, envelope: dict[str, Any], deadline: float
    ) -> tuple[str | None, bool]:
        """What the store says of the thread a reply is in: its request, when this state does
        not know the thread (a hub on another state posted its message, or closed it before
        this one took over), and whether its time is over, when this state has it open but
        the store does not (its close reached a hub on another state, or none: see
        `_closed_elsewhere`). Read by `deadline`, else a `StoreError` (Slack gets a 503 and
        sends it again)."""
        thread = _thread_of(envelope)
        shared = self.inbox.shared
        if thread is None or not shared.kept:
            return None, False

        def known() -> tuple[str | None, bool]:
            with waiting_until(deadline):
                memo = self.channel.recall(thread_key(*thread))
                found = self._request_of(*thread)
            closed = isinstance(memo, dict) and memo.get("closed_at") is not None
            return found, found is not None and not closed

        found, open_here = await off_loop(known)
        left = max(0.0, deadline - time.monotonic())
        try:
            memo = await asyncio.wait_for(shared.recall(thread_key(*thread)), left)
            if found is not None:
                over = open_here and await asyncio.wait_for(
                    self._closed_elsewhere(found, memo), max(0.0, deadline - time.monotonic())
                )
                return None, over
        except TimeoutError:
            raise StoreError("slack: the thread of a reply was not read in time") from None
        if not isinstance(memo, dict) or not isinstance(memo.get("request_id"), str):
            return None, False
        closed = memo.get("closed_at")
        if closed is not None and not seconds(closed) > self.channel.clock() - KEEP_THREADS:
            return None, False
        return str(memo["request_id"]), False

    async def _closed_elsewhere(self, request_id: str, memo: Any) -> bool:
        """Whether the thread of `request_id`, open in this state, has had its time by the
        store: closed there more than `KEEP_THREADS` seconds ago, or no longer kept there
        (dropped that long after its close) with its request closed."""
        if isinstance(memo, dict) and memo.get("request_id") == request_id:
            closed = memo.get("closed_at")
            return closed is not None and not seconds(closed) > self.channel.clock() - KEEP_THREADS
        stored = await self.channel.runtime.store.get_request(request_id)
        return stored is None or stored.status != "pending"

    def _reply(self, envelope: dict[str, Any], elsewhere: str | None = None) -> TypedReply | None:
        """The typed reply an `event_callback` carries, or None if it carries none of ours
        (`elsewhere`: the request of its thread, as the store has it, if this state lacks
        it)."""
        try:
            event = envelope["event"]
            event_id = envelope["event_id"]
            if not isinstance(event, dict) or not _EVENT_ID.fullmatch(str(event_id)):
                raise TypeError("event must be an object and event_id Slack's kind of id")
            if event.get("type") != "message":
                return None
            if event.get("subtype") not in _TYPED or _from_bot(event):
                return None
            bots = {
                a.get("user_id")
                for a in envelope.get("authorizations") or []
                if isinstance(a, dict) and a.get("is_bot")
            }
            user, text = event.get("user"), event.get("text")
            thread, ts, where = event.get("thread_ts"), event.get("ts"), event.get("channel")
            if not isinstance(user, str) or not user or user in bots:
                return None
            if not isinstance(thread, str) or thread == ts or not isinstance(where, str):
                return None  # not a reply in a thread
            # `user_team` is the person's own (a Slack Connect guest's is not the host's); on
            # Enterprise Grid a member is named by the organization (`member_of`). The
            # installation's ids are its authorization's: in a shared channel the envelope's
            # may be another organization's.
            own = event.get("user_team") or event.get("team") or envelope.get("team_id")
            auths = envelope.get("authorizations")
            first = auths[0] if isinstance(auths, list) and auths else None
            auth = first if isinstance(first, dict) else envelope
            team = member_of(own, auth.get("team_id"), auth.get("enterprise_id"))
            if not isinstance(team, str) or not isinstance(text, str):
                raise TypeError("team and text must be strings")
            check_ids(user=user, team=team, channel=where, thread=thread)
        except (KeyError, TypeError) as exc:
            raise SlackPayloadError(f"unreadable Slack event: {exc!r}") from None
        request_id = self._request_of(where, thread) or elsewhere
        text = _plain(text, bots)
        if request_id is None or is_blank(text):
            return None
        return TypedReply(event_id, request_id, team, user, where, thread, text)

    def _request_of(self, channel: str, ts: str) -> str | None:
        """The request whose message is `ts`: its thread memo (None once closed more than
        `KEEP_THREADS` seconds ago, also before a sweep drops it), or (posted before these
        memos were kept) the message memo of a request still open."""
        ch = self.channel
        memo = ch.recall(thread_key(channel, ts))
        if isinstance(memo, dict) and isinstance(memo.get("request_id"), str):
            closed = memo.get("closed_at")
            if closed is not None and not seconds(closed) > ch.clock() - KEEP_THREADS:
                return None
            return str(memo["request_id"])
        for key, where in ch.memos("msg:"):
            if (
                isinstance(where, dict)
                and where.get("channel") == channel
                and where.get("ts") == ts
            ):
                return key.removeprefix("msg:")
        return None

    # -- sending --------------------------------------------------------------------------------

    async def resume(self, *, older_than: float | None = None) -> None:
        """Send the saved replies no process finished (all of them, or those saved more than
        `older_than` seconds ago), and drop the memos of handled events and old threads."""
        await self.inbox.resume(older_than=older_than)
        await off_loop(self._tidy_threads)

    def _tidy_threads(self) -> None:
        """Drop the memos of threads closed more than `KEEP_THREADS` seconds ago."""
        ch = self.channel
        now = ch.clock()
        for key, memo in ch.memos("thread:"):
            closed = memo.get("closed_at") if isinstance(memo, dict) else 0  # None: open
            if closed is not None and not seconds(closed) > now - KEEP_THREADS:
                ch.forget(key)

    async def tick(self) -> None:
        """Now and then: resume replies a process that died left, and drop old memos (the
        store's of threads closed more than `KEEP_THREADS` seconds ago too)."""
        if self.inbox.due():
            await self.resume(older_than=RESUME_AFTER)
            await self._tidy_shared_threads()
        await self.inbox.adopt(due=True)

    async def _tidy_shared_threads(self) -> None:
        """Drop the store's memos of threads closed more than `KEEP_THREADS` seconds ago. One
        still open after that long is looked up (`CHECKS_PER_SWEEP` at most, the oldest first):
        its request closed without any hub hearing of it (a channel removed, a close given up
        on) is marked closed now, so a later sweep drops it; one unknown to the store is
        dropped; one still open is kept anew, so the next sweeps look at the others first."""
        shared = self.inbox.shared
        store = self.channel.runtime.store
        checks = CHECKS_PER_SWEEP
        try:
            for key, memo, age in await shared.listed("thread:"):
                if age <= KEEP_THREADS:
                    continue
                rid = memo.get("request_id") if isinstance(memo, dict) else None
                if not isinstance(rid, str) or memo.get("closed_at") is not None:
                    await shared.keep({key: None})
                    continue
                if checks <= 0:
                    continue
                checks -= 1
                stored = await store.get_request(rid)
                if stored is None:
                    await shared.keep({key: None})
                elif stored.status != "pending":
                    now = self.channel.runtime.now()
                    await shared.keep({key: {"request_id": rid, "closed_at": now}})
                else:
                    await shared.keep({key: memo})
        except SignoffError as exc:
            logger.warning("slack: the threads kept in the store were not tidied: %s", exc)

    async def _sent(self, reply: TypedReply, again: bool) -> None:
        """`_send`; a request whose stored row is damaged (it reads the same every time) is
        told of and let out, for the inbox to log once."""
        try:
            await self._send(reply, again)
        except StoreDamaged:
            where = {"channel": reply.channel, "user": reply.user, "thread_ts": reply.thread}
            await self.channel._tell(where, damaged_note(reply.request_id))
            raise

    async def _send(self, reply: TypedReply, again: bool) -> None:
        """Deliver a reply to its request's session as its author, if they may answer (once:
        its event id is the idempotency key, so `again` only changes what a person no one can
        tell is told)."""
        ch = self.channel
        rt = ch.runtime
        where = {"channel": reply.channel, "user": reply.user, "thread_ts": reply.thread}
        stored = await rt.store.get_request(reply.request_id)
        if stored is None:  # its session was deleted: told, as a click on it is
            logger.warning("slack: a reply in the thread of unknown request %s", reply.request_id)
            sent = "may not have been sent" if again else "was not sent"
            await ch._tell(where, f"Your reply {sent}: request {reply.request_id} is gone.")
            return
        try:
            principal = await ch.identities.principal(reply.team, reply.user)
        except SlackUserUnknown as exc:
            sent = "may not have been sent" if again else "was not sent"  # an earlier run's
            await ch._tell(where, f"Your reply {sent}: {str(exc).rstrip('.')}.")
            return
        state = await rt.state(stored.request.session_id)
        if await self._closed_for_good(stored, state, reply.text, where):
            return
        first = first_open(state.pending_requests())
        serves = None if state.turn is None else state.turn.principal
        same_person = serves is None or principal.same_as(serves)
        # The person the turn serves talks to their own session, as through `send`, also when
        # four eyes bars them from approving the call (their approve is refused by `send`).
        own = serves is not None and principal.same_as(serves)
        refused = None
        if not own and not await rt._may_answer(stored.request, principal):
            refused = stored.request
        answers = first is not None and match(first, reply.text) is not None
        if refused is None and first is not None and answers:
            # It would answer `first`: without the right to, it must not become a message.
            refused = None if same_person or await rt._may_answer(first, principal) else first
        if refused is None and not own and not answers:
            # A message, which no response policy judges: sent only by someone it would let
            # answer the thread's request (else anyone could queue a turn in the session).
            if await policy_refuses(rt, stored.request, principal):
                refused = stored.request
        if refused is not None:
            await ch._tell(where, f"You may not answer request {refused.id}: nothing was sent.")
            return
        try:
            result = await rt.send(
                state.id,
                reply.text,
                principal=principal,
                idempotency_key=f"slack-event:{reply.event_id}",
            )
        except StoreError:
            raise
        except SignoffError as exc:  # an expired session, a message too long, ...
            await ch._tell(where, f"Your reply was not delivered: {exc}")
            return
        for outcome in result.outcomes:
            note = outcome_note(outcome)
            if note is not None:
                await ch._tell(where, note)
        if result.queued:  # else they would think the agent read it in the turn now running
            await ch._tell(where, QUEUED_NOTE)

    async def _closed_for_good(
        self, stored: StoredRequest, state: SessionState, text: str, where: dict[str, str]
    ) -> bool:
        """Whether a reply answering the thread's request was refused, its author told why, as
        a press of its button is told: the request was open when read and closed by the read of
        its session, or it is expired or withdrawn and its session, or one above it, passed its
        TTL (whoever recorded that: a sweep, a page of the parent). Else it would reach the
        session as a message, a new turn of a subagent whose parent is gone."""
        request = stored.request
        if any(p.id == request.id for p in state.pending_requests()):
            return False
        if match(request, text) is None:
            return False
        rt = self.channel.runtime
        now = await rt.store.get_request(request.id)
        if now is None or now.status == "pending":
            return False
        if stored.status != "pending" and not (
            now.status in ("expired", "withdrawn")
            and await lapsed_in_tree(state, rt.now(), rt._state) is not None
        ):
            return False
        outcome = (now.resolution or {}).get("outcome")
        on_timeout = (now.resolution or {}).get("on_timeout")
        closed = closed_text(now.request, now.status, outcome, on_timeout)
        await self.channel._tell(
            where, f"This request can no longer be answered: {closed}. Your reply was not sent."
        )
        return True


def _plain(text: str, bots: set[Any]) -> str:
    """A message's text as typed: a leading mention of the bot dropped, a link Slack made of
    what was typed read as what it shows (a typed `acme.io` arrives as
    `<http://acme.io|acme.io>`), then Slack's escapes undone. Mentions of people and channels
    are kept as Slack writes them (`<@U1>`): they name someone exactly."""
    mention = _LEADING_MENTION.match(text)
    if mention is not None and mention.group(1) in bots:
        text = text[mention.end() :]
    text = _LINK.sub(lambda link: link.group(2) or link.group(1).removeprefix("mailto:"), text)
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&").strip()


_LINK = re.compile(r"<((?:https?://|mailto:)[^<>|]*)(?:\|([^<>]*))?>")
"""A link in Slack's markup, with the text it shows: a typed `<` arrives as `&lt;`, so a `<`
in the text is Slack's own."""
