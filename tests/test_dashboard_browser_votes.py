"""A request that needs several approvers shows its count of approvals live: another person's
vote, cast elsewhere, is redrawn on the queue and session pages open meanwhile."""

from __future__ import annotations

import httpx
import pytest
from playwright.sync_api import Page, expect

from ._dashboard_browser import base, browser, page, start
from .test_server_common import PLAIN, auth

__all__ = ["base", "browser", "page"]  # the fixtures, used by name


def vote(base: str, sid: str, rid: str, token: str) -> None:
    """Approve `rid` over the API as `token`'s person: elsewhere than the page."""
    r = httpx.post(
        f"{base}/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
        headers=auth(token),
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 200, r.text
    assert r.json()["outcomes"][0]["outcome"] == "counted", r.text


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
    card.locator("input[name=text]").fill("checked the account")
    vote(base, sid, rid, "bob-token")
    expect(count).to_have_text("1 of 2 (bob)")
    expect(card.locator("input[name=text]")).to_have_value("checked the account")
    expect(card.get_by_role("button", name="Approve")).to_be_enabled()
