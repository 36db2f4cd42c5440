"""`BodyLimit`: refuses request bodies over a size, 413 `payload_too_large` (as JSON, or as a
page to a browser on a dashboard address); and `OneFraming`: refuses a body framed two ways, by
a length and by chunks."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ._auth import is_dashboard
from ._errors import error_response
from ._message_page import bare_error_page, wants_page

__all__ = ["BodyLimit", "OneFraming"]

TWO_FRAMINGS = (
    "the request gives both a Content-Length and a Transfer-Encoding, which frame its body "
    "differently (RFC 9112, section 6.3): send one of them; the connection is closed"
)

TOO_LARGE = "the request body is larger than this server accepts ({limit} bytes)"


class BodyLimit:
    """ASGI middleware: a body over `max_bytes` is refused before the app reads it all.

    A declared `Content-Length` over the limit is refused up front; a streamed body is counted
    as it arrives, and the read that crosses the limit raises a 413 that the app's handlers
    render like any other error. A browser's form post refused up front on a dashboard address
    gets a page naming the code, as that error would (it got the API's JSON, shown raw), drawn
    without asking who is signed in: the refusal depends on neither the authenticator nor the
    store (this runs outside the app's error handlers and the store's time bound)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        message = TOO_LARGE.format(limit=self.max_bytes)
        declared = Headers(scope=scope).get("content-length", "").strip()
        # ASCII digits only: `isdigit()` also takes "²", which `int()` refuses (a 500), as it
        # does more than 4300 digits, a length far over any limit.
        if (
            declared.isascii()
            and declared.isdigit()
            and (len(declared) > 18 or int(declared) > self.max_bytes)
        ):
            request = Request(scope)
            response: Response
            if is_dashboard(request.url.path) and wants_page(request):
                response = bare_error_page(request, 413, "payload_too_large", message)
            else:
                response = error_response(413, "payload_too_large", message)
            await response(scope, receive, send)
            return
        received = 0

        async def limited() -> Message:
            nonlocal received
            got = await receive()
            if got["type"] == "http.request":
                received += len(got.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, message)
            return got

        await self.app(scope, limited, send)


class OneFraming:
    """ASGI middleware: a request with both a `Content-Length` and a `Transfer-Encoding` is
    400 `malformed_request`, and its connection closed, before the app runs.

    uvicorn's h11 parser frames such a body by its chunks, where a proxy in front may frame it
    by its length: the bytes after the chunks would then be served as another request on the
    connection, one the proxy never saw (request smuggling). RFC 9112 has the server close the
    connection after answering one.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            names = {name.lower() for name, _ in scope.get("headers", ())}
            if b"content-length" in names and b"transfer-encoding" in names:
                response = error_response(400, "malformed_request", TWO_FRAMINGS)
                response.headers["Connection"] = "close"
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
