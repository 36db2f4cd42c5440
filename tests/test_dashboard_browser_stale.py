"""Dashboard pages left open while what they show changes under them, in a real browser: a
request escalated by its deadline shows it as a reload would, what was typed in it kept; a sign-in
as someone else in another tab has the page say to sign in again, not show that person's view
(this viewer's open request "closed elsewhere", its session "deleted")."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from playwright.sync_api import Browser, Page, expect

import signoff as so
from signoff.testing import ManualClock

from ._dashboard_browser import answer, base, browser, clocked, page, start
from .test_server_common import PLAIN, auth

__all__ = ["base", "browser", "page"]  # the fixtures, used by name

REASON = "Checked with the supplier: the invoice is theirs"


def _escalating() -> so.Agent:
    """Agent `payments`: its call to `wire_money` needs an approval within an hour, escalated to
    the managers once that passes."""

    @so.tool(approval=so.always(expires_in=3600, on_timeout="escalate", escalate_to="managers"))
    async def wire_money(to: str, amount: float) -> str:
        """Send money to an account."""
        return "sent"

    call = so.ToolCall(name="wire_money", input={"to": "ACME GmbH", "amount": 5000})
    return so.Agent(
        name="payments",
        model=so.models.Scripted([so.ModelResponse(tool_calls=[call])]),
        tools=[wire_money],
    )


@contextmanager
def _swept(browser: Browser, tmp_path: Path) -> Iterator[tuple[Page, ManualClock, str]]:
    """A page signed in as alice to a dashboard whose deadlines pass by a clock the test moves,
    recorded by the server's sweep as they pass."""
    with clocked(browser, _escalating(), tmp_path / "s.db", sweep_every=0.2) as served:
        yield served


def test_a_card_escalated_while_its_page_is_open_shows_it(browser: Browser, tmp_path: Path) -> None:
    """The request's deadline passed and escalated it while its queue and session pages were
    open: each kept its card as first drawn, with no "escalated to managers" and an "Expires"
    that went on to say "a few seconds ago" for a deadline it no longer has; only a reload
    showed it. The card's title and facts are drawn anew; the reason typed in it stays."""
    with _swept(browser, tmp_path) as (queue, clock, url):
        body = httpx.post(
            f"{url}/v1/sessions",
            json={"agent": "payments", "message": "Pay ACME"},
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        ).json()
        sid, rid = body["session_id"], body["pending"][0]["id"]
        session = queue.context.new_page()
        session.goto(f"/_signoff/sessions/{sid}")
        cards = [p.locator(f"[data-request-id='{rid}']") for p in (queue, session)]
        for p, card in zip((queue, session), cards, strict=True):
            expect(p.locator("#live-dot.on")).to_be_attached()
            expect(card.locator(".facts")).to_contain_text("Expiresin an hour")
            expect(card.locator(".title")).not_to_contain_text("escalated")
            card.locator("input[name=text]").fill(REASON)
        clock.advance(3601)
        for card in cards:
            expect(card.locator(".title")).to_contain_text("escalated to managers")
            expect(card.locator(".facts")).to_contain_text("Expiresnever")
            expect(card.locator("input[name=text]")).to_have_value(REASON)
        cards[1].get_by_role("button", name="Approve").click()  # its form still answers
        expect(cards[1].locator(".result-note")).to_contain_text("Approved")


def test_a_sign_in_as_someone_else_in_another_tab_asks_to_sign_in_again(
    page: Page, base: str
) -> None:
    """Mallory signed in in another tab of alice's browser (which signed alice out) while alice
    wrote reasons on her queue and a session page: their next reads carried mallory's cookie and
    showed what mallory sees, so the queue said alice's open request was "Closed elsewhere" and
    dropped the reason, and the session page said the session was deleted and stopped reading.
    Each says to sign in again, keeping the card, its form and what was typed; signing in as
    alice brings the queue back with the reason in place."""
    body = start(base, "batch")
    sid = body["session_id"]
    first, second = (r["id"] for r in body["pending"])
    session = page.context.new_page()
    session.goto(f"/_signoff/sessions/{sid}")
    pages = (page, session)
    cards = [p.locator(f"[data-request-id='{second}']") for p in pages]
    for p, card in zip(pages, cards, strict=True):
        expect(p.locator("#live-dot.on")).to_be_attached()
        card.locator("input[name=text]").fill(REASON)
    other = page.context.new_page()
    other.goto("/_signoff/login")
    other.fill("input[name=token]", "mallory-token")
    other.click("button[type=submit]")
    expect(other.locator("h1")).to_have_text("Approval queue")
    other.close()
    answer(base, sid, first)  # alice, over the API: her queue and her session change
    for p, card in zip(pages, cards, strict=True):
        note = p.locator("#signed-out")
        expect(note).to_contain_text("You have signed in as someone else in another tab")
        expect(note.get_by_role("link", name="Sign in")).to_be_visible()
        expect(card.locator("input[name=text]")).to_have_value(REASON)
        expect(card).not_to_contain_text("Closed elsewhere")
    expect(session.locator("#session-deleted")).to_have_count(0)
    expect(cards[0]).to_be_visible()  # it does not leave
    page.locator("#signed-out").get_by_role("link", name="Sign in").click()
    page.fill("input[name=token]", "alice-token")
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/_signoff/?$"))
    expect(cards[0].locator("input[name=text]")).to_have_value(REASON)
    expect(page.locator(f"[data-request-id='{first}']")).to_have_count(0)
