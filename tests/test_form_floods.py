"""A urlencoded body of megabytes of `&` separators (or of tiny fields) is refused before it is
parsed, on every route that reads a form: the dashboard's forms, signing in and out, and Slack's
interactivity endpoint. Parsed, 4 MB of it cost a second of CPU for anyone who can post."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from signoff.channels import ChannelHub
from signoff.server import create_app

from ._slack import PATH, FakeSlack, channel, click, refund_requested, sign, slack_api
from .test_sign_ins import HTTP, JSON, dashboard, sign_in

__all__ = ["slack_api"]  # the fixture, used by name

URLENCODED = {"Content-Type": "application/x-www-form-urlencoded"}
# Just under the server's 4 MiB bound on a body: each a second or more of CPU, parsed.
FLOODS = {
    "separators": b"&" * 4_000_000,
    "empty fields": b"a=1" + b"&" * 4_000_000,
    "tiny fields": b"a&" * 2_000_000,
    "fields": b"a=1&" * 1_000_000,
}
WARM_UP = b"a=%ff"  # not UTF-8: malformed
FAST = 0.3  # seconds of CPU a refusal may take, at most (a parse took 1.09 s and more)

# The dashboard's routes that read a form, by path pattern: each is tested below, and a route
# added that is not is named by the last test.
FORM_ROUTES = [
    "/_signoff/login",
    "/_signoff/logout",
    "/_signoff/sessions",
    "/_signoff/sessions/{session_id}/messages",
    "/_signoff/sessions/{session_id}/cancel",
    "/_signoff/sessions/{session_id}/delete",
    "/_signoff/requests/{request_id}/respond",
]


def _state(app: Any) -> tuple[Any, ...]:
    """What a post could have changed: sessions, their events, the requests open, the audit
    trail."""
    runtime = app.state.signoff.runtime
    sessions = runtime.sessions_sync(limit=1000)
    events = [len(runtime.events_sync(s.id)) for s in sessions]
    pending = [r.id for r in runtime.pending_sync()]
    return len(sessions), events, pending, len(runtime.audit_sync(limit=10_000))


@pytest.mark.parametrize("flood", list(FLOODS))
@pytest.mark.parametrize("signed", [False, True], ids=["anonymous", "signed in"])
def test_a_flood_on_a_dashboard_form_is_refused_before_it_is_parsed(
    tmp_path: Path, flood: str, signed: bool
) -> None:
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app, TestClient(app, base_url=HTTP) as c:
        r = c.post(
            "/v1/sessions",
            json={"agent": "support", "message": "Refund 1042"},
            headers={"Authorization": "Bearer alice-token"},
        )
        assert r.status_code == 201, r.text
        sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
        if signed:
            sign_in(c)
        cookies = dict(c.cookies.items())
        before = _state(app)
        for pattern in FORM_ROUTES:
            path = pattern.format(session_id=sid, request_id=rid)
            # Not signed in, a page that needs a sign-in does not read the body at all.
            anonymous = not signed and pattern not in ("/_signoff/login", "/_signoff/logout")
            status, code = (401, "unauthenticated") if anonymous else (400, "malformed_form")
            # A small malformed form first, so the flood's CPU holds none of a first request's
            # one-off costs (modules imported lazily, compiled from source under CI).
            for body in (WARM_UP, FLOODS[flood]):
                # The process's CPU is measured: a collection of the garbage earlier tests in
                # this worker left (a large heap's can take a few hundred ms) is not the
                # refusal's, so none runs in the window.
                gc.disable()
                try:
                    began = time.process_time()
                    r = c.post(path, content=body, headers={**URLENCODED, **JSON})
                    cpu = time.process_time() - began
                finally:
                    gc.enable()
                assert r.status_code == status, (path, r.text)
                assert r.json()["error"]["code"] == code, (path, r.text)
                assert "signoff_token" not in r.headers.get("set-cookie", "")
            assert cpu < FAST, (path, cpu)
        assert _state(app) == before
        assert dict(c.cookies.items()) == cookies


def test_every_dashboard_form_route_is_covered(tmp_path: Path) -> None:
    """Read from the app (and the routers it includes), whichever module a route is in."""
    with dashboard(f"sqlite:///{tmp_path}/s.db") as app:
        routes = [
            route
            for entry in app.routes
            for route in getattr(getattr(entry, "original_router", None), "routes", [entry])
        ]
    posted = {
        r.path
        for r in routes
        if isinstance(r, Route) and r.path.startswith("/_signoff/") and "POST" in (r.methods or ())
    }
    assert posted == set(FORM_ROUTES)


@pytest.mark.parametrize("flood", list(FLOODS))
async def test_a_flood_on_slacks_interactivity_endpoint_is_refused_before_it_is_parsed(
    tmp_path: Path, slack_api: FakeSlack, flood: str
) -> None:
    """Signed or not: Slack's signature is checked first (an HMAC over the body, quick), and a
    signed flood, which only the signing secret's holder can send, is refused unparsed too."""
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack])
        app = create_app(rt, dev=True, channels=hub)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                audit = len(await rt.store.audit(limit=10_000))
                approve = click(
                    {
                        "action_id": "signoff.approve",
                        "block_id": f"signoff:{req.id}",
                        "value": req.id,
                        "type": "button",
                    }
                )
                # A first request's one-off costs (modules imported lazily, compiled from
                # source under CI) are not the flood's: a small bad request of each kind first.
                warm = b"payload=%7B"
                for headers, status in ((URLENCODED, 401), (sign(warm, int(time.time())), 400)):
                    r = await http.post(PATH, content=warm, headers=headers)
                    assert r.status_code == status, r.text
                body = approve + b"&" + FLOODS[flood]
                for headers, status, code in (
                    (URLENCODED, 401, "invalid_signature"),
                    (sign(body, int(time.time())), 400, "invalid_payload"),
                ):
                    began = time.process_time()
                    r = await http.post(PATH, content=body, headers=headers)
                    cpu = time.process_time() - began
                    assert r.status_code == status, r.text
                    assert r.json()["error"]["code"] == code, r.text
                    assert cpu < FAST, (status, cpu)
                await slack.idle()
                assert len(await rt.store.audit(limit=10_000)) == audit
        assert log == []
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
