"""Cancelling a turn from its session page in a real browser: the disclosure opens, the turn is
cancelled with the reason typed, and the page then offers deleting instead; another tab open on
the session redraws its offer live, as the session changes."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from ._dashboard_browser import base, browser, page, session, start

__all__ = ["base", "browser", "page"]  # the fixtures, used by name


def test_a_turn_cancelled_from_its_page_offers_deleting_here_and_in_another_tab(
    page: Page, base: str
) -> None:
    sid = start(base)["session_id"]
    other = page.context.new_page()
    other.goto(f"/_signoff/sessions/{sid}")
    expect(other.locator("#live-dot.on")).to_be_attached()
    expect(other.locator("form#cancel-turn")).to_be_attached()
    page.goto(f"/_signoff/sessions/{sid}")
    expect(page.locator("form#delete-session")).to_have_count(0)
    page.locator("details.cancel-turn summary").click()  # the disclosure opens
    page.get_by_label("Reason (optional, recorded with the cancel)").fill("customer left")
    page.get_by_role("button", name="Cancel turn").click()
    expect(page).to_have_url(f"{base}/_signoff/sessions/{sid}")
    expect(page.locator("[data-session-status]")).to_have_text("cancelled")
    expect(page.locator("form#cancel-turn")).to_have_count(0)
    expect(page.locator("details.delete-session summary")).to_be_visible()
    assert session(base, sid)["status"] == "cancelled"
    # the other tab was not reloaded: its live read redrew what it offers
    expect(other.locator("[data-session-status]")).to_have_text("cancelled")
    expect(other.locator("form#cancel-turn")).to_have_count(0)
    expect(other.locator("details.delete-session summary")).to_be_visible()
