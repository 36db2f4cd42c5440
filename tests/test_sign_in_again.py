"""Signing in again from a browser already signed in ends its earlier sign-in, in every process
serving the store."""

from __future__ import annotations

from starlette.testclient import TestClient

from .test_sign_ins import HTTP, _csrf, dashboard, sign_in, who


def test_signing_in_again_ends_the_browsers_earlier_sign_in(store_url: str) -> None:
    """A browser signed in with one token signs in with another: the first cookie (a copy of
    it kept, say, by whoever used the browser before) no longer signs anyone in, here or in
    another process; a sign-in of another browser goes on."""
    with dashboard(store_url) as one, dashboard(store_url) as two:
        with TestClient(one, base_url=HTTP) as a, TestClient(two, base_url=HTTP) as b:
            name, value = sign_in(a)
            first = {name: value}
            elsewhere = dict([sign_in(b)])
            assert who(b, first) == "Alice (alice)"
            assert who(a, first) == "Alice (alice)"
            second = dict([sign_in(a, "bob-token")])  # the same browser, another token
            assert second[name] != value
            assert who(a, second) == "Bob (bob)"
            assert who(a, first) is None
            assert who(b, first) is None  # in the other process too
            assert who(b, elsewhere) == "Alice (alice)"  # another browser's sign-in goes on


def test_a_failed_sign_in_leaves_the_earlier_one(store_url: str) -> None:
    """A wrong token typed while signed in is only refused: the sign-in held stays."""
    with dashboard(store_url) as app, TestClient(app, base_url=HTTP) as c:
        held = dict([sign_in(c)])
        page = c.get("/_signoff/")
        r = c.post("/_signoff/login", data={"token": "wrong", "csrf": _csrf(page.text)})
        assert r.status_code == 401
        assert who(c, held) == "Alice (alice)"
