"""Right-to-left items in a real browser: two Hebrew tool names a model called, listed in a
trace row's summary, read in the order they were called (left to right), not merged into one
right-to-left run that shows the second first."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from playwright.sync_api import Browser, Page, expect

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard_browser import browser
from .test_dashboard_bidi import TOKENS, _session, refund
from .test_server_common import running

__all__ = ["browser"]  # the fixture, used by name

_LEFT_OF = """([root, first, second]) => {
    // The left edge of where `text` shows inside `root`, whatever elements hold it.
    const left = (text) => {
        const walker = document.createTreeWalker(root, NodeFilter.SHOW_TEXT);
        for (let node = walker.nextNode(); node; node = walker.nextNode()) {
            const at = node.data.indexOf(text);
            if (at >= 0) {
                const range = document.createRange();
                range.setStart(node, at);
                range.setEnd(node, at + text.length);
                return range.getBoundingClientRect().left;
            }
        }
        throw new Error("not shown: " + text);
    };
    return left(first) < left(second);
}"""


def _in_order(page: Page, selector: str) -> bool:
    root = page.locator(selector).first.element_handle()
    return bool(page.evaluate(_LEFT_OF, [root, "עזרה", "חיפוש"]))


def test_two_right_to_left_names_in_a_summary_keep_their_order(
    browser: Browser, tmp_path: Path
) -> None:
    # In a thread: a test's Playwright marks this thread's event loop as running.
    with ThreadPoolExecutor(1) as pool:
        store, sid = pool.submit(_session, tmp_path).result()
    agent = so.Agent(name="desk", model=so.models.Scripted([]), tools=[refund, so.ask_question()])
    app = create_app(so.Runtime([agent], store=store), auth=TokenAuth(TOKENS))
    with running(app) as base:
        context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=base)
        try:
            page = context.new_page()
            page.set_default_timeout(10_000)
            page.goto("/_signoff/login")
            page.fill("input[name=token]", "dana-token")
            page.click("button[type=submit]")
            expect(page.locator("h1")).to_have_text("Approval queue")
            page.goto(f"/_signoff/sessions/{sid}")
            row = "summary:has-text('calls')"
            expect(page.locator(row).first).to_be_visible()
            assert _in_order(page, row)
            # The same words unisolated are one right-to-left run: the second shows first.
            page.set_content('<p id="bare">calls refund, עזרה, חיפוש</p>')
            assert not _in_order(page, "#bare")
        finally:
            context.close()
