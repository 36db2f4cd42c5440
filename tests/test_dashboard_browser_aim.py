"""A click lands where it was aimed (aim.js) in a real browser: a live update that moves a
button on screen under a resting pointer, however it moves it, makes a click on it a moment later
send nothing and say so; the reviewer's own scrolling does not."""

from __future__ import annotations

from typing import Any

import pytest
from playwright.sync_api import Page, expect

from signoff.server import _page_data

from ._dashboard_browser import answer, base, browser, page, session, start

__all__ = ["base", "browser", "page"]  # the fixtures, used by name

# What a card's form says when a click on it was refused.
REFUSED = "moved under the pointer as you clicked: nothing was sent"


def center(page: Page, rid: str) -> tuple[float, float]:
    """Where on screen the middle of the request's Approve button is."""
    box = page.locator(f"[data-request-id='{rid}']").get_by_role("button", name="Approve")
    at = box.bounding_box()
    assert at is not None
    return at["x"] + at["width"] / 2, at["y"] + at["height"] / 2


def under(page: Page, x: float, y: float) -> str | None:
    """The request whose Approve button is at (x, y) on screen, if one is."""
    found: str | None = page.evaluate(
        """([x, y]) => {
          const b = document.elementFromPoint(x, y);
          const approve = b && b.closest("form.respond button[value=approve]");
          return approve ? approve.closest("[data-request-id]").dataset.requestId : null;
        }""",
        [x, y],
    )
    return found


def gone(page: Page, selector: str) -> None:
    """Wait, frame by frame, until nothing matches: the click that follows comes well within
    the 0.8 s (an assertion's polling can see it a second late)."""
    page.wait_for_function("(s) => !document.querySelector(s)", arg=selector, polling="raf")


def scroll_to_bottom(page: Page) -> None:
    page.evaluate("window.scrollTo(0, document.documentElement.scrollHeight)")
    assert page.evaluate("scrollY") > 0  # the queue is taller than the window


def refused(page: Page, base: str, bodies: list[dict[str, Any]], rid: str) -> None:
    """The click on `rid`'s Approve sent nothing: its form says so, no form was sent (sending
    hides that error and marks the card `answering` at once), and every request is open."""
    card = page.locator(f"[data-request-id='{rid}']")
    expect(card.locator(".form-error")).to_contain_text(REFUSED)
    expect(card.locator(".form-error")).to_be_visible()
    assert page.locator(".answering, .done").count() == 0
    for body in bodies:
        assert session(base, body["session_id"])["status"] == "waiting"


def test_a_card_below_leaving_a_page_scrolled_to_its_bottom_does_not_answer_the_card_slid_under_it(
    page: Page, base: str
) -> None:
    """The queue scrolled to its bottom, the pointer on the Approve of the card before the last:
    the last was answered elsewhere, the page got shorter and the browser pulled its scroll
    back, so every card above slid down and a third card's Approve sat under the pointer. Only
    positions on the page were compared, which a card leaving below changes for none, and the
    click ~0.5 s later approved a tool call nobody meant to approve."""
    bodies = [start(base) for _ in range(6)]
    page.goto("/_signoff/")
    expect(page.locator("#live-dot.on")).to_be_attached()
    cards = page.locator("[data-request-id]")
    expect(cards).to_have_count(6)
    ids: list[str] = cards.evaluate_all("els => els.map((e) => e.dataset.requestId)")
    scroll_to_bottom(page)
    x, y = center(page, ids[-2])
    page.mouse.move(x, y)
    assert under(page, x, y) == ids[-2]
    last = next(b for b in bodies if b["pending"][0]["id"] == ids[-1])
    answer(base, last["session_id"], ids[-1])
    gone(page, f"[data-request-id='{ids[-1]}']")
    slid = under(page, x, y)
    assert slid is not None and slid != ids[-2], slid  # another request's Approve is there now
    page.mouse.click(x, y)
    refused(page, base, [b for b in bodies if b is not last], slid)


def test_a_pager_gone_from_a_page_scrolled_to_its_bottom_makes_a_click_on_a_slid_card_refused(
    page: Page, base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Page 1 of two scrolled to its bottom: the one request on page 2 was answered elsewhere,
    the pager went, the page got shorter and every card slid down. The pager is redrawn after
    the cards, outside what a live update marks, so that move was not marked either."""
    monkeypatch.setattr(_page_data, "PAGE_SIZE", 5)
    bodies = [start(base) for _ in range(6)]
    page.goto("/_signoff/")
    expect(page.locator("#live-dot.on")).to_be_attached()
    expect(page.locator(".pager")).to_be_visible()
    cards = page.locator("[data-request-id]")
    expect(cards).to_have_count(5)
    shown: list[str] = cards.evaluate_all("els => els.map((e) => e.dataset.requestId)")
    scroll_to_bottom(page)
    aimed = shown[-1]
    before = center(page, aimed)
    other = next(b for b in bodies if b["pending"][0]["id"] not in shown)  # the one on page 2
    answer(base, other["session_id"], other["pending"][0]["id"])
    gone(page, ".pager")
    x, y = center(page, aimed)
    assert y > before[1]  # it slid down
    page.mouse.click(x, y)
    refused(page, base, [b for b in bodies if b is not other], aimed)


def test_a_click_just_after_the_reviewers_own_scroll_answers(page: Page, base: str) -> None:
    """The reviewer's own scrolling moves every button on screen: a click right after it is
    meant, and answers (only a live update's moves are refused)."""
    bodies = [start(base) for _ in range(6)]
    page.goto("/_signoff/")
    expect(page.locator("#live-dot.on")).to_be_attached()
    cards = page.locator("[data-request-id]")
    expect(cards).to_have_count(6)
    ids: list[str] = cards.evaluate_all("els => els.map((e) => e.dataset.requestId)")
    x, y = center(page, ids[0])
    page.mouse.move(x, y)
    page.mouse.wheel(0, center(page, ids[1])[1] - y)
    page.wait_for_function(  # the wheel's scroll is over: the next card's Approve is there
        """([x, y, rid]) => {
          const b = document.elementFromPoint(x, y);
          return !!(b && b.closest(`[data-request-id="${rid}"] button[value=approve]`));
        }""",
        arg=[x, y, ids[1]],
    )
    page.mouse.click(x, y)
    expect(page.locator(f"[data-request-id='{ids[1]}'] .result-note")).to_contain_text("Approved")
    expect(page.locator(".form-error:visible")).to_have_count(0)
    opened = {b["pending"][0]["id"]: b["session_id"] for b in bodies}
    assert session(base, opened[ids[0]])["status"] == "waiting"
