"""`ApiRoute`: what every `/v1` route checks before FastAPI reads the request.

The caller is authenticated first, so one without a valid token is told that (401), not what is
wrong with a body or query it would send again only to get the 401. A query or header parameter
given twice is refused: FastAPI reads one of them (a query's last, a header's first) where a
proxy or a log may read the other, or join them. A whole-number query parameter is plain digits,
as `Last-Event-ID` is: pydantic would also read `1_0` as 10 and `+5` or ` 5` as 5.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ._context import get_context
from ._errors import ApiError
from ._json_body import UniqueKeysRoute

__all__ = ["ApiRoute"]


def _refused(field: str, problem: str) -> ApiError:
    return ApiError(
        422,
        "invalid_request",
        f"{field}: {problem}",
        fields=[{"field": field, "problem": problem}],
    )


class ApiRoute(UniqueKeysRoute):
    """A `/v1` route: the caller authenticated, each parameter given once, numbers as digits."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        queries = [p.alias for p in self.dependant.query_params]
        headers = [p.alias for p in self.dependant.header_params]
        whole = {p.alias for p in self.dependant.query_params if p.field_info.annotation is int}

        async def checked(request: Request) -> Response:
            await get_context(request).require(request)
            for where, names, given in (
                ("query", queries, request.query_params),
                ("header", headers, request.headers),
            ):
                for name in names:
                    values = given.getlist(name)
                    if len(values) > 1:
                        raise _refused(f"{where}.{name}", f"given {len(values)} times")
                    if (
                        values
                        and name in whole
                        and not (values[0].isascii() and values[0].isdigit())
                    ):
                        raise _refused(
                            f"{where}.{name}",
                            f"must be a whole number in plain digits, not {values[0]!r}",
                        )
            return await handler(request)

        return checked
