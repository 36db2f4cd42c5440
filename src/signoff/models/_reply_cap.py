"""A cap on the size of a provider's reply, applied while the body is read: a broken or hostile
server sending an endless body (or a small gzip bomb) fails the call after about the cap, instead
of filling the process's memory before `max_response_bytes` could look at the parsed reply.

The SDK clients get an HTTP client whose response hook wraps each body's stream; gzip and
deflate bodies are inflated here, counted as they are inflated, so the cap bounds the text the
SDK would parse, not just the bytes on the wire. Only those two are asked for: a reply in any
other encoding (or two at once) fails the call.
"""

from __future__ import annotations

import importlib
import zlib
from collections.abc import AsyncIterator, Mapping
from types import ModuleType
from typing import Any

from ._retry_after import refuse_long_waits
from ._urls import shown_url

__all__ = [
    "DEFAULT_MAX_REPLY_BYTES",
    "KNOWN_ENCODINGS",
    "ReplyTooLarge",
    "cap_reply",
    "capped_http_client",
    "check_reply_cap",
]

DEFAULT_MAX_REPLY_BYTES = 16 * 1024 * 1024
"""A reply body (as inflated) longer than this fails the call: far over any real completion."""

_ERRORS: dict[type[Exception], type[ReplyTooLarge]] = {}
_STREAMS: dict[str, type[_CappedStream]] = {}


class ReplyTooLarge(Exception):
    """A reply body passed the cap while it was read (or announced a length over it);
    `reply_status` is the HTTP status of the reply."""

    reply_status = 0


def _error_for(sdk_error: type[Exception]) -> type[ReplyTooLarge]:
    """`ReplyTooLarge` as the SDK's own error type too, so the SDK neither retries it (the next
    reply would be as large) nor wraps it as a connection failure."""
    known = _ERRORS.get(sdk_error)
    if known is None:
        known = _ERRORS[sdk_error] = type("ReplyTooLarge", (ReplyTooLarge, sdk_error), {})
    return known


def check_reply_cap(owner: str, value: object) -> int:
    """`max_reply_bytes` as given to a model adapter or a client: a whole number of bytes, at
    least 1 KiB."""
    from .._exceptions import UsageError

    if isinstance(value, bool) or not isinstance(value, int) or value < 1024:
        raise UsageError(f"{owner}: max_reply_bytes must be an integer >= 1024, not {value!r}")
    return value


class _Inflater:
    """gzip or deflate (zlib-wrapped, or raw as some servers send it) inflated piece by piece,
    never producing more than it is asked for at once."""

    def __init__(self, encoding: str) -> None:
        self._raw_fallback = encoding == "deflate"
        wbits = zlib.MAX_WBITS | 16 if encoding == "gzip" else zlib.MAX_WBITS
        self._z = zlib.decompressobj(wbits)
        self._started = False

    def inflate(self, data: bytes, most: int) -> bytes:
        try:
            out = self._z.decompress(data, most)
        except zlib.error:
            if not self._raw_fallback or self._started:
                raise
            self._z = zlib.decompressobj(-zlib.MAX_WBITS)  # a deflate body without its header
            out = self._z.decompress(data, most)
        self._started = True
        return out

    @property
    def tail(self) -> bytes:
        return self._z.unconsumed_tail

    def flush(self) -> bytes:
        return self._z.flush()


class _CappedStream:
    """A response body stream that stops with `error` once more than `cap` bytes came out of it
    (inflated, when `encoding` is gzip or deflate), or, `per_line`, more than `cap` bytes
    without a line break: an event stream may go on for ever, but no line of it may."""

    def __init__(
        self,
        inner: Any,
        cap: int,
        encoding: str | None,
        error: type[ReplyTooLarge],
        url: str,
        *,
        status: int = 0,
        per_line: bool = False,
    ) -> None:
        self._inner, self._cap, self._error, self._url = inner, cap, error, url
        self._inflater = _Inflater(encoding) if encoding else None
        self._seen = 0
        self._status, self._per_line = status, per_line

    def _count(self, data: bytes) -> bytes:
        if self._per_line:
            end = max(data.rfind(b"\n"), data.rfind(b"\r"))
            self._seen = len(data) - end - 1 if end >= 0 else self._seen + len(data)
        else:
            self._seen += len(data)
        if self._seen > self._cap:
            what = "a line of the reply" if self._per_line else "the reply"
            exc = self._error(
                f"{what} from {self._url} passed {self._cap:,} bytes (max_reply_bytes); "
                "it was cut off there"
            )
            exc.reply_status = self._status
            raise exc
        return data

    async def __aiter__(self) -> AsyncIterator[bytes]:
        inflater = self._inflater
        try:
            async for chunk in self._inner:
                if inflater is None:
                    yield self._count(chunk)
                    continue
                data = chunk
                while data:
                    out = inflater.inflate(data, self._cap - self._seen + 1)
                    yield self._count(out)
                    data = inflater.tail
            if inflater is not None:
                yield self._count(inflater.flush())
        except zlib.error as exc:
            error = self._error(
                f"the reply from {self._url} is labelled compressed, but the body could not be "
                f"decoded: {exc}"
            )
            error.reply_status = self._status
            raise error from exc

    async def aclose(self) -> None:
        await self._inner.aclose()


def _stream_type(response: Any) -> type[_CappedStream]:
    """`_CappedStream` as an async byte stream of the HTTP package the SDK uses (`httpx`, or
    the `httpx2` of newer SDKs), which its responses check the type of."""
    package = type(response).__module__.partition(".")[0]
    known = _STREAMS.get(package)
    if known is None:
        base = importlib.import_module(package).AsyncByteStream
        known = _STREAMS[package] = type("CappedStream", (_CappedStream, base), {})
    return known


def _coding(header: str, url: str, error: type[ReplyTooLarge]) -> str | None:
    """The one compression (`gzip` or `deflate`) a `Content-Encoding` header names, or None for
    none; any other (two codings, `br`, ...) the HTTP package might inflate past the cap, or
    could not read at all, so it fails the call."""
    codings = [c.strip().lower() for c in header.split(",")]
    codings = ["gzip" if c == "x-gzip" else c for c in codings if c not in ("", "identity")]
    if not codings:
        return None
    if len(codings) > 1 or codings[0] not in ("gzip", "deflate"):
        raise error(
            f"the reply from {url} is encoded as {header!r}, not asked for: only one gzip or "
            "deflate coding is read (within max_reply_bytes)"
        )
    return codings[0]


def cap_reply(
    response: Any, cap: int, error: type[ReplyTooLarge], *, streams: bool = False
) -> None:
    """Have `response` (an httpx response, before its body is read) read its body within `cap`
    bytes, raising `error`. With `streams`, an event stream asked for as one (`Accept:
    text/event-stream`) is capped line by line instead: it may go on for ever."""
    url = shown_url(response.request.url.copy_with(query=None))
    status = response.status_code
    per_line = (
        streams
        and response.request.headers.get("accept", "") == "text/event-stream"
        and response.headers.get("content-type", "").startswith("text/event-stream")
    )
    length = response.headers.get("content-length", "")
    if not per_line and length.isdigit() and int(length) > cap:
        exc = error(
            f"the reply from {url} announced {int(length):,} bytes, over max_reply_bytes ({cap:,})"
        )
        exc.reply_status = status
        raise exc
    try:
        encoding = _coding(response.headers.get("content-encoding", ""), url, error)
    except ReplyTooLarge as exc:
        exc.reply_status = status
        raise
    if encoding is not None:
        del response.headers["content-encoding"]  # inflated here, counted as it inflates
    capped = _stream_type(response)
    response.stream = capped(
        response.stream, cap, encoding, error, url, status=status, per_line=per_line
    )


KNOWN_ENCODINGS = "gzip, deflate"
"""The `Accept-Encoding` a capped client sends: the codings `cap_reply` inflates itself."""


def capped_http_client(
    sdk: ModuleType, sdk_error: type[Exception], cap: int, options: Mapping[str, Any] | None = None
) -> Any:
    """The SDK's default async HTTP client (its timeouts, connection limits and redirects), with
    every reply body capped at `cap` bytes and no retry after a wait past `MAX_RETRY_WAIT`;
    `options` are further arguments for it."""
    error = _error_for(sdk_error)

    async def cap_replies(response: Any) -> None:
        cap_reply(response, cap, error)

    async def ask_for_known_encodings(request: Any) -> None:
        request.headers["Accept-Encoding"] = KNOWN_ENCODINGS

    return sdk.DefaultAsyncHttpxClient(
        event_hooks={
            "request": [ask_for_known_encodings],
            "response": [cap_replies, refuse_long_waits],
        },
        **(options or {}),
    )
