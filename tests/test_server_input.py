"""What a careless client sends the HTTP API: blank messages, bad or badly encoded bodies,
parameters named twice, numbers that are not plain digits, a trailing slash, values that are
not plain JSON and idempotency keys, each refused with a 4xx and a stable code (or acted on
once) and the store unchanged.
"""

from __future__ import annotations

import gzip
import json
import re
import socket
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.server._route import NOT_UTF8
from signoff.testing import store_contents

from ._server_api import (
    _stored,
    alice,
    base,
    client,
    error,
    in_process,
    start,
    store,
)
from .test_server_common import (
    ALICE,
    PLAIN,
    TOKENS,
    make_runtime,
    served,
)

__all__ = ["alice", "base", "store"]  # the fixtures, used by name


@pytest.mark.parametrize("blank", ["", " ", "\n\t "])
async def test_a_blank_message_is_refused_everywhere_and_stores_nothing(
    store_url: str, blank: str
) -> None:
    """An empty or whitespace-only prompt is 422 invalid_request over HTTP and a UsageError in
    Python, on every store, before a session is made or an event appended."""
    runtime = make_runtime(store_url)
    async with in_process(runtime) as c:
        created = await c.post("/v1/sessions", json={"agent": "support"})
        sid = created.json()["session_id"]
        before = await store_contents(runtime.store, sid)
        r = await c.post("/v1/sessions", json={"agent": "support", "message": blank})
        assert "message" in error(r, 422, "invalid_request")["message"]
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"text": blank})
        assert "text" in error(r, 422, "invalid_request")["message"]
        with pytest.raises(so.UsageError, match="empty"):
            await runtime.generate("support", prompt=blank)
        with pytest.raises(so.UsageError, match="empty"):
            await runtime.generate(session_id=sid, prompt=blank)
        with pytest.raises(so.UsageError, match="empty"):
            await runtime.schedule("support", blank, session_id=sid)
        with pytest.raises(so.UsageError, match="empty"):
            await runtime.send(sid, blank)
        assert [s.id for s in await runtime.sessions()] == [sid]
        assert await store_contents(runtime.store, sid) == before


BAD_RESPONSES: list[tuple[dict[str, Any], str]] = [
    ({}, "inputResponses"),
    ({"inputResponses": []}, "inputResponses"),
    ({"inputResponses": [{"optionId": "approve"}]}, "requestId"),
    ({"inputResponses": [{"requestId": 7, "optionId": "approve"}]}, "requestId"),
    ({"inputResponses": [{"requestId": "r", "optionId": "approve", "extra": 1}]}, "extra"),
    ({"input_responses": [{"requestId": "r", "optionId": "approve"}]}, "input_responses"),
    (
        {"inputResponses": [{"requestId": "r", "optionId": "approve", "editedInput": []}]},
        "editedInput",
    ),
]


def test_bad_response_bodies_name_the_field(alice: httpx.Client) -> None:
    sid = start(alice)["session_id"]
    for payload, field in BAD_RESPONSES:
        r = alice.post(f"/v1/sessions/{sid}/responses", json=payload)
        assert field in error(r, 422, "invalid_request")["message"], payload
    assert alice.get(f"/v1/sessions/{sid}").json()["status"] == "waiting"


def test_a_body_in_another_encoding_than_utf8_is_refused(alice: httpx.Client, store: str) -> None:
    """JSON between systems is UTF-8 (RFC 8259, section 8.1) and the documented body is, but a
    UTF-16 or UTF-32 body started a conversation: Python's `json.loads` guesses the encoding
    of bytes. A gateway that inspects bodies as UTF-8 reads such a body as something else, so
    it is 400 `malformed_json`, naming UTF-8, and nothing is stored. A UTF-8 byte order mark,
    which a parser may ignore, is ignored."""
    body = json.dumps({"agent": "support", "message": "Refund order 1042, it broke"})
    sent = {"Content-Type": "application/json"}
    before = _stored(store)
    for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"):
        r = alice.post("/v1/sessions", content=body.encode(encoding), headers=sent)
        assert "UTF-8" in error(r, 400, "malformed_json")["message"], encoding
    assert _stored(store) == before
    sid = start(alice)["session_id"]
    before = _stored(store)
    cancel = json.dumps({"reason": "customer left"}).encode("utf-16")
    r = alice.post(f"/v1/sessions/{sid}/cancel", content=cancel, headers=sent)
    error(r, 400, "malformed_json")
    assert _stored(store) == before
    r = alice.post("/v1/sessions", content=body.encode("utf-8-sig"), headers=sent)
    assert r.status_code == 201, r.text


def test_a_compressed_body_is_refused_as_unsupported_not_read_as_it_is(
    alice: httpx.Client, store: str
) -> None:
    """The server decodes no content coding: a gzip body was 400 `malformed_json` (it is valid
    JSON, gzipped), and a plain body labelled `Content-Encoding: gzip` was acted on as plain,
    where a gateway decoding it by its label reads something else. Either is 415
    `unsupported_encoding` with `Accept-Encoding: identity`, and nothing is stored."""
    body = json.dumps({"agent": "support", "message": "Refund order 1042, it broke"}).encode()
    before = _stored(store)
    for coding, sent in (
        ("gzip", gzip.compress(body)),
        ("gzip", body),
        ("deflate", body),
        ("br", body),
        ("identity, gzip", body),
    ):
        headers = {"Content-Type": "application/json", "Content-Encoding": coding}
        r = alice.post("/v1/sessions", content=sent, headers=headers)
        assert coding in error(r, 415, "unsupported_encoding")["message"], coding
        assert r.headers["accept-encoding"] == "identity"
    assert _stored(store) == before
    sid = start(alice)["session_id"]
    before = _stored(store)
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    r = alice.post(f"/v1/sessions/{sid}/cancel", content=b'{"reason": "x"}', headers=headers)
    error(r, 415, "unsupported_encoding")
    assert _stored(store) == before
    r = httpx.post(f"{alice.base_url}/v1/sessions", content=body, headers=headers, verify=PLAIN)
    error(r, 401, "unauthenticated")  # who asks comes first, as for any other body
    for coding in ("identity", "Identity"):
        headers = {"Content-Type": "application/json", "Content-Encoding": coding}
        r = alice.post("/v1/sessions", content=body, headers=headers)
        assert r.status_code == 201, (coding, r.text)


def test_bad_bodies_elsewhere(alice: httpx.Client, store: str) -> None:
    sid = start(alice)["session_id"]
    r = alice.post(
        f"/v1/sessions/{sid}/approvals", json={"approvals": [{"id": "r", "approved": "yes"}]}
    )
    assert "approved" in error(r, 422, "invalid_request")["message"]
    r = alice.post(
        f"/v1/sessions/{sid}/responses",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    error(r, 400, "malformed_json")
    error(alice.post("/v1/sessions", json={"agent": "nobody"}), 422, "unknown_agent")
    error(alice.post("/v1/sessions", json={"agent": 3}), 422, "invalid_request")
    before = _stored(store)
    r = alice.post("/v1/sessions", json={"agent": "support", "message": ""})  # as /messages does
    assert "message" in error(r, 422, "invalid_request")["message"]
    assert _stored(store) == before
    error(
        alice.post(f"/v1/sessions/{sid}/messages", json={"text": "x", "turnPolicy": "now"}),
        422,
        "invalid_request",
    )
    error(alice.get("/v1/requests", params={"limit": 0}), 422, "invalid_request")
    error(alice.get("/v1/requests", params={"status": "open"}), 422, "invalid_request")
    for last in ("abc", "-1", str(2**70)):
        r = alice.get(f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": last})
        error(r, 422, "invalid_request")
    error(alice.get(f"/v1/sessions/{sid}/events", params={"after": 2**70}), 422, "invalid_request")
    error(alice.get("/v1/requests", params={"offset": 2**70}), 422, "invalid_request")
    for bad in ({"limit": 0}, {"limit": 501}, {"offset": -1}, {"offset": 2**70}):
        error(alice.get("/v1/sessions", params=bad), 422, "invalid_request")
    for status in ("open", "pending", "completed", ""):
        r = alice.get("/v1/sessions", params={"status": status})
        assert error(r, 422, "invalid_request")["fields"][0]["field"] == "query.status", status
    # an option that is not an approval's
    rid = alice.get(f"/v1/sessions/{sid}").json()["pending"][0]["id"]
    r = alice.post(
        f"/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "maybe"}]},
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_answer"


def test_an_idempotency_key_makes_a_retried_post_act_once(alice: httpx.Client, store: str) -> None:
    body = {"agent": "support", "message": "Refund order 1042"}
    key = {"Idempotency-Key": "order-1042-try"}
    first = alice.post("/v1/sessions", json=body, headers=key)
    again = alice.post("/v1/sessions", json=body, headers=key)
    assert first.status_code == again.status_code == 201
    assert set(first.json()) == set(again.json())
    assert first.json()["replayed"] is False and again.json()["replayed"] is True
    sid = first.json()["session_id"]
    assert again.json()["session_id"] == sid
    before = _stored(store)
    other = alice.post("/v1/sessions", json={**body, "message": "Refund 9"}, headers=key)
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert other.json()["error"]["session_id"] == sid
    for bad in ("", "x" * 201):
        r = alice.post("/v1/sessions", json=body, headers={"Idempotency-Key": bad})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    msg = {"text": "never mind", "turnPolicy": "queue"}
    sent = alice.post(f"/v1/sessions/{sid}/messages", json=msg, headers={"Idempotency-Key": "m"})
    assert sent.status_code == 200 and sent.json()["replayed"] is False
    after_send = _stored(store)
    assert after_send != before
    repeat = alice.post(f"/v1/sessions/{sid}/messages", json=msg, headers={"Idempotency-Key": "m"})
    assert repeat.status_code == 200 and repeat.json()["replayed"] is True
    assert set(repeat.json()) == set(sent.json())
    assert _stored(store) == after_send
    steered = {**msg, "turnPolicy": "steer"}  # the same key and text with the other policy
    r = alice.post(f"/v1/sessions/{sid}/messages", json=steered, headers={"Idempotency-Key": "m"})
    assert r.status_code == 409 and r.json()["error"]["code"] == "idempotency_key_reused"
    assert _stored(store) == after_send


def test_a_repeated_post_answers_with_the_turn_its_message_went_to(store_url: str) -> None:
    """Message A parks on an approval (a repeat shows the request), is approved, then message B
    runs a turn of its own: A repeated still answers with A's turn, on both stores."""
    with served(store_url) as base, client(base, "alice-token") as alice:
        body = {"agent": "support", "message": "Refund order 1042"}
        key_a, key_b = {"Idempotency-Key": "refund-a"}, {"Idempotency-Key": "ask-b"}
        a = alice.post("/v1/sessions", json=body, headers=key_a).json()
        sid, (req,) = a["session_id"], a["pending"]
        parked = alice.post("/v1/sessions", json=body, headers=key_a)
        assert parked.status_code == 201 and parked.json() == {**a, "replayed": True}
        done = alice.post(
            f"/v1/sessions/{sid}/responses",
            json={"inputResponses": [{"requestId": req["id"], "optionId": "approve"}]},
        ).json()
        assert done["status"] == "completed" and done["text"].startswith("tool ok: ")
        url = f"/v1/sessions/{sid}/messages"
        b = alice.post(url, json={"text": "and order 7?"}, headers=key_b).json()
        assert b["turn_id"] != a["turn_id"] and b["text"] == "nothing to report"
        before = _stored(store_url)
        again = alice.post("/v1/sessions", json=body, headers=key_a)
        assert again.status_code == 201
        assert again.json() == {**done, "outcomes": [], "replayed": True}
        b_again = alice.post(url, json={"text": "and order 7?"}, headers=key_b)
        assert b_again.status_code == 200 and b_again.json() == {**b, "replayed": True}
        opened = alice.post("/v1/sessions", json={"agent": "support"}, headers=key_b)
        opened_again = alice.post("/v1/sessions", json={"agent": "support"}, headers=key_b)
        assert opened.status_code == opened_again.status_code == 201
        assert opened_again.json() == {**opened.json(), "replayed": True}
        assert opened.json()["replayed"] is False and opened.json()["status"] == "idle"
        assert len(_stored(store_url)) == len(before) + 1


def test_a_create_retried_on_another_server_after_the_first_one_went_finds_its_session(
    store_url: str,
) -> None:
    """A create (with its first message, or empty) whose answer was lost, the server that made it
    gone, sent again to another server on the same store (nothing of it in memory): the session
    its key derives its id from answers as a repeat, and no second session is made."""
    body = {"agent": "support", "message": "Refund order 1042"}
    keys = {"Idempotency-Key": "lost-1"}, {"Idempotency-Key": "lost-2"}
    with served(store_url) as base, client(base, "alice-token") as alice:
        first = alice.post("/v1/sessions", json=body, headers=keys[0]).json()
        opened = alice.post("/v1/sessions", json={"agent": "support"}, headers=keys[1]).json()
    before = _stored(store_url)
    with served(store_url) as base, client(base, "alice-token") as alice:
        again = alice.post("/v1/sessions", json=body, headers=keys[0])
        reopened = alice.post("/v1/sessions", json={"agent": "support"}, headers=keys[1])
        other = alice.post("/v1/sessions", json={**body, "message": "Refund 9"}, headers=keys[0])
    assert again.status_code == reopened.status_code == 201
    assert again.json() == {**first, "replayed": True}
    assert reopened.json() == {**opened, "replayed": True}
    assert other.status_code == 409 and other.json()["error"]["session_id"] == first["session_id"]
    assert _stored(store_url) == before and len(before) == 2


def test_the_idempotency_key_is_in_the_openapi_document(base: str) -> None:
    doc = httpx.get(f"{base}/v1/openapi.json", verify=PLAIN).json()
    for path in ("/v1/sessions", "/v1/sessions/{session_id}/messages"):
        params = doc["paths"][path]["post"]["parameters"]
        header = next(p for p in params if p["name"] == "Idempotency-Key")
        assert header["in"] == "header" and not header.get("required")
        assert header["schema"]["anyOf"][0]["maxLength"] == 200


def test_a_body_that_is_not_a_json_object_is_told_what_to_send(
    alice: httpx.Client, store: str
) -> None:
    """JSON sent with another Content-Type (or none), a form, an array, `null` or no body at all
    is 422 `invalid_request` saying what the body must be, not pydantic's "valid dictionary"."""
    sid = start(alice)["session_id"]
    before = _stored(store)
    as_json = b'{"agent": "support"}'
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {} if content_type is None else {"Content-Type": content_type}
        r = alice.post("/v1/sessions", content=as_json, headers=headers)
        detail = error(r, 422, "invalid_request")
        assert "Content-Type: application/json" in detail["message"], detail
        assert detail["fields"] == [{"field": "body", "problem": detail["message"]}]
        if content_type is not None:
            assert content_type in detail["message"]
    for url in (f"/v1/sessions/{sid}/responses", f"/v1/sessions/{sid}/cancel"):
        for payload in (b"[]", b'"approve"', b"7", b"null"):
            r = alice.post(url, content=payload, headers={"Content-Type": "application/json"})
            detail = error(r, 422, "invalid_request")
            assert "must be a JSON object" in detail["message"], (url, payload)
    r = alice.post(f"/v1/sessions/{sid}/responses")
    assert "needs a JSON object body" in error(r, 422, "invalid_request")["message"]
    r = alice.post("/v1/sessions", files={"agent": ("agent", b"support")})
    assert "multipart/form-data" in error(r, 422, "invalid_request")["message"]
    assert _stored(store) == before
    assert alice.get(f"/v1/sessions/{sid}").json()["status"] == "waiting"


def test_a_parameter_named_twice_is_refused_not_half_read(alice: httpx.Client, store: str) -> None:
    """`?status=pending&status=settled` read only the last, so a client asking for both got one
    silently; two `Idempotency-Key` headers (which a proxy may join or pick from) acted on one
    of them. Each is 422 `invalid_request` naming the parameter, and nothing is stored."""
    sid = start(alice)["session_id"]
    before = _stored(store)
    for query in ("status=pending&status=settled", "limit=1&limit=2", "agent=a&agent=b"):
        for path in ("/v1/requests", "/v1/sessions"):
            r = alice.get(f"{path}?{query}")
            name = query.partition("=")[0]
            detail = error(r, 422, "invalid_request")
            assert detail["fields"] == [{"field": f"query.{name}", "problem": "given 2 times"}]
    r = alice.get(f"/v1/sessions/{sid}/events?follow=false&after=1&after=2")
    error(r, 422, "invalid_request")
    r = alice.get(
        f"/v1/sessions/{sid}/events?follow=false",
        headers=[("Last-Event-ID", "1"), ("Last-Event-ID", "2")],
    )
    assert error(r, 422, "invalid_request")["fields"][0]["field"] == "header.last-event-id"
    for url, body in (
        ("/v1/sessions", {"agent": "support", "message": "Refund order 1042"}),
        (f"/v1/sessions/{sid}/messages", {"text": "and order 7?"}),
    ):
        keys = [("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
        r = alice.post(url, json=body, headers=keys)
        assert "Idempotency-Key" in error(r, 422, "invalid_request")["message"]
    assert _stored(store) == before
    # one of each is as before; a parameter the route does not take is ignored (as documented)
    assert alice.get("/v1/requests?status=pending&limit=1").json()["total"] == 1
    assert alice.get("/v1/requests?tenant=nobody&limit=1").json()["total"] == 1


def test_an_idempotency_key_on_a_route_that_takes_none_is_refused_not_dropped(
    alice: httpx.Client, store: str
) -> None:
    """A key sent to `/responses`, `/approvals`, `/cancel`, a DELETE or `/prune` was dropped
    unsaid (two of them, or one of the wrong form, too), so a client retrying with it was made
    no promise: a retried prune deleted a second batch. 400 `usage_error`, nothing stored."""
    sid = start(alice)["session_id"]
    before = _stored(store)
    calls: list[tuple[str, str, Any]] = [
        (
            "POST",
            f"/v1/sessions/{sid}/responses",
            {"inputResponses": [{"requestId": "req_x", "optionId": "approve"}]},
        ),
        (
            "POST",
            f"/v1/sessions/{sid}/approvals",
            {"approvals": [{"id": "req_x", "approved": True}]},
        ),
        ("POST", f"/v1/sessions/{sid}/cancel", {"reason": "no"}),
        ("DELETE", f"/v1/sessions/{sid}", None),
        ("POST", "/v1/prune", {"olderThan": 0}),
    ]
    for keys in (
        [("Idempotency-Key", "k-1")],
        [("Idempotency-Key", "a"), ("Idempotency-Key", "b")],
    ):
        for method, url, body in calls:
            r = alice.request(method, url, json=body, headers=keys)
            detail = error(r, 400, "usage_error")
            assert "takes no Idempotency-Key" in detail["message"], (method, url)
    assert _stored(store) == before
    r = alice.get(f"/v1/sessions/{sid}", headers={"Idempotency-Key": "k-1"})  # reads change nothing
    assert r.status_code == 200 and r.json()["status"] == "waiting"


def test_a_query_that_is_not_utf8_is_refused_not_read_as_other_text(
    alice: httpx.Client, store: str
) -> None:
    """`?agent=%FF` listed the requests of the agent "\ufffd" (none: a 200 of an empty page, as
    if the filter were right), and a lone surrogate's escapes alike. A query is UTF-8, as the
    body is: 422 `invalid_request`."""
    sid = start(alice)["session_id"]
    before = _stored(store)
    for raw in ("agent=%FF", "agent=%ED%A0%80", "tool=%C3", "agent=support&kind=%E9"):
        for path in ("/v1/requests", "/v1/sessions", f"/v1/sessions/{sid}"):
            detail = error(alice.get(f"{path}?{raw}"), 422, "invalid_request")
            assert detail["fields"] == [{"field": "query", "problem": NOT_UTF8}], (raw, detail)
    r = alice.get(f"/v1/sessions/{sid}/events?follow=false&agent=%FF")
    error(r, 422, "invalid_request")
    assert _stored(store) == before
    # percent-encoded UTF-8 is text like any other
    assert alice.get("/v1/requests", params={"agent": "supp\u00e9rt ✓"}).json()["total"] == 0
    assert alice.get("/v1/requests", params={"agent": "support"}).json()["total"] == 1


async def test_a_query_of_raw_bytes_past_ascii_is_refused(tmp_path: Path) -> None:
    """Raw bytes past ASCII in a query, which uvicorn refuses itself but another ASGI server may
    pass on, were read as Latin-1 (`é` as "Ã©"): 422 `invalid_request` too."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/s.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "GET",
        "scheme": "http",
        "path": "/v1/requests",
        "raw_path": b"/v1/requests",
        "root_path": "",
        "query_string": "agent=suppé".encode(),
        "headers": [(b"host", b"t"), (b"authorization", b"Bearer alice-token")],
        "client": ("127.0.0.1", 1234),
        "server": ("t", 80),
    }
    async with app.router.lifespan_context(app):
        await app(scope, receive, send)
    assert sent[0]["status"] == 422
    detail = json.loads(b"".join(m.get("body", b"") for m in sent[1:]))["error"]
    assert detail["code"] == "invalid_request" and detail["fields"][0]["field"] == "query"
    await runtime.close()


def test_a_body_with_two_content_types_is_refused_not_read_by_the_first(
    alice: httpx.Client, store: str
) -> None:
    """A POST with `Content-Type: application/json` and `Content-Type: text/plain` started a
    session: the first was read, where a proxy may read the last or join them (a body it then
    takes for text, not JSON to inspect). Content-Type is one value (RFC 9110): two are 422
    `invalid_request` naming the header, as two `Idempotency-Key`s are, a dashboard form's too."""
    sid = start(alice)["session_id"]
    rid = alice.get("/v1/requests").json()["items"][0]["id"]
    before = _stored(store)
    answer = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
    for url, body in (
        ("/v1/sessions", {"agent": "support", "message": "Refund order 7"}),
        (f"/v1/sessions/{sid}/messages", {"text": "and order 7?"}),
        (f"/v1/sessions/{sid}/responses", answer),
        (f"/v1/sessions/{sid}/approvals", {"approvals": [{"id": rid, "approved": True}]}),
        (f"/v1/sessions/{sid}/cancel", {}),
    ):
        for types in (("application/json", "text/plain"), ("application/json",) * 2):
            headers = [("Content-Type", kind) for kind in types]
            r = alice.post(url, content=json.dumps(body), headers=headers)
            detail = error(r, 422, "invalid_request")
            assert detail["fields"] == [
                {"field": "header.content-type", "problem": "given 2 times"}
            ], (url, detail)
    page = alice.get(f"/_signoff/sessions/{sid}")
    csrf = re.search(r'name="csrf-token" content="([^"]+)"', page.text)
    assert csrf, page.text[:200]
    form = f"csrf={csrf.group(1)}&option=approve".encode()
    for types in (("application/x-www-form-urlencoded", "text/plain"),):
        r = alice.post(
            f"/_signoff/requests/{rid}/respond",
            content=form,
            headers=[("Accept", "application/json"), *(("Content-Type", t) for t in types)],
        )
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
    assert _stored(store) == before


def test_numbers_in_the_query_are_plain_digits(alice: httpx.Client) -> None:
    """`after`, `limit` and `offset` take plain digits, as `Last-Event-ID` does: `1_0` (read as
    10), `+5` or ` 5` are refused, not read as some other number; `older_than` is a finite
    number of seconds (`inf` is refused, as `Runtime.pending` refuses it)."""
    sid = start(alice)["session_id"]
    for param in ("limit", "offset"):
        for raw in ("5_0", "+5", " 5", "5 ", "٥"):
            for path in ("/v1/requests", "/v1/sessions"):
                detail = error(alice.get(path, params={param: raw}), 422, "invalid_request")
                assert detail["fields"][0]["field"] == f"query.{param}", (path, raw, detail)
        assert alice.get("/v1/requests", params={param: "05"}).status_code == 200
        assert alice.get("/v1/sessions", params={param: "05"}).status_code == 200
    for raw in ("1_0", "+1", " 1"):
        r = alice.get(f"/v1/sessions/{sid}/events", params={"after": raw, "follow": "false"})
        assert error(r, 422, "invalid_request")["fields"][0]["field"] == "query.after"
    for raw in ("inf", "Infinity", "1e400", "nan", "-1"):
        r = alice.get("/v1/requests", params={"older_than": raw})
        assert error(r, 422, "invalid_request")["fields"][0]["field"] == "query.older_than", raw
    # as plain as the whole numbers: `1_0`, `+5` and ` 5` were read as 10, 5 and 5
    for raw in ("1_0", "+5", " 5", "5 ", ".5", "5.", "0x10", "٥", "1e", "1.5e+"):
        r = alice.get("/v1/requests", params={"older_than": raw})
        detail = error(r, 422, "invalid_request")
        assert detail["fields"][0]["field"] == "query.older_than", (raw, detail)
        assert "plain decimal digits" in detail["message"], detail
    for raw in ("00", "0.0", "0E+3", "0e-1"):
        assert alice.get("/v1/requests", params={"older_than": raw}).json()["total"] == 1, raw
    assert alice.get("/v1/requests", params={"older_than": "1e3"}).json()["total"] == 0
    assert alice.get("/v1/requests", params={"older_than": "0"}).json()["total"] == 1


def test_a_trailing_slash_is_an_unknown_path_not_a_redirect(
    alice: httpx.Client, store: str
) -> None:
    """`/v1/requests/` was a 307 to a Location built from the Host header, which behind a proxy
    terminating TLS named plain `http://`. A path with a slash too many is now 404 `not_found`,
    as any unknown path is, on the API and the dashboard alike, and a POST there stores nothing;
    the dashboard's own paths and the root's relative redirect are as before."""
    sid = start(alice)["session_id"]
    before = _stored(store)
    proxied = {"Host": "signoff.example", "X-Forwarded-Proto": "https"}
    for path in (
        "/v1/requests/",
        "/v1/sessions/",
        f"/v1/sessions/{sid}/",
        f"/v1/sessions/{sid}/events/",
        "/_signoff/tools/",
        "/_signoff/audit/",
        "/_signoff/static",
    ):
        r = alice.get(path, headers=proxied)
        assert "location" not in r.headers, (path, r.headers)
        error(r, 404, "not_found")
    for path in ("/v1/sessions/", f"/v1/sessions/{sid}/messages/", f"/v1/sessions/{sid}/cancel/"):
        r = alice.post(path, json={"agent": "support", "text": "hi"}, headers=proxied)
        assert "location" not in r.headers, (path, r.headers)
        error(r, 404, "not_found")
    assert _stored(store) == before
    for path in ("/_signoff", "/_signoff/", "/_signoff/tools", "/v1/requests"):
        assert alice.get(path).status_code == 200, path
    root = alice.get("/", headers=proxied)
    assert root.status_code == 307 and root.headers["location"] == "/_signoff/"


def _raw_post(base: str, path: str, body: bytes, *headers: str) -> tuple[int, Any]:
    """POST over a bare socket, so header lines go out exactly as written (httpx refuses a
    value with spaces around it)."""
    host, port = base.removeprefix("http://").split(":")
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
    head += ["Content-Type: application/json", f"Content-Length: {len(body)}", *headers]
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status, _, rest = data.partition(b"\r\n\r\n")
    return int(status.split()[1]), json.loads(rest)


def test_spaces_around_an_idempotency_key_are_not_part_of_it(
    alice: httpx.Client, base: str
) -> None:
    """Over HTTP, spaces and tabs around a header's value are no part of it (RFC 9110 5.5), and
    uvicorn's parser strips them: `Idempotency-Key:  k-ows ` is the key `k-ows`."""
    body = {"agent": "support", "message": "Refund order 1042"}
    status, first = _raw_post(
        base,
        "/v1/sessions",
        json.dumps(body).encode(),
        "Authorization: Bearer alice-token",
        "Idempotency-Key: \t k-ows  ",
    )
    assert status == 201 and first["replayed"] is False, first
    again = alice.post("/v1/sessions", json=body, headers={"Idempotency-Key": "k-ows"})
    assert again.status_code == 201 and again.json()["replayed"] is True
    assert again.json()["session_id"] == first["session_id"]


async def test_an_idempotency_key_with_spaces_around_it_is_refused(store: str) -> None:
    """A server that hands the header's value on unstripped (an ASGI server other than uvicorn,
    or the app called in process) could take ` k` as a key other than `k`; the rule is strict
    instead, as `Runtime`'s and the client's are: 1 to 200 printable ASCII characters, no space
    at either end, else 422 `invalid_request` naming the header, and nothing is stored."""
    runtime = make_runtime(store)
    async with in_process(runtime) as c:
        first = await c.post("/v1/sessions", json={"agent": "support"})
        sid = first.json()["session_id"]
        before = await store_contents(runtime.store, sid)
        for key in (" k", "k ", " ", "  k  ", "k\t"):
            for url, body in (
                ("/v1/sessions", {"agent": "support", "message": "hi"}),
                (f"/v1/sessions/{sid}/messages", {"text": "hi"}),
            ):
                r = await c.post(url, json=body, headers={"Idempotency-Key": key})
                detail = error(r, 422, "invalid_request")
                assert detail["fields"][0]["field"] == "header.Idempotency-Key", detail
        assert await store_contents(runtime.store, sid) == before
        assert len(await runtime.sessions()) == 1
        inner = await c.post(
            f"/v1/sessions/{sid}/messages",
            json={"text": "hi"},
            headers={"Idempotency-Key": "a b"},
        )
        assert inner.status_code == 200, inner.text
    await runtime.close()


def test_an_integer_too_long_for_python_is_named_not_malformed(
    alice: httpx.Client, store: str
) -> None:
    """JSON bounds no number's digits, but Python reads an integer of at most 4300 of them
    (`sys.get_int_max_str_digits()`): a longer one was 400 `malformed_json`, though the body is
    valid JSON. It is 422 `invalid_request` saying the number is too long; nothing is stored."""
    body = start(alice)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    before = _stored(store)
    limit = sys.get_int_max_str_digits()
    long, json_type = "9" * (limit + 1), {"Content-Type": "application/json"}
    answer = f'{{"requestId": "{rid}", "optionId": "approve", "value": -{long}}}'
    for url, payload in (
        ("/v1/sessions", f'{{"agent": "support", "message": "hi", "n": {long}}}'),
        (f"/v1/sessions/{sid}/responses", f'{{"inputResponses": [{answer}]}}'),
    ):
        r = alice.post(url, content=payload, headers=json_type)
        detail = error(r, 422, "invalid_request")
        assert "too long" in detail["message"] and f"{limit} digits" in detail["message"], detail
        assert detail["fields"] == [{"field": "body", "problem": detail["message"]}]
    assert _stored(store) == before
    # at the limit the number is read, and the field it is in judged as any other
    r = alice.post(
        "/v1/sessions", content=f'{{"agent": "support", "n": {"9" * limit}}}', headers=json_type
    )
    assert error(r, 422, "invalid_request")["fields"][0]["field"] == "n"


async def test_an_answer_value_that_is_not_plain_json_is_refused_for_a_question_too(
    store_url: str,
) -> None:
    """A question's answer with a `value` of NaN, Infinity or nested over 100 levels was taken
    (200) and the value dropped, where an approval's is 422 `invalid_answer`, as the docs say
    of every answer; now both are refused and nothing is stored, on every store."""
    runtime = make_runtime(store_url)
    json_type = {"Content-Type": "application/json"}
    async with in_process(runtime) as c:
        created = await c.post("/v1/sessions", json={"agent": "helper", "message": "hi"})
        sid, rid = created.json()["session_id"], created.json()["pending"][0]["id"]
        before = await store_contents(runtime.store, sid)
        deep = "[" * 101 + "]" * 101
        for value in ("NaN", "Infinity", "-Infinity", "1e400", deep):
            for answer in ('"text": "Large"', '"optionId": "2"'):
                body = f'{{"inputResponses": [{{"requestId": "{rid}", {answer}, '
                body += f'"value": {value}}}]}}'
                r = await c.post(f"/v1/sessions/{sid}/responses", content=body, headers=json_type)
                assert error(r, 422, "invalid_answer")["request_ids"] == [rid], value
        with pytest.raises(so.InvalidAnswer, match="plain JSON"):
            await runtime.respond(
                sid,
                [so.InputResponse(request_id=rid, text="Large", value=float("nan"))],
                principal=ALICE,
            )
        assert await store_contents(runtime.store, sid) == before
        ok = {"inputResponses": [{"requestId": rid, "text": "Large", "value": {"size": "L"}}]}
        r = await c.post(f"/v1/sessions/{sid}/responses", json=ok)
        assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    await runtime.close()
