"""Dev mode (`DevAuth`): the server acts as the dev admin only for requests from this machine,
addressed to its own name and not sent by another site's page, and its 401 says so.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff.server import DevAuth, TokenAuth, create_app

from .test_server_common import (
    TOKENS,
    make_runtime,
)


async def test_dev_mode_accepts_localhost_only(tmp_path: Path) -> None:
    runtime = make_runtime(f"sqlite:///{tmp_path}/dev.db")
    app = create_app(runtime, dev=True)
    for host, status in (("127.0.0.1", 200), ("::1", 200), ("10.1.2.3", 401)):
        transport = httpx.ASGITransport(app=app, client=(host, 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            r = await c.get("/v1/requests")
            assert r.status_code == status, (host, r.text)
            page = await c.get("/_signoff/")
            assert page.status_code == status
            assert ("Approval queue" in page.text) == (status == 200)
    await runtime.close()
    # A misconfigured app is a UsageError, like every error signoff raises (README)
    with pytest.raises(so.UsageError, match="auth"):
        create_app(runtime)
    with pytest.raises(so.UsageError, match="not both"):
        create_app(runtime, auth=TokenAuth(TOKENS), dev=True)
    with pytest.raises(so.UsageError, match="Runtime"):
        create_app(object(), dev=True)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="positive"):
        create_app(runtime, dev=True, poll_interval=0)
    with pytest.raises(so.UsageError, match="non-empty"):
        TokenAuth({"": so.Principal(authenticator="token", principal_id="a")})
    with pytest.raises(so.UsageError, match="not a Principal"):
        TokenAuth({"t0k3n": "alice"})  # type: ignore[dict-item]
    assert DevAuth().principal.principal_id == "dev"


async def test_dev_mode_refuses_requests_addressed_to_another_name(tmp_path: Path) -> None:
    """DNS rebinding: a page of another site, resolved to 127.0.0.1, reaches the dev server from
    a browser on this machine with its own name in `Host`; it must not act as the dev admin."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/dev.db")
    app = create_app(runtime, dev=True, sweep_every=None)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with app.router.lifespan_context(app):
        for base, status in (
            ("http://attacker.example:8000", 401),
            ("http://127.0.0.1.attacker.example", 401),
            ("http://localhost.attacker.example:8000", 401),
            ("http://evillocalhost:8000", 401),  # a name ending in "localhost", not ".localhost"
            ("http://10.0.0.5:8000", 401),
            ("http://localhost:8000", 200),
            ("http://LOCALHOST", 200),
            ("http://app.localhost:8000", 200),
            ("http://127.0.0.1:8000", 200),
            ("http://127.1.2.3", 200),
            ("http://[::1]:8000", 200),
        ):
            async with httpx.AsyncClient(transport=transport, base_url=base) as c:
                r = await c.get("/v1/requests")
                assert r.status_code == status, (base, r.text)
                created = await c.post("/v1/sessions", json={"agent": "support"})
                assert created.status_code == (201 if status == 200 else 401), base
                page = await c.get("/_signoff/")
                assert ("Approval queue" in page.text) == (status == 200), base
    await runtime.close()


async def test_dev_mode_says_what_it_serves_when_it_refuses(tmp_path: Path) -> None:
    """A dev server reached by another name, or from another machine, has no tokens to ask for:
    its 401 says which requests dev mode serves and how to serve others, not "authenticate with
    a bearer token"; a token server's 401 asks for the token."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/dev.db")
    for app, client, base in (
        (create_app(runtime, dev=True, sweep_every=None), "127.0.0.1", "http://10.0.0.5:8000"),
        (create_app(runtime, dev=True, sweep_every=None), "10.0.0.9", "http://localhost:8000"),
        (create_app(runtime, auth=TokenAuth({}), sweep_every=None), "127.0.0.1", "http://x"),
    ):
        transport = httpx.ASGITransport(app=app, client=(client, 5000))
        async with httpx.AsyncClient(transport=transport, base_url=base) as c:
            r = await c.get("/v1/requests")
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
        message = r.json()["error"]["message"]
        if isinstance(app.state.signoff.auth, DevAuth):
            assert "bearer" not in message and "localhost" in message, message
            assert "--token" in message, message
        else:
            assert "bearer token" in message, message
    await runtime.close()


async def test_dev_mode_refuses_requests_from_another_site(tmp_path: Path) -> None:
    """A page of another site, open in a browser on this machine, can POST to the dev server
    without a preflight (e.g. a bodiless cancel); its `Origin` names that site: not the dev
    admin. Same-origin requests (the dashboard's scripts) and clients sending no `Origin` are."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/dev.db")
    app = create_app(runtime, dev=True, sweep_every=None)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost:8000") as c:
            created = await c.post("/v1/sessions", json={"agent": "support", "message": "x"})
            sid = created.json()["session_id"]
            for origin in (
                "http://evil.example",
                "null",
                "http://localhost:3000",
                "http://localhost:8000.evil.example",
                "http://[::1",  # not even a URL
            ):
                r = await c.post(f"/v1/sessions/{sid}/cancel", headers={"Origin": origin})
                assert r.status_code == 401, (origin, r.text)
                assert (await c.get(f"/v1/sessions/{sid}")).json()["status"] == "waiting"
            r = await c.get("/v1/requests", headers={"Origin": "http://LOCALHOST:8000"})
            assert r.status_code == 200
            r = await c.post(
                f"/v1/sessions/{sid}/cancel", headers={"Origin": "http://localhost:8000"}
            )
            assert r.status_code == 200 and r.json()["status"] == "cancelled"
    await runtime.close()
