"""Finding a request's message that Slack accepted but signoff never saved (a crash between the
two), so a restarted hub adopts it instead of posting the request a second time.

`chat.postMessage` has no idempotency key. Each post therefore carries message metadata naming
the request and a fresh delivery id, which is saved (with the time) before the post is sent; a
channel that finds such a saved attempt without a saved message reads the channel's history
around that time (`conversations.history` with `include_all_metadata`) for a message carrying
that delivery id.
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

from aiohttp import ClientConnectorError, ClientError
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.async_handler import AsyncRetryHandler
from slack_sdk.http_retry.builtin_async_handlers import AsyncConnectionErrorRetryHandler
from slack_sdk.http_retry.request import HttpRequest
from slack_sdk.http_retry.response import HttpResponse
from slack_sdk.http_retry.state import RetryState
from slack_sdk.web.async_client import AsyncWebClient

from .._base import logger
from ._payloads import ABSENT, REFUSED_TOKEN, api_error

__all__ = ["EVENT_TYPE", "find_post", "metadata", "new_attempt", "retry_handlers"]

EVENT_TYPE = "signoff_request"
SKEW = 60.0  # seconds: how far this host's clock may be off Slack's
_PAGE = 200  # messages per history page (Slack may return fewer)
_PAGES = 5  # history pages read at most: the window is short, so this is rarely reached


class _NoRepost(AsyncConnectionErrorRetryHandler):
    """slack_sdk's retry of a call whose connection failed, except that `chat.postMessage` and
    `views.open` are sent again only when no connection was made (nothing was sent). A post
    whose connection dropped after Slack took it would be posted twice: the hub retries it
    instead, and finds the message first. A form's trigger is single-use and lives three
    seconds, so after a dropped connection a second call can only fail, though the form may
    well be open."""

    async def _can_retry_async(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        url = request.url.rstrip("/")
        if url.endswith(("/chat.postMessage", "/views.open")) and not isinstance(
            error, ClientConnectorError
        ):
            return False
        return await super()._can_retry_async(
            state=state, request=request, response=response, error=error
        )


def retry_handlers() -> list[AsyncRetryHandler]:
    """The retries of the client a channel makes: slack_sdk's defaults, but a post or a form's
    opening only when it never reached Slack.

    slack_sdk's `AsyncRateLimitErrorRetryHandler` is left out: it sleeps out any Retry-After
    (an hour's too) inside the call, holding up the hub's delivery to every channel. The hub
    waits out a post's or an update's 429 itself (`RateLimited`), and a note a bounded while."""
    return [_NoRepost()]


def new_attempt() -> dict[str, Any]:
    """The record of a post about to be sent: its delivery id and when (this host's clock)."""
    return {"delivery": uuid.uuid4().hex, "at": time.time()}


def metadata(request_id: str, attempt: dict[str, Any]) -> dict[str, Any]:
    """The message metadata a post carries, naming its request and delivery."""
    return {
        "event_type": EVENT_TYPE,
        "event_payload": {"request_id": request_id, "delivery": str(attempt["delivery"])},
    }


async def find_post(
    client: AsyncWebClient, channel: str, request_id: str, attempt: Any
) -> dict[str, Any] | None:
    """Where the message of an unsaved `attempt` is (`{"channel", "ts"}`), or None: not in the
    channel's history from the attempt's time to the client's timeout (plus clock skew), or the
    history cannot be read (e.g. the bot lacks `channels:history`), which is logged.

    A rate limit (HTTP 429), a 5xx, a bot that cannot reach the channel (`ABSENT`) or a token
    Slack refuses (`REFUSED_TOKEN`; a missing history scope is not one of those) is raised
    as the `SlackApiError` it is, to be waited out or retried, and so is a connection that
    failed or timed out: posting again then could post twice, and the new attempt's memo would
    replace the one that finds the message."""
    try:
        delivery = str(attempt["delivery"])
        at = float(attempt["at"])
        if not math.isfinite(at):
            raise ValueError(at)
    except (KeyError, TypeError, ValueError):
        logger.warning("slack: the saved post attempt of %s is unreadable: %r", request_id, attempt)
        return None
    oldest, latest = f"{at - SKEW:.6f}", None
    timeout = getattr(client, "timeout", None)
    if isinstance(timeout, (int, float)) and math.isfinite(timeout):  # else: up to now
        latest = f"{at + timeout + SKEW:.6f}"
    cursor: str | None = None
    for _ in range(_PAGES):
        try:
            page = await client.conversations_history(
                channel=channel,
                include_all_metadata=True,
                limit=_PAGE,
                cursor=cursor,
                oldest=oldest,
                latest=latest,
                inclusive=True,
            )
        except SlackApiError as exc:
            status = getattr(exc.response, "status_code", None)
            if isinstance(status, int) and (status == 429 or status >= 500):
                raise  # waited out, or retried: posting again now could post twice
            if api_error(exc) in ABSENT or api_error(exc) in REFUSED_TOKEN:
                raise  # waited out until the bot (or its token) is back, as a post would be
            error, needed = api_error(exc), api_error(exc, "needed")
            logger.warning(
                "slack: cannot read the history of %s to find the unsaved post of %s (%s%s); "
                "posting it again",
                channel,
                request_id,
                error,
                f", needs {needed}" if needed else "",
            )
            return None
        except (ClientError, OSError):  # OSError: a timeout too; Slack may have the message
            raise
        except Exception:
            logger.warning(
                "slack: reading the history of %s to find the unsaved post of %s failed; "
                "posting it again",
                channel,
                request_id,
                exc_info=True,
            )
            return None
        messages = page.get("messages")
        for message in messages if isinstance(messages, list) else []:
            if _carries(message, request_id, delivery):
                return {"channel": channel, "ts": str(message["ts"])}
        meta = page.get("response_metadata")
        cursor = meta.get("next_cursor") if isinstance(meta, dict) else None
        if not page.get("has_more") or not cursor:
            return None
    logger.warning(
        "slack: the post of %s was not found in %s messages of %s; posting it again",
        request_id,
        _PAGE * _PAGES,
        channel,
    )
    return None


def _carries(message: Any, request_id: str, delivery: str) -> bool:
    """Whether a history message is the post of this request's delivery."""
    if not isinstance(message, dict) or not isinstance(message.get("ts"), str):
        return False
    meta = message.get("metadata")
    if not isinstance(meta, dict) or meta.get("event_type") != EVENT_TYPE:
        return False
    payload = meta.get("event_payload")
    return (
        isinstance(payload, dict)
        and payload.get("request_id") == request_id
        and payload.get("delivery") == delivery
    )
