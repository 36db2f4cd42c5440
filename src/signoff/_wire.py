"""What a signoff server sends, as the client reads it: error bodies as the named exceptions,
the JSON of results, and the event stream's messages; anything else is a `RemoteError`."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpx

from . import _exceptions as errors
from ._events import Event
from ._types import InputRequest
from .stores import SessionSummary

__all__ = [
    "ERRORS",
    "MOST_RETRY_AFTER",
    "REFUSED",
    "backoff",
    "error",
    "event",
    "malformed",
    "not_signoff",
    "past_head",
    "page",
    "raise_for",
    "request_ids",
    "session_page",
    "session_view",
    "shown_url",
    "slots_full",
    "sse_data",
    "streamed",
    "transient",
    "transport_error",
]

ERRORS: dict[str, type[errors.SignoffError]] = {
    cls.code: cls
    for cls in (
        errors.SignoffError,
        errors.UsageError,
        errors.InvalidAnswer,
        errors.TooLarge,
        errors.UnknownAgent,
        errors.UnknownTool,
        errors.IdempotencyKeyReused,
        errors.SessionError,
        errors.UnknownSession,
        errors.SessionDeleted,
        errors.SessionExpired,
        errors.SessionBusy,
        errors.SessionWaiting,
        errors.SubagentSession,
        errors.SubagentOrphaned,
        errors.SessionLimitReached,
        errors.AnswerError,
        errors.UnknownRequest,
        errors.PartialAnswer,
        errors.ConflictingAnswer,
        errors.RequestClosed,
        errors.StaleAnswer,
        errors.NotAllowed,
        errors.ModelError,
        errors.StoreError,
        errors.SchemaVersionError,
        errors.StoreGone,
        errors.AppendConflict,
        errors.LeaseLost,
        errors.EventsRewritten,
        errors.StoreUnavailable,
        errors.StoreBusy,
    )
}
MOST_RETRY_AFTER = 30
"""The longest wait a `Retry-After` sets, in seconds: one of years (a server of another kind at
the address, or hostile) would hang the caller that honours it."""
REFUSED = ("invalid_request",)
"""Codes of a request the server refused as malformed: a misuse, as it would be in process."""


def raise_for(response: httpx.Response) -> None:
    """The error a refused call's answer names, or a `RemoteError` (`http_error`) for an answer
    that is not a signoff server's error (a proxy's page; a redirect, which is not followed)."""
    if response.is_success:
        return
    try:
        exc = error(response.json()["error"], response.status_code, response.request.url.path)
    except Exception:
        status = response.status_code
        said = f"HTTP {status} from {shown_url(response.request.url)}"
        location = response.headers.get("location", "") if 300 <= status < 400 else ""
        if location:  # e.g. http:// sent to https://: the base URL to use instead
            try:
                to = shown_url(response.request.url.join(location))
            except httpx.InvalidURL:
                to = repr(location[:200])
            said += f": the server redirects to {to}, which the client does not follow"
        raise errors.RemoteError(
            f"{said}: {response.text[:200]}", "http_error", response.status_code
        ) from None
    if isinstance(exc, (errors.StoreBusy, errors.StoreUnavailable)):
        hint = response.headers.get("retry-after", "").strip()
        if hint.isascii() and hint.isdigit() and len(hint) < 10:
            # the server's, rather than the class's default; bounded as `backoff` waits
            exc.retry_after = min(int(hint), MOST_RETRY_AFTER)
    raise exc


def shown_url(url: httpx.URL | str) -> str:
    """`url` as an error may show it: without its userinfo, whose password (a proxy's basic
    authentication) would be in every message and log line the error reaches."""
    url = httpx.URL(url)
    return str(url.copy_with(userinfo=b"")) if url.userinfo else str(url)


def request_ids(value: Any) -> list[str]:
    """The `request_ids` of an error body: a list of ids, or none (never a string's letters)."""
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def error(detail: Mapping[str, Any], status: int, path: str = "") -> errors.SignoffError:
    """The exception an error body (`{"code", "message", ...}`) names, as a local class; a
    request refused as malformed is an `InvalidAnswer` when it carried answers."""
    code, message = str(detail["code"]), str(detail["message"])
    cls = ERRORS.get(code)
    if code in REFUSED:
        answering = path.endswith(("/responses", "/approvals"))
        cls = errors.InvalidAnswer if answering else errors.UsageError
    if cls is None:
        return errors.RemoteError(message, code, status)
    exc = cls.__new__(cls)
    Exception.__init__(exc, message)  # the server's message, the local class
    if issubclass(cls, (errors.AnswerError, errors.InvalidAnswer)):
        exc.request_ids = request_ids(detail.get("request_ids"))  # type: ignore[attr-defined]
    if issubclass(cls, (errors.SessionError, errors.IdempotencyKeyReused, errors.EventsRewritten)):
        exc.session_id = str(detail.get("session_id") or "")  # type: ignore[attr-defined]
    if issubclass(cls, errors.EventsRewritten):
        exc.seq = int(detail.get("seq") or 0)  # type: ignore[attr-defined]
    if issubclass(cls, errors.SessionWaiting):
        exc.request_ids = request_ids(detail.get("request_ids"))  # type: ignore[attr-defined]
        exc.held_by = request_ids(detail.get("held_by"))  # type: ignore[attr-defined]
    if issubclass(cls, (errors.SubagentSession, errors.SubagentOrphaned)):
        exc.parent_id = ""  # type: ignore[attr-defined]  # the server's message names it
    if issubclass(cls, errors.SubagentOrphaned):
        exc.lapsed = None  # type: ignore[attr-defined]  # the server's message names it too
    if issubclass(cls, errors.SessionExpired):
        exc.pending = request_ids(detail.get("request_ids"))  # type: ignore[attr-defined]
    if issubclass(cls, errors.ModelError):
        exc.usage = None  # type: ignore[attr-defined]  # a reply's cost: the server's to count
    return exc


def malformed(response: httpx.Response, wanted: str, exc: Exception) -> errors.RemoteError:
    """A body that is JSON but not the shape a signoff server sends for this call."""
    return errors.RemoteError(
        f"HTTP {response.status_code} from {shown_url(response.request.url)} is not {wanted} "
        f"({type(exc).__name__}: {str(exc)[:200]})",
        "http_error",
        response.status_code,
    )


def not_signoff(response: httpx.Response, wanted: str) -> errors.RemoteError:
    """A successful response that is not what a signoff server sends (another web server)."""
    return errors.RemoteError(
        f"HTTP {response.status_code} from {shown_url(response.request.url)} is not {wanted}: "
        f"{response.text[:200]}",
        "http_error",
        response.status_code,
    )


def event(data: Mapping[str, Any]) -> Event:
    """The event a stream's message holds, its fields as sent: one of another type (a `"7"`
    seq, a numeric turn_id) is `StoreDamaged` here, a malformed message (`streamed`)."""
    if not isinstance(data.get("session_id"), str) or not isinstance(data.get("type"), str):
        raise ValueError("it has no session_id and type")
    at = data["at"]
    return Event.from_row(
        session_id=data["session_id"],
        seq=data["seq"],
        type=data["type"],
        at=float(at) if type(at) is int else at,
        turn_id=data.get("turn_id"),
        data=data.get("data") or {},
        v=data.get("v", 1),
    )


def session_view(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get("status"), str):
        raise ValueError("it has no status")
    return data


def page(data: Any) -> tuple[list[InputRequest], int]:
    return [InputRequest.model_validate(r) for r in data["items"]], int(data["total"])


def session_page(data: Any) -> tuple[list[SessionSummary], int]:
    return [_summary(r) for r in data["items"]], int(data["total"])


def _summary(row: Any) -> SessionSummary:
    """One listed session; a field of the wrong type is a `ValueError` (a malformed answer)."""
    texts = [row[k] for k in ("id", "agent", "status")]
    if not all(isinstance(t, str) for t in texts) or not isinstance(row["seq"], int):
        raise ValueError(f"not a listed session: {row!r}")
    expires_at = row["expires_at"]
    return SessionSummary(
        id=texts[0],
        agent=texts[1],
        status=texts[2],
        head=row["seq"],
        created_at=float(row["created_at"]),
        updated_at=float(row["updated_at"]),
        expires_at=None if expires_at is None else float(expires_at),
    )


def transient(response: httpx.Response) -> bool:
    """Whether a refused stream is worth asking for again: a gateway's error while the server
    behind it restarts (or its rate limit), or a store that is busy or down for a while."""
    if response.status_code not in (429, 502, 503, 504):
        return False
    try:
        code = response.json()["error"]["code"]
    except Exception:
        return True  # not a signoff error body: the proxy's own page
    return code in (errors.StoreBusy.code, errors.StoreUnavailable.code)


def slots_full(response: httpx.Response) -> bool:
    """Whether a stream was refused as one more than the server serves the caller (429
    `too_many_streams`): worth asking again on a reconnect, whose old connection the server may
    not have seen go yet (it notices a silent cut only when its writes fail)."""
    if response.status_code != 429:
        return False
    try:
        return bool(response.json()["error"]["code"] == "too_many_streams")
    except Exception:
        return False


def past_head(response: httpx.Response) -> bool:
    """Whether a stream was refused as starting past the session's last event (422
    `invalid_request`): asked from an event the server sent, the store no longer has it."""
    if response.status_code != 422:
        return False
    try:
        return bool(response.json()["error"]["code"] == "invalid_request")
    except Exception:
        return False


def backoff(failures: int, response: httpx.Response | None = None) -> float:
    """Seconds to wait before attempt `failures + 1`: doubling up to 2 s, or the server's
    `Retry-After` (up to 30 s) when it names a longer wait."""
    pause = min(0.1 * 2.0**failures, 2.0)
    hint = "" if response is None else response.headers.get("retry-after", "").strip()
    if hint.isascii() and hint.isdigit() and len(hint) < 10:
        pause = max(pause, min(float(hint), MOST_RETRY_AFTER))
    return pause


def streamed(kind: str, data: Any) -> Event:
    """The event a stream's message carries; a `stream.end` raises the error it names."""
    try:
        if kind != "stream.end":
            return event(data)
        end = error(data["error"], int(data["status"]))  # the session can have no more events
    except (
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
        OverflowError,
        errors.StoreDamaged,  # the server's message, not this process's store
    ) as exc:
        raise errors.RemoteError(
            f"the event stream sent a {kind!r} message that is not a signoff event "
            f"({type(exc).__name__}: {str(exc)[:200]})",
            "http_error",
            200,
        ) from None
    raise end


async def sse_data(
    lines: AsyncIterator[str], most: int | None = None
) -> AsyncIterator[tuple[str, Any]]:
    """Each message's event type (`message` if it names none) and its JSON data; a comment
    (the server's keep-alive) as `(":", None)`, which says the server is still there. A message
    whose data lines add up to more than `most` characters is `reply_too_large`."""
    data: list[str] = []
    size = 0
    kind = "message"
    async for line in lines:
        if line == "":
            size = 0
            if data:
                text = "\n".join(data)
                try:
                    value = json.loads(text)
                except (ValueError, RecursionError):  # nested past the parser's depth too
                    raise errors.RemoteError(
                        f"the event stream sent data that is not JSON: {text[:200]}",
                        "http_error",
                        200,
                    ) from None
                yield kind, value
            data, kind = [], "message"
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
            size += len(data[-1]) + 1
            if most is not None and size > most:
                raise errors.RemoteError(
                    f"an event of the stream passed {most:,} characters (max_reply_bytes); "
                    "it was cut off there",
                    "reply_too_large",
                    200,
                )
        elif line.startswith("event:"):
            kind = line[6:].removeprefix(" ")
        elif line.startswith(":"):
            yield ":", None


def _untrusted(exc: BaseException) -> bool:
    """Whether a failed connection failed on the server's certificate (httpx keeps the `ssl`
    error as the cause, or in its text when it came through httpcore's mapping)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return True
        seen = seen.__cause__ or seen.__context__
    return "CERTIFICATE_VERIFY_FAILED" in str(exc)


def transport_error(exc: httpx.TransportError, url: object) -> errors.RemoteError:
    """A call that got no answer, as a `RemoteError` (status 0) saying whether it was sent:
    `unreachable` (it was not), `timeout` or `connection_lost` (it may have been applied)."""
    if isinstance(exc, httpx.PoolTimeout):  # e.g. 100 streams followed on one client
        code = "unreachable"
        what = "every connection of the client stayed in use (100, followed streams included)"
        what += "; the call was not sent"
    elif isinstance(exc, httpx.ConnectError) and _untrusted(exc):
        code = "unreachable"
        what = "the server's TLS certificate could not be verified; the call was not sent "
        what += "(pass verify= an ssl.SSLContext that trusts its certificate authority)"
    elif isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
        code, what = "unreachable", "could not reach the server; the call was not sent"
    elif isinstance(exc, httpx.TimeoutException):
        code, what = "timeout", "the server did not answer within the client's timeout"
    else:
        code, what = "connection_lost", "the connection was lost before the server answered"
    if code != "unreachable":
        what += "; the call may or may not have been applied"
    return errors.RemoteError(f"{url}: {what} ({type(exc).__name__}: {exc})", code, 0)
