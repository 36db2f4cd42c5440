"""A session page open while its session expires ends up as a reload shows it: no message box,
but the note that it expired and a link to start a new conversation. The page drew the box only
when loaded, so it stayed, and what was typed in it was refused with a bare `session '…'
expired`; with nothing recorded of the expiry (its turn had ended) the header kept saying it
expires in a minute."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, expect

from ._dashboard_browser import browser, expiring
from .test_server_common import PLAIN, auth

__all__ = ["browser"]  # the fixture, used by name


def ended_turn(url: str) -> str:
    """A `desk` session whose turn has ended (its request denied over the API): its expiry
    closes nothing, so nothing records it."""
    body = httpx.post(
        f"{url}/v1/sessions",
        json={"agent": "desk", "message": "reset my password"},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    ).json()
    sid: str = body["session_id"]
    r = httpx.post(
        f"{url}/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": body["pending"][0]["id"], "optionId": "cancel"}]},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 200 and r.json()["status"] != "running", r.text
    return sid


def expired_note(p: Page) -> None:
    """The page offers no message box, says the session expired, and links a new one."""
    expect(p.locator("#send")).to_have_count(0)
    note = p.locator("#send-expired")
    expect(note).to_contain_text("This session expired")
    expect(note).to_contain_text("it takes no more messages")
    expect(note.get_by_role("link", name="Start a new conversation")).to_have_attribute(
        "href", "/_signoff/new?agent=desk"
    )


@pytest.mark.parametrize("stream", ["followed", "lost", "lost, one read failed"])
def test_a_session_page_shows_the_expiry_that_nothing_recorded(
    browser: Browser, tmp_path: Path, stream: str
) -> None:
    """The TTL passes with the page open and no event: the stream's end says so (`followed`),
    or, its stream down, the page reads itself once the header's expiry has passed by the
    server's clock (`lost`; the browser's fake clock moved on as the server's did), and again
    later when that read failed (it looked no more: a review)."""
    with expiring(browser, tmp_path) as (p, clock, url):
        sid = ended_turn(url)
        if stream != "followed":
            p.route("**/v1/sessions/*/events*", lambda route: route.abort())
            p.clock.install()
        p.goto(f"/_signoff/sessions/{sid}")
        if stream == "followed":
            expect(p.locator("#live-dot.on")).to_be_attached()
        header = p.locator("#session-header")
        expect(header).to_contain_text("in a minute")
        expect(p.locator("#send textarea")).to_be_visible()
        failed: list[str] = []
        if stream == "lost, one read failed":

            def once(route: Route) -> None:
                if failed:
                    route.continue_()
                else:
                    failed.append(route.request.url)
                    route.abort()

            p.route("**/fragments/sessions/**", once)
        clock.advance(120)  # past the session's TTL (60 s)
        if stream != "followed":
            p.clock.fast_forward(121_000)
        if stream == "lost, one read failed":
            for _ in range(100):  # the read at the expiry, which fails
                if failed:
                    break
                p.wait_for_timeout(100)
            assert len(failed) == 1
            p.clock.fast_forward(600_000)  # it looks again, later
        expired_note(p)
        expect(header.locator("[data-session-expired]")).to_have_text("expired")
        expect(header.locator("dl")).to_contain_text("Expired")
        live = p.locator("#session-send").inner_text()
        p.reload()
        expect(p.locator("#session-send")).to_have_text(live)  # as a reload shows it


def test_a_message_refused_as_expired_shows_the_note_instead_of_the_box(
    browser: Browser, tmp_path: Path
) -> None:
    """The page not kept up to date (its reads lost): a message sent after the TTL passed is
    refused `session_expired`, and the box gives way to the note, which takes the focus."""
    with expiring(browser, tmp_path) as (p, clock, url):
        sid = ended_turn(url)
        p.route("**/v1/sessions/*/events*", lambda route: route.abort())
        p.route("**/_signoff/fragments/sessions/**", lambda route: route.abort())
        p.goto(f"/_signoff/sessions/{sid}")
        clock.advance(120)  # past the session's TTL (60 s)
        p.fill("#send textarea", "one more thing")
        p.click("#send button")
        expired_note(p)
        expect(p.locator("#send-expired")).to_be_focused()  # the keyboard's place, read out
        expect(p.locator("#send-expired")).to_contain_text("was not sent")
