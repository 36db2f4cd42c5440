"""`Posts`: where each request's Slack message is, and its post.

The message (`{"channel", "ts"}`) is kept in the channel's state and, for a hub that takes over
on another machine (another state), in the runtime's store (`Shared`): that hub updates the
messages the first posted instead of posting them again. Its thread's memo (the request a reply
there answers) is kept in the store too, for a reply that reaches a process on another state.
A post's attempt is saved in both before it is sent, so a crash between Slack's answer and the
save finds the message in the channel's history (`_adopt`) rather than posting it twice, on
this state or another.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from slack_sdk.errors import SlackApiError

from ..._exceptions import SignoffError
from ..._types import InputRequest
from .._base import Resolution, logger, off_loop
from .._shared import Shared
from ._adopt import find_post, metadata, new_attempt
from ._blocks import (
    TOO_LONG,
    UNPARSED,
    fallback_text,
    request_blocks,
    short_blocks,
    short_text,
    text_length,
)
from ._payloads import api_error, maybe_done
from ._replies import thread_key

if TYPE_CHECKING:
    from ._channel import SlackChannel

__all__ = ["Posts", "post_key", "sent_fitting"]

T = TypeVar("T")


def post_key(request_id: str) -> str:
    """The state's memo of where a request's message is."""
    return f"msg:{request_id}"


def _attempt_key(request_id: str) -> str:
    """The state's memo of a post sent and not yet saved under `post_key`."""
    return f"posting:{request_id}"


def _shared_key(request_id: str) -> str:
    """The store's memo of a request's message (`{"channel", "ts"}`), or of its post's attempt
    (`{"attempt"}`) until Slack answers."""
    return f"post:{request_id}"


def _where(memo: Any) -> dict[str, Any] | None:
    """The message a memo names, if it names one."""
    if isinstance(memo, dict) and isinstance(memo.get("channel"), str):
        if isinstance(memo.get("ts"), str):
            return {"channel": memo["channel"], "ts": memo["ts"]}
    return None


class Posts:
    """The messages of `channel`'s requests: posted once, found again after a crash or on
    another state, and forgotten once closed."""

    def __init__(self, channel: SlackChannel) -> None:
        self.channel = channel
        self.shared = Shared(channel)
        self.unsaved: dict[str, dict[str, Any]] = {}  # request id -> a post whose memo failed

    async def show(self, request: InputRequest) -> None:
        """Post a request's message, unless this state or the store has it already (a hub on
        another state posted it: it is adopted)."""
        ch = self.channel
        where = self.unsaved.get(request.id)
        adopted = False  # the store's: no need to keep it there again
        if where is None:
            if await off_loop(ch.recall, post_key(request.id)) is not None:
                return  # already posted
            kept = await self.shared.recall(_shared_key(request.id))
            where = _where(kept)
            adopted = where is not None
            if where is None:
                where = await self.find_unsaved(request.id, kept)
            if where is None:
                where = await self._post(request)
            # Kept until the memo is saved: the hub's retry of a failed save must not post again.
            self.unsaved[request.id] = where
        await off_loop(self._save, request.id, where)
        if not adopted:  # its thread too, for a reply reaching a process on another state
            thread = {thread_key(where["channel"], where["ts"]): {"request_id": request.id}}
            await self.shared.keep({_shared_key(request.id): where, **thread})
        del self.unsaved[request.id]

    def _save(self, request_id: str, where: dict[str, Any]) -> None:
        """Keep where a request's message is (and its thread's request), its attempt done."""
        ch = self.channel
        ch.remember(thread_key(where["channel"], where["ts"]), {"request_id": request_id})
        ch.remember(post_key(request_id), where)
        ch.forget(_attempt_key(request_id))

    async def _post(self, request: InputRequest) -> dict[str, Any]:
        """Post a request's message; the attempt is saved first, so that a restart after a
        crash before the message's memo is saved finds the message instead of posting again."""
        ch = self.channel
        attempt = new_attempt()
        await off_loop(ch.remember, _attempt_key(request.id), attempt)
        await self.shared.keep({_shared_key(request.id): {"attempt": attempt}})
        try:

            async def send(blocks: list[dict[str, Any]], text: str) -> Any:
                return await ch.client.chat_postMessage(
                    channel=ch.channel,
                    text=text,
                    blocks=blocks or None,  # none at all: a message of text alone
                    metadata=metadata(request.id, attempt),
                    **UNPARSED,
                )

            reply = await sent_fitting(send, request, None, request_blocks(request), "new")
        except SlackApiError as exc:
            if not maybe_done(exc):  # Slack posted nothing: no message to find
                with contextlib.suppress(SignoffError):
                    await off_loop(ch.forget, _attempt_key(request.id))
                    await self.shared.keep({_shared_key(request.id): None})
            ch.refused(exc, "chat.postMessage", ch.channel)
            raise
        ch.refused_token.worked()
        return {"channel": reply["channel"], "ts": reply["ts"]}

    async def find_unsaved(self, request_id: str, kept: Any = None) -> dict[str, Any] | None:
        """The message of a post sent before a crash and never saved, if Slack has it: by the
        attempt in this state, or else in the store (`kept`, read if not given)."""
        ch = self.channel
        attempt = await off_loop(ch.recall, _attempt_key(request_id))
        if attempt is None:
            if kept is None:
                kept = await self.shared.recall(_shared_key(request_id))
            attempt = kept.get("attempt") if isinstance(kept, dict) else None
        if attempt is None:
            return None
        try:
            where = await find_post(ch.client, ch.channel, request_id, attempt)
        except SlackApiError as exc:
            # Posting again now would replace the attempt's memo: its message is found once
            # the bot is back.
            ch.refused(exc, "conversations.history", ch.channel)
            raise
        if where is not None:
            logger.info("slack: adopted the unsaved post of %s (%s)", request_id, where)
        return where

    async def where(self, request_id: str, *, adopt: bool = True) -> dict[str, Any] | None:
        """Where a request's message is: its memo, a post whose memo is not saved yet, or one
        a hub on another state posted (kept here from now on, if `adopt`)."""
        unsaved = self.unsaved.get(request_id)
        if unsaved is not None:
            return unsaved
        ch = self.channel
        where = await off_loop(ch.recall, post_key(request_id))
        if where is None:
            where = _where(await self.shared.recall(_shared_key(request_id)))
            if where is not None and adopt:
                await off_loop(self._save, request_id, where)
        return where if isinstance(where, dict) else None

    async def forget(self, request_id: str, thread: dict[str, Any] | None = None) -> None:
        """Drop the memos of a closed request's message (its thread's stays, for replies; in
        the store, replaced with `thread`, its memo once closed, if given)."""
        ch = self.channel
        await off_loop(ch.forget, post_key(request_id))
        await off_loop(ch.forget, _attempt_key(request_id))
        await self.shared.keep({_shared_key(request_id): None, **(thread or {})})
        self.unsaved.pop(request_id, None)

    async def gone(self, request_id: str, where: dict[str, Any]) -> None:
        """Drop the memos of a message deleted in Slack, its thread's too."""
        ch = self.channel
        key = thread_key(where["channel"], where["ts"])
        await off_loop(ch.forget, key)
        await self.forget(request_id, {key: None})


async def sent_fitting(
    send: Callable[[list[dict[str, Any]], str], Awaitable[T]],
    request: InputRequest,
    resolution: Resolution | None,
    blocks: list[dict[str, Any]],
    what: str,
) -> T:
    """`send(blocks, text)`; when Slack refuses the blocks (one of `TOO_LONG`), sent once more as
    `short_blocks`, and when it refuses those too, as text alone (`short_text`, no blocks): a
    form Slack refused is refused on every retry, and the request would never be in Slack."""
    text = fallback_text(request, resolution)
    try:
        return await send(blocks, text)
    except SlackApiError as exc:
        refused = api_error(exc)
        if refused not in TOO_LONG:
            raise
    # Sent again as it is, Slack would refuse it for ever: the short message says the rest is
    # too long for Slack and where to read it.
    logger.warning(
        "slack: Slack refused the %s message of %s (%s, %s characters of text); sending a "
        "short one that points to the dashboard",
        what,
        request.id,
        refused,
        text_length(blocks),
    )
    try:
        return await send(short_blocks(request, resolution, refused=refused), text)
    except SlackApiError as exc:
        again = api_error(exc)
        if again not in TOO_LONG:
            raise
    logger.warning(
        "slack: Slack refused the short %s message of %s too (%s); sending it as text alone, "
        "with no buttons: it is answered on the dashboard or the command line",
        what,
        request.id,
        again,
    )
    return await send([], short_text(request, resolution, refused=again))
