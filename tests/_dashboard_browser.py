"""The browser tests' Chromium, driven by Playwright for Python, and their fixtures: a served
dashboard, a page signed in as alice that fails on any content security policy report, and
helpers that start and read sessions over the API, and a dashboard whose sessions expire by a
clock the test moves (`expiring`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, Playwright, expect, sync_playwright

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import ManualClock

from ._ttl import ttl_agent
from .test_server_common import PLAIN, TOKENS, auth, running, served

__all__ = [
    "base",
    "browser",
    "close_browser",
    "csp_violations",
    "clocked",
    "expiring",
    "page",
    "session",
    "settled",
    "start",
]


# An assertion waits as long as an action may: Playwright's own 5 s was too short for an
# approval's round trip (a resumed turn) on a loaded two-CPU machine.
expect.set_options(timeout=10_000)

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


_running: list[tuple[Playwright, Browser]] = []


@pytest.fixture
def browser() -> Browser:
    """One Chromium for the browser tests of every file, started by the first of them and closed
    by `close_browser` (tests/conftest.py) once the next test needs none: a live Playwright marks
    the thread's event loop as running, which no asyncio test after it could then use."""
    if not _running:
        assert Path(CHROMIUM).exists(), (
            "Chromium is missing: run ./scripts/setup (apt-get chromium)"
        )
        pw = sync_playwright().start()
        try:
            b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        except BaseException:
            pw.stop()
            raise
        _running.append((pw, b))
    return _running[0][1]


def close_browser() -> None:
    """Close the shared Chromium and its Playwright, if they run."""
    while _running:
        pw, b = _running.pop()
        try:
            b.close()
        finally:
            pw.stop()


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


@pytest.fixture
def page(browser: Browser, base: str) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=base)
    p = context.new_page()
    refused = csp_violations(p)
    # Sign in as alice through the login form (CSRF-protected). 30 s, no claim about speed: a
    # fresh server's first requests took over 10 s on a loaded CI machine (as in
    # tests/_dashboard.signed_in).
    p.set_default_timeout(30_000)
    p.goto("/_signoff/")
    expect(p).to_have_url(f"{base}/_signoff/login", timeout=30_000)
    p.fill("input[name=token]", "alice-token")
    p.click("button[type=submit]")
    expect(p.locator("h1")).to_have_text("Approval queue", timeout=30_000)
    p.set_default_timeout(10_000)  # the tests' own steps
    yield p
    context.close()
    assert refused == [], "the dashboard's content security policy blocks its own page"


def csp_violations(p: Page) -> list[str]:
    """The console's reports of what the content security policy refused on this page."""
    refused: list[str] = []
    p.on(
        "console",
        lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None,
    )
    return refused


def start(base: str, agent: str = "support") -> dict[str, Any]:
    r = httpx.post(
        f"{base}/v1/sessions",
        json={"agent": agent, "message": "Refund order 1042, it arrived broken"},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def answer(base: str, sid: str, rid: str, option: str = "approve") -> None:
    """Answer a request over the API as alice: answered elsewhere than the page."""
    r = httpx.post(
        f"{base}/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": option}]},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 200, r.text


def session(base: str, sid: str) -> dict[str, Any]:
    r = httpx.get(
        f"{base}/v1/sessions/{sid}", headers=auth("alice-token"), timeout=10, verify=PLAIN
    )
    body: dict[str, Any] = r.json()
    return body


def settled(p: Page, rid: str) -> None:
    """Wait until no button of the request's card moved on screen less than 0.8 s ago: a click
    on one that a live change (a card leaving, the page's scroll pulled back) just moved is
    refused (aim.js)."""
    p.wait_for_function(
        """(rid) => [...document.querySelectorAll(`[data-request-id="${rid}"] button`)]
          .every((b) => !(performance.now() - Number(b.dataset.movedAt) < 800))""",
        arg=rid,
    )


@contextmanager
def expiring(browser: Browser, tmp_path: Path) -> Iterator[tuple[Page, ManualClock, str]]:
    """A page signed in to a dashboard whose agent `desk` parks sessions that expire 60 s after
    their last event, by a clock the test moves; no sweep, so only reads record an expiry."""
    with clocked(browser, ttl_agent(), tmp_path / "ttl.db", sweep_every=None) as served:
        yield served


@contextmanager
def clocked(
    browser: Browser, agent: so.Agent, path: Path, *, sweep_every: float | None
) -> Iterator[tuple[Page, ManualClock, str]]:
    """A page signed in as alice to a dashboard of `agent` (its store at `path`) on a clock the
    test moves, the server sweeping every `sweep_every` seconds (None: never); the clock, and
    the server's url."""
    clock = ManualClock()
    runtime = so.Runtime([agent], store=f"sqlite:///{path}", clock=clock, poll_interval=0.05)
    with running(create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=sweep_every)) as url:
        context = browser.new_context(base_url=url)
        p = context.new_page()
        p.set_default_timeout(10_000)
        p.goto("/_signoff/login")
        p.fill("input[name=token]", "alice-token")
        p.click("button[type=submit]")
        expect(p.locator("h1")).to_have_text("Approval queue")
        try:
            yield p, clock, url
        finally:
            context.close()
