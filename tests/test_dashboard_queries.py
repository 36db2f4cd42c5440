"""The dashboard reads a query string as the API does: UTF-8, each byte past ASCII percent-encoded.
One that is not (`?agent=%FF`, a lone surrogate's escapes) is refused with the API's code, as a
page naming it for a browser and as JSON for the page's script; nothing in the store changes.
"""

from __future__ import annotations

import httpx

from signoff.server._route import NOT_UTF8

from ._dashboard import signed_in, start
from ._server_api import _stored
from .test_server_common import PLAIN, served

NOT_UTF8_QUERIES = ("agent=%FF", "agent=%ED%A0%80", "tool=%C3", "page=2&kind=%E9")


def _pages(sid: str, rid: str) -> list[str]:
    """Every page and fragment of the dashboard a GET reaches, the event stream among them."""
    return [
        "/_signoff",
        "/_signoff/",
        "/_signoff/fragments/queue",
        "/_signoff/stream",
        "/_signoff/sessions",
        f"/_signoff/sessions/{sid}",
        f"/_signoff/fragments/sessions/{sid}",
        f"/_signoff/sessions/{sid}/events/1",
        f"/_signoff/requests/{rid}/input",
        f"/_signoff/requests/{rid}/payload",
        f"/_signoff/requests/{rid}/place",
        f"/_signoff/requests/{rid}/reason",
        "/_signoff/new",
        "/_signoff/tools",
        "/_signoff/audit",
        "/_signoff/audit/tools",
        "/_signoff/login",
    ]


def test_a_dashboard_query_not_utf8_is_refused_not_read_as_other_text(store_url: str) -> None:
    """`/_signoff/?agent=%FF` showed the queue of the agent "\ufffd" (empty, as if the filter
    were right), a lone surrogate's escapes alike, where `GET /v1/requests?agent=%FF` is 422
    `invalid_request`: each page is that 422 now, a page naming the code for a browser and
    JSON for the page's script."""
    with served(store_url) as base, signed_in(base) as c:
        body = start(base)
        sid, rid = body["session_id"], body["pending"][0]["id"]
        before = _stored(store_url)
        for raw in NOT_UTF8_QUERIES:
            for path in _pages(sid, rid):
                page = c.get(f"{path}?{raw}", headers={"Accept": "text/html"})
                assert page.status_code == 422, (path, raw, page.status_code, page.text[:300])
                assert page.headers["content-type"].startswith("text/html"), (path, raw)
                assert "invalid_request" in page.text and NOT_UTF8 in page.text, (path, raw)
                r = c.get(f"{path}?{raw}", headers={"Accept": "application/json"})
                assert r.status_code == 422, (path, raw, r.text[:300])
                error = r.json()["error"]
                assert error["code"] == "invalid_request", (path, raw, error)
                assert error["message"] == f"query: {NOT_UTF8}", (path, raw, error)
        assert _stored(store_url) == before
        # percent-encoded UTF-8 is text like any other; the request is still open
        assert c.get("/_signoff/", params={"agent": "supp\u00e9rt ✓"}).status_code == 200
        queue = c.get("/_signoff/fragments/queue", params={"agent": "support"})
        assert queue.status_code == 200 and queue.headers["x-total-count"] == "1"
        assert c.get("/_signoff/login", params={"next": "/_signoff/tools"}).status_code == 200


def test_a_query_not_utf8_is_refused_after_the_sign_in(store_url: str) -> None:
    """A visitor not signed in is sent to sign in first, as the API tells a caller without a
    token that (401) before what is wrong with its query."""
    with served(store_url) as base:
        with httpx.Client(base_url=base, timeout=10, verify=PLAIN) as c:
            r = c.get("/_signoff/sessions?agent=%FF")
            assert r.status_code == 303 and r.headers["location"].startswith("/_signoff/login")
            r = c.get("/_signoff/fragments/queue?agent=%FF")
            assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
