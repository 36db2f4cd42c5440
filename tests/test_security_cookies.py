"""The dashboard's CSRF cookie under cookie tossing: a page of a sibling subdomain can set a
cookie for the parent domain, with the same name and path as the dashboard's own, which the
browser then sends beside it (after it, when planted later). Over https the CSRF cookie is a
`__Host-` one, which no other host can set, and the plain-named one is not read there, so a
planted cookie can neither shadow it (every form refused, for as long as the planted cookie
lives) nor stand in for it.
"""

from __future__ import annotations

from pathlib import Path

from starlette.testclient import TestClient

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard import csrf_of
from .test_server_common import TOKENS, auth, make_agents

HOST = "__Host-signoff_csrf"


def _app(tmp_path: Path) -> TestClient:
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/x.db")
    return TestClient(create_app(runtime, auth=TokenAuth(TOKENS)), base_url="https://dash.example")


def test_over_https_the_csrf_cookie_is_one_no_other_host_can_set(tmp_path: Path) -> None:
    with _app(tmp_path) as c:
        page = c.get("/_signoff/login")
        [cookie] = page.headers.get_list("set-cookie")
        assert cookie.startswith(f"{HOST}="), cookie
        flags = [f.strip().lower() for f in cookie.split(";")[1:]]
        assert {"secure", "httponly", "path=/", "samesite=strict"} <= set(flags), cookie
        assert not any(f.startswith("domain") for f in flags), cookie
        token = csrf_of(page.text)
        assert page.cookies[HOST] == token


def test_a_csrf_cookie_planted_by_a_sibling_host_neither_shadows_nor_stands_in(
    tmp_path: Path,
) -> None:
    with _app(tmp_path) as c:
        page = c.get("/_signoff/", headers=auth("alice-token"))
        token = csrf_of(page.text)
        planted = csrf_of(c.get("/_signoff/login").text)  # an anonymous visitor's: the attacker's
        c.cookies.clear()
        # The browser sends its own cookie and, after it, the one planted for the parent domain.
        both = {"Cookie": f"{HOST}={token}; signoff_csrf={planted}", **auth("alice-token")}
        r = c.post(
            "/_signoff/sessions",
            data={"csrf": token, "agent": "support", "message": "Refund order 1042"},
            headers=both,
            follow_redirects=False,
        )
        assert r.status_code == 303, r.text[:300]
        # Only a plain-named cookie (which another host can set) is not the dashboard's.
        alone = {"Cookie": f"signoff_csrf={token}", **auth("alice-token")}
        r = c.post(
            "/_signoff/sessions",
            data={"csrf": token, "agent": "support", "message": "Refund order 1043"},
            headers={**alone, "Accept": "application/json"},
        )
        assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed", r.text[:300]
