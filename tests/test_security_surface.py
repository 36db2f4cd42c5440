"""The HTTP surface under attack: security headers on every response, sign-ins and signed-in
forms posted from another site, tokens no request can carry, and edited arguments that
cannot be read.
"""

from __future__ import annotations

import hmac
import re
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app

from ._security import (
    DEEP,
    JSON_REPLY,
    Served,
    World,
    deep_json,
    served,
    snapshot,
    world,
)
from .test_server_common import ALICE, TOKENS, auth

__all__ = ["served", "world"]  # the fixtures, used by name


# -- the HTTP surface: headers on every response, the sign-in, the tokens ------------------------


def _failing_auth(request: Any) -> None:
    raise RuntimeError("the authenticator broke")


async def test_a_server_failure_carries_the_security_headers(world: World) -> None:
    """A 500 is a response like any other: it may not be framed or sniffed, and on the
    dashboard it carries the page policy and is not cached."""
    app = create_app(world.rt, auth=_failing_auth, sweep_every=None)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://signoff.test") as c:
        for path in ("/v1/requests", "/_signoff/"):
            r = await c.get(path)
            assert r.status_code == 500, path
            assert r.json()["error"]["code"] == "internal_error"
            assert r.headers.get("x-content-type-options") == "nosniff", path
            assert r.headers.get("x-frame-options") == "DENY", path
            assert r.headers.get("referrer-policy") == "same-origin", path
        assert "frame-ancestors 'none'" in r.headers.get("content-security-policy", "")
        assert r.headers.get("cache-control") == "no-store"


def _csrf_in(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match, html[:500]
    return match.group(1)


async def test_a_sign_in_posted_from_another_site_is_refused(served: Served) -> None:
    """Login CSRF: an anonymous visitor's CSRF token is valid for every anonymous browser, so a
    page of a sibling subdomain (or of another port) could plant one in the victim's cookie and
    post the attacker's token, signing the victim in as the attacker. The browser names such a
    post `Sec-Fetch-Site: same-site` (or `cross-site`): it is refused, and signs nobody in."""
    c = served.client
    token = _csrf_in((await c.get("/_signoff/login")).text)  # the attacker's own visit
    async with httpx.AsyncClient(transport=served.transport, base_url="http://signoff.test") as v:
        v.cookies.set("signoff_csrf", token, domain="signoff.test", path="/_signoff")
        for site in ("same-site", "cross-site"):
            r = await v.post(
                "/_signoff/login",
                data={"csrf": token, "token": "mallory-token"},
                headers={"Sec-Fetch-Site": site, "Accept": "application/json"},
            )
            assert r.status_code == 403, r.text[:300]
            assert r.json()["error"]["code"] == "csrf_failed"
            assert "signoff_token" not in r.headers.get("set-cookie", "")
    # The dashboard's own form (same-origin), and a client that sends no such header, sign in.
    for headers in ({"Sec-Fetch-Site": "same-origin"}, {}):
        async with httpx.AsyncClient(
            transport=served.transport, base_url="http://signoff.test"
        ) as b:
            token = _csrf_in((await b.get("/_signoff/login")).text)
            r = await b.post(
                "/_signoff/login", data={"csrf": token, "token": "alice-token"}, headers=headers
            )
            assert r.status_code == 303 and "signoff_token=" in r.headers["set-cookie"]
            assert "alice-token" not in r.headers["set-cookie"]  # a sign-in, never the token


async def test_a_signed_in_form_posted_from_another_site_is_refused(served: Served) -> None:
    """Every dashboard form, not only the sign-in, refuses a post the browser says came from
    another site, even with a valid token and cookie; nothing changes."""
    w = served.world
    c = served.client
    page = await c.get("/_signoff/", headers=auth("alice-token"))
    token = _csrf_in(page.text)
    before = await snapshot(w.rt)
    r = await c.post(
        f"/_signoff/requests/{w.ra}/respond",
        data={"csrf": token, "option": "approve"},
        headers={**auth("alice-token"), "Sec-Fetch-Site": "cross-site", **JSON_REPLY},
    )
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed", r.text[:300]
    assert await snapshot(w.rt) == before


@pytest.mark.parametrize("token", ["tök€n-1234", " padded ", "tab\there", "new\nline", "\x00"])
def test_a_token_no_request_can_carry_is_refused_up_front(token: str) -> None:
    """A token a header cannot carry as given (not ASCII, a control character, spaces around
    it, which the server strips) could never sign anyone in, and made the dashboard's sign-in a
    500: `TokenAuth` refuses it, without naming it."""
    with pytest.raises(so.UsageError, match="printable ASCII") as caught:
        TokenAuth({token: ALICE})
    assert token.strip() not in str(caught.value)


def test_a_token_auth_error_names_no_part_of_the_token() -> None:
    """Configuration errors end up in logs: they say which token is wrong by position, not by
    any of its characters."""
    with pytest.raises(so.UsageError, match="not a Principal") as caught:
        TokenAuth({"alice-token": ALICE, "s3cret-value": "bob"})  # type: ignore[dict-item]
    assert "s3cr" not in str(caught.value) and "#2" in str(caught.value)


def test_tokens_are_compared_at_one_length(monkeypatch: pytest.MonkeyPatch) -> None:
    """`compare_digest` may return early on a length mismatch, which would time how long each
    configured token is: what it compares is always the same length."""
    lengths: set[tuple[int, int]] = set()
    real = hmac.compare_digest

    def recording(a: bytes, b: bytes) -> bool:
        lengths.add((len(a), len(b)))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", recording)
    tokens = TokenAuth(TOKENS)
    assert tokens.lookup("alice-token") == ALICE
    assert tokens.lookup("x") is None and tokens.lookup("y" * 500) is None
    assert tokens.lookup("") is None
    assert lengths == {(32, 32)}, lengths  # whole SHA-256 digests: no prefix decides


async def test_edited_arguments_naming_a_key_twice_are_refused(served: Served) -> None:
    """A reviewer who types a new `"amount": 50` above the old line and approves means 50, but
    JSON parsing keeps the last one (180): the edit is refused, and nothing is approved."""
    w = served.world
    c = served.client
    token = _csrf_in((await c.get("/_signoff/", headers=auth("alice-token"))).text)
    before = await snapshot(w.rt)
    edited = '{"amount": 50, "order_id": "1042", "amount": 180, "reason": "arrived broken"}'
    r = await c.post(
        f"/_signoff/requests/{w.ra}/respond",
        data={"csrf": token, "option": "approve", "edited_input": edited},
        headers={**auth("alice-token"), **JSON_REPLY},
    )
    assert r.status_code == 422, r.text[:300]
    assert r.json()["error"]["code"] == "invalid_answer"
    assert "'amount'" in r.json()["error"]["message"]
    assert await snapshot(w.rt) == before


async def test_edited_arguments_nested_too_deeply_to_read_are_refused(served: Served) -> None:
    """Edited arguments nested past what the JSON parser can read are not JSON to the server:
    a 422 `invalid_answer` (not a 500 from the parser's `RecursionError`, whose words it does not
    pass on), and nothing changes."""
    w = served.world
    c = served.client
    token = _csrf_in((await c.get("/_signoff/", headers=auth("alice-token"))).text)
    before = await snapshot(w.rt)
    r = await c.post(
        f"/_signoff/requests/{w.ra}/respond",
        data={"csrf": token, "option": "approve", "edited_input": deep_json(DEEP).decode()},
        headers={**auth("alice-token"), **JSON_REPLY},
    )
    assert r.status_code == 422, r.text[:300]
    assert r.json()["error"]["code"] == "invalid_answer"
    assert "not JSON" in r.json()["error"]["message"]
    # in the client's words, not the parser's ("maximum recursion depth exceeded while ...")
    assert "nested too deeply" in r.json()["error"]["message"]
    assert "recursion" not in r.json()["error"]["message"]
    assert await snapshot(w.rt) == before
