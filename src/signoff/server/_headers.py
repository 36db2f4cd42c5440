"""`SecurityHeaders`: the browser-facing protections every response carries.

No response may be framed (an Approve button clickjacked) or sniffed into another type; the
dashboard's pages may load only their own script, style and connections, and are not cached.
The API's interactive docs (`/v1/docs`) load their assets from a CDN, so only the dashboard gets
the content security policy.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._auth import DASHBOARD_PREFIX, is_dashboard

__all__ = ["DASHBOARD_POLICY", "SecurityHeaders", "add_security_headers"]

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
