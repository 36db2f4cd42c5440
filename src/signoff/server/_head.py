"""`HeadAsGet`: HEAD is answered for every GET route, with GET's status and headers only."""

from __future__ import annotations

from collections.abc import Iterable

import anyio
from starlette.routing import BaseRoute, Match, Mount
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HeadAsGet", "allowed", "with_head"]

_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def allowed(routes: Iterable[BaseRoute], scope: Scope) -> str:
    """A 405's `Allow` value: each method some route takes at the request's path (Starlette names
    only the first route's, and `/v1/sessions` has one route for POST and one for GET)."""
    routes = [r for r in routes if not isinstance(r, Mount)]  # a mount takes any method
    methods = [
        method
        for method in _METHODS
        if any(r.matches({**scope, "method": method})[0] is Match.FULL for r in routes)
    ]
    return with_head(", ".join(methods))


def with_head(allow: str) -> str:
    """A 405's `Allow` value with HEAD wherever it names GET: the routes declare only GET, and
    `HeadAsGet` answers HEAD for each."""
    methods = [m.strip() for m in allow.split(",") if m.strip()]
    if "GET" in methods and "HEAD" not in methods:
        methods.insert(methods.index("GET") + 1, "HEAD")
    return ", ".join(methods)


class HeadAsGet:
    """ASGI middleware: a HEAD request runs as the GET of its URL, and the response ends with
    the headers (probes and proxies check pages with `curl -I`).

    Once the headers are sent the GET is cancelled, so a HEAD on an event stream returns at
    once instead of following it. A route without GET still answers 405.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self.app(scope, receive, send)
            return
        get = {**scope, "method": "GET"}  # a copy: the server keeps its own scope's HEAD
        with anyio.CancelScope() as scope_of_get:

            async def headers_only(message: Message) -> None:
                if scope_of_get.cancel_called:
                    return
                if message["type"] == "http.response.start":
                    await send(message)
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    scope_of_get.cancel()

            await self.app(get, receive, headers_only)
