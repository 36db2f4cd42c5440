"""`SlackChannel`: every open request as a Slack message with buttons, updated as it changes (a
quorum's count, an escalation to a group) and once it closes.

People answer with the message's controls; Slack posts the interaction to the endpoint this
channel adds to the signoff server (`create_app(..., channels=hub)`), which checks Slack's
signature, saves the interaction, acknowledges it and settles the answer in the background as
the person who pressed (`slack:<team_id>:<user_id>`, authenticator "slack", or the principal
`identify=` maps them to; see `_clicks` and `_identity`). A
reply typed in the thread of a request's message reaches the channel's Events API endpoint and
goes to the request's session as a follow-up message from that person (see `_replies`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import aiohttp
from slack_sdk.errors import SlackApiError
from slack_sdk.signature import Clock, SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient

from ..._exceptions import UsageError
from ..._json_keys import cut_repr
from ..._sync import checked_clock
from ..._types import InputRequest
from ...stores import promptly
from .._base import (
    Channel,
    ChannelUnreachable,
    Erased,
    InvalidSignature,
    RateLimited,
    Resolution,
    logger,
    off_loop,
)
from .._lease import Presence, alive
from ._adopt import retry_handlers
from ._backlog import Backlog
from ._blocks import (
    UNPARSED,
    erased_blocks,
    erased_text,
    note_text,
    request_blocks,
)
from ._clicks import Clicks
from ._identity import Identities, SlackUserMapping
from ._payloads import (
    ABSENT,
    SlackPayloadError,
    api_error,
    retry_after,
    slack_principal,
)
from ._posts import Posts, sent_fitting
from ._replies import ThreadReplies, thread_key
from ._routes import routes
from ._token import TokenRefusals

__all__ = ["SlackChannel", "SlackPayloadError", "slack_principal"]

R = TypeVar("R")

TOLERANCE = 300  # seconds: Slack's own advice for the request timestamp

# While the bot cannot reach its channel (`ABSENT` errors), the hub holds the channel's feed,
# trying again every ABSENT_WAIT seconds, instead of giving up each request in turn.
ABSENT_WAIT = 30.0

# A note (chat.postEphemeral) Slack rate-limits is sent again within these calls and seconds.
NOTE_TRIES = 4
NOTE_WAIT = 30.0

# A conversation's id: a public channel's `C…`, a private one's `G…` or `C…`, a DM's `D…`.
_CONVERSATION_ID = re.compile(r"[A-Z0-9]+")

# chat.update errors no retry can cure: the message was deleted, or can no longer be edited.
_GONE = frozenset({"message_not_found", "cant_update_message", "edit_window_closed"})


class _Clock(Clock):
    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now

    def now(self) -> float:
        return self._now()


class SlackChannel(Channel):
    """Posts requests to one Slack channel; answers arrive at the interactivity endpoint, and
    replies typed in a request's thread at the Events API endpoint.

    Give a bot `token` (and optionally `base_url`) or a ready `client` (`AsyncWebClient`), the
    conversation id `channel` to post in, and the app's `signing_secret`. Point the Slack app's
    Interactivity Request URL at `https://<your server><path>` and its Event Subscriptions
    Request URL at `https://<your server><events_path>` (None: typed replies are not read).
    The bot needs `chat:write` and the channel's history scope (`channels:history`), which a
    restart after a crash uses to find a post it never saved rather than post it again.
    The client made from `token` does not retry a post or a form's opening whose connection
    dropped (it may have been carried out); a `client` of your own keeps its retry handlers
    (slack_sdk's default does). Leave slack_sdk's `AsyncRateLimitErrorRetryHandler` out of
    one: it sleeps out any Retry-After inside the call, which the channel does itself, bounded.

    People act as `slack:<team_id>:<user_id>` unless `identify` maps them: a callable (sync or
    async) of the team id, the user id and the user's `users.info` object (needs `users:read`)
    returning their `so.Principal` on your other surfaces, or None to refuse them; `by_email`
    is one. It is asked only about members of the workspace (or Enterprise Grid organization)
    the bot token is installed in (`auth.test`) and of the team ids `external_teams` lists: a
    Slack Connect guest from elsewhere, whose email their own admin sets, stays
    `slack:<their team>:<user>`.
    """

    name = "slack"

    def __init__(
        self,
        channel: str,
        *,
        signing_secret: str,
        token: str | None = None,
        client: AsyncWebClient | None = None,
        base_url: str | None = None,
        name: str | None = None,
        accepts: Callable[[InputRequest], bool] | None = None,
        path: str = "/channels/slack/interactivity",
        events_path: str | None = "/channels/slack/events",
        clock: Callable[[], float] = time.time,
        identify: SlackUserMapping | None = None,
        external_teams: Iterable[str] | None = None,
    ) -> None:
        super().__init__(name=name, accepts=accepts)
        if not isinstance(channel, str) or not channel:
            raise UsageError("SlackChannel needs the id of the Slack channel to post in")
        if not _CONVERSATION_ID.fullmatch(channel):
            # chat.postMessage takes a name too, but the history a lost post is looked for in
            # takes only the id (a name is `channel_not_found`: the channel would wait for ever),
            # and a message's answers name the id, which `channel` is compared with.
            raise UsageError(
                f"SlackChannel needs the Slack channel's id (such as C0123ABCD, at the bottom of "
                f"the channel's details in Slack), not {cut_repr(channel, 80)}"
            )
        if not isinstance(signing_secret, str) or not signing_secret.strip():
            raise UsageError("SlackChannel needs the Slack app's signing secret")
        if signing_secret != signing_secret.strip():  # not shown: it is a secret
            # A secret file's newline: Slack signs without it, so every click was refused (401).
            raise UsageError(
                "SlackChannel: the signing secret has spaces or a newline around it: drop them"
            )
        for what, secret in (("signing secret", signing_secret), ("bot token", token)):
            try:
                (secret or "").encode("ascii")
            except UnicodeEncodeError:  # else every request fails to verify, or to send
                raise UsageError(f"SlackChannel: the {what} is not ASCII (Slack's are)") from None
        if client is None:
            if not token:
                raise UsageError("SlackChannel needs a bot token (token=...) or a client")
            kwargs: dict[str, Any] = {"token": token, "retry_handlers": retry_handlers()}
            if base_url is not None:
                kwargs["base_url"] = base_url
            client = AsyncWebClient(**kwargs)
        elif token is not None or base_url is not None:
            raise UsageError("pass either client=... or token=/base_url=, not both")
        if not isinstance(path, str) or not path.startswith("/"):
            raise UsageError(f"the interactivity path must start with '/', not {path!r}")
        if events_path is not None and (
            not isinstance(events_path, str) or not events_path.startswith("/")
        ):
            raise UsageError(f"the events path must start with '/', not {events_path!r}")
        if events_path == path:
            raise UsageError(f"the events path and the interactivity path are both {path!r}")
        self.channel = channel
        self.client = client
        self.path = path
        self.events_path = events_path
        checked_clock(clock, "SlackChannel: clock")  # else every request from Slack failed
        self.clock = clock
        self._verifier = SignatureVerifier(signing_secret, clock=_Clock(clock))
        self._seen: dict[str, float] = {}  # signature -> when it can be forgotten
        self._answered: dict[str, dict[str, Any] | None] = {}  # signature -> what Slack got
        self._tasks: set[asyncio.Task[Any]] = set()
        self._cut = False  # a forced stop cancels the background work (`cut_short`)
        self._router: Any = None
        self._presence: Presence | None = None  # held while it may act on the work it took
        self._presence_lock = threading.Lock()
        self._token = secrets.token_hex(8)  # names this object's `home` on a state in memory
        self._closing: asyncio.Event | None = None  # set by close(): notes stop waiting
        self.identities = Identities(self, identify, external_teams)
        self.replies = ThreadReplies(self)
        self.clicks = Clicks(self)
        self.posts = Posts(self)
        self.backlog = Backlog(self)  # the requests open at start, not posted yet
        self.refused_token = TokenRefusals()  # a token or scope Slack refuses: logged, waited

    # -- what the hub tells it ----------------------------------------------------------------

    async def start(self, open_requests: Sequence[InputRequest]) -> None:
        # Those never posted (e.g. opened before the first start); what Slack's rate limit
        # or a failure holds back is posted on the hub's ticks (`_backlog`).
        self.backlog.start(open_requests)
        self._cut = False
        if self._closing is None or self._closing.is_set():  # else notes wait on it already
            self._closing = asyncio.Event()
        # Answers acknowledged and not settled (or sent) before a crash, on this state or (in
        # the store) on a state whose machine was lost.
        await self.clicks.resume()
        await self.replies.resume()
        await self.clicks.inbox.adopt()
        await self.replies.inbox.adopt()
        await self.backlog.post()

    async def tick(self, now: float) -> None:
        await self.clicks.tick()
        await self.replies.tick()
        await self.backlog.post()

    async def on_requested(self, request: InputRequest) -> None:
        await self.posts.show(request)

    async def on_updated(self, request: InputRequest) -> None:
        where = await self.posts.where(request.id)
        if where is not None:
            await self._update(request, where, None, request_blocks(request))

    async def on_resolved(self, request: InputRequest, resolution: Resolution) -> None:
        where = await self.posts.where(request.id) or await self.posts.find_unsaved(request.id)
        if where is None:
            await self.posts.forget(request.id)
            return
        edited = None
        if resolution.outcome == "approved":  # the input.resolved entry does not carry an edit
            stored = await self.runtime.store.get_request(request.id)
            edited = ((stored.resolution if stored else None) or {}).get("edited_input")
        blocks = request_blocks(request, resolution, edited_input=edited)
        # Replies in its thread still reach the session for a while (`_replies`).
        closed = {"request_id": request.id, "closed_at": resolution.at}
        thread = thread_key(where["channel"], where["ts"])
        await off_loop(self.remember, thread, closed)
        await self._update(request, where, resolution, blocks)
        await self.posts.forget(request.id, {thread: closed})

    async def on_erased(self, erased: Sequence[Erased]) -> None:
        """Each erased request whose message this channel keeps: rewritten to say its session
        was deleted (what it asked went with it, and its buttons), and its memos dropped, its
        thread's too (the session takes no reply)."""
        kept = set(self.posts.unsaved)
        for prefix in ("msg:", "posting:"):
            kept.update(k.removeprefix(prefix) for k, _ in await off_loop(self.memos, prefix))
        kept.update(k.removeprefix("post:") for k, _, _ in await self.posts.shared.listed("post:"))
        for gone in erased:
            rid = gone.request_id
            if rid not in kept:
                continue
            where = await self.posts.where(rid, adopt=False) or await self.posts.find_unsaved(rid)
            if where is None:  # an attempt that never reached Slack
                await self.posts.forget(rid)
                continue
            try:
                await self.client.chat_update(
                    channel=where["channel"],
                    ts=where["ts"],
                    text=erased_text(gone),
                    blocks=erased_blocks(gone),
                    **UNPARSED,
                )
                self.refused_token.worked()
            except SlackApiError as exc:
                self.refused(exc, "chat.update", where["channel"])
                error = api_error(exc)
                if error not in _GONE:
                    raise
                logger.warning("slack: the message of %s cannot be updated (%s)", rid, error)
            await self.posts.gone(rid, where)

    async def _update(
        self,
        request: InputRequest,
        where: dict[str, Any],
        resolution: Resolution | None,
        blocks: list[Any],
    ) -> None:
        """Rewrite a request's message (as `blocks`, or shorter when Slack refuses them: see
        `sent_fitting`); one deleted in Slack (or past editing) is forgotten, as the hub's
        retries could never update it and would hold back the other requests."""

        async def send(shown: list[dict[str, Any]], text: str) -> Any:
            # an empty list: a message of text alone, the blocks it had taken off
            return await self.client.chat_update(
                channel=where["channel"], ts=where["ts"], text=text, blocks=shown, **UNPARSED
            )

        try:
            await sent_fitting(send, request, resolution, blocks, "updated")
            self.refused_token.worked()
        except SlackApiError as exc:
            self.refused(exc, "chat.update", where["channel"])
            error = api_error(exc)
            if error not in _GONE:
                raise
            logger.warning("slack: the message of %s cannot be updated (%s)", request.id, error)
            await self.posts.gone(request.id, where)

    def refused(self, exc: SlackApiError, method: str, channel: str) -> None:
        """Raise `RateLimited` for a 429 and `ChannelUnreachable` for a token or scope Slack
        refuses (`_token`) or a bot that cannot reach `channel` (see `_raise_if_absent`):
        errors the hub waits out rather than retries."""
        _raise_if_limited(exc, method)
        self.refused_token.check(exc, method)
        self._raise_if_absent(exc, method, channel)

    def _raise_if_absent(self, exc: SlackApiError, method: str, channel: str) -> None:
        """Raise `ChannelUnreachable` (`ABSENT_WAIT` seconds) when Slack refused a call in this
        channel's conversation because the bot cannot reach it: the hub then holds the feed,
        spending no attempt, logs what to do, and goes on in order once the bot is back. A
        message in another conversation (posted before `channel` changed) fails as any error
        does."""
        error = api_error(exc)
        if channel != self.channel or error not in ABSENT:
            return
        raise ChannelUnreachable(
            f"slack: {method} cannot reach channel {channel} ({error}): invite the bot to it "
            "(or unarchive the channel, or check its id)",
            ABSENT_WAIT,
        ) from exc

    async def close(self) -> None:
        if self._closing is not None:
            self._closing.set()  # a note waiting out a rate limit gives up
        await self.idle()
        if self._presence is not None:
            self._presence.release()  # what it left undone is now any process's to take up

    def cut_short(self) -> list[asyncio.Task[Any]]:
        """Cancel the answers and replies being settled in the background, and start none until
        the channel starts again, so `close` waits only for them to end: a turn one resumed is
        cut short, its lease given back. The click or reply stays saved, and the next start
        acts on it again, which records nothing twice, and goes on with the turn."""
        self._cut = True
        running = [task for task in self._tasks if not task.done()]
        for task in running:
            if not task.cancelling():  # cancelled once: a second would cut its unwinding short
                task.cancel()
        return running

    def owner(self) -> str:
        """The token this channel object saves in the work it takes (clicks, replies), holding
        its `Presence` next to the state file: while held (it is open, its process alive),
        another hub's start leaves that work to it instead of acting on it a second time."""
        name = f"{self._hub}.{self.name}"
        with self._presence_lock:  # called in worker threads, two clicks' saves at once
            presence = self._presence
            if presence is None or (presence.state_path, presence.name) != (self.state.path, name):
                if presence is not None:
                    presence.release()
                presence = self._presence = Presence(self.state.path, name)
            return presence.hold()

    @property
    def home(self) -> str:
        """The state this channel object works on, as the work it saves in the store names it
        (`_inbox`): its file's own id (`ChannelState.identity`; another file at the same path,
        another machine's of the same name, has another), or this object for a state in memory.
        A file's is read from it once (the hub's start reads it first, in a thread)."""
        if self.state.path == ":memory:":
            return f"memory|{self._token}"
        return self.state.identity()

    @property
    def old_home(self) -> str | None:
        """The name an older signoff gave this state as the work's home: the machine's name and
        the file's absolute path, which another file at that path (a container's of the same
        hostname) had too; None in memory, whose older names went with their objects."""
        path = self.state.path
        return None if path == ":memory:" else f"{socket.gethostname()}|{os.path.abspath(path)}"

    def elsewhere(self, token: object) -> bool:
        """Whether work saved with `token` is another live channel object's (of this channel,
        in this process or another sharing the state file) to finish."""
        mine = self._presence is not None and token == self._presence.token
        name = f"{self._hub}.{self.name}"
        return isinstance(token, str) and not mine and alive(self.state.path, name, token)

    async def idle(self) -> None:
        """Wait for the answers being settled in the background."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    # -- the endpoints -------------------------------------------------------------------------

    @property
    def routers(self) -> Sequence[Any]:
        return [self.router()]

    def router(self) -> Any:
        """A FastAPI router with `POST {path}` and `POST {events_path}` (mounted by
        `create_app(..., channels=hub)`)."""
        if self._router is None:
            self._router = routes(self)
        return self._router

    def verify(self, body: bytes, headers: Mapping[str, str]) -> None:
        """Check Slack's signature (v0 HMAC-SHA256 of `v0:{timestamp}:{body}`), its age (five
        minutes at most) and that it was not seen before; raises `InvalidSignature`.

        Seen signatures are kept in memory for those five minutes, per process: behind a load
        balancer, a replay could reach another process once (it settles nothing new: a
        request resolves once).
        """
        signature, sent = self._authentic(body, headers)
        now = self.clock()
        for old in [s for s, until in self._seen.items() if until < now]:
            del self._seen[old]
            self._answered.pop(old, None)
        if signature in self._seen:
            raise InvalidSignature("this signed request was already received (a replay)")
        self._seen[signature] = sent + TOLERANCE + 1

    def _authentic(self, body: bytes, headers: Mapping[str, str]) -> tuple[str, int]:
        """The signature of a request Slack signed within the last five minutes, and when it
        was sent; raises `InvalidSignature`."""
        lowered = {k.lower(): v for k, v in headers.items()}
        stamp = lowered.get("x-slack-request-timestamp")
        signature = lowered.get("x-slack-signature")
        if not stamp or not signature:
            raise InvalidSignature("missing X-Slack-Request-Timestamp or X-Slack-Signature")
        try:
            sent = int(stamp)
        except ValueError:
            raise InvalidSignature(f"the timestamp is not a number: {stamp!r}") from None
        now = self.clock()
        try:
            off = abs(now - sent)
        except OverflowError:  # an integer too large for a float: no real clock is there
            off = float("inf")
        if off > TOLERANCE:
            raise InvalidSignature("the request timestamp is more than five minutes off")
        # slack_sdk's check raises on both (a UnicodeDecodeError, a TypeError), not a no.
        if not signature.isascii():
            raise InvalidSignature("the Slack signature does not match")
        try:
            body.decode()
        except UnicodeDecodeError:
            raise InvalidSignature("the body is not UTF-8 text, as Slack signs it") from None
        if not self._verifier.is_valid(body=body, timestamp=stamp, signature=signature):
            raise InvalidSignature("the Slack signature does not match")
        return signature, sent

    async def handle(self, body: bytes, headers: Mapping[str, str]) -> dict[str, Any] | None:
        """Verify and take one interaction (see `Clicks.handle`); the JSON to answer Slack with
        (None: empty 200). It is saved before this returns and settled in the background, so
        Slack hears back well within three seconds and a crash after that loses nothing."""
        return await self._taking(self.clicks.handle, body, headers)

    async def handle_event(self, body: bytes, headers: Mapping[str, str]) -> dict[str, Any] | None:
        """Verify and take one Events API request (see `ThreadReplies.handle`); the JSON to
        answer Slack with (None: empty 200)."""
        return await self._taking(self.replies.handle, body, headers)

    async def _taking(
        self,
        handle: Callable[[bytes, Mapping[str, str]], Awaitable[dict[str, Any] | None]],
        body: bytes,
        headers: Mapping[str, str],
    ) -> dict[str, Any] | None:
        """Run `handle`, keyed on the request's signature (so on its timestamp and body).

        A retry Slack signs anew (its last comes past the five-minute window, so at least that
        one is) is taken once by the durable memo of its work. Should a retry come with the
        first delivery's headers: after a 5xx (nothing was taken) the signature was forgotten,
        so it is taken; after a 2xx, it gets the first answer again and does nothing (a 401
        would only make Slack retry and count failures); while the first is still being taken,
        and without `X-Slack-Retry-Num`, it is refused as a replay. That header is not signed:
        a replay carrying it acts on nothing either."""
        lowered = {k.lower(): v for k, v in headers.items()}
        signature = lowered.get("x-slack-signature", "")
        if signature in self._answered and lowered.get("x-slack-retry-num"):
            self._authentic(body, headers)  # the signature must be this body's, and fresh
            logger.info("slack: a retry of a delivery taken before; it gets the same answer")
            return self._answered[signature]
        try:
            answer = await handle(body, headers)
        except (InvalidSignature, SlackPayloadError):
            raise  # a 4xx: a replay, or a delivery no retry can make right
        except BaseException:
            self._seen.pop(signature, None)
            raise
        if signature in self._seen:
            self._answered[signature] = answer
        return answer

    # -- background work ----------------------------------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, R]) -> asyncio.Task[R]:
        # Started from the endpoint, which does not wait for it to end: its store calls wait as
        # long as the store allows, not an HTTP request's brief while (which would lose the
        # person's click).
        with promptly(False):
            task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self._cut:
            task.cancel()
        return task

    async def _tell(self, where: dict[str, str], text: str) -> None:
        """An ephemeral note only the person who acted sees (in the thread they typed in, if
        they typed); its text (reasons, errors naming what was answered) is escaped like the
        messages' and clipped to what Slack takes (a longer one is refused: `msg_too_long`).

        A 429 (Slack took nothing) is sent again after its Retry-After, within `NOTE_TRIES`
        calls and `NOTE_WAIT` seconds, and never past the channel's close: a note is for now,
        and its wait holds up the work that tells it. One Slack refuses, or whose call went
        unanswered (its connection dropped, a timeout: not sent again, as Slack may have it),
        is logged, not raised, so the work (its other notes, a form turned into the reason,
        the message shown closed) goes on."""
        waited, tries = 0.0, 0
        while True:
            tries += 1
            try:
                await self.client.chat_postEphemeral(
                    channel=where["channel"],
                    user=where["user"],
                    text=note_text(text),
                    thread_ts=where.get("thread_ts"),
                    **UNPARSED,
                )
                return
            except SlackApiError as exc:
                wait = retry_after(exc)
                if wait is None:
                    why = api_error(exc) or f"HTTP {getattr(exc.response, 'status_code', '?')}"
                    break
                why = f"rate limited, Retry-After {wait:g}s, after {tries} tries"
                if tries >= NOTE_TRIES or waited + wait > NOTE_WAIT or not await self._pause(wait):
                    break
                waited += wait
            except (aiohttp.ClientError, OSError) as exc:  # OSError: a timeout too
                logger.warning(
                    "slack: a note to %s in %s went unanswered, it may not have reached them "
                    "(%r): %.200r",
                    where["user"],
                    where["channel"],
                    exc,
                    text,
                )
                return
        logger.warning(
            "slack: a note to %s in %s was not delivered (%s): %.200r",
            where["user"],
            where["channel"],
            why,
            text,
        )

    async def _pause(self, seconds: float) -> bool:
        """Wait `seconds`, or less if the channel closes meanwhile; whether it is still open."""
        if self._closing is None:
            self._closing = asyncio.Event()
        closing = self._closing
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(closing.wait(), seconds)
        return not closing.is_set()


def _raise_if_limited(exc: SlackApiError, method: str) -> None:
    """Raise `RateLimited` with Slack's Retry-After (1 s if it names none) for a 429, so the
    hub retries when Slack allows rather than on its backoff."""
    wait = retry_after(exc)
    if wait is not None:
        raise RateLimited(f"slack: {method} is rate limited; retry in {wait:g}s", wait) from exc
