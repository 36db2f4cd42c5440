"""`UniqueKeysRoute`: the API's JSON bodies are UTF-8 and may not name a key twice.

Parsers disagree on such a body: Python's keeps the last value, others keep the first, so a
gateway or log that checked `{"approved": false, "approved": true}` would record one decision
while signoff applied the other. The body is refused instead (422 `invalid_request`), and so is
one holding an integer longer than Python converts (`sys.get_int_max_str_digits()`, 4300 digits),
which is valid JSON: FastAPI would call it a malformed body. A body in another encoding than
UTF-8 (RFC 8259, section 8.1), which `json.loads` would guess from its bytes (UTF-16, UTF-32),
is 400 `malformed_json`: a gateway inspecting it as UTF-8 would read something else. So is one
labelled with another charset (`application/json; charset=utf-16`), which the server would read
as UTF-8 and a gateway decoding by the label as other text, as a dashboard form's part so
labelled is refused. A body
with a `Content-Encoding` (gzip, say) is 415 `unsupported_encoding`: the server decodes none,
so it would read a compressed body as malformed JSON, and act on a plain one so labelled that
a gateway decoding it by its label reads as something else.
"""

from __future__ import annotations

import codecs
import json
import sys
from collections.abc import Callable, Coroutine
from email.message import Message
from email.utils import collapse_rfc2231_value
from typing import Any

from fastapi.routing import APIRoute
from starlette.requests import Request
from starlette.responses import Response

from ._errors import ApiError, is_json

__all__ = ["RepeatedKey", "UniqueKeysRoute", "body_problem", "encoding_problem", "unique_keys"]


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


def _refused(message: str, field: str, problem: str) -> ApiError:
    return ApiError(422, "invalid_request", message, fields=[{"field": field, "problem": problem}])


async def body_problem(request: Request) -> ApiError | None:
    """The error for a JSON body naming a key twice in one object, or holding an integer too
    long to convert; None for any other. A body that does not parse is left to FastAPI, which
    names what is wrong with it."""
    if not is_json(request.headers.get("content-type")):
        return None
    body = await request.body()  # kept by the request: FastAPI reads it again from there
    if not body:
        return None
    charset = _charset(request.headers.get("content-type", ""))
    if charset is not None:
        return ApiError(400, "malformed_json", f"{_NOT_UTF8}, not labelled charset={charset}")
    try:
        # A string, so that no encoding is guessed; a UTF-8 byte order mark may be ignored.
        text = body.removeprefix(b"\xef\xbb\xbf").decode("utf-8")
        json.loads(text, object_pairs_hook=unique_keys)
    except RepeatedKey as twice:
        message = f"the body names the key {twice.key!r} twice in one object"
        return _refused(message, twice.key, "named twice")
    except (json.JSONDecodeError, UnicodeDecodeError):
        if _parses(body):  # JSON only in an encoding json.loads guessed
            return ApiError(400, "malformed_json", _NOT_UTF8)
        return None
    except RecursionError:
        return None
    except ValueError:  # the one other error of a parse: an integer past Python's digit limit
        message = (
            "the body holds a number too long to read: an integer of more than "
            f"{sys.get_int_max_str_digits()} digits"
        )
        return _refused(message, "body", message)
    return None


def encoding_problem(request: Request) -> ApiError | None:
    """The error for a body sent with a content coding other than `identity`; None without
    one. The refusal names the one coding taken (RFC 9110, section 15.5.16)."""
    sent = ", ".join(request.headers.getlist("content-encoding"))
    codings = [c.strip().lower() for c in sent.split(",")]
    if all(c in ("", "identity") for c in codings):
        return None
    return ApiError(
        415,
        "unsupported_encoding",
        f"the request body is sent with Content-Encoding {sent.strip()!r}: this server reads "
        "only bodies sent as they are (identity), not compressed",
        headers={"Accept-Encoding": "identity"},
    )


_NOT_UTF8 = "the request body is not valid JSON in UTF-8 (JSON is sent as UTF-8)"


def _charset(content_type: str) -> str | None:
    """The charset a Content-Type names (unquoted) other than UTF-8, if any: the first of them,
    where it names several (a parser may read any one)."""
    message = Message()
    message["content-type"] = content_type
    for name, value in (message.get_params() or [])[1:]:
        charset = collapse_rfc2231_value(value) if name.lower() == "charset" else None
        if charset is not None and _codec(charset) != "utf-8":
            return charset
    return None


def _codec(charset: str) -> str | None:
    try:
        return codecs.lookup(charset).name
    except LookupError:
        return None


def _parses(body: bytes) -> bool:
    """Whether `json.loads` reads `body`, guessing its encoding as it does for bytes."""
    try:
        json.loads(body)
    except (ValueError, RecursionError):  # UnicodeDecodeError and JSONDecodeError among them
        return False
    return True


class UniqueKeysRoute(APIRoute):
    """A route that refuses a JSON body naming a key twice (or holding an integer too long to
    read, or sent compressed), before FastAPI reads it."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        takes_body = self.body_field is not None

        async def unique_keys(request: Request) -> Response:
            problem = encoding_problem(request) if takes_body else None
            if problem is None:
                problem = await body_problem(request)
            if problem is not None:
                raise problem
            return await handler(request)

        return unique_keys
