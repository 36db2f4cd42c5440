"""What every route asks of the server's context: who may see a session is decided before its
state is loaded, so a foreign session's 404 costs what a missing one's does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app

from .test_server_common import TOKENS, auth, make_agents


@asynccontextmanager
async def _served(store_url: str) -> AsyncIterator[tuple[so.Runtime, httpx.AsyncClient]]:
    runtime = so.Runtime(make_agents(), store=store_url)
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        yield runtime, c


class _Spy:
    """Records the state loads and store reads made while `on`."""

    def __init__(self, runtime: so.Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        self.on = False
        for name in ("_state", "state"):
            self._wrap(monkeypatch, runtime, name, f"runtime.{name}")
        store = runtime.store
        for name in ("read_events", "head", "get_request", "load_session", "audit_heads"):
            if hasattr(store, name):
                self._wrap(monkeypatch, store, name, f"store.{name}")

    def _wrap(self, mp: pytest.MonkeyPatch, obj: Any, name: str, label: str) -> None:
        real = getattr(obj, name)

        async def spied(*args: Any, **kwargs: Any) -> Any:
            if self.on:
                self.calls.append(label)
            return await real(*args, **kwargs)

        mp.setattr(obj, name, spied)

    async def during(self, call: Any) -> tuple[httpx.Response, list[str]]:
        self.calls.clear()
        self.on = True
        try:
            response = await call
        finally:
            self.on = False
        return response, list(self.calls)


async def test_a_foreign_session_is_refused_before_its_state_is_loaded(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mallory (another tenant) asking for Alice's session got a 404 only after its whole state
    was loaded, which a missing id skips: the time a 404 took told which ids exist. Now both
    make the same reads, and a foreign session's state is never loaded, for reads and writes."""
    async with _served(store_url) as (runtime, c):
        r = await c.post(
            "/v1/sessions",
            json={"agent": "support", "message": "Refund order 1042"},
            headers=auth("alice-token"),
        )
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        spy = _Spy(runtime, monkeypatch)
        mallory = auth("mallory-token")
        # Alice's own reads keep working, and remember who started the session.
        assert (await c.get(f"/v1/sessions/{sid}", headers=auth("alice-token"))).status_code == 200
        for attempt in range(2):  # the second time, the initiator is remembered
            calls = {}
            for name, target in (("foreign", sid), ("missing", "ses_" + "x" * 22)):
                for method, path, body in (
                    ("GET", f"/v1/sessions/{target}", None),
                    ("POST", f"/v1/sessions/{target}/cancel", None),
                    ("POST", f"/v1/sessions/{target}/messages", {"text": "hi"}),
                ):
                    call = c.request(method, path, json=body, headers=mallory)
                    response, made = await spy.during(call)
                    assert response.status_code == 404, (attempt, name, path, response.text)
                    assert response.json()["error"]["code"] == "unknown_session"
                    assert not any(m.startswith("runtime.") for m in made), (name, path, made)
                    calls[name, method, path.rsplit("/", 1)[-1] if method == "POST" else "get"] = (
                        made
                    )
            for (name, method, what), made in calls.items():
                if name == "foreign":
                    assert made == calls["missing", method, what] == ["store.read_events"], (
                        attempt,
                        what,
                        made,
                    )
        # Nothing Mallory did changed the session.
        r = await c.get(f"/v1/sessions/{sid}", headers=auth("alice-token"))
        assert r.json()["status"] == "waiting"


async def test_a_request_is_shown_without_loading_its_sessions_state(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Who may see a request is decided from its session's first event: its whole state was
    loaded only to be dropped, for its reviewer too. A foreign request and a missing one are the
    same 404, and neither loads a state."""
    async with _served(store_url) as (runtime, c):
        r = await c.post(
            "/v1/sessions",
            json={"agent": "support", "message": "Refund order 1042"},
            headers=auth("alice-token"),
        )
        assert r.status_code == 201, r.text
        request_id = r.json()["pending"][0]["id"]
        spy = _Spy(runtime, monkeypatch)
        own = c.get(f"/v1/requests/{request_id}", headers=auth("alice-token"))
        response, made = await spy.during(own)
        assert response.status_code == 200 and response.json()["request"]["id"] == request_id
        assert not any(m.startswith("runtime.") for m in made), made
        assert "store.load_session" not in made, made
        answers = {}
        for name, target in (("foreign", request_id), ("missing", "req_" + "x" * 20)):
            foreign = c.get(f"/v1/requests/{target}", headers=auth("mallory-token"))
            response, made = await spy.during(foreign)
            assert response.status_code == 404, (name, response.text)
            assert not any(m.startswith("runtime.") for m in made), (name, made)
            answers[name] = response.json()["error"]["code"]
        assert answers == {"foreign": "unknown_request", "missing": "unknown_request"}
