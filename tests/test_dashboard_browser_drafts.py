"""What a reviewer typed and had not sent outlives a sign-in that ended under it: signing in
again, or reloading for a fresh form token, brings the page back with the text in place."""

from __future__ import annotations

import httpx
from playwright.sync_api import Page, expect

from ._dashboard_browser import base, browser, page, session, start
from .test_server_common import PLAIN, auth

__all__ = ["base", "browser", "page"]  # the fixtures, used by name

MESSAGE = "Refund only the broken part: the rest arrived whole\nand the box is kept."
REASON = "Checked the photos: the screen is cracked"


def test_text_typed_before_the_sign_in_expired_is_there_after_signing_in(
    page: Page, base: str
) -> None:
    """The sign-in cookie expired while a reviewer wrote a message and an approval's reason:
    Send said to sign in again, and the link's round trip came back to an empty page (both
    texts lost). They are filled in again, and what is sent then is sent once."""
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    page.goto(f"/_signoff/sessions/{sid}")
    card = page.locator(f"[data-request-id='{rid}']")
    expect(page.locator("#live-dot.on")).to_be_attached()
    page.fill("#send textarea", MESSAGE)
    card.locator("input[name=text]").fill(REASON)
    page.context.clear_cookies(name="signoff_token")
    page.click("#send button")
    note = page.locator("#signed-out")
    expect(note).to_contain_text("Your sign-in has expired")
    note.get_by_role("link", name="Sign in").click()
    page.fill("input[name=token]", "alice-token")
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{base}/_signoff/sessions/{sid}")
    expect(page.locator("#send textarea")).to_have_value(MESSAGE)
    expect(card.locator("input[name=text]")).to_have_value(REASON)
    card.get_by_role("button", name="Deny").click()
    expect(card.locator(".result-note")).to_contain_text("Denied")
    page.reload()  # told once: a later visit starts empty
    expect(page.locator("#send textarea")).to_have_value("")
    assert session(base, sid)["status"] == "idle"


def test_text_typed_on_a_page_of_an_older_sign_in_is_there_after_the_reload(
    page: Page, base: str
) -> None:
    """The reviewer signed in again in another tab: this page's form token was for the old
    sign-in, and the refusal said to reload the page, which emptied the message box."""
    sid = start(base)["session_id"]
    page.goto(f"/_signoff/sessions/{sid}")
    expect(page.locator("#live-dot.on")).to_be_attached()
    other = page.context.new_page()
    other.goto("/_signoff/")
    other.get_by_role("button", name="Sign out").click()
    other.fill("input[name=token]", "alice-token")
    other.click("button[type=submit]")
    expect(other.locator("h1")).to_have_text("Approval queue")
    other.close()
    page.fill("#send textarea", MESSAGE)
    page.click("#send button")
    expect(page.locator("#send .form-error")).to_contain_text("reload the page")
    page.reload()
    expect(page.locator("#send textarea")).to_have_value(MESSAGE)


def test_text_typed_when_a_form_token_is_refused_is_there_after_the_reload(
    page: Page, base: str
) -> None:
    """A message's form token refused as out of date (`invalid_form`) or as spent on another
    message (`form_already_sent`): each refusal said to reload the page, which emptied the box
    (only `csrf_failed` kept the text)."""
    sid = start(base)["session_id"]
    page.goto(f"/_signoff/sessions/{sid}")
    expect(page.locator("#live-dot.on")).to_be_attached()
    token = page.locator("#send input[name=form]")
    token.evaluate("(el) => { el.value = 'out-of-date'; }")
    page.fill("#send textarea", MESSAGE)
    page.click("#send button")
    expect(page.locator("#send .form-error")).to_contain_text("out of date")
    page.reload()
    expect(page.locator("#send textarea")).to_have_value(MESSAGE)

    spent = token.input_value()
    page.click("#send button")  # sent: the box empties, the form takes a fresh token
    expect(page.locator("#send textarea")).to_have_value("")
    expect(token).not_to_have_value(spent)
    token.evaluate("(el, spent) => { el.value = spent; }", spent)
    page.fill("#send textarea", REASON)
    page.click("#send button")
    expect(page.locator("#send .form-error")).to_contain_text("sent already")
    page.reload()
    expect(page.locator("#send textarea")).to_have_value(REASON)


def test_a_card_closed_elsewhere_while_a_reason_is_typed_says_so(page: Page, base: str) -> None:
    """Another tab denied the request while the reviewer wrote a reason for it: the live update
    took the card away mid-sentence, with no word of why or of the text. The card stays, says
    it was closed elsewhere and that nothing typed was sent, offers no buttons, then leaves."""
    body = start(base)
    rid = body["pending"][0]["id"]
    page.goto("/_signoff/")
    expect(page.locator("#live-dot.on")).to_be_attached()
    card = page.locator(f"[data-request-id='{rid}']")
    card.locator("input[name=text]").fill(REASON)
    httpx.post(
        f"{base}/v1/sessions/{body['session_id']}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "cancel"}]},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    ).raise_for_status()
    note = card.locator(".result-note")
    expect(note).to_contain_text("Closed elsewhere")
    expect(note).to_contain_text("nothing you typed here was sent")
    expect(card.get_by_role("button", name="Approve")).to_have_count(0)
    expect(note).to_be_focused()  # read out where the reviewer was typing
    expect(card).to_have_count(0, timeout=15_000)
