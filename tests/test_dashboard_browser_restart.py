"""A live page whose server stops and comes back: it says it is reconnecting while the stream
is down, and is live again, without a reload, once the server is back."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from playwright.sync_api import Browser, expect

from signoff.server import TokenAuth, create_app

from ._dashboard_browser import browser, csp_violations, start
from .test_server_common import PLAIN, TOKENS, auth, free_port, make_runtime

__all__ = ["browser"]  # the fixture, used by name


@contextmanager
def serving(app: Any, port: int) -> Iterator[str]:
    """Serve `app` on `port` in a thread until the block ends (its streams cut then)."""
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="critical", timeout_graceful_shutdown=1
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started, f"could not serve on port {port}"
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.mark.parametrize("where", ["queue", "session"])
def test_a_server_restart_says_reconnecting_and_the_page_is_live_again(
    browser: Browser, tmp_path: Path, where: str
) -> None:
    """The server stopping cut the page's stream, which the browser reopens by itself: the
    page only dimmed its live dot, and said "Reconnecting…" only once the browser gave up (a
    proxy's 502), so a page left on a stopped server looked live and current. It says so while
    the browser retries, and once the server is back the page follows it again."""
    app = create_app(
        make_runtime(f"sqlite:///{tmp_path}/state.db"), auth=TokenAuth(TOKENS), poll_interval=0.05
    )
    port = free_port()
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(10_000)
    refused = csp_violations(page)
    status = page.locator("#live-status")
    with serving(app, port) as base:
        page.goto(f"{base}/_signoff/login")
        page.fill("input[name=token]", "alice-token")
        page.click("button[type=submit]")
        expect(page.locator("h1")).to_have_text("Approval queue")
        body = start(base)
        page.goto(
            f"{base}/_signoff/"
            if where == "queue"
            else f"{base}/_signoff/sessions/{body['session_id']}"
        )
        expect(page.locator("#live-dot.on")).to_be_attached()
        expect(status).to_have_text("")
    expect(status).to_have_text("Reconnecting…")
    expect(page.locator("#live-dot.on")).to_have_count(0)
    expect(page.locator("#live-dot.retrying")).to_have_count(1)
    with serving(app, port) as base:
        expect(page.locator("#live-dot.on")).to_be_attached(timeout=20_000)
        expect(status).to_have_text("")
        if where == "queue":
            later = start(base)  # live again: a new request shows without a reload
            card = page.locator(f"[data-request-id='{later['pending'][0]['id']}']")
            expect(card).to_have_count(1)
        else:
            rid = body["pending"][0]["id"]
            r = httpx.post(
                f"{base}/v1/sessions/{body['session_id']}/responses",
                json={"inputResponses": [{"requestId": rid, "optionId": "cancel"}]},
                headers=auth("alice-token"),
                timeout=10,
                verify=PLAIN,
            )
            assert r.status_code == 200, r.text
            expect(page.locator("[data-session-status]")).not_to_have_text("waiting")
    context.close()
    assert refused == []
