"""A paged list of open requests (the queue's, a session's) in a real browser: a card that only
moved to another page, because requests before it closed, is not lost and not said closed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, expect

import signoff as so
from signoff.server import TokenAuth, _page_data, create_app

from ._dashboard_browser import answer, base, browser, page, start
from .test_server_common import PLAIN, TOKENS, auth, running

__all__ = ["base", "browser", "page"]  # the fixtures, used by name

REASON = "Checked the photos: the screen is cracked"


def ids(body: dict[str, Any]) -> list[str]:
    return [r["id"] for r in body["pending"]]


def test_a_card_back_on_the_page_as_it_leaves_stays(
    page: Page, base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Page 2 of a queue: a request before it closed, so its first card moved to page 1 and
    left; another closed, so page 2 was gone and the next read showed page 1, that card on it.
    That read came within the 300 ms the card took to leave, found the leaving card and kept
    it, and the card was then removed: an open request missing from the page until a reload."""
    monkeypatch.setattr(_page_data, "PAGE_SIZE", 2)
    bodies = [start(base) for _ in range(4)]
    moving, staying = bodies[2]["pending"][0]["id"], bodies[3]["pending"][0]["id"]
    page.goto("/_signoff/?page=2")
    expect(page.locator("#live-dot.on")).to_be_attached()
    expect(page.locator("[data-request-id]")).to_have_count(2)
    page.wait_for_timeout(300)  # the stream's first read is merged
    held: list[tuple[Route, Any]] = []

    released: list[bool] = []

    def hold(route: Route) -> None:
        if released:
            route.continue_()
        else:  # read now, answered when the test says
            held.append((route, route.fetch()))

    page.route("**/_signoff/fragments/queue*", hold)
    answer(base, bodies[0]["session_id"], ids(bodies[0])[0], "cancel")
    for _ in range(200):
        if held:
            break
        page.wait_for_timeout(50)
    assert len(held) == 1, "the page did not read the queue after a request was answered"
    answer(base, bodies[1]["session_id"], ids(bodies[1])[0], "cancel")
    for _ in range(200):
        if len(held) == 2:
            break
        page.wait_for_timeout(50)
    assert len(held) == 2, "the page did not read the queue again"
    released.append(True)
    # Page 2 without the moving card, then page 1 with it, a moment apart.
    for route, response in held:
        route.fulfill(response=response)
    expect(page.locator(".pager-note")).to_have_text(
        "Page 2 is gone (fewer are open now): showing page 1."
    )
    page.wait_for_timeout(1000)  # past the time a leaving card takes to go
    for rid in (moving, staying):
        expect(page.locator(f"[data-request-id='{rid}']")).to_have_count(1)
        expect(page.locator(f"[data-request-id='{rid}']")).to_be_visible()
    expect(page.locator("[data-request-id].leaving")).to_have_count(0)


def test_a_card_moved_to_another_page_while_a_reason_is_typed_stays_open(
    page: Page, base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Page 2 of a queue, a reason typed in its first card; a request on page 1 was answered
    elsewhere, so that card moved to page 1. The page took it for closed: "Closed elsewhere ...
    nothing you typed here was sent", its form removed, then the card, though it was still
    open. It now says it moved and where, keeps the form and the text, and answers from here;
    one really closed elsewhere still says so."""
    monkeypatch.setattr(_page_data, "PAGE_SIZE", 2)
    bodies = [start(base) for _ in range(5)]
    moving = ids(bodies[2])[0]
    page.goto("/_signoff/?page=2")
    expect(page.locator("#live-dot.on")).to_be_attached()
    card = page.locator(f"[data-request-id='{moving}']")
    card.locator("input[name=text]").fill(REASON)
    answer(base, bodies[0]["session_id"], ids(bodies[0])[0], "cancel")
    # The next card of the queue comes in; the one typed in stays, said to have moved.
    expect(page.locator(f"[data-request-id='{ids(bodies[4])[0]}']")).to_have_count(1)
    note = card.locator(".result-note")
    expect(note).to_have_text(
        "Still open, now on page 1: what you type here is kept, and you can answer it here."
    )
    expect(note.get_by_role("link", name="page 1")).to_have_attribute("href", "/_signoff/")
    page.wait_for_timeout(1000)
    expect(card).to_have_count(1)
    expect(card.locator("input[name=text]")).to_have_value(REASON)
    expect(page.get_by_text("Closed elsewhere")).to_have_count(0)
    card.get_by_role("button", name="Deny").click()
    expect(card.locator(".result-note.ok")).to_contain_text("Denied")
    r = httpx.get(
        f"{base}/v1/requests/{moving}", headers=auth("alice-token"), timeout=10, verify=PLAIN
    )
    assert r.json()["resolution"]["reason"] == REASON
    expect(card).to_have_count(0, timeout=10_000)
    # A card typed in that really closed elsewhere is still said to be closed.
    closing = page.locator(f"[data-request-id='{ids(bodies[4])[0]}']")
    closing.locator("input[name=text]").fill(REASON)
    answer(base, bodies[4]["session_id"], ids(bodies[4])[0], "cancel")
    expect(closing.locator(".result-note")).to_contain_text("Closed elsewhere")
    expect(closing.locator("form")).to_have_count(0)


def test_a_sessions_card_moved_to_another_page_while_typed_in_stays_open(
    browser: Browser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session page's open requests are paged as the queue's: a card typed in that moved to
    the page before, as a request before it closed, was said closed elsewhere there too."""
    monkeypatch.setattr(_page_data, "PAGE_SIZE", 1)

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": order_id}

    three = so.ModelResponse(
        tool_calls=[so.ToolCall(name="refund", input={"order_id": str(n)}) for n in range(3)]
    )
    agent = so.Agent(
        name="triple",
        model=so.models.Scripted([three, so.ModelResponse(text="done")]),
        tools=[refund],
    )
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/three.db", poll_interval=0.05)
    with running(create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05)) as url:
        body = start(url, "triple")
        sid = body["session_id"]
        a, b, c = ids(body)
        context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=url)
        try:
            p = context.new_page()
            p.set_default_timeout(10_000)
            p.goto("/_signoff/login")
            p.fill("input[name=token]", "alice-token")
            p.click("button[type=submit]")
            p.goto(f"/_signoff/sessions/{sid}?page=2")
            expect(p.locator("#live-dot.on")).to_be_attached()
            card = p.locator(f"[data-request-id='{b}']")
            card.locator("input[name=text]").fill(REASON)
            answer(url, sid, a, "cancel")
            expect(p.locator(f"[data-request-id='{c}']")).to_have_count(1)  # page 2's now
            expect(card.locator(".result-note")).to_have_text(
                "Still open, now on page 1: what you type here is kept, and you can answer it here."
            )
            link = card.get_by_role("link", name="page 1")
            expect(link).to_have_attribute("href", f"/_signoff/sessions/{sid}")
            p.wait_for_timeout(1000)
            expect(card.locator("input[name=text]")).to_have_value(REASON)
            expect(p.get_by_text("Closed elsewhere")).to_have_count(0)
        finally:
            context.close()
