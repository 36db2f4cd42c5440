"""JSON errors with stable codes: every `SignoffError` and every bad request maps to a 4xx."""

from __future__ import annotations

import logging
from email.message import Message
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.models import OpenAPI
from pydantic import BaseModel, ConfigDict
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from .._exceptions import (
    AnswerError,
    ConflictingAnswer,
    EventsRewritten,
    IdempotencyKeyReused,
    InvalidAnswer,
    ModelError,
    NotAllowed,
    PartialAnswer,
    RequestClosed,
    SessionBusy,
    SessionDeleted,
    SessionError,
    SessionExpired,
    SessionLimitReached,
    SignoffError,
    StaleAnswer,
    StoreBusy,
    StoreError,
    StoreUnavailable,
    TooLarge,
    UnknownAgent,
    UnknownRequest,
    UnknownSession,
    UnknownTool,
    UsageError,
)
from ._head import allowed, with_head
from ._headers import add_security_headers, add_server_time
from ._json_response import JSONText

__all__ = [
    "ERROR_RESPONSES",
    "add_error_body",
    "ApiError",
    "ErrorBody",
    "ErrorDetail",
    "error_response",
    "install_error_handlers",
    "is_json",
    "malformed_form",
    "public_message",
    "status_for",
]

log = logging.getLogger("signoff.server")


class ErrorDetail(BaseModel):
    model_config = ConfigDict(extra="forbid")

    code: str
    message: str
    request_ids: list[str] | None = None
    session_id: str | None = None
    held_by: list[str] | None = None  # `session_waiting`: the session of each of `request_ids`
    fields: list[dict[str, Any]] | None = None


class ErrorBody(BaseModel):
    """Every error response: `{"error": {"code": ..., "message": ...}}`."""

    model_config = ConfigDict(extra="forbid")

    error: ErrorDetail


class ApiError(Exception):
    """An HTTP-level error raised by the routes themselves (auth, visibility, bad agent)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}
        self.extra = extra


# Most specific first: the first class an error is an instance of decides its status.
_STATUS: list[tuple[type[SignoffError], int]] = [
    (SessionDeleted, 410),
    (UnknownSession, 404),
    (UnknownRequest, 404),
    (ConflictingAnswer, 409),
    (IdempotencyKeyReused, 409),
    (RequestClosed, 409),
    (StaleAnswer, 409),
    (SessionBusy, 409),
    (PartialAnswer, 422),
    (InvalidAnswer, 422),
    (NotAllowed, 403),
    (SessionExpired, 410),
    (SessionLimitReached, 409),
    (AnswerError, 422),
    (SessionError, 409),
    (TooLarge, 413),
    (UnknownAgent, 422),
    (UnknownTool, 422),
    (UsageError, 400),
    (ModelError, 502),
    (EventsRewritten, 409),
    (StoreError, 503),
]


def status_for(exc: SignoffError) -> int:
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def public_message(exc: SignoffError) -> str:
    """What a caller is told of `exc`: its message, except for a store failure, whose message
    names the database and the driver's error; that goes to the server's log instead."""
    if isinstance(exc, StoreUnavailable):  # one line per call while the database is down
        log.warning("the store is unavailable: %s", exc)
        return "the store is unavailable (its database is down); try again later"
    if isinstance(exc, StoreBusy):  # one line per call while the server is overloaded
        log.warning("the store is busy: %s", exc)
        return (
            "the store is busy (no connection to its database, or its file's lock, came free in "
            "time); try again soon"
        )
    if isinstance(exc, EventsRewritten):  # names no database: the caller reads again
        log.warning("%s", exc)
        return str(exc)
    if isinstance(exc, StoreError):
        log.error("the store failed: %s", exc, exc_info=exc)
        return f"the store failed ({type(exc).__name__}); see the server's log"
    return str(exc)


FORM_TYPES = ("multipart/form-data", "application/x-www-form-urlencoded")

CLIENT_GONE = (
    "the client closed its connection before its request's body arrived whole; nothing was done"
)
"""The message of a 499 `client_closed_request`, which no one receives: the metrics count it as
the client's doing, not as a failure of the server."""


def malformed_form(detail: object) -> str:
    """The message of a 400 `malformed_form`: the parser's own words on what it could not read."""
    why = detail if isinstance(detail, str) and detail else "it is not a valid form"
    return f"the form body could not be read: {why}"


def error_response(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    detail: dict[str, Any] = {"code": code, "message": message}
    detail.update({k: v for k, v in extra.items() if v is not None})
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONText({"error": detail}, status_code=status, headers=headers)


def is_json(content_type: str | None) -> bool:
    """Whether FastAPI reads a body of this type as JSON (`application/json`, `...+json`)."""
    if not content_type:
        return False
    message = Message()
    message["content-type"] = content_type
    subtype = message.get_content_subtype()
    return message.get_content_maintype() == "application" and (
        subtype == "json" or subtype.endswith("+json")
    )


_NOT_AN_OBJECT = ("model_attributes_type", "model_type", "dict_type")
_JSON_TYPES = {list: "an array", str: "a string", bool: "a boolean", int: "a number"}


def _body_problem(errors: list[Any], content_type: str | None) -> str | None:
    """What is wrong with a body that is no JSON object at all (none, or not sent as JSON), in
    words a client can act on; None when the problem is inside the object."""
    if len(errors) != 1 or tuple(errors[0].get("loc", ())) != ("body",):
        return None
    kind, given = errors[0].get("type"), errors[0].get("input")
    if kind == "missing":
        return "the request needs a JSON object body, sent with Content-Type: application/json"
    if kind not in _NOT_AN_OBJECT:
        return None
    if not is_json(content_type):
        sent = content_type.split(";")[0].strip() if content_type else ""
        with_type = f"as {sent!r}" if sent else "without a Content-Type"
        return f"the body must be JSON sent with Content-Type: application/json, not {with_type}"
    found = "null" if given is None else _JSON_TYPES.get(type(given), "a number")
    return f"the body must be a JSON object, not {found}"


def _describe(errors: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    fields = []
    parts = []
    for e in errors:
        loc = [str(p) for p in e.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "body"
        fields.append({"field": where, "problem": e.get("msg", "invalid")})
        parts.append(f"{where}: {e.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request", fields


def install_error_handlers(app: FastAPI) -> None:
    """Register the handlers that turn every failure of a client into a JSON 4xx."""

    async def on_signoff(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, SignoffError)
        context = getattr(request.app.state, "signoff", None)
        if context is not None:
            context.met(exc)  # a `StoreGone` fails `/healthz` from now on
        # An expired session names the requests its expiry closed (`.pending`).
        ids = exc.pending if isinstance(exc, SessionExpired) else getattr(exc, "request_ids", None)
        response = error_response(
            status_for(exc),
            exc.code,
            public_message(exc),
            request_ids=ids or None,
            session_id=getattr(exc, "session_id", None),
            held_by=getattr(exc, "held_by", None) or None,
        )
        if isinstance(exc, (StoreUnavailable, StoreBusy)):  # say when to try again
            response.headers["Retry-After"] = str(exc.retry_after)
        return response

    async def on_api(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, ApiError)
        response = error_response(exc.status, exc.code, exc.message, **exc.extra)
        response.headers.update(exc.headers)
        return response

    async def on_validation(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = list(exc.errors())
        if any(e.get("type") == "json_invalid" for e in errors):
            return error_response(400, "malformed_json", "the request body is not valid JSON")
        problem = _body_problem(errors, request.headers.get("content-type"))
        if problem is not None:
            fields = [{"field": "body", "problem": problem}]
            return error_response(422, "invalid_request", problem, fields=fields)
        message, fields = _describe(errors)
        return error_response(422, "invalid_request", message, fields=fields)

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        codes = {
            404: "not_found",
            405: "method_not_allowed",
            401: "unauthenticated",
            413: "payload_too_large",
        }
        code = codes.get(exc.status_code, f"http_{exc.status_code}")
        message = exc.detail if isinstance(exc.detail, str) else "request failed"
        content_type = request.headers.get("content-type", "").strip().lower()
        if exc.status_code == 400 and "json" in content_type:
            # The body could not even be decoded: not UTF-8, or nested too deeply to parse.
            code, message = "malformed_json", "the request body is not valid JSON"
        elif exc.status_code == 400 and content_type.startswith(FORM_TYPES):
            # Starlette could not parse the form: broken multipart, or too many fields or parts.
            code, message = "malformed_form", malformed_form(exc.detail)
        response = error_response(exc.status_code, code, message)
        for key, value in (exc.headers or {}).items():
            response.headers[key] = value
        if exc.status_code == 405:
            given = next((v for k, v in (exc.headers or {}).items() if k.lower() == "allow"), "")
            allow = allowed(request.app.router.routes, request.scope) or with_head(given)
            if allow:
                response.headers["Allow"] = allow
        return response

    async def on_bug(request: Request, exc: Exception) -> JSONResponse:
        # Not a client mistake: the server failed. Say so in the usual shape; the traceback is
        # logged by the server. Starlette sends this response from outside every middleware of
        # the app, `SecurityHeaders` and `ServerTime` too, so it gets their headers here.
        response = error_response(
            500, "internal_error", f"the server failed: {type(exc).__name__}; see its log"
        )
        add_security_headers(response.headers, request.url.path)
        context = getattr(request.app.state, "signoff", None)
        if context is not None:
            add_server_time(response.headers, context.runtime.now)
        return response

    async def on_gone(request: Request, exc: Exception) -> JSONResponse:
        # The read of the body found the connection closed (a phone losing its network while
        # it uploads): no failure of the server's, whose handler would log a traceback and
        # count a 5xx. 499 is nginx's number for it; no client reads it.
        return error_response(499, "client_closed_request", CLIENT_GONE)

    app.add_exception_handler(Exception, on_bug)
    app.add_exception_handler(ClientDisconnect, on_gone)
    app.add_exception_handler(SignoffError, on_signoff)
    app.add_exception_handler(ApiError, on_api)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)


_ERROR_BODY = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}


def _doc(description: str) -> dict[str, Any]:
    # The schema by reference, not `"model": ErrorBody`: FastAPI builds a pydantic adapter for
    # every response model of every route of every app, at its first request (13 codes x 10
    # routes, most of a new app's first 0.1 s of CPU), used only to write this document.
    # `add_error_body` puts the schema in the document, as FastAPI put it from the model.
    return {"description": description, "content": _ERROR_BODY}


def add_error_body(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with the schemas `ERROR_RESPONSES` refer to (`ErrorBody`, `ErrorDetail`), written
    as FastAPI writes a response model's: its components in name order, through its `OpenAPI`
    model (its key order, no `null` defaults)."""
    _, defs = models_json_schema(
        [(ErrorBody, "serialization")], ref_template="#/components/schemas/{model}"
    )
    schemas = {**doc.get("components", {}).get("schemas", {}), **defs["$defs"]}
    components = {**doc.get("components", {}), "schemas": {k: schemas[k] for k in sorted(schemas)}}
    written: dict[str, Any] = jsonable_encoder(
        OpenAPI(**{**doc, "components": components}), by_alias=True, exclude_none=True
    )
    return written


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: _doc(
        "Malformed body or a misuse (`malformed_json`, `malformed_form`, `usage_error`), or a "
        "body framed both by a length and by chunks (`malformed_request`)"
    ),
    401: _doc("Not authenticated (`unauthenticated`)"),
    403: _doc(
        "Not allowed to settle (`not_allowed`), or a route only an admin may call "
        "(`admin_only`: `POST /v1/prune`)"
    ),
    404: _doc(
        "Unknown session or request (`unknown_session`, `unknown_request`), or path (`not_found`)"
    ),
    409: _doc(
        "Conflict (`conflicting_answer`, `request_closed`, `stale_answer`, `session_busy`, "
        "`session_limit_reached`, `idempotency_key_reused`; a deletion refused: "
        "`session_waiting`, `subagent_session`; a retry of a subagent's failed turn no one "
        "waits on, or a message to a subagent a passed TTL above it ended: "
        "`subagent_orphaned`), or, ending an event stream, the "
        "store lost events the stream had sent (`events_rewritten`)"
    ),
    410: _doc(
        "The session expired (`session_expired`), or was deleted: a call repeating the "
        "idempotency key that started it (`session_deleted`)"
    ),
    413: _doc("The request body is too large (`payload_too_large`)"),
    415: _doc(
        "The request body is sent compressed (`unsupported_encoding`, with "
        "`Accept-Encoding: identity`): send it as it is"
    ),
    429: _doc(
        "Too many failed sign-ins or unrecognised tokens from this address "
        "(`too_many_failures`, with `Retry-After`), or too many event streams held open by "
        "this caller (`too_many_streams`, with `Retry-After`)"
    ),
    422: _doc(
        "Invalid or partial body (`invalid_request`, `invalid_answer`, `partial_answer`, "
        "`unknown_agent`, `unknown_tool`)"
    ),
    499: _doc(
        "Never received: the client closed its connection before its request's body arrived "
        "whole (`client_closed_request`); the server's metrics count it as a 4xx"
    ),
    500: _doc("The server failed (`internal_error`); the details are in its log"),
    502: _doc("The model provider failed or answered something unusable (`model_error`)"),
    503: _doc(
        "The store failed (`store_error`, `schema_version`, `store_gone`), its database has "
        "been down for a while (`store_unavailable`, with `Retry-After`), or every connection "
        "to it stayed busy (`store_busy`, with `Retry-After`), other writers kept appending to "
        "the session first (`append_conflict`) or took its turn over (`lease_lost`); the "
        "details are in the server's log"
    ),
}
