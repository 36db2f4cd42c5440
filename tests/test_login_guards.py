"""The page a sign-in returns to is a path of this dashboard, never another host's, however the
address is written: a scheme-relative `//host/_signoff/...` names another host with a path that
looks like the dashboard's."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from signoff.server._login import return_to

from .test_sign_ins import HTTP, JSON, _csrf, dashboard

URLENCODED = "application/x-www-form-urlencoded"

ELSEWHERE = [
    "//evil.example/_signoff/",
    "//evil.example/_signoff/tools",
    "//evil.example:8443/_signoff/audit?page=2",
    "//user@evil.example/_signoff",
]


@pytest.mark.parametrize("target", ELSEWHERE)
def test_a_scheme_relative_address_is_no_page_to_return_to(target: str) -> None:
    assert return_to(target) is None


def test_the_sign_in_form_never_sends_a_browser_to_another_host(tmp_path: Path) -> None:
    """Signed in from a form whose `next` names another host, the browser lands on the queue."""
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app, TestClient(app, base_url=HTTP) as c:
        for target in ELSEWHERE:
            c.cookies.clear()
            page = c.get("/_signoff/login", params={"next": target})
            assert 'name="next"' not in page.text
            r = c.post(
                "/_signoff/login",
                data={"token": "alice-token", "csrf": _csrf(page.text), "next": target},
                follow_redirects=False,
            )
            assert r.status_code == 303 and r.headers["location"] == "/_signoff", target


def test_a_form_of_empty_fields_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    """A body of nothing but `&` was parsed one empty field at a time, a second of CPU for the
    4 MB a body may be, for anyone, signed in or not, before the CSRF check refused it. Now a
    form with more separators than a form may have fields (1000) is 400 `malformed_form` at
    once, as one with too many fields is."""
    empty = b"&" * 1_000_001
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app, TestClient(app, base_url=HTTP) as c:
        paths = ["/_signoff/login", "/_signoff/logout"]
        for path in paths:
            r = c.post(path, content=empty, headers={"Content-Type": URLENCODED, **JSON})
            assert r.status_code == 400, (path, r.text)
            assert r.json()["error"]["code"] == "malformed_form", (path, r.text)
        page = c.get("/_signoff/login")  # a form's own fields, and a few empty ones, still post
        body = f"csrf={_csrf(page.text)}&token=alice-token&&&".encode()
        r = c.post("/_signoff/login", content=body, headers={"Content-Type": URLENCODED})
        assert r.status_code == 200 and "viewer-name" in r.text
        for path in [*paths, "/_signoff/sessions"]:  # signed in too
            r = c.post(path, content=empty, headers={"Content-Type": URLENCODED, **JSON})
            assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_form", path


UNPARSABLE = ["//[", "//[::1", "//[x]/_signoff/", "http://[", "/_signoff/x#//["]


def test_an_address_urlsplit_cannot_read_is_no_page_to_return_to(tmp_path: Path) -> None:
    """An unclosed or bad IPv6 bracket (`?next=//[`, a `Referer: http://[`) made `urlsplit`
    raise ValueError: the sign-in page for such a link, and a form posted signed out with such
    a Referer, were 500 `internal_error` with a traceback. They are no page to return to: the
    sign-in page is served, and the signed-out post goes to sign in, returning nowhere."""
    for target in UNPARSABLE:
        assert return_to(target) is None
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app, TestClient(app, base_url=HTTP) as c:
        for target in UNPARSABLE:
            page = c.get("/_signoff/login", params={"next": target})
            assert page.status_code == 200, (target, page.text)
            assert 'name="next"' not in page.text
            r = c.post(
                "/_signoff/login",
                data={"token": "alice-token", "csrf": _csrf(page.text), "next": target},
                follow_redirects=False,
            )
            assert r.status_code == 303 and r.headers["location"] == "/_signoff", target
            c.cookies.clear()
        for referer in ["http://[", "http://[x]/_signoff/sessions", "http://signoff.test:99999/"]:
            r = c.post(
                "/_signoff/requests/req_x/respond",
                data={"option": "approve"},
                headers={"Referer": referer},
                follow_redirects=False,
            )
            assert r.status_code == 303, (referer, r.text)
            assert r.headers["location"] == "/_signoff/login", referer
