"""The HTTP endpoints a `SlackChannel` mounts on the signoff server: interactivity (button
presses, menus, modals) and, unless disabled, the Events API (replies typed in threads)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..._exceptions import SignoffError, StoreError, UsageError
from .._base import InvalidSignature, logger
from ._payloads import SlackPayloadError

if TYPE_CHECKING:
    from ._channel import SlackChannel

__all__ = ["REFUSED_LOGGED_EVERY", "routes"]

# Seconds: an endpoint logs the requests it refused for their signature at most this often.
REFUSED_LOGGED_EVERY = 60.0

Handler = Callable[[bytes, Mapping[str, str]], Awaitable[dict[str, Any] | None]]


def routes(channel: SlackChannel) -> Any:
    """A FastAPI router with the channel's endpoints, each a plain Starlette route: the raw body
    must reach the signature check untouched."""
    try:
        from fastapi import APIRouter, Request
        from starlette.responses import JSONResponse, Response
    except ImportError as exc:  # pragma: no cover - depends on the extras installed
        raise UsageError(
            "the Slack endpoint needs the server extra: pip install 'signoff[server,slack]'"
        ) from exc

    urls = f"that the Slack app's Interactivity Request URL ends in {channel.path}"
    if channel.events_path is not None:
        urls += f" and its Event Subscriptions Request URL in {channel.events_path}"

    def endpoint(handle: Handler, path: str) -> Callable[[Request], Awaitable[Response]]:
        forged = _Refused(
            path,
            "for their signature",
            "that the channel's signing_secret (serve's --slack-signing-secret) is the Slack "
            "app's Signing Secret (Basic Information, App Credentials) and that this server's "
            "clock is right",
        )
        unread = _Refused(path, "as unreadable", urls)

        async def serve(request: Request) -> Response:
            body = await request.body()
            try:
                answer = await handle(body, request.headers)
            except InvalidSignature as exc:
                forged.note(exc)
                return JSONResponse(_error(exc), status_code=401)
            except SlackPayloadError as exc:  # e.g. interactions sent to the events URL
                unread.note(exc)
                return JSONResponse(_error(exc), status_code=400)
            except StoreError as exc:  # nothing was taken: Slack retries the delivery
                return JSONResponse(_error(exc), status_code=503)
            if answer is None:
                return Response(status_code=200)
            return JSONResponse(answer)

        return serve

    router = APIRouter()
    router.add_route(
        channel.path,
        endpoint(channel.handle, channel.path),
        methods=["POST"],
        include_in_schema=False,
    )
    if channel.events_path is not None:
        router.add_route(
            channel.events_path,
            endpoint(channel.handle_event, channel.events_path),
            methods=["POST"],
            include_in_schema=False,
        )
    return router


class _Refused:
    """The requests one endpoint refused for one reason, logged: the first at once, then at
    most once every `REFUSED_LOGGED_EVERY` seconds with how many were refused since, so a
    flood (of forged requests, say) writes a line a minute. A misconfiguration refuses every
    request Slack sends, and Slack only shows the person an error: the line says what to
    check. Neither a secret nor a request's signature is shown."""

    def __init__(self, path: str, why: str, check: str) -> None:
        self.path = path
        self.why = why  # "for their signature"
        self.check = check  # what to check if Slack's own requests are refused so
        self.logged_at: float | None = None  # monotonic time of the last line
        self.count = 0  # refused since that line

    def note(self, exc: SignoffError) -> None:
        self.count += 1
        now = time.monotonic()
        if self.logged_at is not None and now - self.logged_at < REFUSED_LOGGED_EVERY:
            return
        logger.warning(
            "slack: %s refused %s request(s) %s (the last: %.200s); if Slack's own are refused "
            "(what people do in Slack fails), check %s",
            self.path,
            self.count,
            self.why,
            str(exc),
            self.check,
        )
        self.logged_at = now
        self.count = 0


def _error(exc: SignoffError) -> dict[str, Any]:
    return {"error": {"code": exc.code, "message": str(exc)}}
