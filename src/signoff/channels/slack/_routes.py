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

    def endpoint(handle: Handler, path: str) -> Callable[[Request], Awaitable[Response]]:
        refused = _Refused(path)

        async def serve(request: Request) -> Response:
            body = await request.body()
            try:
                answer = await handle(body, request.headers)
            except InvalidSignature as exc:
                refused.note(exc)
                return JSONResponse(_error(exc), status_code=401)
            except SlackPayloadError as exc:
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
    """The requests one endpoint refused for their signature, logged: the first at once, then
    at most once every `REFUSED_LOGGED_EVERY` seconds with how many were refused since, so a
    flood of forged requests writes a line a minute. A wrong signing secret (the app's client
    secret or verification token given for it) or a server clock that is off refuses every
    click Slack sends, and Slack only shows the person an error: the log says what to check.
    Neither the secret nor the request's signature is shown."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.logged_at: float | None = None  # monotonic time of the last line
        self.count = 0  # refused since that line

    def note(self, exc: InvalidSignature) -> None:
        self.count += 1
        now = time.monotonic()
        if self.logged_at is not None and now - self.logged_at < REFUSED_LOGGED_EVERY:
            return
        logger.warning(
            "slack: %s refused %s request(s) for their signature (the last: %.200s); if "
            "Slack's own are refused (clicks in Slack fail), check that the channel's "
            "signing_secret (serve's --slack-signing-secret) is the Slack app's Signing Secret "
            "(Basic Information, App Credentials) and that this server's clock is right",
            self.path,
            self.count,
            str(exc),
        )
        self.logged_at = now
        self.count = 0


def _error(exc: SignoffError) -> dict[str, Any]:
    return {"error": {"code": exc.code, "message": str(exc)}}
