"""The dashboard's sign-in cookie: signed and expiring, revoked by signing out in every process,
never the API token itself, and over https not plantable from a sibling domain."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

import signoff as so
from signoff.server import TokenAuth, create_app

from .test_server_common import ALICE, PLAIN, TOKENS, make_agents, running
from .test_sse import _follow_until_closed

JSON = {"Accept": "application/json"}
HTTP = "http://signoff.test"
HTTPS = "https://signoff.test"


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf-token" content="([^"]+)"', html)
    assert match, html[:300]
    return match.group(1)


@contextmanager
def dashboard(
    store: str,
    tokens: dict[str, so.Principal] = TOKENS,
    clock: Callable[[], float] | None = None,
    **kwargs: Any,
) -> Iterator[Any]:
    """An app for the demo agents on `store` (a process of its own, as far as the app knows)."""
    runtime = so.Runtime(make_agents(), store=store, clock=clock or time.time)
    app = create_app(runtime, auth=TokenAuth(tokens), sweep_every=None, **kwargs)
    yield app


def sign_in(client: TestClient, token: str = "alice-token") -> tuple[str, str]:
    """Sign `client` in through the form; the name and value of the cookie it was given."""
    page = client.get("/_signoff/login")
    r = client.post(
        "/_signoff/login", data={"token": token, "csrf": _csrf(page.text)}, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    set_cookie = next(
        h for h in r.headers.get_list("set-cookie") if not h.startswith("signoff_csrf=")
    )
    name, _, rest = set_cookie.partition("=")
    return name, rest.partition(";")[0]


def who(client: TestClient, cookies: dict[str, str] | None = None) -> str | None:
    """Who the API says `client` (holding `cookies`, if given) is, or None when no one."""
    if cookies is not None:
        client.cookies.clear()
        for name, value in cookies.items():
            client.cookies.set(name, value)
    r = client.get("/v1/requests")
    if r.status_code == 401:
        return None
    assert r.status_code == 200, r.text
    page = client.get("/_signoff/", follow_redirects=False)
    assert page.status_code == 200, page.status_code
    match = re.search(r'class="viewer-name"[^>]*>([^<]*)<', page.text)
    assert match, page.text[:300]
    return match.group(1).strip()


def test_the_cookie_does_not_hold_the_token(tmp_path: Path) -> None:
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app, TestClient(app, base_url=HTTP) as c:
        name, value = sign_in(c)
        assert name == "signoff_token"
        assert "alice-token" not in value and value
        assert who(c) is not None
        # the raw token in the cookie (the old sign-in) signs no one in
        assert who(c, {"signoff_token": "alice-token"}) is None


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_copied_cookie_is_refused_after_sign_out(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """Signing out revokes the sign-in in the store: a copy of the cookie taken before stops
    working, in this process and in another one serving the same store."""
    store = (
        f"sqlite:///{tmp_path}/s.db"
        if kind == "sqlite"
        else str(request.getfixturevalue("pg_store_url"))
    )
    with dashboard(store) as one, dashboard(store) as two:
        with TestClient(one, base_url=HTTP) as a, TestClient(two, base_url=HTTP) as b:
            name, value = sign_in(a)
            copied = {name: value}
            assert who(b, copied) == "Alice (alice)"  # the other process honours it
            other_name, other_value = sign_in(b)  # another browser's sign-in of the same token
            assert who(b, {other_name: other_value}) is not None
            page = a.get("/_signoff/")
            r = a.post("/_signoff/logout", data={"csrf": _csrf(page.text)}, follow_redirects=False)
            assert r.status_code == 303
            assert who(a, copied) is None
            assert who(b, copied) is None
            r = b.get("/_signoff/", follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"] == "/_signoff/login"
            # the other browser's sign-in is its own: it stays signed in
            assert who(b, {other_name: other_value}) is not None
        # a process started after the sign-out knows it too
        with dashboard(store) as three, TestClient(three, base_url=HTTP) as c:
            assert who(c, copied) is None
            assert who(c, {other_name: other_value}) is not None


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_a_principal_holding_a_lone_surrogate_signs_out(
    tmp_path: Path, kind: str, request: pytest.FixtureRequest
) -> None:
    """A principal whose id holds a lone surrogate (which events hold, and which signs in):
    its sign-out's audit entry, text, could not be written on either store, so the sign-out
    answered 500 and the cookie went on working, and the next sign-in (which signs the earlier
    one out) failed too. The entry holds its text escaped: the cookie is refused after."""
    store = (
        f"sqlite:///{tmp_path}/s.db"
        if kind == "sqlite"
        else str(request.getfixturevalue("pg_store_url"))
    )
    eve = so.Principal(authenticator="t", principal_id="eve\udcff")
    with dashboard(store, {"eve-token": eve}) as app, TestClient(app, base_url=HTTP) as c:
        name, value = sign_in(c, "eve-token")
        assert who(c) is not None
        page = c.get("/_signoff/")
        r = c.post("/_signoff/logout", data={"csrf": _csrf(page.text)}, follow_redirects=False)
        assert r.status_code == 303, r.text
        assert who(c, {name: value}) is None
        sign_in(c, "eve-token")  # and again, the earlier one signed out first
        assert who(c) is not None
        entries = app.state.signoff.runtime.audit_sync(stream="dashboard:sign-outs")
        assert [e.data["principal_id"] for e in entries] == ["eve\\udcff"]
        assert app.state.signoff.runtime.verify_audit_sync() == []


def test_a_sign_out_is_in_the_audit_trail_and_the_trail_verifies(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/s.db"
    with dashboard(store) as app, TestClient(app, base_url=HTTP) as c:
        sign_in(c)
        page = c.get("/_signoff/")
        c.post("/_signoff/logout", data={"csrf": _csrf(page.text)})
        runtime = app.state.signoff.runtime
        entries = runtime.audit_sync(stream="dashboard:sign-outs")
        assert [e.type for e in entries] == ["dashboard.signed_out"]
        assert entries[0].data["principal_id"] == "alice"
        assert "alice-token" not in str(entries[0].data)
        assert runtime.verify_audit_sync() == []


def test_a_planted_cookie_from_a_sibling_domain_is_not_honoured_over_https(
    tmp_path: Path,
) -> None:
    """Mallory signs in herself, then a page of hers on `evil.signoff.test` sets her cookie for
    the parent domain in Alice's browser: over https the server reads only its `__Host-`
    cookie, which no other host can set, so Alice's browser is not signed in as Mallory."""
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app:
        with TestClient(app, base_url=HTTPS) as mallory:
            name, value = sign_in(mallory, "mallory-token")
            header = mallory.post(
                "/_signoff/login",
                data={"token": "mallory-token", "csrf": _csrf(mallory.get("/_signoff/").text)},
                follow_redirects=False,
            ).headers.get_list("set-cookie")
        with TestClient(app, base_url=HTTPS) as alice:
            alice.cookies.set("signoff_token", value, domain=".signoff.test", path="/_signoff")
            r = alice.get("/_signoff/", follow_redirects=False)
            assert r.status_code == 303 and r.headers["location"] == "/_signoff/login"
            assert alice.get("/v1/requests").status_code == 401
    assert name == "__Host-signoff_token"
    cookie = next(h for h in header if h.startswith("__Host-signoff_token="))
    attributes = [a.strip().lower() for a in cookie.split(";")[1:]]
    assert "secure" in attributes and "path=/" in attributes and "httponly" in attributes
    assert not any(a.startswith("domain") for a in attributes), cookie


def test_over_https_the_sign_in_and_sign_out_use_the_host_cookie(tmp_path: Path) -> None:
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app, TestClient(app, base_url=HTTPS) as c:
        name, value = sign_in(c)
        assert who(c, {name: value}) is not None
        # the same value under the plain name (where a sibling could have put it) is ignored
        assert who(c, {"signoff_token": value}) is None
        c.cookies.set(name, value)
        page = c.get("/_signoff/")
        r = c.post("/_signoff/logout", data={"csrf": _csrf(page.text)}, follow_redirects=False)
        gone = [h for h in r.headers.get_list("set-cookie") if h.startswith(name + "=")]
        assert gone and "secure" in gone[0].lower() and "max-age=0" in gone[0].lower(), gone
        assert who(c, {name: value}) is None


def test_an_expired_sign_in_is_refused(tmp_path: Path) -> None:
    """A sign-in lasts `sign_in_lifetime` seconds (by the runtime's clock), and the browser is
    told to keep the cookie no longer."""
    now = [1_000_000.0]
    with (
        dashboard(f"sqlite:///{tmp_path}/s.db", clock=lambda: now[0], sign_in_lifetime=600) as app,
        TestClient(app, base_url=HTTP) as c,
    ):
        page = c.get("/_signoff/login")
        r = c.post(
            "/_signoff/login",
            data={"token": "alice-token", "csrf": _csrf(page.text)},
            follow_redirects=False,
        )
        assert "max-age=600" in r.headers["set-cookie"].lower(), r.headers["set-cookie"]
        cookies = {"signoff_token": c.cookies["signoff_token"]}
        now[0] += 599
        assert who(c, cookies) is not None
        now[0] += 1  # exactly its lifetime: the browser has dropped it, and so does the server
        assert who(c, cookies) is None
        now[0] += 1
        assert who(c, cookies) is None
        # nor does a sign-in from the future count (a clock set back, or a copied cookie)
        now[0] -= 10_000
        assert who(c, cookies) is None


def test_the_sign_in_lifetime_is_checked() -> None:
    runtime = so.Runtime([], store="sqlite:///:memory:")
    bad: Any
    for bad in (0, -1, float("nan"), float("inf"), True, "600", 10**400, 10**5000):
        with pytest.raises(so.UsageError, match="sign_in_lifetime"):
            create_app(runtime, auth=TokenAuth(TOKENS), sign_in_lifetime=bad)


def test_a_sign_in_of_a_token_no_longer_configured_is_refused(tmp_path: Path) -> None:
    """A token removed from the configuration, or changed (even for the same principal), ends
    the sign-ins made with it."""
    store = f"sqlite:///{tmp_path}/s.db"
    with dashboard(store) as before, TestClient(before, base_url=HTTP) as c:
        cookies = dict([sign_in(c)])
    removed = {k: v for k, v in TOKENS.items() if k != "alice-token"}
    changed = {**removed, "alice-new-token": ALICE}
    for tokens in (removed, changed):
        with dashboard(store, tokens) as after, TestClient(after, base_url=HTTP) as c:
            assert who(c, cookies) is None
    with dashboard(store) as again, TestClient(again, base_url=HTTP) as c:
        assert who(c, cookies) is not None


def test_a_sign_in_of_another_server_secret_is_refused(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/s.db"
    with dashboard(store, secret="one") as one, TestClient(one, base_url=HTTP) as c:
        cookies = dict([sign_in(c)])
    with dashboard(store, secret="two") as two, TestClient(two, base_url=HTTP) as c:
        assert who(c, cookies) is None
    with dashboard(store, secret="one") as twin, TestClient(twin, base_url=HTTP) as c:
        assert who(c, cookies) is not None


def test_a_tampered_cookie_signs_no_one_in(tmp_path: Path) -> None:
    """Changing any part of a sign-in (its id, its time, the token it names) breaks its mac;
    cookies that are not a sign-in at all are refused too, never a 500."""
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app, TestClient(app, base_url=HTTP) as c:
        _, value = sign_in(c)
        c.cookies.clear()  # another browser: signing in again in this one would end Alice's
        _, mallory = sign_in(c, "mallory-token")
        parts = value.split(".")
        theirs = mallory.split(".")
        forged = []
        for i in range(len(parts)):
            for swap in (theirs[i], parts[i] + "A", parts[i][:-1], ""):
                if swap != parts[i]:
                    forged.append(".".join([*parts[:i], swap, *parts[i + 1 :]]))
        junk = [
            value + ".x",
            "v1.a.99999999999999999999999.c.d",
            "v1.a.-5.c.d",
            "v1.a.1e9.c.d",
            "v1....",
            "....",
            "x" * 5000,
        ]
        for cookie in forged + junk:
            assert who(c, {"signoff_token": cookie}) is None, cookie
        c.cookies.clear()
        for raw in ("v1.a.١٢٣.c.d", value[:-2] + "é" + value[-1:]):
            header = [(b"cookie", f"signoff_token={raw}".encode())]
            assert c.get("/v1/requests", headers=header).status_code == 401
        assert who(c, {"signoff_token": mallory}) == "mallory"
        assert who(c, {"signoff_token": value}) == "Alice (alice)"


def test_sign_out_without_a_valid_sign_in_still_clears_the_cookie(tmp_path: Path) -> None:
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app, TestClient(app, base_url=HTTP) as c:
        c.cookies.set("signoff_token", "v1.not.a.sign.in")
        page = c.get("/_signoff/login")
        r = c.post("/_signoff/logout", data={"csrf": _csrf(page.text)}, follow_redirects=False)
        assert r.status_code == 303
        assert any(
            h.startswith("signoff_token=") and "max-age=0" in h.lower()
            for h in r.headers.get_list("set-cookie")
        )
        assert app.state.signoff.runtime.audit_sync(stream="dashboard:sign-outs") == []


@pytest.mark.parametrize("how", ["signed out", "expired"])
@pytest.mark.parametrize("stream", ["queue", "session"])
def test_a_stream_opened_with_a_sign_in_ends_when_it_is_signed_out(
    tmp_path: Path, stream: str, how: str
) -> None:
    """A stream authenticates once, when it opens: one opened with a copied cookie used to go
    on for ever after the sign-out. It ends (`stream.end`, 401 `unauthenticated`) within a
    heartbeat, and so does one whose sign-in expires."""
    now = [1_000_000.0]
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db", clock=lambda: now[0])
    app = create_app(
        runtime,
        auth=TokenAuth(TOKENS),
        poll_interval=0.02,
        heartbeat=0.1,
        sweep_every=None,
        sign_in_lifetime=3600,
    )
    with running(app) as base, httpx.Client(base_url=base, timeout=10, verify=PLAIN) as browser:
        page = browser.get("/_signoff/login")
        browser.post("/_signoff/login", data={"token": "alice-token", "csrf": _csrf(page.text)})
        copied = {"signoff_token": browser.cookies["signoff_token"]}
        body = browser.post(
            "/v1/sessions",
            json={"agent": "support", "message": "Refund 1042"},
            headers={"Authorization": "Bearer alice-token"},
        ).json()
        path = (
            "/_signoff/stream" if stream == "queue" else f"/v1/sessions/{body['session_id']}/events"
        )
        seen = "event: queue" if stream == "queue" else "id: 1"

        def sign_out() -> None:
            if how == "expired":
                now[0] += 3600
                return
            csrf = _csrf(browser.get("/_signoff/").text)
            assert browser.post("/_signoff/logout", data={"csrf": csrf}).status_code == 303

        with (
            httpx.Client(base_url=base, cookies=copied, timeout=10, verify=PLAIN) as thief,
            thief.stream("GET", path) as s,
        ):
            lines = _follow_until_closed(s, seen, sign_out)
    end = lines.index("event: stream.end")
    data = json.loads(lines[end + 1].removeprefix("data: "))
    assert data["status"] == 401 and data["error"]["code"] == "unauthenticated", data
