"""The dashboard's CSRF token: bound to the sign-in it was minted for, keyed by the server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard import cookie_of, csrf_of, signed_in, start
from .test_server_common import PLAIN, TOKENS, auth, make_runtime, running, served

JSON = {"Accept": "application/json"}


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


def token_of(base: str, cookies: dict[str, str] | None = None) -> str:
    """The CSRF token a page gives a browser with `cookies` (none: a visitor not signed in)."""
    with httpx.Client(base_url=base, cookies=cookies, timeout=10, verify=PLAIN) as c:
        path = "/_signoff/" if cookies else "/_signoff/login"
        return csrf_of(c.get(path).text)


def post_as(
    base: str, cookies: dict[str, str], path: str, token: str, data: dict[str, str]
) -> httpx.Response:
    """A browser holding `cookies` posting a form that carries `token`, in the field and the
    header, as the dashboard's script does."""
    with httpx.Client(base_url=base, cookies=cookies, timeout=10, verify=PLAIN) as c:
        return c.post(path, data={**data, "csrf": token}, headers={**JSON, "X-CSRF-Token": token})


def forged_post(
    base: str, me: dict[str, str], path: str, token: str, data: dict[str, str]
) -> httpx.Response:
    """Alice's browser (signed in with the cookies `me`), into which an attacker planted `token`
    as the CSRF cookie, posting a form that carries the same token (a cookie-tossing attack
    from a sibling host)."""
    return post_as(base, {**me, "signoff_csrf": token}, path, token, data)


def waiting(base: str, body: dict[str, Any]) -> bool:
    r = httpx.get(
        f"{base}/v1/sessions/{body['session_id']}", headers=auth("alice-token"), verify=PLAIN
    )
    return bool(r.json()["status"] == "waiting")


def test_a_planted_token_of_another_sign_in_is_refused(base: str) -> None:
    body = start(base)
    path = f"/_signoff/requests/{body['pending'][0]['id']}/respond"
    me = cookie_of(base, "alice-token")
    planted = {
        "mallory's own": token_of(base, cookie_of(base, "mallory-token")),
        "alice's other sign-in's": token_of(base, cookie_of(base, "alice-token")),
        "a visitor's": token_of(base),
        "made up": "x" * 43,
        "made up, short": "x",
    }
    for name, token in planted.items():
        r = forged_post(base, me, path, token, {"option": "approve"})
        assert r.status_code == 403, (name, r.text)
        assert r.json()["error"]["code"] == "csrf_failed", name
    assert waiting(base, body)  # nothing was settled
    # alice's own token, from her own page, works
    mine = token_of(base, me)
    r = forged_post(base, me, path, mine, {"option": "approve"})
    assert r.status_code == 200 and r.json()["outcome"] == "approved", r.text


def test_switching_users_in_one_browser_refuses_the_old_pages_token(base: str) -> None:
    """Alice signs out and Bob signs in in the same browser: a form left open from Alice's
    sign-in no longer posts, as Bob or as anyone; Bob's fresh pages do."""
    with signed_in(base, "alice-token") as browser:
        old = csrf_of(browser.get("/_signoff/new").text)
        r = browser.post("/_signoff/logout", data={"csrf": old})
        assert r.status_code == 303
        login = browser.get("/_signoff/login")
        r = browser.post(
            "/_signoff/login", data={"token": "bob-token", "csrf": csrf_of(login.text)}
        )
        assert r.status_code == 303
        jar = browser.cookies.get("signoff_csrf") or ""
        bob = browser.cookies.get("signoff_token") or ""
        form = {"agent": "support", "message": "Refund 1042"}
        for cookie in {jar, old}:  # the cookie the browser now holds, or the old page's own
            me = {"signoff_token": bob, "signoff_csrf": cookie}
            r = post_as(base, me, "/_signoff/sessions", old, form)
            assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed", r.text
        fresh = csrf_of(browser.get("/_signoff/new").text)
        assert fresh != old
        r = browser.post("/_signoff/sessions", data={**form, "csrf": fresh}, headers=JSON)
        assert r.status_code == 200 and r.json()["ok"] is True, r.text
    sessions = httpx.get(f"{base}/v1/requests", headers=auth("admin-token"), verify=PLAIN).json()[
        "items"
    ]
    assert [s["requested_by"]["principal_id"] for s in sessions] == ["bob"]


def test_tokens_are_keyed_by_the_servers_secret(tmp_path: Path) -> None:
    """A token minted by a server with another secret is refused; processes given one secret
    accept each other's forms, and so do processes given none."""
    store = f"sqlite:///{tmp_path}/s.db"

    def app(**kwargs: Any) -> Any:
        return create_app(make_runtime(store), auth=TokenAuth(TOKENS), sweep_every=None, **kwargs)

    def bearer_post(base: str, token: str, data: dict[str, str]) -> httpx.Response:
        """Alice posting with her bearer token, the CSRF cookie and field set to `token`."""
        with httpx.Client(
            base_url=base, headers=auth("alice-token"), timeout=10, verify=PLAIN
        ) as c:
            c.cookies.set("signoff_csrf", token)
            return c.post("/_signoff/sessions", data={**data, "csrf": token}, headers=JSON)

    def bearer_token_of(base: str) -> str:
        with httpx.Client(
            base_url=base, headers=auth("alice-token"), timeout=10, verify=PLAIN
        ) as c:
            return csrf_of(c.get("/_signoff/new").text)

    form = {"agent": "support", "message": "x"}
    with running(app(secret="one")) as one, running(app(secret="two")) as two:
        minted = bearer_token_of(one)
        r = bearer_post(two, minted, form)
        assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"
        me = cookie_of(one)  # a sign-in and its page's token, made by the first process
        signed = token_of(one, me)
        with running(app(secret="one")) as twin:
            r = bearer_post(twin, minted, form)
            assert r.status_code == 200, r.text
            r = forged_post(twin, me, "/_signoff/sessions", signed, form)
            assert r.status_code == 200, r.text
    # Without a secret, processes (or a restart) accept each other's tokens, and the sign-in's
    # credential alone makes them unforgeable: a token minted for another one is refused.
    with running(app()) as first, running(app()) as second:
        me = cookie_of(first)
        minted = token_of(first, me)
        r = forged_post(second, me, "/_signoff/sessions", minted, form)
        assert r.status_code == 200, r.text
        other = token_of(first, cookie_of(first, "bob-token"))
        r = forged_post(second, me, "/_signoff/sessions", other, form)
        assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"
        r = bearer_post(second, bearer_token_of(first), form)
        assert r.status_code == 200, r.text
    with pytest.raises(so.UsageError, match="secret"):
        app(secret="")


async def test_dev_mode_forms_still_work(tmp_path: Path) -> None:
    runtime = make_runtime(f"sqlite:///{tmp_path}/dev.db")
    app = create_app(runtime, dev=True, sweep_every=None)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
        token = csrf_of((await c.get("/_signoff/new")).text)
        form = {"agent": "support", "message": "Refund 1042"}
        r = await c.post("/_signoff/sessions", data=form, headers=JSON)
        assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"
        r = await c.post("/_signoff/sessions", data={**form, "csrf": token}, headers=JSON)
        assert r.status_code == 200 and r.json()["ok"] is True, r.text
    await runtime.close()


def test_bearer_clients_post_with_the_token_of_their_page(base: str) -> None:
    """A client authenticating with a bearer header (no sign-in cookie) uses the token its page
    gave it; another bearer's page token is refused."""
    with httpx.Client(
        base_url=base, headers=auth("alice-token"), timeout=10, verify=PLAIN
    ) as alice:
        token = csrf_of(alice.get("/_signoff/new").text)
        form = {"agent": "support", "message": "Refund 1042", "csrf": token}
        r = alice.post("/_signoff/sessions", data=form, headers=JSON)
        assert r.status_code == 200, r.text
        with httpx.Client(
            base_url=base, headers=auth("bob-token"), timeout=10, verify=PLAIN
        ) as bob:
            bob.cookies.set("signoff_csrf", token)
            r = bob.post("/_signoff/sessions", data=form, headers=JSON)
            assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"


def test_two_pages_loaded_at_once_both_post(base: str) -> None:
    """Two tabs loaded at once, before the browser held a token, each got a fresh token and
    the cookie kept the later one: the earlier tab's forms post too, both made for Alice."""
    me = cookie_of(base)
    first, second = token_of(base, me), token_of(base, me)
    assert first != second
    form = {"agent": "support", "message": "Refund 1042"}
    r = post_as(base, {**me, "signoff_csrf": second}, "/_signoff/sessions", first, form)
    assert r.status_code == 200 and r.json()["ok"] is True, r.text
    # the cookie must still be one made for this sign-in, not merely present
    r = post_as(base, {**me, "signoff_csrf": "x" * 43}, "/_signoff/sessions", first, form)
    assert r.status_code == 403 and r.json()["error"]["code"] == "csrf_failed"


def _fields(count: int) -> bytes:
    return "&".join(f"f{i}=1" for i in range(count)).encode()


def _parts(count: int) -> bytes:
    part = b'--x\r\nContent-Disposition: form-data; name="f%d"\r\n\r\n1\r\n'
    return b"".join(part % i for i in range(count)) + b"--x--\r\n"


MULTIPART = "multipart/form-data; boundary=x"
URLENCODED = "application/x-www-form-urlencoded"
MALFORMED = {
    "no boundary": ("multipart/form-data", b"csrf=x"),
    "garbage multipart": (MULTIPART, b"garbage--x\r\n"),
    "a part without a name": (
        MULTIPART,
        b"--x\r\nContent-Disposition: form-data\r\n\r\n1\r\n--x--\r\n",
    ),
    "a header without a colon": (MULTIPART, b"--x\r\nNoColon\r\n\r\n1\r\n--x--\r\n"),
    "too many urlencoded fields": (URLENCODED, _fields(1001)),
    "too many parts": (MULTIPART, _parts(1001)),
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_form_body_that_cannot_be_read_is_malformed_form(base: str, name: str) -> None:
    """A form the server cannot parse is 400 `malformed_form`: JSON for the page's script, a
    page for a plain browser post; nothing is settled or started."""
    body = start(base)
    content_type, raw = MALFORMED[name]
    me = cookie_of(base)
    paths = [
        f"/_signoff/requests/{body['pending'][0]['id']}/respond",
        "/_signoff/sessions",
        f"/_signoff/sessions/{body['session_id']}/messages",
        "/_signoff/login",
        "/_signoff/logout",
    ]
    with httpx.Client(base_url=base, cookies=me, timeout=10, verify=PLAIN) as c:
        for path in paths:
            headers = {"Content-Type": content_type}
            r = c.post(path, content=raw, headers={**headers, **JSON})
            assert r.status_code == 400, (name, path, r.text)
            assert r.json()["error"]["code"] == "malformed_form", (name, path)
            assert r.json()["ok"] is False
            page = c.post(path, content=raw, headers={**headers, "Accept": "text/html"})
            assert page.status_code == 400, (name, path, page.text)
            assert page.headers["content-type"].startswith("text/html"), (name, path)
            assert "could not be read" in page.text, (name, path)
    assert waiting(base, body)
    listed = httpx.get(f"{base}/v1/requests", headers=auth("alice-token"), verify=PLAIN).json()
    assert listed["total"] == 1


async def test_a_route_mounted_on_the_app_gets_malformed_form_too(tmp_path: Path) -> None:
    """Any route added to the app (a channel's, or the application's own) that reads a form
    gets the same stable code for one it cannot parse, not Starlette's bare 400."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/s.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)

    async def hook(request: Request) -> Response:
        form = await request.form()
        return JSONResponse({"fields": len(form)})

    app.add_route("/hooks/form", hook, methods=["POST"])
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
        r = await c.post("/hooks/form", content=_fields(3), headers={"Content-Type": URLENCODED})
        assert r.json() == {"fields": 3}
        for name, (content_type, raw) in sorted(MALFORMED.items()):
            r = await c.post("/hooks/form", content=raw, headers={"Content-Type": content_type})
            assert r.status_code == 400, (name, r.text)
            assert r.json()["error"]["code"] == "malformed_form", (name, r.text)
    await runtime.close()


def test_a_deadline_past_the_year_9999_is_shown(tmp_path: Path) -> None:
    """A request may wait 1e12 seconds (`expires_in` takes any positive, finite time): its
    deadline, past the last date a datetime holds, made the queue, the session page and their
    live fragments a 500 for every reviewer, while the API served it."""

    @so.tool(approval=so.always(expires_in=1e12))
    async def archive(box: str) -> str:
        """Archive a mailbox."""
        return "archived"

    script = [so.ModelResponse(tool_calls=[so.ToolCall(name="archive", input={"box": "b"})])]
    model = so.models.Scripted(script, repeat_last=True)
    agent = so.Agent(name="mail", model=model, tools=[archive])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)) as base:
        h = auth("alice-token")
        body = httpx.post(
            f"{base}/v1/sessions", json={"agent": "mail", "message": "go"}, headers=h, verify=PLAIN
        )
        sid = body.json()["session_id"]
        for path in (
            "/_signoff/",
            "/_signoff/fragments/queue",
            f"/_signoff/sessions/{sid}",
            f"/_signoff/fragments/sessions/{sid}",
        ):
            r = httpx.get(f"{base}{path}", headers=h, verify=PLAIN)
            assert r.status_code == 200, (path, r.text[:200])
            assert "after 9999-12-31" in r.text, path
