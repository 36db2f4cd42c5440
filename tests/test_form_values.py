"""The dashboard's forms are read as UTF-8, each field once, as the API's JSON bodies are: a
field named twice, which parsers read differently (Starlette keeps the last, a gateway or a log
may keep the first), is 422 `invalid_request`; a body that is not UTF-8, whose bytes were read
as U+FFFD or as Latin-1 and recorded so, is 400 `malformed_form`. Nothing is settled, started,
sent or signed in or out."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from ._dashboard import csrf_of, signed_in, start
from .test_server_common import PLAIN, auth, served

URLENCODED = "application/x-www-form-urlencoded"
JSON = {"Accept": "application/json"}


def _multipart(fields: list[tuple[str, bytes]], charset: str | None = None) -> tuple[str, bytes]:
    parts = b"".join(
        b'--x\r\nContent-Disposition: form-data; name="%s"\r\n\r\n%s\r\n' % (name.encode(), value)
        for name, value in fields
    )
    kind = "multipart/form-data; boundary=x" + (f"; charset={charset}" if charset else "")
    return kind, parts + b"--x--\r\n"


def _request(base: str, rid: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/v1/requests/{rid}", headers=auth("alice-token"), verify=PLAIN)
    assert r.status_code == 200, r.text
    record: dict[str, Any] = r.json()
    return record


def _bodies(csrf: str) -> dict[str, tuple[str, bytes, int, str]]:
    """Answers that approve if read at all: (content type, body, status, code) each."""
    token = f"csrf={csrf}".encode()
    return {
        "option twice": (
            URLENCODED,
            token + b"&option=cancel&option=approve",
            422,
            "invalid_request",
        ),
        "csrf twice": (
            URLENCODED,
            token + b"&" + token + b"&option=approve",
            422,
            "invalid_request",
        ),
        "option twice in parts": (
            *_multipart([("csrf", csrf.encode()), ("option", b"cancel"), ("option", b"approve")]),
            422,
            "invalid_request",
        ),
        "a percent-escape not UTF-8": (
            URLENCODED,
            token + b"&option=approve&text=%FF",
            400,
            "malformed_form",
        ),
        "a lone surrogate": (
            URLENCODED,
            token + b"&option=approve&text=%ED%A0%80",
            400,
            "malformed_form",
        ),
        "a raw byte": (URLENCODED, token + b"&option=approve&text=\xc3\xa9", 400, "malformed_form"),
        "a part not UTF-8": (
            *_multipart([("csrf", csrf.encode()), ("option", b"approve"), ("text", b"\xff")]),
            400,
            "malformed_form",
        ),
        "a urlencoded body labelled utf-16": (
            URLENCODED + "; charset=utf-16",
            token + b"&option=approve",
            400,
            "malformed_form",
        ),
        "parts cut off before the closing boundary": (
            _multipart([("csrf", csrf.encode()), ("option", b"approve"), ("text", b"why")])[0],
            _multipart([("csrf", csrf.encode()), ("option", b"approve"), ("text", b"why")])[1][
                : -len(b"\r\n--x--\r\n")
            ],
            400,
            "malformed_form",
        ),
        "a boundary named twice, the one read cut off": (
            "multipart/form-data; boundary=z; boundary=x",  # the parser reads the last
            _multipart([("csrf", csrf.encode()), ("option", b"approve"), ("text", b"\r\n--z--")])[
                1
            ][: -len(b"\r\n--x--\r\n")],
            400,
            "malformed_form",
        ),
        "a field sent as a file": (
            _multipart([("csrf", csrf.encode()), ("option", b"approve")])[0],
            _multipart([("csrf", csrf.encode()), ("option", b"approve")])[1].replace(
                b"--x--",
                b'--x\r\nContent-Disposition: form-data; name="text"; filename="a.txt"\r\n'
                b"\r\nwhy\r\n--x--",
            ),
            400,
            "malformed_form",
        ),
        "parts labelled latin-1": (
            *_multipart(
                [("csrf", csrf.encode()), ("option", b"approve"), ("text", b"caf\xc3\xa9")],
                charset="latin-1",
            ),
            400,
            "malformed_form",
        ),
    }


@pytest.mark.parametrize("name", sorted(_bodies("t")), ids=lambda n: n.replace(" ", "-"))
def test_an_answer_with_a_field_twice_or_not_utf8_is_refused(store_url: str, name: str) -> None:
    """`option=cancel&option=approve` approved (Starlette keeps the last value); `text=%FF` was
    recorded as the reason "\ufffd", raw UTF-8 (`curl -d`) as "Ã©" and a part labelled
    Latin-1 as such: each was a 303 that settled the request, as was an ASCII urlencoded body
    labelled UTF-16 (read as ASCII, where a gateway decoding by the label reads other text).
    Parts cut off before the closing boundary, or a reason sent as a file, settled it without
    the reason (the parser drops a last part cut off, and the form kept only text fields)."""
    with served(store_url) as base, signed_in(base) as c:
        body = start(base)
        rid = body["pending"][0]["id"]
        csrf = csrf_of(c.get(f"/_signoff/sessions/{body['session_id']}").text)
        kind, raw, status, code = _bodies(csrf)[name]
        path = f"/_signoff/requests/{rid}/respond"
        r = c.post(path, content=raw, headers={"Content-Type": kind, **JSON})
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
        page = c.post(path, content=raw, headers={"Content-Type": kind, "Accept": "text/html"})
        assert page.status_code == status and page.headers["content-type"].startswith("text/html")
        assert _request(base, rid)["status"] == "pending"
        # the same answer, each field once and in UTF-8, is taken
        fields = {"csrf": csrf, "option": "approve", "text": "café ✓"}
        r = c.post(path, data=fields, headers=JSON)
        assert r.status_code == 200 and r.json()["outcome"] == "approved", r.text
        record = _request(base, rid)
        assert record["status"] == "settled" and record["resolution"]["reason"] == "café ✓"


def test_every_form_refuses_a_field_twice_or_a_body_not_utf8(store_url: str) -> None:
    """Starting a conversation, sending a message, signing in and signing out read their forms
    alike: nothing is started, sent, or signed in or out."""
    with served(store_url) as base, signed_in(base) as c:
        body = start(base)
        sid = body["session_id"]
        csrf = csrf_of(c.get(f"/_signoff/sessions/{sid}").text)
        seq = c.get(f"/v1/sessions/{sid}").json()["seq"]
        forms = {
            "/_signoff/sessions": [("agent", b"support"), ("message", b"Refund 7")],
            f"/_signoff/sessions/{sid}/messages": [("message", b"only the three-pack")],
            "/_signoff/login": [("token", b"bob-token")],
            "/_signoff/logout": [],
        }
        for path, fields in forms.items():
            sent = [("csrf", csrf.encode()), *fields]
            twice = [*sent, sent[-1]]
            not_utf8 = [*sent, ("note", b"\xff")]
            for kind, raw, status, code in [
                (URLENCODED, _urlencoded(twice), 422, "invalid_request"),
                (*_multipart(twice), 422, "invalid_request"),
                (URLENCODED, _urlencoded(not_utf8), 400, "malformed_form"),
                (*_multipart(not_utf8), 400, "malformed_form"),
            ]:
                r = c.post(path, content=raw, headers={"Content-Type": kind, **JSON})
                assert r.status_code == status, (path, kind, r.text)
                assert r.json()["error"]["code"] == code, (path, kind, r.text)
        # still signed in as Alice, with one session of one turn, as it was
        listed = c.get("/v1/sessions").json()
        assert listed["total"] == 1 and listed["items"][0]["seq"] == seq
        assert "Alice" in c.get("/_signoff/").text


def _urlencoded(fields: list[tuple[str, bytes]]) -> bytes:
    """`fields` as a urlencoded body, each byte past ASCII percent-encoded."""
    from urllib.parse import quote_from_bytes

    return b"&".join(
        name.encode() + b"=" + quote_from_bytes(value, safe="").encode() for name, value in fields
    )


@pytest.mark.parametrize("multipart", [False, True], ids=["urlencoded", "multipart"])
def test_a_form_field_over_a_mebibyte_is_taken_as_the_api_takes_it(
    store_url: str, multipart: bool
) -> None:
    """A reason of 1.5 MiB (the API takes up to 4 MiB) was 400 `malformed_form`, "Field
    exceeded maximum size of 1024KB", from Starlette's own bound on a field: it is recorded,
    and one over the body limit is still 413 `payload_too_large`, settling nothing."""
    reason = "café " + "a" * (3 << 19)  # 1.5 MiB
    with served(store_url) as base, signed_in(base) as c:
        body = start(base)
        rid = body["pending"][0]["id"]
        csrf = csrf_of(c.get(f"/_signoff/sessions/{body['session_id']}").text)
        path = f"/_signoff/requests/{rid}/respond"

        def post(text: str) -> httpx.Response:
            fields = [("csrf", csrf.encode()), ("option", b"approve"), ("text", text.encode())]
            kind, raw = _multipart(fields) if multipart else (URLENCODED, _urlencoded(fields))
            return c.post(path, content=raw, headers={"Content-Type": kind, **JSON})

        r = post("x" * (5 << 20))
        assert (r.status_code, r.json()["error"]["code"]) == (413, "payload_too_large"), r.text
        assert _request(base, rid)["status"] == "pending"
        r = post(reason)
        assert r.status_code == 200 and r.json()["outcome"] == "approved", r.text[:300]
        record = _request(base, rid)
        assert record["status"] == "settled" and record["resolution"]["reason"] == reason
