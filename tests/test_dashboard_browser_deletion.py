"""Deleting a session from its page in a real browser: confirmed by a ticked box, it lands on the
Sessions list with a note; another tab open on the session says it was deleted."""

from __future__ import annotations

import httpx
from playwright.sync_api import Page, expect

from ._dashboard_browser import base, browser, page, start
from .test_server_common import PLAIN, auth

__all__ = ["base", "browser", "page"]  # the fixtures, used by name


def test_a_session_deleted_from_its_page_lands_on_sessions_and_other_tabs_say_so(
    page: Page, base: str
) -> None:
    sid = start(base)["session_id"]
    r = httpx.post(
        f"{base}/v1/sessions/{sid}/cancel", headers=auth("alice-token"), timeout=10, verify=PLAIN
    )
    assert r.status_code == 200, r.text
    other = page.context.new_page()
    other.goto(f"/_signoff/sessions/{sid}")
    expect(other.locator("#live-dot.on")).to_be_attached()
    page.goto(f"/_signoff/sessions/{sid}")
    page.locator("details.delete-session summary").click()  # the disclosure opens
    page.get_by_label("Reason (optional, kept in the audit trail)").fill("GDPR erasure")
    button = page.get_by_role("button", name="Delete session")
    button.click()  # not ticked: the browser asks for the box, nothing is sent
    expect(page).to_have_url(f"{base}/_signoff/sessions/{sid}")
    page.get_by_label("I understand this erases the conversation for good").check()
    button.click()
    expect(page).to_have_url(f"{base}/_signoff/sessions")
    expect(page.get_by_role("status")).to_have_text(f"Deleted {sid}.")
    expect(page.locator("#sessions")).not_to_contain_text(sid)
    # the other tab's stream ended: it says so, and offers nothing more to send
    expect(other.get_by_role("alert")).to_contain_text("This session was deleted.")
    expect(other.locator("#send")).to_be_hidden()
    expect(other.locator("#live-status")).to_have_text("")
    page.reload()
    expect(page.locator(".deleted-note")).to_have_count(0)  # told once
