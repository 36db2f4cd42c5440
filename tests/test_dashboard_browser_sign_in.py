"""A page whose sign-in ends under an authenticator of the application's (a proxy's sign-in,
with no sign-in form here), in a real browser: it says the authenticator does not recognise the
reviewer and offers a reload, which goes through that sign-in, with what was typed kept."""

from __future__ import annotations

from pathlib import Path

import httpx
from playwright.sync_api import Browser, expect

from signoff.server import create_app

from ._dashboard_browser import browser, csp_violations
from .test_login import _sso
from .test_server_common import PLAIN, make_runtime, running

__all__ = ["browser"]  # the fixture, used by name

REASON = "Checked the photos: the screen is cracked"


def test_a_sign_in_the_applications_authenticator_ended_offers_a_reload(
    browser: Browser, tmp_path: Path
) -> None:
    """The proxy's sign-in lapsed while a reviewer wrote a reason: Approve got an HTML 401
    saying "In dev mode only localhost may connect" (it was not dev mode), so the banner read
    "Unexpected response (401). Sign in", its link a token form that signs no one in. It says
    the authenticator does not recognise them, and its Reload link, once they are signed in at
    the proxy again, brings the page back with the reason typed."""
    app = create_app(make_runtime(f"sqlite:///{tmp_path}/s.db"), auth=_sso, secret="s3cret")
    with running(app) as base:
        signed = {"sso_user": "alice"}
        r = httpx.post(
            f"{base}/v1/sessions",
            json={"agent": "support", "message": "Refund 1042"},
            cookies=signed,
            verify=PLAIN,
        )
        assert r.status_code == 201, r.text
        sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
        context = browser.new_context(base_url=base)
        try:
            context.add_cookies([{"name": "sso_user", "value": "alice", "url": base}])
            page = context.new_page()
            refused = csp_violations(page)
            page.goto(f"/_signoff/sessions/{sid}")
            card = page.locator(f"[data-request-id='{rid}']")
            expect(page.locator("#live-dot.on")).to_be_attached()
            card.locator("input[name=text]").fill(REASON)
            context.clear_cookies(name="sso_user")  # the proxy's sign-in lapses
            card.get_by_role("button", name="Approve").click()
            note = page.locator("#signed-out")
            expect(note).to_contain_text("This server's authenticator does not recognise you")
            expect(note.get_by_role("link", name="Sign in")).to_have_count(0)
            note.get_by_role("link", name="Reload").click()  # still not signed in there
            expect(page).to_have_url(f"{base}/_signoff/sessions/{sid}")
            expect(page.locator("main code")).to_have_text("unauthenticated")
            context.add_cookies([{"name": "sso_user", "value": "alice", "url": base}])
            page.reload()
            expect(card.locator("input[name=text]")).to_have_value(REASON)
            assert refused == [], "the dashboard's content security policy blocks its own page"
        finally:
            context.close()
        state = httpx.get(f"{base}/v1/sessions/{sid}", cookies=signed, verify=PLAIN).json()
        assert state["status"] == "waiting"  # the refused click changed nothing
