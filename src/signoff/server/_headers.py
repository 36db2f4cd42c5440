"""`SecurityHeaders`: the browser-facing protections every response carries; `ServerTime`: the
runtime's time, which every response gives too (`X-Signoff-Time`).

No response may be framed (an Approve button clickjacked) or sniffed into another type; the
dashboard's pages may load only their own script, style and connections, and are not cached.
The API's interactive docs (`/v1/docs`) load their assets from a CDN, so only the dashboard gets
the content security policy.
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._exceptions import UsageError
from .._server_clock import TIME_HEADER, header_time
from ._auth import DASHBOARD_PREFIX, is_dashboard

__all__ = [
    "DASHBOARD_POLICY",
    "SecurityHeaders",
    "ServerTime",
    "add_security_headers",
    "add_server_time",
]

DASHBOARD_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


def add_security_headers(headers: MutableHeaders, path: str) -> None:
    """Add the headers above to a response for `path`, keeping any it already sets."""
    headers.setdefault("X-Content-Type-Options", "nosniff")
    headers.setdefault("X-Frame-Options", "DENY")
    headers.setdefault("Referrer-Policy", "same-origin")
    if is_dashboard(path):
        headers.setdefault("Content-Security-Policy", DASHBOARD_POLICY)
        if not path.startswith(DASHBOARD_PREFIX + "/static/"):
            headers.setdefault("Cache-Control", "no-store")


class SecurityHeaders:
    """ASGI middleware adding the headers above to each HTTP response (set ones are kept).

    A 500 is sent by Starlette's outermost middleware, outside this one: its handler
    (`_errors.install_error_handlers`) adds them with `add_security_headers`.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                add_security_headers(MutableHeaders(scope=message), path)
            await send(message)

        await self.app(scope, receive, with_headers)


def add_server_time(headers: MutableHeaders, now: Callable[[], float]) -> None:
    """Add `X-Signoff-Time`, the time `now` says, to a response (unless it has one)."""
    try:
        at = now()
    except UsageError:  # a clock given to the runtime that is broken: said where it is used
        return
    headers.setdefault(TIME_HEADER, header_time(at))


class ServerTime:
    """ASGI middleware giving each HTTP response the runtime's time as it starts (`now`,
    `Runtime.now`: on PostgreSQL the database's clock) in `X-Signoff-Time`, so a client judges
    deadlines and TTLs by it rather than by its own machine's clock (`ServerClock`)."""

    def __init__(self, app: ASGIApp, now: Callable[[], float]) -> None:
        self.app = app
        self.now = now

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_time(message: Message) -> None:
            if message["type"] == "http.response.start":
                add_server_time(MutableHeaders(scope=message), self.now)
            await send(message)

        await self.app(scope, receive, with_time)
