"""A question's options whose ids a browser changes on the way (a line break, a lone CR, a NUL, a
bidirectional control) answered in a real browser, from buttons and from the menu, with the
page's script and without it: the turn gets the very id each time."""

from __future__ import annotations

from pathlib import Path

import pytest
from playwright.sync_api import Browser, expect

from ._dashboard_browser import browser
from .test_option_values import ASKED, FILLER, asked_for, asking_app, start

__all__ = ["browser"]  # the fixture, used by name


@pytest.mark.parametrize("javascript", [True, False], ids=["script", "no-script"])
@pytest.mark.parametrize("agent", ["few", "many"], ids=["buttons", "menu"])
def test_an_option_id_with_a_line_break_is_answered_from_the_page(
    browser: Browser, tmp_path: Path, agent: str, javascript: bool
) -> None:
    """`options=["Ship now\\n(costs $20)", "Wait"]`: the button posted "Ship now\\r\\n(costs
    $20)" (a form sends each line break as CRLF) and the server refused it as no option of the
    request, so the question could not be answered from the dashboard."""
    with asking_app(tmp_path) as (base, answered):
        context = browser.new_context(
            viewport={"width": 1280, "height": 900}, base_url=base, java_script_enabled=javascript
        )
        try:
            p = context.new_page()
            p.set_default_timeout(10_000)
            p.goto("/_signoff/login")
            p.fill("input[name=token]", "alice-token")
            p.click("button[type=submit]")
            expect(p.locator("h1")).to_have_text("Approval queue")
            for at, option_id in enumerate(ASKED):
                sid, rid = start(base, agent)
                p.goto(f"/_signoff/sessions/{sid}")
                card = p.locator(f'[data-request-id="{rid}"]')
                if agent == "many":
                    menu = card.get_by_label(f"Choose one of {len(ASKED) + len(FILLER)}")
                    menu.select_option(index=at + 1)  # after "Choose…"
                    send = card.get_by_role("button", name="Answer")
                else:
                    send = card.locator("button.option").nth(at)
                if javascript:
                    send.click()
                    expect(card).to_contain_text("Answered")
                else:
                    with p.expect_navigation():
                        send.click()
                    expect(p.locator(f'[data-request-id="{rid}"] form')).to_have_count(0)
                assert asked_for(base, sid, answered) == option_id, p.content()[-2000:]
        finally:
            context.close()
