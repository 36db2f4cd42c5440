"""A principal the authenticator answers that names no one (a blank `authenticator` or
`principal_id`, as one reading a missing header as "" answers) or is too large to record
authenticates no one (`_auth.Naming`): 401 `unauthenticated` on every route, reads and streams
included, the dashboard's sign-in page in place of its pages, no sign-in cookie made from it,
`/metrics` still open to its own token; the authenticator's mistake is logged once a problem.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app

from .test_server_common import TOKENS, auth, make_runtime

ALICE = so.Principal(authenticator="hdr", principal_id="alice")
LARGE = {"groups": ["g" * 100] * 200}  # over 16 KiB as JSON


def _no_one(request: Any) -> so.Principal:
    """The README's mistake: a missing header read as ""."""
    return so.Principal(authenticator="hdr", principal_id=request.headers.get("x-user", ""))


NO_ONE: dict[str, tuple[Callable[[Any], so.Principal], str]] = {
    "missing header": (_no_one, "names no one: its principal_id is blank"),
    "invisible id": (
        lambda r: so.Principal(authenticator="hdr", principal_id="\u200b"),
        "its principal_id is blank",
    ),
    "blank authenticator": (
        lambda r: so.Principal(authenticator=" ", principal_id="alice"),
        "its authenticator is blank",
    ),
    "too large": (
        lambda r: so.Principal(authenticator="hdr", principal_id="alice", attributes=LARGE),
        "bytes as JSON, over the limit",
    ),
}


def _refused(r: httpx.Response) -> None:
    assert r.status_code == 401, (r.request.method, r.request.url.path, r.status_code, r.text)
    assert r.json()["error"]["code"] == "unauthenticated", r.text


@pytest.mark.parametrize("case", list(NO_ONE))
async def test_a_principal_naming_no_one_is_served_nothing(
    tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller sending no credentials to an authenticator that reads a missing header as ""
    was served every session started from Python (reads, full tool inputs, event streams) as
    one person, and refused writes as their 400 `usage_error`; every route is now a 401."""
    answer, logged = NO_ONE[case]

    def hdr_auth(request: Any) -> so.Principal:
        return ALICE if request.headers.get("x-user") == "alice" else answer(request)

    runtime = make_runtime(f"sqlite:///{tmp_path}/s.db")
    started = await runtime.generate("support", prompt="Refund order 1042")
    sid, rid = started.session_id, started.pending[0].id
    app = create_app(
        runtime,
        auth=hdr_auth,
        sweep_every=None,
        heartbeat=0.1,
        metrics=True,
        metrics_token="scrape-s3cret",
    )
    reply = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
    transport = httpx.ASGITransport(app=app)
    with caplog.at_level(logging.ERROR, logger="signoff.server"):
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=transport, base_url="http://t") as c,
        ):
            before = await runtime.store.head(sid)
            for path in (
                "/v1/sessions",
                "/v1/requests",
                f"/v1/sessions/{sid}",
                f"/v1/requests/{rid}",
                f"/v1/sessions/{sid}/events?follow=false",
                f"/v1/sessions/{sid}/events",  # a stream: it never ended when served
            ):
                _refused(await asyncio.wait_for(c.get(path), 10))
            for method, path, body in (
                ("POST", "/v1/sessions", {"agent": "support", "message": "hi"}),
                ("POST", f"/v1/sessions/{sid}/responses", reply),
                ("POST", f"/v1/sessions/{sid}/messages", {"message": "hi"}),
                ("POST", f"/v1/sessions/{sid}/cancel", {"reason": "by no one"}),
                ("DELETE", f"/v1/sessions/{sid}", {}),
            ):
                _refused(await c.request(method, path, json=body))
            page = await c.get("/_signoff")
            assert page.status_code == 401 and "Not signed in" in page.text
            assert "Refund" not in page.text
            for path in ("/_signoff/fragments/queue", "/_signoff/stream"):
                r = await asyncio.wait_for(c.get(path), 10)
                assert r.status_code == 401, (path, r.text)
            scraped = await c.get("/metrics", headers=auth("scrape-s3cret"))
            assert scraped.status_code == 200, scraped.text
            assert await runtime.store.head(sid) == before
            # The authenticator still serves who it names.
            seen = await c.get("/v1/requests", headers={"x-user": "alice"})
            assert seen.status_code == 200 and seen.json()["total"] == 1, seen.text
    await runtime.close()
    told = [r.getMessage() for r in caplog.records if "authenticator hdr_auth" in r.getMessage()]
    assert len(told) == 1, told  # once, not once a request
    assert logged in told[0] and "unauthenticated (401)" in told[0], told


def _csrf(html: str) -> str:
    match = re.search(r'name="csrf-token" content="([^"]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


async def test_a_token_whose_principal_names_no_one_gets_no_sign_in(tmp_path: Path) -> None:
    """A `TokenAuth` whose tokens are changed in place after it checked them (a reloaded
    directory) may map one to a blank principal: its bearer token, its sign-in form and a
    sign-in cookie made before all authenticate no one; no cookie is made from it."""
    tokens = TokenAuth(TOKENS)
    runtime = make_runtime(f"sqlite:///{tmp_path}/s.db")
    app = create_app(runtime, auth=tokens, sweep_every=None, close_runtime=True)
    blank = so.Principal(authenticator="token", principal_id="")
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        tokens.tokens["nobody-token"] = blank
        _refused(await c.get("/v1/sessions", headers=auth("nobody-token")))
        form = {"token": "nobody-token", "csrf": _csrf((await c.get("/_signoff/login")).text)}
        r = await c.post("/_signoff/login", data=form)
        assert r.status_code == 401 and "not recognised" in r.text
        assert "signoff_token" not in r.cookies and "signoff_token" not in c.cookies
        # A sign-in made while the token named alice reads no one once it names no one.
        form = {"token": "alice-token", "csrf": _csrf((await c.get("/_signoff/login")).text)}
        assert (await c.post("/_signoff/login", data=form)).status_code == 303
        assert (await c.get("/v1/requests")).status_code == 200
        tokens.tokens["alice-token"] = blank
        _refused(await c.get("/v1/requests"))
        page = await c.get("/_signoff")
        assert page.status_code == 303 and page.headers["location"].startswith("/_signoff/login")
