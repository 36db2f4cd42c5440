"""`UniqueKeysRoute`: the API's JSON bodies may not name a key twice.

Parsers disagree on such a body: Python's keeps the last value, others keep the first, so a
gateway or log that checked `{"approved": false, "approved": true}` would record one decision
while signoff applied the other. The body is refused instead (422 `invalid_request`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from ._errors import ApiError, is_json

__all__ = ["RepeatedKey", "UniqueKeysRoute", "unique_keys"]


class RepeatedKey(ValueError):
    """Raised by `unique_keys` for a JSON object naming `key` twice."""

    def __init__(self, key: str) -> None:
        self.key = key if len(key) <= 100 else key[:100] + "…"
        super().__init__(f"the key {self.key!r} is named twice in one object")


def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`'s `object_pairs_hook` that refuses an object naming a key twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise RepeatedKey(key)
        seen.add(key)
    return dict(pairs)


async def repeated_key(request: Request) -> str | None:
    """A key the request's JSON body names twice in one object, or None. A body that does not
    parse is left to FastAPI, which names what is wrong with it."""
    if not is_json(request.headers.get("content-type")):
        return None
    body = await request.body()  # kept by the request: FastAPI reads it again from there
    if not body:
        return None
    try:
        json.loads(body, object_pairs_hook=unique_keys)
    except RepeatedKey as twice:
        return twice.key
    except (ValueError, RecursionError):
        return None
    return None


class UniqueKeysRoute(APIRoute):
    """A route that refuses a JSON body naming a key twice, before FastAPI reads it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def unique_keys(request: Request) -> Response:
            key = await repeated_key(request)
            if key is not None:
                raise ApiError(
                    422,
                    "invalid_request",
                    f"the body names the key {key!r} twice in one object",
                    fields=[{"field": key, "problem": "named twice"}],
                )
            return await handler(request)

        return unique_keys
