"""The attributes of every cookie signing in and out sets, over http and https: each is
`HttpOnly` and `SameSite=Strict` (no script reads it, no other site's request carries it), over
https `Secure`, and each lasts exactly as long as it should."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

from .test_sign_ins import HTTP, HTTPS, _csrf, dashboard

LIFETIME = 600
REMEMBERED = 30 * 86400  # the signed-in marker outlives the sign-in, to tell it expired


def _attributes(headers: list[str], name: str) -> dict[str, str]:
    """The attributes of the `Set-Cookie` of `name` (lower-cased; flags map to "")."""
    (cookie,) = [h for h in headers if h.startswith(name + "=")]
    found: dict[str, str] = {}
    for part in cookie.split(";")[1:]:
        key, _, value = part.strip().partition("=")
        found[key.lower()] = value.lower()
    return found


@pytest.mark.parametrize("base", [HTTP, HTTPS])
def test_signing_in_and_out_sets_strict_http_only_cookies(tmp_path: Path, base: str) -> None:
    secure = base == HTTPS
    token = "__Host-signoff_token" if secure else "signoff_token"
    # Over https the CSRF cookie is a `__Host-` one too (so no sibling subdomain can shadow it),
    # which needs `Path=/`.
    csrf_name, csrf_path = ("__Host-signoff_csrf", "/") if secure else ("signoff_csrf", "/_signoff")
    with (
        dashboard(f"sqlite:///{tmp_path}/s.db", sign_in_lifetime=LIFETIME) as app,
        TestClient(app, base_url=base) as c,
    ):
        page = c.get("/_signoff/login")
        csrf = _attributes(page.headers.get_list("set-cookie"), csrf_name)
        r = c.post(
            "/_signoff/login",
            data={"token": "alice-token", "csrf": _csrf(page.text)},
            follow_redirects=False,
        )
        assert r.status_code == 303
        signed = r.headers.get_list("set-cookie")
        sign_in = _attributes(signed, token)
        marker = _attributes(signed, "signoff_signed_in")
        for cookie, path in ((csrf, csrf_path), (sign_in, "/"), (marker, "/_signoff")):
            assert "httponly" in cookie and cookie.get("samesite") == "strict", cookie
            assert cookie.get("path") == path and ("secure" in cookie) == secure, cookie
            assert "domain" not in cookie, cookie
        assert sign_in["max-age"] == str(LIFETIME)
        assert marker["max-age"] == str(LIFETIME + REMEMBERED)
        out = c.post(
            "/_signoff/logout",
            data={"csrf": _csrf(c.get("/_signoff/").text)},
            follow_redirects=False,
        )
        gone = out.headers.get_list("set-cookie")
        for name, path in ((token, "/"), ("signoff_signed_in", "/_signoff")):
            cookie = _attributes(gone, name)
            assert cookie["max-age"] == "0" and cookie["path"] == path, cookie
            assert "httponly" in cookie and cookie.get("samesite") == "strict", cookie
            assert ("secure" in cookie) == secure, cookie
