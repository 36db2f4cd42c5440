"""How a dashboard form's body is read: as UTF-8, each field once, as the API reads its JSON.

Starlette reads a urlencoded value's escapes that are not UTF-8 as U+FFFD and its raw bytes past
ASCII as Latin-1 (`text=é` sent by `curl -d` became "Ã©"), and a multipart part as its label's
charset or, failing that, as Latin-1: each was recorded so, as a reason or an answer. Nor does
it refuse a field named twice (`option=cancel&option=approve`), keeping the last value where a
gateway or a log may keep the first, the ambiguity the API refuses in a JSON body.
"""

from __future__ import annotations

import codecs
from collections import Counter
from urllib.parse import unquote_to_bytes

from fastapi import Request
from starlette.exceptions import HTTPException

from .._form_fields import TOO_MANY_FIELDS, too_many_fields
from ._errors import ApiError, malformed_form

__all__ = ["form_fields"]

_URLENCODED = "application/x-www-form-urlencoded"
_MULTIPART = "multipart/form-data"

_NO_FIELD_BOUND = 2**62


NOT_UTF8 = "it is not UTF-8 (a form is sent as UTF-8, each byte past ASCII percent-encoded)"


def _malformed(why: str) -> ApiError:
    return ApiError(400, "malformed_form", malformed_form(why))


def _utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:  # a lone surrogate's encoding too
        return False
    return True


def _type(request: Request) -> tuple[str, dict[str, str]]:
    """The body's media type, lowercased, and the parameters of its label (`charset`,
    `boundary`), by lowercased name: the last of a name given twice, as the parser reads it."""
    kind, *params = request.headers.get("content-type", "").split(";")
    named: dict[str, str] = {}
    for param in params:
        name, _, value = param.partition("=")
        named[name.strip().lower()] = value.strip().strip('"')
    return kind.strip().lower(), named


def _closed(body: bytes, boundary: str) -> bool:
    """Whether a multipart body has its closing boundary: the parser drops a last part cut off
    before it (a reason or an answer lost, the rest acted on) rather than refuse the body."""
    close = b"--" + boundary.encode("latin-1") + b"--"
    return body.startswith(close) or b"\r\n" + close in body


async def _check_bytes(request: Request) -> None:
    """400 `malformed_form` for a form body the parser would read as something it does not say:
    over the fields a form may have (`too_many_fields`, refused unparsed), not UTF-8, or
    labelled with another charset (read as UTF-8, where a gateway decodes it by its label)."""
    kind, params = _type(request)
    charset = params.get("charset")
    if kind in (_URLENCODED, _MULTIPART) and charset is not None and _codec(charset) != "utf-8":
        raise _malformed(f"it is labelled {charset!r}: a form is sent as UTF-8")
    if kind == _URLENCODED:
        body = await request.body()
        if too_many_fields(body):
            raise _malformed(TOO_MANY_FIELDS)
        # Decoded as Starlette does, but strictly: escapes as UTF-8, and no raw byte past
        # ASCII, which a browser never sends (it percent-encodes them) and Starlette reads as
        # Latin-1. A `%26` decoded among the rest changes nothing of whether they are UTF-8.
        if not body.isascii() or not _utf8(unquote_to_bytes(body)):
            raise _malformed(NOT_UTF8)
    elif kind == _MULTIPART:
        body = await request.body()
        if not _utf8(body):  # the dashboard's forms have no file to upload
            raise _malformed(NOT_UTF8)
        boundary = params.get("boundary")
        if boundary and boundary.isascii() and not _closed(body, boundary):
            raise _malformed("its parts end before the closing boundary (cut off?)")


def _codec(charset: str) -> str | None:
    try:
        return codecs.lookup(charset).name
    except LookupError:
        return None


async def form_fields(request: Request) -> dict[str, str]:
    """The posted form's text fields. A body that is not a readable form (too many fields,
    broken multipart, not UTF-8) is 400 `malformed_form`; a field named twice, or a second
    `Content-Type`, is 422 `invalid_request`."""
    types = request.headers.getlist("content-type")
    if len(types) > 1:  # Starlette reads the first, where a proxy may read the last
        problem = f"given {len(types)} times"
        raise ApiError(
            422,
            "invalid_request",
            f"header.content-type: {problem}",
            fields=[{"field": "header.content-type", "problem": problem}],
        )
    await _check_bytes(request)
    try:
        # A field may be as long as the body (`max_body_size` bounds it): Starlette's 1 MiB
        # a field refused a reason or an answer the API takes, as 400 `malformed_form`.
        form = await request.form(max_part_size=_NO_FIELD_BOUND)
    except HTTPException as exc:
        if exc.status_code != 400:
            raise
        raise _malformed(exc.detail) from None
    counts = Counter(name for name, _ in form.multi_items())
    twice = [name for name, count in counts.items() if count > 1]
    if twice:
        name = twice[0] if len(twice[0]) <= 100 else twice[0][:100] + "…"
        message = f"the form names the field {name!r} {counts[twice[0]]} times: send it once"
        problem = "named more than once"
        raise ApiError(
            422, "invalid_request", message, fields=[{"field": name, "problem": problem}]
        )
    files = [name for name, value in form.multi_items() if not isinstance(value, str)]
    if files:  # dropped, it was a reason or an answer lost with the rest acted on
        await form.close()
        name = files[0] if len(files[0]) <= 100 else files[0][:100] + "…"
        raise _malformed(f"the field {name!r} is sent as a file: the form has no file to upload")
    return {k: v for k, v in form.items() if isinstance(v, str)}
