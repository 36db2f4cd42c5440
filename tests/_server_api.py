"""Helpers of the HTTP API tests: a server on a loopback port per test (the `store`, `base` and
`alice` fixtures; a file that uses one imports all three, as its `store` stands in for the
conftest's), clients as a given token, and checks of a started session and of an error body.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app

from .test_server_common import (
    PLAIN,
    TOKENS,
    auth,
    make_runtime,
    served,
)

__all__ = ["_stored", "alice", "base", "client", "error", "in_process", "start", "store"]


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


@pytest.fixture
def base(store: str) -> Iterator[str]:
    with served(store) as url:
        yield url


@pytest.fixture
def alice(base: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, headers=auth("alice-token"), timeout=10, verify=PLAIN) as c:
        yield c


def client(base: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers=auth(token), timeout=10, verify=PLAIN)


@asynccontextmanager
async def in_process(runtime: so.Runtime) -> AsyncIterator[httpx.AsyncClient]:
    """An app serving `runtime`, running, and a client calling it in this process as alice."""
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://t",
            headers=auth("alice-token"),
        ) as c,
    ):
        yield c


def start(c: httpx.Client, agent: str = "support") -> dict[str, Any]:
    r = c.post("/v1/sessions", json={"agent": agent, "message": "Refund order 1042, it broke"})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    assert body["status"] == "waiting"
    return body


def error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    detail: dict[str, Any] = r.json()["error"]
    assert detail["code"] == code, detail
    assert detail["message"]
    return detail


def _stored(store: str) -> list[tuple[str, int]]:
    """Each session in the store with the number of its events."""
    rt = make_runtime(store)
    try:
        sessions = rt.sessions_sync()
        return sorted((s.id, len(rt.events_sync(s.id))) for s in sessions)
    finally:
        rt.close_sync()
