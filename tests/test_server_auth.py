"""Who the HTTP API serves (`_auth`): bearer tokens and what each caller may see, the default
access rule, settings `create_app` cannot run with, and credentials missing, misplaced or given
twice.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import DevAuth, TokenAuth, create_app, default_access

from ._server_api import (
    _stored,
    alice,
    base,
    client,
    error,
    start,
    store,
)
from .test_server_common import (
    PLAIN,
    TOKENS,
    auth,
)

__all__ = ["alice", "base", "store"]  # the fixtures, used by name


def test_authentication_and_visibility(base: str) -> None:
    with client(base, "alice-token") as alice, client(base, "bob-token") as bob:
        with client(base, "mallory-token") as mallory:
            body = start(alice)
            sid, rid = body["session_id"], body["pending"][0]["id"]
            plain = httpx.get(f"{base}/v1/sessions/{sid}", verify=PLAIN)
            none = error(plain, 401, "unauthenticated")
            assert none["message"].startswith("authenticate with a bearer token"), none
            wrong = error(
                httpx.get(f"{base}/v1/requests", headers=auth("wrong"), verify=PLAIN),
                401,
                "unauthenticated",
            )
            # a token sent and refused is told apart from none sent (not which tokens exist)
            assert wrong["message"].startswith("the bearer token sent is not one"), wrong
            # another tenant cannot see the session, its events, or its requests
            error(mallory.get(f"/v1/sessions/{sid}"), 404, "unknown_session")
            error(mallory.get(f"/v1/sessions/{sid}/events?follow=false"), 404, "unknown_session")
            error(mallory.get(f"/v1/requests/{rid}"), 404, "unknown_request")
            assert mallory.get("/v1/requests").json()["total"] == 0
            answer = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
            error(
                mallory.post(f"/v1/sessions/{sid}/responses", json=answer), 404, "unknown_session"
            )
            # the same tenant sees it, but the runtime's response rule lets only alice settle
            assert bob.get("/v1/requests").json()["total"] == 1
            r = bob.post(f"/v1/sessions/{sid}/responses", json=answer)
            assert error(r, 403, "not_allowed")["request_ids"] == [rid]
            assert alice.get(f"/v1/sessions/{sid}").json()["status"] == "waiting"
            assert alice.post(f"/v1/sessions/{sid}/responses", json=answer).status_code == 200


@pytest.mark.parametrize(
    "settings",
    [
        {"auth": ...},  # the README's Channels example copied as it is
        {"auth": "s3cret"},
        {"dev": True, "access": "tenant"},
        {"dev": True, "poll_interval": float("nan")},
        {"dev": True, "heartbeat": float("nan")},
        {"dev": True, "heartbeat": float("inf")},
        {"dev": True, "sweep_every": float("nan")},
        {"dev": True, "sweep_every": 0},
        {"dev": True, "secret": "s\udcff"},  # a byte of SIGNOFF_SECRET that is not UTF-8
        {"dev": True, "close_runtime": "no"},  # an environment variable, taken for its truth
        {"dev": True, "channels": 5},  # was an AttributeError
        {"dev": True, "channels": "slack"},
    ],
)
def test_create_app_refuses_settings_it_cannot_run_with(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    """An `auth` or `access` that is not a function was accepted, and then every request was a
    500 (`auth=...`, as the README's example shows it, included); NaN seconds passed the
    `<= 0` check. Each is now a `UsageError` when the app is made."""
    runtime = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match=next(k for k in settings if k != "dev")):
        create_app(runtime, **settings)


async def _own_only_async(caller: so.Principal, initiator: so.Principal | None) -> bool:
    return initiator is not None and caller.same_as(initiator)


class _AsyncRule:
    async def __call__(self, caller: so.Principal, initiator: so.Principal | None) -> bool:
        return False


@pytest.mark.parametrize("access", [_own_only_async, _AsyncRule()], ids=["function", "object"])
def test_create_app_refuses_an_async_access_rule(tmp_path: Path, access: Any) -> None:
    """`access=` is asked without awaiting: an async rule's coroutine was taken for True, so
    every caller saw every session, another tenant's included. It is refused when the app is
    made."""
    runtime = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match="access must be a plain function .* an async one"):
        create_app(runtime, auth=TokenAuth(TOKENS), access=access)


@dataclasses.dataclass
class _OwnOnly:
    """A rule object, meant to be made (`_OwnOnly()`) and called."""

    admins: tuple[str, ...] = ()
    tenant: str | None = None

    def __call__(self, caller: so.Principal, initiator: so.Principal | None) -> bool:
        return initiator is not None and caller.principal_id == initiator.principal_id


def test_create_app_refuses_a_class_for_auth_or_access(tmp_path: Path) -> None:
    """Given the class, not an instance: `auth=TokenAuth` made a TokenAuth out of each request
    (every request a 400 'API token #1: 'http' is not a Principal'), `auth=DevAuth` a 500; and
    `access=_OwnOnly` made a rule object of (caller, initiator), whose truth let every caller
    see every session. Each is refused when the app is made."""
    runtime = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    for cls in (TokenAuth, DevAuth):
        with pytest.raises(so.UsageError, match=f"auth is the class {cls.__name__}, .* instance"):
            create_app(runtime, auth=cls)  # type: ignore[arg-type]
    alice_p = so.Principal(authenticator="t", principal_id="alice")
    assert bool(_OwnOnly(alice_p, None))  # type: ignore[arg-type]  # what it was taken for
    assert not _OwnOnly()(alice_p, None)
    with pytest.raises(so.UsageError, match="access is the class _OwnOnly, not a rule"):
        create_app(runtime, auth=TokenAuth(TOKENS), access=_OwnOnly)  # type: ignore[arg-type]
    create_app(runtime, auth=TokenAuth(TOKENS), access=_OwnOnly())  # an instance is a rule


@pytest.mark.parametrize("dev", ["no", "false", 0, 1])
def test_dev_mode_is_turned_on_only_by_true(tmp_path: Path, dev: object) -> None:
    """`dev=os.environ.get("DEV", "false")` was taken for its truth: "false" served every
    local request as the dev admin. Like every switch of signoff, it is True or False."""
    runtime = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match="dev must be True or False"):
        create_app(runtime, dev=dev)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="dev must be True or False"):
        create_app(runtime, auth=TokenAuth(TOKENS), dev=dev)  # type: ignore[arg-type]


def test_only_the_bearer_scheme_carries_an_api_token(base: str) -> None:
    """A token under another scheme (`Basic`, `Token`) or bare is not a bearer token: 401.
    The scheme's name is case-insensitive (RFC 9110)."""
    for header in ("Basic alice-token", "Token alice-token", "alice-token", "Bearer"):
        r = httpx.get(
            f"{base}/v1/requests", headers={"Authorization": header}, timeout=10, verify=PLAIN
        )
        assert r.status_code == 401, header
    r = httpx.get(
        f"{base}/v1/requests", headers={"Authorization": "bearer alice-token"}, verify=PLAIN
    )
    assert r.status_code == 200, r.text


def test_default_access_is_the_initiator_the_same_tenant_or_an_admin() -> None:
    """Two callers without a tenant are not one tenant, and only `admin: true` (the boolean)
    makes an admin: a string such as "false" in a token's attributes must not."""

    def who(pid: str, **attributes: object) -> so.Principal:
        return so.Principal(authenticator="token", principal_id=pid, attributes=attributes)

    carol, dave = who("carol"), who("dave")
    assert default_access(carol, carol)
    assert not default_access(dave, carol)  # neither has a tenant: not the same one
    assert default_access(who("e", tenant="acme"), who("f", tenant="acme"))
    assert not default_access(who("e", tenant="acme"), who("f", tenant="evil"))
    assert not default_access(who("e", tenant="acme"), carol)
    assert default_access(carol, None) and not default_access(who("e", tenant="acme"), None)
    assert default_access(who("root", admin=True), carol)
    for not_admin in ("false", "yes", 1, ["true"]):
        assert not default_access(who("mallory", admin=not_admin), carol), not_admin
        assert not default_access(who("mallory", admin=not_admin, tenant="x"), None), not_admin


def test_a_caller_without_credentials_is_401_whatever_it_sent(base: str, store: str) -> None:
    """Authentication comes first: a caller with no token (or a wrong one) is told so, not
    that its body, query or headers are wrong, which fixing would only lead to a 401."""
    with client(base, "alice-token") as alice:
        sid = start(alice)["session_id"]
    before = _stored(store)
    json_type = {"Content-Type": "application/json"}
    for headers in ({}, auth("wrong")):
        with httpx.Client(base_url=base, headers=headers, timeout=10, verify=PLAIN) as anon:
            for r in (
                anon.post("/v1/sessions", json={"agent": 1}),
                anon.post("/v1/sessions", content=b"{not json", headers=json_type),
                anon.post(
                    "/v1/sessions", content=b'{"agent": "a", "agent": "b"}', headers=json_type
                ),
                anon.post(
                    "/v1/sessions", json={"agent": "support"}, headers={"Idempotency-Key": ""}
                ),
                anon.post(f"/v1/sessions/{sid}/responses", json={}),
                anon.post(f"/v1/sessions/{sid}/cancel", json=[]),
                anon.get("/v1/requests", params={"limit": 0}),
                anon.get(f"/v1/sessions/{sid}/events", params={"after": -1}),
                anon.get(f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": "x"}),
            ):
                assert (
                    error(r, 401, "unauthenticated") and r.headers["www-authenticate"] == "Bearer"
                )
            # What the API does not have is told before who asks, as the docs say: a path
            # (404) or a method (405), which the public OpenAPI document lists anyway.
            error(anon.get("/v1/nothing"), 404, "not_found")
            error(anon.get("/v1/requests/"), 404, "not_found")
            error(anon.delete("/v1/sessions"), 405, "method_not_allowed")
    assert _stored(store) == before


def test_two_authorization_headers_authenticate_no_one(base: str, store: str) -> None:
    """Two `Authorization` headers acted as the first one's principal, where a proxy in front
    (checking, logging or rate-limiting callers) may read the last, or join them: Mallory's
    token first and an admin's second read the queue as Mallory. Two credentials are no
    credential (401 `unauthenticated`, saying why), on the API and the dashboard, and nothing is
    stored; a sign-in cookie beside them does not stand in for them either."""
    with client(base, "alice-token") as alice:
        sid = start(alice)["session_id"]
    before = _stored(store)
    for tokens in (("alice-token", "alice-token"), ("mallory-token", "admin-token")):
        two = [("Authorization", f"Bearer {t}") for t in tokens]
        with httpx.Client(base_url=base, timeout=10, verify=PLAIN) as c:
            r = c.get("/v1/requests", headers=two)
            assert "one Authorization header" in error(r, 401, "unauthenticated")["message"]
            r = c.post("/v1/sessions", json={"agent": "support", "message": "hi"}, headers=two)
            error(r, 401, "unauthenticated")
            r = c.post(f"/v1/sessions/{sid}/cancel", headers=two)
            error(r, 401, "unauthenticated")
            page = c.get("/_signoff/", headers=two)
            assert page.status_code == 303 and page.headers["location"].startswith(
                "/_signoff/login"
            )
    with client(base, "alice-token") as alice:
        signed = alice.get("/_signoff/login")
        token = re.search(r'name="csrf" value="([^"]+)"', signed.text)
        assert token is not None
        r = alice.post("/_signoff/login", data={"token": "alice-token", "csrf": token[1]})
        assert r.status_code == 303
        two = [("Authorization", "Bearer alice-token"), ("Authorization", "Bearer x")]
        r = alice.get("/v1/requests", headers=two)
        error(r, 401, "unauthenticated")
        alice.headers.pop("Authorization")
        assert alice.get("/v1/requests").status_code == 200  # the cookie alone reads
    assert _stored(store) == before


async def test_an_authenticator_answering_no_principal_serves_no_one(tmp_path: Path) -> None:
    """An authenticator of the application's own that answers a look-alike of a `Principal` (a
    plain object with `admin: true` in its attributes) is a bug of that authenticator: every
    call fails with a 500 naming the `TypeError`, rather than reading the queue as that object
    would be allowed to."""
    from types import SimpleNamespace

    from .test_server_common import make_runtime

    runtime = make_runtime(f"sqlite:///{tmp_path}/s.db")
    await runtime.generate("support", prompt="Refund order 1042")
    look_alike = SimpleNamespace(
        authenticator="custom", principal_id="x", attributes={"admin": True}, same_as=lambda o: True
    )
    app = create_app(runtime, auth=lambda request: look_alike, sweep_every=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://t"
        ) as c,
    ):
        for path in ("/v1/requests", "/v1/sessions"):
            detail = error(await c.get(path), 500, "internal_error")
            assert "TypeError" in detail["message"], detail
    await runtime.close()


class _Blocking:
    """A directory lookup that blocks its thread: `entered` is set once it is asked for the slow
    caller (token `slow` for the authenticator, principal `bob` for the rule), which then waits
    up to 3 s for `release`; `held` records whether it came before the time ran out."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.held: list[bool] = []

    def block(self) -> None:
        self.entered.set()
        self.held.append(self.release.wait(3))


async def _served_while_blocked(app: Any, slow: str, blocking: _Blocking) -> None:
    """Alice's call is answered while the slow caller's is blocked in the app's callable, which
    ran in a thread: on the event loop it held up every other request until its wait ran out."""
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        stalled = asyncio.create_task(c.get("/v1/sessions", headers=auth(slow)))
        while not blocking.entered.is_set():
            await asyncio.sleep(0.01)
        fast = await asyncio.wait_for(c.get("/v1/sessions", headers=auth("alice-token")), 10)
        assert fast.status_code == 200, fast.text
        blocking.release.set()
        assert (await stalled).status_code == 200
    assert blocking.held and all(blocking.held)  # the first came before its time ran out


async def test_a_plain_authenticator_runs_off_the_event_loop(tmp_path: Path) -> None:
    """A plain authenticator may block (a directory asked): it runs in a thread, so the other
    requests and streams of the server go on meanwhile; an async one is awaited on the loop."""
    from .test_server_common import make_runtime

    blocking = _Blocking()
    tokens = TokenAuth(TOKENS)

    def directory(request: Any) -> so.Principal | None:
        if request.headers.get("authorization") == "Bearer slow":
            blocking.block()
            return TOKENS["bob-token"]
        return tokens(request)

    runtime = make_runtime(f"sqlite:///{tmp_path}/s.db")
    await _served_while_blocked(
        create_app(runtime, auth=directory, sweep_every=None), "slow", blocking
    )

    loops: list[bool] = []

    async def on_the_loop(request: Any) -> so.Principal | None:
        loops.append(threading.current_thread() is threading.main_thread())
        return tokens(request)

    app = create_app(runtime, auth=on_the_loop, sweep_every=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        assert (await c.get("/v1/sessions", headers=auth("alice-token"))).status_code == 200
    assert loops == [True]
    await runtime.close()


async def test_a_plain_access_rule_runs_off_the_event_loop(tmp_path: Path) -> None:
    """An access rule of the application's may block too: it is asked in a thread, once for all
    the sessions of a listing's chunk, so the server's other requests go on meanwhile."""
    from .test_server_common import make_runtime

    blocking = _Blocking()
    threads: set[int] = set()

    def rule(caller: so.Principal, initiator: so.Principal | None) -> bool:
        threads.add(threading.get_ident())
        if caller.principal_id == "bob":
            blocking.block()
        return default_access(caller, initiator)

    runtime = make_runtime(f"sqlite:///{tmp_path}/s.db")
    for _ in range(3):
        await runtime.generate("support", prompt="Refund order 1042", auth=TOKENS["alice-token"])
    app = create_app(runtime, auth=TokenAuth(TOKENS), access=rule, sweep_every=None)
    await _served_while_blocked(app, "bob-token", blocking)
    assert threading.get_ident() not in threads
    await runtime.close()


async def test_a_keyed_post_is_replayed_to_its_creator_whatever_the_access_rule_shows(
    tmp_path: Path,
) -> None:
    """A submit-only client (the app's rule shows it no session) retrying its keyed POST got
    404 for the session its first attempt made (and may then send it again without the key):
    the creator is told of it; another caller only if the rule shows it to them."""
    submitter = so.Principal(
        authenticator="tok", principal_id="intake", attributes={"role": "submit"}
    )

    def reviewers_only(caller: so.Principal, initiator: so.Principal | None) -> bool:
        return caller.attributes.get("role") == "review"

    agent = so.Agent(name="a", model=so.models.Scripted([so.ModelResponse(text="hi")] * 3))
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db")
    app = create_app(
        runtime,
        auth=TokenAuth({"t1": submitter}),
        access=reviewers_only,
        close_runtime=True,
        sweep_every=None,
    )
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        sent = {"authorization": "Bearer t1", "idempotency-key": "intake-42"}
        first = await c.post("/v1/sessions", json={"agent": "a", "message": "hi"}, headers=sent)
        again = await c.post("/v1/sessions", json={"agent": "a", "message": "hi"}, headers=sent)
        assert (first.status_code, again.status_code) == (201, 201)
        assert again.json()["session_id"] == first.json()["session_id"]
        assert again.json()["replayed"] is True
        # It is told the call happened, not what the turn said since: the rule hides that.
        assert first.json()["text"] == "hi" and again.json()["text"] == ""
