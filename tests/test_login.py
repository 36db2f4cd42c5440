"""Signing in to the dashboard: an expired sign-in is told so and sent back to its page once
signed in again, and the page to go back to is always a path of the dashboard."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from starlette.requests import HTTPConnection
from starlette.testclient import TestClient

import signoff as so
from signoff.server import create_app
from signoff.server._login import return_to

from .test_server_common import make_agents
from .test_sign_ins import HTTP, JSON, _csrf, dashboard, sign_in

LIFETIME = 600
BROWSER = {"Accept": "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}


def _next_of(location: str) -> str | None:
    parts = urlsplit(location)
    assert parts.path == "/_signoff/login" and not parts.netloc, location
    found = parse_qs(parts.query).get("next")
    return None if found is None else found[0]


def _hidden_next(html: str) -> str | None:
    match = re.search(r'<input type="hidden" name="next" value="([^"]*)">', html)
    return None if match is None else match.group(1).replace("&amp;", "&")


@pytest.mark.parametrize("browser_kept_the_cookie", [False, True])
def test_an_expired_sign_in_says_so_and_returns_to_its_page(
    tmp_path: Path, browser_kept_the_cookie: bool
) -> None:
    """A reviewer whose sign-in expired was sent to a bare sign-in form (a script was told
    "sign in first"), and after signing in landed on the queue, not the page they were on."""
    now = [1_000_000.0]
    with (
        dashboard(
            f"sqlite:///{tmp_path}/s.db", clock=lambda: now[0], sign_in_lifetime=LIFETIME
        ) as app,
        TestClient(app, base_url=HTTP) as c,
    ):
        sign_in(c)
        assert c.get("/_signoff/tools", follow_redirects=False).status_code == 200
        now[0] += LIFETIME + 1
        if not browser_kept_the_cookie:  # it was told to keep it no longer than the lifetime
            c.cookies.delete("signoff_token")
        page = "/_signoff/audit?status=expired&page=2"
        r = c.get(page, follow_redirects=False)
        assert r.status_code == 303 and _next_of(r.headers["location"]) == page
        form = c.get(r.headers["location"])
        assert "Your sign-in has expired" in form.text and "data-expired" in form.text
        assert _hidden_next(form.text) == page
        fragment = c.get("/_signoff/fragments/queue", headers=JSON)
        assert fragment.status_code == 401
        assert fragment.json()["error"] == {
            "code": "unauthenticated",
            "message": "your sign-in has expired: sign in again",
        }
        # an answer posted without JavaScript returns to the page the form was on
        posted = c.post(
            "/_signoff/requests/req_x/respond",
            data={"option": "approve", "csrf": _csrf(form.text)},
            headers={"Referer": f"{HTTP}/_signoff/sessions/ses_1?upto=3"},
            follow_redirects=False,
        )
        assert posted.status_code == 303
        assert _next_of(posted.headers["location"]) == "/_signoff/sessions/ses_1?upto=3"
        signed = c.post(
            "/_signoff/login",
            data={"token": "alice-token", "csrf": _csrf(form.text), "next": page},
            follow_redirects=False,
        )
        assert signed.status_code == 303 and signed.headers["location"] == page
        assert c.get(page, follow_redirects=False).status_code == 200
        # signed in again: the form no longer says the sign-in expired
        assert "data-expired" not in c.get("/_signoff/login").text


def test_a_visitor_never_signed_in_or_signed_out_is_not_told_of_an_expiry(
    tmp_path: Path,
) -> None:
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app, TestClient(app, base_url=HTTP) as c:
        r = c.get("/_signoff/tools", follow_redirects=False)
        assert r.status_code == 303 and _next_of(r.headers["location"]) == "/_signoff/tools"
        # the queue itself is where a sign-in leads anyway
        r = c.get("/_signoff/", follow_redirects=False)
        assert r.headers["location"] == "/_signoff/login"
        assert "data-expired" not in c.get("/_signoff/login").text
        fragment = c.get("/_signoff/fragments/queue")
        assert fragment.status_code == 401
        assert fragment.json()["error"]["message"] == "sign in first"
        sign_in(c)
        out = c.post(
            "/_signoff/logout", data={"csrf": _csrf(c.get("/_signoff/").text)}
        )  # followed to the sign-in form
        assert out.url.path == "/_signoff/login" and "data-expired" not in out.text
        assert c.get("/_signoff/fragments/queue").json()["error"]["message"] == "sign in first"


OUTSIDE = [
    "//evil.example/",
    "///evil.example/",
    "/\\evil.example",
    "/_signoff/\\\\evil.example",
    "https://evil.example/_signoff/",
    "http:/_signoff/",
    "javascript:alert(1)",
    "/v1/requests",
    "/_signoff.evil.example",
    "/_signoffs",
    "/_signoff/../v1/requests",
    "/_signoff/%2e%2e/v1/requests",
    "/_signoff/%2E%2E%2Fv1",
    "/_signoff/\r\nSet-Cookie: x=1",
    "/_signoff/%0d%0aSet-Cookie:%20x=1",
    "/_signoff/ x",
    "/_signoff/é",
    "/_signoff/#frag",
    "/_signoff/login",
    "/_signoff/logout",
    "_signoff/tools",
    "",
    "/_signoff/" + "a" * 2000,
]


@pytest.mark.parametrize("target", OUTSIDE)
def test_the_page_to_return_to_is_only_ever_a_path_of_the_dashboard(
    tmp_path: Path, target: str
) -> None:
    """No open redirect: a sign-in form linked with `?next=` elsewhere signs in to the queue."""
    assert return_to(target) is None
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app, TestClient(app, base_url=HTTP) as c:
        form = c.get("/_signoff/login", params={"next": target})
        assert form.status_code == 200 and _hidden_next(form.text) is None
        r = c.post(
            "/_signoff/login",
            data={"token": "alice-token", "csrf": _csrf(form.text), "next": target},
            follow_redirects=False,
        )
        assert r.status_code == 303 and r.headers["location"] == "/_signoff"


@pytest.mark.parametrize(
    "target",
    ["/_signoff", "/_signoff/", "/_signoff/tools", "/_signoff/sessions/ses_1?upto=3&x=%2F"],
)
def test_a_page_of_the_dashboard_is_returned_to(target: str) -> None:
    assert return_to(target) == target


def test_a_form_posted_from_another_host_returns_to_no_page(tmp_path: Path) -> None:
    """The page to return to after a form's post is its `Referer`, of this very host only."""
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app, TestClient(app, base_url=HTTP) as c:
        token = _csrf(c.get("/_signoff/login").text)
        for referer in ("https://evil.example/_signoff/tools", "not a url", ""):
            r = c.post(
                "/_signoff/requests/req_x/respond",
                data={"option": "approve", "csrf": token},
                headers={"Referer": referer},
                follow_redirects=False,
            )
            assert r.status_code == 303 and r.headers["location"] == "/_signoff/login", referer


def _sso(request: HTTPConnection) -> so.Principal | None:
    """An application's own authenticator: the cookie its sign-in proxy sets."""
    user = request.cookies.get("sso_user")
    attributes = {"tenant": "acme"}
    return (
        None
        if not user
        else so.Principal(authenticator="sso", principal_id=user, attributes=attributes)
    )


def test_an_applications_authenticator_that_does_not_recognise_a_visitor_says_so(
    tmp_path: Path,
) -> None:
    """Under an authenticator of the application's (an SSO proxy's cookie), a visitor it does
    not recognise got a 401 page saying "In dev mode only localhost may connect" (it was not
    dev mode), naming no code; the page's script got that HTML where it reads JSON (its banner
    said "Unexpected response (401)"); and the sign-in form's address served a token form that
    signs no one in. The script gets 401 `unauthenticated` as JSON, the page names the code and
    the authenticator, and the form's address leads to the page to return to."""
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db")
    app = create_app(runtime, auth=_sso, secret="s3cret", sweep_every=None)
    said = (
        "this server's authenticator does not recognise you: sign in as you do for this "
        "application, then reload the page"
    )
    with TestClient(app, base_url=HTTP) as c:
        for headers in ({}, JSON, BROWSER):
            r = c.get("/_signoff/fragments/queue", headers=headers)
            assert r.status_code == 401, r.text
            assert r.json()["error"] == {"code": "unauthenticated", "message": said}
        csrf = _csrf(c.get("/_signoff/", headers=BROWSER).text)
        form = {"option": "approve", "csrf": csrf}
        r = c.post("/_signoff/requests/req_x/respond", data=form, headers=JSON)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
        for page in (
            c.get("/_signoff/sessions/ses_1", headers=BROWSER),
            c.post("/_signoff/requests/req_x/respond", data=form, headers=BROWSER),
        ):
            assert page.status_code == 401 and page.headers["content-type"].startswith("text/html")
            assert "<code>unauthenticated</code>" in page.text
            assert "This server&#39;s authenticator does not recognise you" in page.text
            assert "dev mode" not in page.text and "/_signoff/login" not in page.text
        r = c.get("/_signoff/login?next=%2F_signoff%2Ftools", follow_redirects=False)
        assert (r.status_code, r.headers["location"]) == (303, "/_signoff/tools")
        r = c.post("/_signoff/login", data={"token": "x", "csrf": csrf}, follow_redirects=False)
        assert (r.status_code, r.headers["location"]) == (303, "/_signoff")
        assert 'name="token"' not in c.get("/_signoff/login").text
        c.cookies.set("sso_user", "alice")  # signed in at the proxy
        r = c.get("/_signoff/login")
        assert r.status_code == 200 and "Approval queue" in r.text, r.text


def test_dev_mode_tells_a_caller_from_elsewhere_only_localhost_may_connect(
    tmp_path: Path,
) -> None:
    """Dev mode keeps its own words, now with the code, and as JSON to a script."""
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db")
    app = create_app(runtime, dev=True, sweep_every=None)
    said = "this server does not recognise you: in dev mode only localhost may connect"
    with TestClient(app, base_url=HTTP) as c:  # from "testclient", to signoff.test
        r = c.get("/_signoff/fragments/queue")
        assert r.status_code == 401 and r.json()["error"]["message"] == said
        page = c.get("/_signoff/", headers=BROWSER)
        assert page.status_code == 401 and "<code>unauthenticated</code>" in page.text
        assert "This server does not recognise you: in dev mode only localhost" in page.text
