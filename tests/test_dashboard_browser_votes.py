"""A request that needs several approvers shows its count of approvals live: another person's
vote, cast elsewhere, is redrawn on the queue and session pages open meanwhile."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard_browser import base, browser, page, start
from .test_server_common import PLAIN, TOKENS, auth, running

__all__ = ["base", "browser", "page"]  # the fixtures, used by name


def vote(base: str, sid: str, rid: str, token: str, outcome: str = "counted") -> None:
    """Approve `rid` over the API as `token`'s person: elsewhere than the page."""
    r = httpx.post(
        f"{base}/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
        headers=auth(token),
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 200, r.text
    assert r.json()["outcomes"][0]["outcome"] == outcome, r.text


@pytest.mark.parametrize("where", ["queue", "session"])
def test_a_vote_cast_elsewhere_is_counted_on_the_open_page(
    page: Page, base: str, where: str
) -> None:
    """A two-person approval's card said "0 of 2" while the page stayed open, whatever others
    voted: a vote changes no request's presence, so the queue's stream said nothing, and a
    session page's read of the vote kept the card it had. The count and who voted are redrawn
    in place, and what the reviewer typed in the card stays."""
    body = start(base, "treasury")
    sid, rid = body["session_id"], body["pending"][0]["id"]
    page.goto("/_signoff/" if where == "queue" else f"/_signoff/sessions/{sid}")
    expect(page.locator("#live-dot.on")).to_be_attached()
    card = page.locator(f"[data-request-id='{rid}']")
    count = card.locator(".facts div", has_text="Approvals").locator("dd")
    expect(count).to_have_text("0 of 2")
    expect(count).to_have_attribute("aria-live", "polite")  # announced, not only redrawn
    count.evaluate("el => { el.dataset.kept = 'yes'; }")
    card.locator("input[name=text]").fill("checked the account")
    vote(base, sid, rid, "bob-token")
    expect(count).to_have_text("1 of 2 (bob)")
    expect(count).to_have_attribute("data-kept", "yes")  # the live region itself, changed
    expect(card.locator("input[name=text]")).to_have_value("checked the account")
    expect(card.get_by_role("button", name="Approve")).to_be_enabled()


def test_the_note_of_ones_own_vote_follows_the_count(browser: Browser, tmp_path: Path) -> None:
    """A three-person approval: once the reviewer's own vote counted, their card's note said
    "(1 of 3)" beside a count others' votes moved on. Both are redrawn, the note written in
    the page by the reviewer's own answer too."""

    @so.tool(approval=so.always(approvers=3))
    async def close_account(account: str) -> str:
        """Close an account for good."""
        return "closed"

    call = so.ToolCall(name="close_account", input={"account": "ACME"})
    model = so.models.Scripted([so.ModelResponse(tool_calls=[call])], repeat_last=True)
    agent = so.Agent(name="ops", model=model, tools=[close_account])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db", poll_interval=0.05)
    with running(create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05)) as base:
        context = browser.new_context(base_url=base)
        page = context.new_page()
        page.set_default_timeout(10_000)
        page.goto("/_signoff/login")
        page.fill("input[name=token]", "alice-token")
        page.click("button[type=submit]")
        expect(page.locator("h1")).to_have_text("Approval queue")
        r = httpx.post(
            f"{base}/v1/sessions",
            json={"agent": "ops", "message": "close ACME"},
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        assert r.status_code == 201, r.text
        sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
        card = page.locator(f"[data-request-id='{rid}']")
        count = card.locator(".facts div", has_text="Approvals").locator("dd")
        expect(count).to_have_text("0 of 3")
        card.get_by_role("button", name="Approve").click()
        note = card.locator(".result-note.ok")
        expect(note).to_contain_text("Your approval is counted (1 of 3)")
        expect(count).to_have_text("1 of 3 (alice)")  # the live update after her own vote
        vote(base, sid, rid, "bob-token")
        expect(count).to_have_text("2 of 3 (alice, bob)")
        expect(note).to_contain_text("Your approval is counted (2 of 3)")
        page.reload()  # the note the server writes follows the count alike
        expect(note).to_contain_text("You approved this (2 of 3)")
        vote(base, sid, rid, "admin-token", "approved")  # the third settles it: the card goes
        expect(card).to_have_count(0)
        context.close()
