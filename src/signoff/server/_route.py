"""`ApiRoute`: what every `/v1` route checks before FastAPI reads the request.

The caller is authenticated first, so one without a valid token is told that (401), not what is
wrong with a body or query it would send again only to get the 401. A query or header parameter
given twice is refused, and so is a second `Content-Type` of a body: FastAPI reads one of them
(a query's last, a header's first) where a proxy or a log may read the other, or join them. A
whole-number query parameter is plain digits, as `Last-Event-ID` is: pydantic would also read
`1_0` as 10 and `+5` or ` 5` as 5. A decimal one (`older_than`) is a plain decimal number the
same way: digits, maybe a fraction and an exponent (`90`, `1.5`, `1e3`), and nothing around
them. The query string is UTF-8 (`NOT_UTF8`), a dashboard page's too (`check_query`). An
`Idempotency-Key` sent to a route that changes something and takes none is 400 `usage_error`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine
from typing import Any, get_args
from urllib.parse import unquote_to_bytes

from starlette.requests import Request
from starlette.responses import Response

from ._context import get_context
from ._errors import ApiError
from ._json_body import UniqueKeysRoute

__all__ = ["NOT_UTF8", "ApiRoute", "check_query"]

NOT_UTF8 = "must be UTF-8, each byte past ASCII percent-encoded"
"""Why a query string is refused that is not: Starlette read its escapes that are not UTF-8 as
U+FFFD and its raw bytes past ASCII as Latin-1, a filter for text no one sent."""

_WHOLE = re.compile("[0-9]+")
_DECIMAL = re.compile("[0-9]+(?:\\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


_UNKEYED = (
    "this route takes no Idempotency-Key (only POST /v1/sessions, .../messages and .../generate "
    "with a message do): send it without one"
)


def _refused(field: str, problem: str) -> ApiError:
    return ApiError(
        422,
        "invalid_request",
        f"{field}: {problem}",
        fields=[{"field": field, "problem": problem}],
    )


def _utf8_query(raw: bytes) -> bool:
    """Whether a raw query string is ASCII and its percent-escapes UTF-8 (a `%26` decoded among
    the rest changes nothing of that)."""
    if not raw.isascii():
        return False
    try:
        unquote_to_bytes(raw).decode("utf-8")
    except UnicodeDecodeError:  # a lone surrogate's encoding too
        return False
    return True


def check_query(request: Request) -> None:
    """422 `invalid_request` for a query string that is not UTF-8, each byte past ASCII
    percent-encoded: the API's routes and the dashboard's pages refuse it alike."""
    if not _utf8_query(request.scope.get("query_string", b"")):
        raise _refused("query", NOT_UTF8)


class ApiRoute(UniqueKeysRoute):
    """A `/v1` route: the caller authenticated, each parameter given once, numbers as digits."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        queries = [p.alias for p in self.dependant.query_params]
        headers = [p.alias for p in self.dependant.header_params]
        if self.body_field is not None:  # one value (RFC 9110): which of two counts is a guess
            headers.append("content-type")
        forms: dict[str, tuple[re.Pattern[str], str]] = {}
        for p in self.dependant.query_params:
            kinds = {p.field_info.annotation, *get_args(p.field_info.annotation)}
            if int in kinds:
                forms[p.alias] = (_WHOLE, "a whole number in plain digits")
            elif float in kinds:
                forms[p.alias] = (_DECIMAL, "a number in plain decimal digits (90, 1.5, 1e3)")

        # A key on a route that takes none would be dropped: its repeat acts again, unsaid.
        changes = bool((self.methods or set()) - {"GET", "HEAD"})
        unkeyed = changes and "Idempotency-Key" not in headers

        async def checked(request: Request) -> Response:
            await get_context(request).require(request)
            check_query(request)
            if unkeyed and "idempotency-key" in request.headers:
                raise ApiError(400, "usage_error", _UNKEYED)
            for where, names, given in (
                ("query", queries, request.query_params),
                ("header", headers, request.headers),
            ):
                for name in names:
                    values = given.getlist(name)
                    if len(values) > 1:
                        raise _refused(f"{where}.{name}", f"given {len(values)} times")
                    form = forms.get(name) if where == "query" and values else None
                    if form is not None and not form[0].fullmatch(values[0]):
                        raise _refused(f"{where}.{name}", f"must be {form[1]}, not {values[0]!r}")
            return await handler(request)

        return checked
