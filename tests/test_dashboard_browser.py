"""The dashboard in a real browser: Playwright for Python driving Debian's Chromium."""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from .test_server_common import ROOT, auth, served, tool_output

CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    assert Path(CHROMIUM).exists(), "Chromium is missing: run ./scripts/setup (apt-get chromium)"
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


@pytest.fixture
def page(browser: Browser, base: str) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=base)
    p = context.new_page()
    p.set_default_timeout(10_000)
    # sign in as alice through the login form (CSRF-protected)
    p.goto("/_signoff/")
    expect(p).to_have_url(f"{base}/_signoff/login")
    p.fill("input[name=token]", "alice-token")
    p.click("button[type=submit]")
    expect(p.locator("h1")).to_have_text("Approval queue")
    yield p
    context.close()


def start(base: str, agent: str = "support") -> dict[str, Any]:
    r = httpx.post(
        f"{base}/v1/sessions",
        json={"agent": agent, "message": "Refund order 1042, it arrived broken"},
        headers=auth("alice-token"),
        timeout=10,
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def session(base: str, sid: str) -> dict[str, Any]:
    r = httpx.get(f"{base}/v1/sessions/{sid}", headers=auth("alice-token"), timeout=10)
    body: dict[str, Any] = r.json()
    return body


def test_reviewer_approves_a_refund_live(page: Page, base: str, tmp_path: Path) -> None:
    expect(page.get_by_text("All caught up")).to_be_visible()
    expect(page.locator("#live-dot.on")).to_be_attached()
    # the request arrives while the page is open: no reload
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    card = page.locator(f"[data-request-id='{rid}']")
    expect(card).to_be_visible()
    expect(card.locator(".tool-name")).to_have_text("issue_refund")
    expect(card.get_by_label("Tool input")).to_contain_text('"order_id": "1042"')
    expect(card.get_by_label("Tool input")).to_contain_text('"amount": 180.0')
    expect(card).to_contain_text("Alice (alice)")
    expect(card).to_contain_text("1,280 tokens · $0.0042")
    expect(page.locator("[data-live-total]")).to_have_text("1")

    # two more for a realistic screenshot of the queue
    start(base, "batch")
    expect(page.locator("[data-request-id]")).to_have_count(3)
    expect(page.locator("[data-live-total]")).to_have_text("3")
    shot = tmp_path / "queue.png"
    page.screenshot(path=str(shot), full_page=True, animations="disabled")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("SIGNOFF_UPDATE_SCREENSHOT"):
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copy(shot, ROOT / "docs" / "queue.png")

    card.locator("input[name=text]").fill("Customer sent photos of the damage")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".result-note")).to_have_text("Approved — the run is now completed.")
    expect(card).to_have_count(0)  # it leaves the queue
    expect(page.locator("[data-live-total]")).to_have_text("2")

    state = session(base, sid)
    assert state["status"] == "idle" and state["turn"]["status"] == "completed"
    seen = tool_output(state["turn"]["text"])
    assert seen["result"] == {"order_id": "1042", "refunded": 180.0}
    assert seen["approval"]["reason"] == "Customer sent photos of the damage"
    record = httpx.get(f"{base}/v1/requests/{rid}", headers=auth("alice-token")).json()
    assert record["resolution"]["reason"] == "Customer sent photos of the damage"

    # the audit page lists the settlement
    page.goto("/_signoff/audit")
    row = page.locator("#audit tbody tr").first
    expect(row).to_contain_text("issue_refund")
    expect(row).to_contain_text("approved")
    expect(row).to_contain_text("Customer sent photos of the damage")


def test_reviewer_edits_the_amount_then_approves(page: Page, base: str) -> None:
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    card = page.locator(f"[data-request-id='{rid}']")
    card.get_by_text("Edit arguments before approving").click()
    expect(card.locator("pre.schema")).to_contain_text('"amount"')  # the schema is shown
    box = card.locator("textarea[name=edited_input]")
    box.fill(box.input_value().replace("180.0", "120"))
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".result-note")).to_have_text(
        "Approved with edited arguments — the run is now completed."
    )
    text = session(base, sid)["turn"]["text"]
    assert '"result": {"order_id": "1042", "refunded": 120.0}' in text  # ran with the edit
    assert "a reviewer edited the arguments" in text  # and the model is told so


def test_deny_with_a_reason_reaches_the_model(page: Page, base: str) -> None:
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    page.reload()
    card = page.locator(f"[data-request-id='{rid}']")
    card.locator("input[name=text]").fill("Refunds over 100 need a manager")
    card.get_by_role("button", name="Deny").click()
    expect(card.locator(".result-note")).to_contain_text("Denied")
    text = session(base, sid)["turn"]["text"]
    assert text.startswith("tool error: ")
    assert "Refunds over 100 need a manager" in text


def test_session_page_follows_the_run_live(page: Page, base: str) -> None:
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    page.goto(f"/_signoff/sessions/{sid}")
    expect(page.locator("[data-session-status]")).to_have_text("waiting")
    expect(page.locator("#trace li")).to_have_count(5)
    expect(page.locator(f"#session-pending [data-request-id='{rid}']")).to_be_visible()
    # someone approves from elsewhere (the API); the page follows over SSE
    r = httpx.post(
        f"{base}/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
        headers=auth("alice-token"),
        timeout=10,
    )
    assert r.json()["status"] == "completed"
    expect(page.locator("#trace li .badge.type", has_text="turn.completed")).to_be_visible()
    expect(page.locator("[data-session-status]")).to_have_text("idle")
    expect(page.locator(f"#session-pending [data-request-id='{rid}']")).to_have_count(0)
    expect(page.locator("blockquote.reply")).to_contain_text("refunded")
    seqs = page.locator("#trace li").evaluate_all("els => els.map(e => Number(e.dataset.seq))")
    assert seqs == list(range(1, len(seqs) + 1))


def test_tools_page_shows_approval_settings(page: Page) -> None:
    page.goto("/_signoff/tools")
    refund = page.locator("tr", has_text="issue_refund").first
    expect(refund.locator(".badge").first).to_have_text("Conditional")
    lookup = page.locator("tr", has_text="lookup_order")
    expect(lookup.locator(".badge").first).to_have_text("Never")


def test_reviewer_answers_a_question(page: Page, base: str) -> None:
    body = start(base, "helper")
    sid, rid = body["session_id"], body["pending"][0]["id"]
    card = page.locator(f"[data-request-id='{rid}']")
    expect(card.locator(".tool-name")).to_have_text("Which size should the replacement be?")
    expect(card.locator(".badge").first).to_have_text("question")
    card.get_by_role("button", name="Large").click()
    expect(card.locator(".result-note")).to_have_text("Answered — the run is now completed.")
    assert '"answer": "Large"' in session(base, sid)["turn"]["text"]


def test_a_conversation_started_and_answered_from_the_browser(page: Page, base: str) -> None:
    page.goto("/_signoff/new")
    page.select_option("select[name=agent]", "helper")
    page.fill("textarea[name=message]", "My shoes are too small")
    page.get_by_role("button", name="Start").click()
    expect(page).to_have_url(re.compile(r"/_signoff/sessions/ses_\w+$"))
    expect(page.locator("[data-session-status]")).to_have_text("waiting")
    pending = page.locator("#session-pending [data-request-id]")
    expect(pending.locator(".tool-name")).to_have_text("Which size should the replacement be?")
    # a typed message that names an option answers the question; the trace follows live
    page.fill("#send textarea[name=message]", "Large")
    page.locator("#send").get_by_role("button", name="Send").click()
    expect(page.locator("#trace li .badge.type", has_text="turn.completed")).to_be_visible()
    expect(page.locator("[data-session-status]")).to_have_text("idle")
    expect(pending).to_have_count(0)
    expect(page.locator("blockquote.reply")).to_contain_text('"answer": "Large"')
    expect(page.locator("#send textarea")).to_have_value("")
