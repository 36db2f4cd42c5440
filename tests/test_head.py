"""HEAD on every GET route: GET's status and headers, no body, nothing changed, no hang."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from .test_server_common import PLAIN, auth, served

ALICE = auth("alice-token")


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


def started(base: str) -> dict[str, str]:
    r = httpx.post(
        f"{base}/v1/sessions",
        json={"agent": "support", "message": "Refund 1042"},
        headers=ALICE,
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 201, r.text
    body = r.json()
    return {"sid": body["session_id"], "rid": body["pending"][0]["id"]}


def test_head_answers_like_get_without_a_body(base: str) -> None:
    ids = started(base)
    paths = [
        "/v1/requests",
        f"/v1/requests/{ids['rid']}",
        f"/v1/sessions/{ids['sid']}",
        "/v1/openapi.json",
        "/_signoff/",
        "/_signoff",
        "/_signoff/login",
        "/_signoff/tools",
        "/_signoff/audit",
        "/_signoff/audit/tools",
        "/_signoff/new",
        f"/_signoff/sessions/{ids['sid']}",
        f"/_signoff/fragments/sessions/{ids['sid']}",
        "/_signoff/fragments/queue",
        "/_signoff/static/app.js",
        "/",
    ]
    with httpx.Client(base_url=base, headers=ALICE, timeout=10, verify=PLAIN) as c:
        for path in paths:
            get = c.get(path)
            head = c.head(path)
            assert head.status_code == get.status_code, (path, head.status_code, head.text)
            assert head.content == b"", path
            for name in ("content-type", "content-length", "location", "x-frame-options"):
                assert head.headers.get(name) == get.headers.get(name), (path, name)
        # an unknown session or one not signed in: the same answer as GET's, without its body
        assert c.head("/v1/sessions/ses_nope").status_code == 404
        assert httpx.head(f"{base}/v1/requests", verify=PLAIN).status_code == 401
        r = httpx.head(f"{base}/_signoff/tools", verify=PLAIN)
        back = "/_signoff/login?next=%2F_signoff%2Ftools"
        assert (r.status_code, r.headers["location"]) == (303, back)


def test_head_on_a_route_without_get_is_still_405(base: str) -> None:
    ids = started(base)
    with httpx.Client(base_url=base, headers=ALICE, timeout=10, verify=PLAIN) as c:
        for path in (
            f"/v1/sessions/{ids['sid']}/messages",
            f"/v1/sessions/{ids['sid']}/cancel",
            f"/v1/sessions/{ids['sid']}/responses",
            f"/_signoff/requests/{ids['rid']}/respond",
            "/_signoff/logout",
        ):
            r = c.head(path)
            assert r.status_code == 405, (path, r.status_code)
            assert "HEAD" not in r.headers.get("allow", ""), path
        # nothing was settled, cancelled or started by them
        state = c.get(f"/v1/sessions/{ids['sid']}").json()
        assert state["status"] == "waiting"
        assert c.get("/v1/requests").json()["total"] == 1


def test_a_405_on_a_get_route_names_head_among_its_methods(base: str) -> None:
    """HEAD is answered wherever GET is, but a PUT (or OPTIONS) there was told `Allow: GET`:
    the header must list every method the resource supports (RFC 9110, section 15.5.6)."""
    ids = started(base)
    with httpx.Client(base_url=base, headers=ALICE, timeout=10, verify=PLAIN) as c:
        session = f"/v1/sessions/{ids['sid']}"  # DELETE deletes it
        for path in ("/v1/requests", session, "/_signoff/tools"):
            for method in ("PUT", "OPTIONS") if path == session else ("PUT", "DELETE", "OPTIONS"):
                r = c.request(method, path)
                assert r.status_code == 405, (path, method)
                allow = "GET, HEAD, DELETE" if path == session else "GET, HEAD"
                assert r.headers["allow"] == allow, (path, method)
                assert r.json()["error"]["code"] == "method_not_allowed"
        assert c.put(f"/v1/sessions/{ids['sid']}/cancel").headers["allow"] == "POST"
        # one route takes POST and another GET here: both are named
        assert c.put("/v1/sessions").headers["allow"] == "GET, HEAD, POST"
        assert c.head("/v1/sessions").status_code == 200


def test_head_on_the_streams_returns_at_once(base: str) -> None:
    ids = started(base)
    with httpx.Client(base_url=base, headers=ALICE, timeout=5, verify=PLAIN) as c:
        seq = c.get(f"/v1/sessions/{ids['sid']}").json()["seq"]
        for path in (f"/v1/sessions/{ids['sid']}/events", "/_signoff/stream"):
            began = time.monotonic()
            r = c.head(path)
            assert time.monotonic() - began < 3, path
            assert r.status_code == 200, (path, r.text)
            assert r.headers["content-type"].startswith("text/event-stream"), path
            assert r.content == b""
        # the connection is still usable, and the session is as it was
        assert c.get(f"/v1/sessions/{ids['sid']}").json()["seq"] == seq
