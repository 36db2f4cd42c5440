"""Hostile requests to the HTTP API: forged, foreign, replayed, stale, oversized and malformed ones
are a 4xx with a stable code and the store is unchanged; the body limit.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.responses import PlainTextResponse
from starlette.types import Message, Receive, Scope, Send

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.server._app import MAX_BODY_SIZE
from signoff.server._limits import BodyLimit
from signoff.server._pages import csrf_key
from signoff.server._sign_ins import issue

from ._security import (
    BIG,
    CHARSET,
    DEEP,
    JSON,
    RA,
    STALE_HASH,
    A,
    Served,
    World,
    deep_json,
    forged,
    nested,
    served,
    snapshot,
    world,
)
from .test_server_common import TOKENS, auth

__all__ = ["served", "world"]  # the fixtures, used by name


@dataclass(frozen=True, slots=True)
class Call:
    """One hostile HTTP call: `build(world)` gives the method, path and httpx keyword arguments."""

    build: Callable[[World], tuple[str, str, dict[str, Any]]]
    status: int
    code: str
    token: str | None = "alice-token"


def responses(
    sid: Callable[[World], str], rid: Callable[[World], str], **extra: Any
) -> Callable[[World], tuple[str, str, dict[str, Any]]]:
    def build(w: World) -> tuple[str, str, dict[str, Any]]:
        item = {"requestId": rid(w), "optionId": "approve", **extra}
        return "POST", f"/v1/sessions/{sid(w)}/responses", {"json": {"inputResponses": [item]}}

    return build


def approvals(
    sid: Callable[[World], str], ids: Callable[[World], list[str]], **extra: Any
) -> Callable[[World], tuple[str, str, dict[str, Any]]]:
    def build(w: World) -> tuple[str, str, dict[str, Any]]:
        items = [{"id": i, "approved": True, **extra} for i in ids(w)]
        return "POST", f"/v1/sessions/{sid(w)}/approvals", {"json": {"approvals": items}}

    return build


def raw(
    path: Callable[[World], str], content: bytes | Callable[[World], bytes], **headers: str
) -> Callable[[World], tuple[str, str, dict[str, Any]]]:
    def build(w: World) -> tuple[str, str, dict[str, Any]]:
        body = content(w) if callable(content) else content
        return "POST", path(w), {"content": body, "headers": {**JSON, **headers}}

    return build


async def chunks(chunk: bytes, count: int) -> AsyncIterator[bytes]:
    """A streamed body with no Content-Length."""
    for _ in range(count):
        yield chunk


def to_responses(w: World) -> str:
    return f"/v1/sessions/{w.a}/responses"


def answer_json(value: bytes) -> Callable[[World], bytes]:
    def body(w: World) -> bytes:
        head = json.dumps({"requestId": w.ra, "optionId": "approve"})[:-1].encode()
        return b'{"inputResponses": [' + head + b', "value": ' + value + b"}]}"

    return body


def alice_sign_in(w: World) -> str:
    """A valid dashboard sign-in of Alice's (the served app has no secret), as her cookie holds."""
    return issue(csrf_key(None), "alice-token", w.clock())


HTTP_ATTACKS: dict[str, Call] = {
    # forged ids
    "forged-id": Call(responses(A, lambda w: forged()), 404, "unknown_request"),
    "forged-id-helix": Call(approvals(A, lambda w: [forged()]), 404, "unknown_request"),
    "malformed-id": Call(responses(A, lambda w: "req_'; DROP TABLE--"), 404, "unknown_request"),
    # no request has that id: 404, as `Runtime.respond` refuses it
    "empty-id": Call(responses(A, lambda w: ""), 404, "unknown_request"),
    "numeric-id": Call(responses(A, lambda w: 7), 422, "invalid_request"),  # type: ignore[arg-type,return-value]
    "forged-session": Call(
        responses(lambda w: "ses_" + uuid.uuid4().hex[:20], RA), 404, "unknown_session"
    ),
    "get-forged-request": Call(
        lambda w: ("GET", f"/v1/requests/{forged()}", {}), 404, "unknown_request"
    ),
    "forged-plus-real": Call(approvals(A, lambda w: [w.ra, forged()]), 404, "unknown_request"),
    # foreign ids: another session, another tenant
    "other-session": Call(responses(A, lambda w: w.rb), 404, "unknown_request"),
    "other-session-helix": Call(approvals(A, lambda w: [w.rb]), 404, "unknown_request"),
    "other-tenant": Call(responses(A, RA), 404, "unknown_session", token="mallory-token"),
    "other-tenant-helix": Call(
        approvals(A, lambda w: [w.ra]), 404, "unknown_session", token="mallory-token"
    ),
    "other-tenant-cancel": Call(
        lambda w: ("POST", f"/v1/sessions/{w.a}/cancel", {}),
        404,
        "unknown_session",
        token="mallory-token",
    ),
    "other-tenant-message": Call(
        lambda w: ("POST", f"/v1/sessions/{w.a}/messages", {"json": {"text": "approve"}}),
        404,
        "unknown_session",
        token="mallory-token",
    ),
    "other-tenant-read-request": Call(
        lambda w: ("GET", f"/v1/requests/{w.ra}", {}),
        404,
        "unknown_request",
        token="mallory-token",
    ),
    "other-tenant-quorum-vote": Call(
        responses(lambda w: w.t, lambda w: w.rt_), 404, "unknown_session", token="mallory-token"
    ),
    "same-tenant-not-the-requester": Call(responses(A, RA), 403, "not_allowed", token="bob-token"),
    # closed requests
    "conflicting-replay": Call(
        responses(lambda w: w.s, lambda w: w.rs, optionId="cancel"), 409, "conflicting_answer"
    ),
    "after-cancel": Call(responses(lambda w: w.c, lambda w: w.rc), 409, "request_closed"),
    "after-expiry": Call(responses(lambda w: w.x, lambda w: w.rx), 409, "request_closed"),
    # stale input hash
    "stale-hash": Call(responses(A, RA, inputHash=STALE_HASH), 409, "stale_answer"),
    "stale-hash-helix": Call(
        approvals(A, lambda w: [w.ra], inputHash=STALE_HASH), 409, "stale_answer"
    ),
    # size
    "huge-prompt": Call(
        lambda w: ("POST", "/v1/sessions", {"json": {"agent": "support", "message": "x" * BIG}}),
        413,
        "payload_too_large",
    ),
    "huge-message": Call(
        lambda w: ("POST", f"/v1/sessions/{w.a}/messages", {"json": {"text": "x" * BIG}}),
        413,
        "payload_too_large",
    ),
    "huge-answer-value": Call(responses(A, RA, value="v" * BIG), 413, "payload_too_large"),
    "huge-chunked-body": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {"content": chunks(b"[" * 65536, BIG // 65536 + 1), "headers": JSON},
        ),
        413,
        "payload_too_large",
    ),
    "huge-body-unauthenticated": Call(
        lambda w: ("POST", "/v1/sessions", {"content": b" " * BIG, "headers": JSON}),
        413,
        "payload_too_large",
        token=None,
    ),
    # malformed JSON
    "deep-body": Call(raw(to_responses, deep_json(DEEP)), 400, "malformed_json"),
    "deep-answer-value": Call(
        raw(to_responses, answer_json(deep_json(DEEP))), 400, "malformed_json"
    ),
    "nested-answer-value": Call(
        raw(to_responses, answer_json(deep_json(150))), 422, "invalid_answer"
    ),
    "edited-input-nested-wrong-type": Call(
        responses(A, RA, editedInput={"order_id": nested(150)}), 422, "invalid_answer"
    ),
    "non-utf8": Call(
        raw(to_responses, b'{"inputResponses": "\xff\xfe\xfd"}'), 400, "malformed_json"
    ),
    # a JSON media type with parameters is JSON all the same: not a bare `http_400`
    "non-utf8-charset": Call(
        raw(to_responses, b'{"inputResponses": "\xff"}', **{"Content-Type": CHARSET}),
        400,
        "malformed_json",
    ),
    "deep-body-charset": Call(
        raw(to_responses, deep_json(DEEP), **{"Content-Type": CHARSET}), 400, "malformed_json"
    ),
    "latin1-in-prompt": Call(
        raw(lambda w: "/v1/sessions", '{"agent": "support", "message": "café"}'.encode("latin-1")),
        400,
        "malformed_json",
    ),
    "lone-surrogate-value": Call(
        raw(to_responses, answer_json(b'{"\\udc00": "x"}')), 422, "invalid_request"
    ),
    "lone-surrogate-text": Call(
        raw(to_responses, answer_json(b'"x", "text": "ok \\ud800"')), 422, "invalid_request"
    ),
    "lone-surrogate-prompt": Call(
        raw(lambda w: "/v1/sessions", b'{"agent": "support", "message": "hi \\ud800"}'),
        422,
        "invalid_request",
    ),
    "lone-surrogate-message": Call(
        raw(lambda w: f"/v1/sessions/{w.a}/messages", b'{"text": "\\udfff"}'),
        422,
        "invalid_request",
    ),
    "truncated": Call(
        raw(to_responses, b'{"inputResponses": [{"requestId": '), 400, "malformed_json"
    ),
    # a key named twice: JSON parsers disagree on which one counts (Python's takes the last, a
    # gateway checking the body may take the first), so the body is refused
    "duplicate-approved": Call(
        raw(
            lambda w: f"/v1/sessions/{w.a}/approvals",
            lambda w: (
                b'{"approvals": [{"id": "%s", "approved": false, "approved": true}]}'
                % w.ra.encode()
            ),
        ),
        422,
        "invalid_request",
    ),
    "duplicate-option": Call(
        raw(
            to_responses,
            lambda w: (
                b'{"inputResponses": [{"requestId": "%s", "optionId": "deny", '
                b'"optionId": "approve"}]}' % w.ra.encode()
            ),
        ),
        422,
        "invalid_request",
    ),
    "duplicate-top-level": Call(
        raw(
            to_responses,
            lambda w: (
                b'{"inputResponses": [], "inputResponses": [{"requestId": "%s", '
                b'"optionId": "approve"}]}' % w.ra.encode()
            ),
        ),
        422,
        "invalid_request",
    ),
    "duplicate-in-value": Call(
        raw(to_responses, answer_json(b'{"amount": 1, "amount": 1000000}')),
        422,
        "invalid_request",
    ),
    "nan-value": Call(raw(to_responses, answer_json(b"NaN")), 422, "invalid_answer"),
    "infinity-value": Call(raw(to_responses, answer_json(b"[Infinity]")), 422, "invalid_answer"),
    "minus-infinity-value": Call(
        raw(to_responses, answer_json(b'{"x": -Infinity}')), 422, "invalid_answer"
    ),
    "huge-number": Call(raw(to_responses, answer_json(b"1e999")), 422, "invalid_answer"),
    # wrong content types and shapes
    "text-plain": Call(
        raw(to_responses, answer_json(b"1"), **{"Content-Type": "text/plain"}),
        422,
        "invalid_request",
    ),
    "form-encoded": Call(
        lambda w: ("POST", to_responses(w), {"data": {"requestId": w.ra, "optionId": "approve"}}),
        422,
        "invalid_request",
    ),
    "no-content-type": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {"content": answer_json(b"1")(w), "headers": {"Content-Type": ""}},
        ),
        422,
        "invalid_request",
    ),
    "array-body": Call(raw(to_responses, b"[]"), 422, "invalid_request"),
    "unknown-field": Call(responses(A, RA, isAdmin=True), 422, "invalid_request"),
    "unknown-top-level-field": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {"json": {"inputResponses": [{"requestId": w.ra, "optionId": "approve"}], "as": "bob"}},
        ),
        422,
        "invalid_request",
    ),
    "snake-case-spoof": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {"json": {"inputResponses": [{"request_id": w.ra, "option_id": "approve"}]}},
        ),
        422,
        "invalid_request",
    ),
    # authentication
    "no-token": Call(responses(A, RA), 401, "unauthenticated", token=None),
    "wrong-token": Call(responses(A, RA), 401, "unauthenticated", token="alice-token-x"),
    "token-prefix": Call(responses(A, RA), 401, "unauthenticated", token="alice"),
    "no-token-helix": Call(approvals(A, lambda w: [w.ra]), 401, "unauthenticated", token=None),
    "no-token-cancel": Call(
        lambda w: ("POST", f"/v1/sessions/{w.a}/cancel", {}), 401, "unauthenticated", token=None
    ),
    "basic-scheme": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {
                "json": {"inputResponses": [{"requestId": w.ra, "optionId": "approve"}]},
                "headers": {"Authorization": "Basic YWxpY2UtdG9rZW46"},
            },
        ),
        401,
        "unauthenticated",
        token=None,
    ),
    # the dashboard's cookie (a valid sign-in) carries no authority for the API's writes (no
    # CSRF from a page)
    "cookie-on-api-post": Call(
        lambda w: (
            "POST",
            to_responses(w),
            {
                "json": {"inputResponses": [{"requestId": w.ra, "optionId": "approve"}]},
                "headers": {"Cookie": f"signoff_token={alice_sign_in(w)}"},
            },
        ),
        401,
        "unauthenticated",
        token=None,
    ),
}


async def test_the_sign_in_refused_for_api_writes_is_valid_for_reads(served: Served) -> None:
    """`cookie-on-api-post` is refused for what it is, a cookie on an API write: the same
    sign-in is honoured for a read."""
    cookie = {"Cookie": f"signoff_token={alice_sign_in(served.world)}"}
    assert (await served.client.get("/v1/requests", headers=cookie)).status_code == 200


@pytest.mark.parametrize("name", sorted(HTTP_ATTACKS))
async def test_http_api_refuses_and_changes_nothing(served: Served, name: str) -> None:
    call = HTTP_ATTACKS[name]
    method, path, kwargs = call.build(served.world)
    headers = {**(auth(call.token) if call.token else {}), **kwargs.pop("headers", {})}
    before = await snapshot(served.world.rt)
    r = await served.client.request(method, path, headers=headers, **kwargs)
    assert r.status_code == call.status, f"{name}: {r.status_code} {r.text[:500]}"
    assert r.headers["content-type"].startswith("application/json"), name
    body = r.json()
    assert set(body) == {"error"}, body
    assert body["error"]["code"] == call.code, f"{name}: {body}"
    assert body["error"]["message"]
    assert await snapshot(served.world.rt) == before, f"{name} changed the store"


@pytest.mark.parametrize(
    "endpoint",
    [
        lambda w: (
            "/v1/sessions/{a}/responses",
            {"inputResponses": [{"requestId": w.ra, "optionId": "approve"}]},
        ),
        lambda w: ("/v1/sessions/{a}/approvals", {"approvals": [{"id": w.ra, "approved": True}]}),
    ],
    ids=["responses", "approvals"],
)
async def test_the_same_post_twice_is_a_no_op(served: Served, endpoint: Any) -> None:
    w = served.world
    path, body = endpoint(w)
    url = path.format(a=w.a)
    first = await served.client.post(url, json=body, headers=auth("alice-token"))
    assert first.status_code == 200, first.text
    assert first.json()["outcomes"][0]["applied"] is True
    before = await snapshot(w.rt)
    again = await served.client.post(url, json=body, headers=auth("alice-token"))
    assert again.status_code == 200, again.text
    assert again.json()["outcomes"] == [
        {"request_id": w.ra, "outcome": "approved", "applied": False, "reason": None}
    ]
    assert again.json()["status"] == first.json()["status"] == "completed"
    assert await snapshot(w.rt) == before


async def test_the_body_limit_is_configurable(world: World) -> None:
    app = create_app(world.rt, auth=TokenAuth(TOKENS), sweep_every=None, max_body_size=200)
    body = {"inputResponses": [{"requestId": world.ra, "optionId": "approve"}]}
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://signoff.test") as c:
            before = await snapshot(world.rt)
            padded = {**body, "inputResponses": [{**body["inputResponses"][0], "text": "x" * 200}]}
            r = await c.post(
                f"/v1/sessions/{world.a}/responses", json=padded, headers=auth("alice-token")
            )
            assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
            assert await snapshot(world.rt) == before
            r = await c.post(
                f"/v1/sessions/{world.a}/responses", json=body, headers=auth("alice-token")
            )
            assert r.status_code == 200, r.text
    for bad in (0, -1, 1.5, True):
        with pytest.raises(so.UsageError, match="max_body_size"):
            create_app(world.rt, auth=TokenAuth(TOKENS), max_body_size=bad)  # type: ignore[arg-type]


async def test_a_streamed_body_over_the_limit_is_refused_and_changes_nothing(world: World) -> None:
    """A body sent in chunks, with no `Content-Length` to refuse up front, is counted as it
    arrives: past the limit it is a 413 `payload_too_large`, and the answer it carried is not
    applied; one within the limit is."""
    app = create_app(world.rt, auth=TokenAuth(TOKENS), sweep_every=None, max_body_size=200)
    body = {"inputResponses": [{"requestId": world.ra, "optionId": "approve", "text": "x" * 300}]}

    async def chunks(raw: bytes) -> AsyncIterator[bytes]:
        for i in range(0, len(raw), 50):
            yield raw[i : i + 50]

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://signoff.test") as c:
            before = await snapshot(world.rt)
            headers = {**auth("alice-token"), "Content-Type": "application/json"}
            url = f"/v1/sessions/{world.a}/responses"
            r = await c.post(url, content=chunks(json.dumps(body).encode()), headers=headers)
            assert "content-length" not in r.request.headers
            assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
            assert await snapshot(world.rt) == before
            del body["inputResponses"][0]["text"]
            r = await c.post(url, content=chunks(json.dumps(body).encode()), headers=headers)
            assert r.status_code == 200, r.text


async def test_a_declared_length_over_the_limit_is_refused_before_the_app_runs() -> None:
    """A `Content-Length` one byte over the limit is refused up front, even on a route that
    would never read the body; one at the limit reaches the app."""
    reached: list[int] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        reached.append(1)  # answers without reading the body
        await PlainTextResponse("ok")(scope, receive, send)

    transport = httpx.ASGITransport(app=BodyLimit(app, max_bytes=100))
    async with httpx.AsyncClient(transport=transport, base_url="http://signoff.test") as c:
        r = await c.post("/", content=b"x" * 101)
        assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
        assert reached == []
        r = await c.post("/", content=b"x" * 100)
        assert r.status_code == 200 and reached == [1]


@pytest.mark.parametrize("declared", [b"\xb2", b"1\xb2"])  # "²", "1²" in latin-1
async def test_a_declared_length_of_superscript_digits_is_not_a_500(declared: bytes) -> None:
    """A `Content-Length` of superscript digits (`str.isdigit()` takes them, `int()` does not)
    raised a `ValueError` from the limit, a 500 under an ASGI server that passes the header on
    unchecked: it is no declared length, and the body is counted as it arrives."""
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await PlainTextResponse("ok")(scope, receive, send)

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/", "query_string": b""}
    scope["headers"] = [(b"content-length", declared)]
    for size in (101, 10):

        async def receive(size: int = size) -> Message:
            return {"type": "http.request", "body": b"x" * size, "more_body": False}

        limit = BodyLimit(app, max_bytes=100)
        if size > 100:
            with pytest.raises(StarletteHTTPException) as caught:  # the app's handlers render it
                await limit(scope, receive, send)
            assert caught.value.status_code == 413
        else:
            await limit(scope, receive, send)
            assert sent[0]["status"] == 200
    # Plain digits past `int()`'s digit limit (4300) declare a body far over any limit.
    sent.clear()
    scope["headers"] = [(b"content-length", b"9" * 5000)]
    await BodyLimit(app, max_bytes=100)(scope, receive, send)
    assert sent[0]["status"] == 413


async def test_a_body_under_the_limit_is_accepted(served: Served) -> None:
    """The limit refuses only what is over it: a prompt of most of it starts a session."""
    text = "x" * (MAX_BODY_SIZE - 1024)
    r = await served.client.post(
        "/v1/sessions", json={"agent": "support", "message": text}, headers=auth("alice-token")
    )
    assert r.status_code == 201, r.text[:300]
