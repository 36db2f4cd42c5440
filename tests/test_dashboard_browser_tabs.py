"""Dashboard tabs in a real browser: a hidden tab holds no live stream, so however many are open
the next page still loads (a browser opens 6 connections to a host over HTTP/1.1), and a tab
shown again opens its stream and reads what changed while it was hidden."""

from __future__ import annotations

from playwright.sync_api import Page, expect

from ._dashboard_browser import answer, base, browser, page, start

__all__ = ["base", "browser", "page"]  # the fixtures, used by name

# The page's `document.visibilityState` made what the test says, with the event a browser fires
# when a tab is hidden or shown: Playwright's pages of one context are all "visible".
SHOW = """(state) => {
  Object.defineProperty(document, "visibilityState", { configurable: true, get: () => state });
  Object.defineProperty(document, "hidden", { configurable: true, get: () => state === "hidden" });
  document.dispatchEvent(new Event("visibilitychange"));
}"""


def show(p: Page, state: str) -> None:
    p.evaluate(SHOW, state)


def test_hidden_tabs_hold_no_stream_so_a_seventh_page_loads(page: Page, base: str) -> None:
    """Every queue and session page kept its EventSource open while its tab was hidden: with six
    dashboard tabs open, a seventh page never loaded and an answer posted in a tab hung."""
    sids = [start(base)["session_id"] for _ in range(6)]
    expect(page.locator("#live-dot.on")).to_be_attached()  # the queue's tab, shown: 1 stream
    tabs = []
    for sid in sids[:5]:
        tab = page.context.new_page()
        tab.goto(f"/_signoff/sessions/{sid}")
        expect(tab.locator("#live-dot.on")).to_be_attached()
        show(tab, "hidden")
        tabs.append(tab)

    seventh = page.context.new_page()
    seventh.goto(f"/_signoff/sessions/{sids[5]}", timeout=20_000)
    for tab in tabs:  # their streams closed, as their dots say (not "Reconnecting…": none is tried)
        expect(tab.locator("#live-dot.on")).to_have_count(0)
        expect(tab.locator("#live-status")).to_have_text("")
    expect(seventh.locator("#live-dot.on")).to_be_attached()
    card = seventh.locator("[data-request-id]")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".result-note")).to_contain_text("Approved")

    # A tab shown again opens its stream, and shows the request answered while it was hidden.
    hidden = tabs[0]
    rid = hidden.locator("[data-request-id]").get_attribute("data-request-id")
    assert rid is not None
    answer(base, sids[0], rid)
    expect(hidden.locator("[data-request-id]")).to_have_count(1)  # no stream: not seen yet
    show(hidden, "visible")
    expect(hidden.locator("#live-dot.on")).to_be_attached()
    expect(hidden.locator("[data-request-id]")).to_have_count(0)


def test_a_page_opened_in_a_hidden_tab_opens_its_stream_when_shown(page: Page, base: str) -> None:
    """A page loaded in a background tab opens no stream until its tab is shown."""
    start(base)
    tab = page.context.new_page()
    streams: list[str] = []
    tab.on("request", lambda r: streams.append(r.url) if r.url.endswith("/stream") else None)
    tab.add_init_script(
        'Object.defineProperty(document, "visibilityState", {get: () => "hidden", '
        "configurable: true});"
    )
    tab.goto("/_signoff/")
    expect(tab.locator("[data-request-id]")).to_have_count(1)
    tab.wait_for_timeout(500)
    assert streams == []
    expect(tab.locator("#live-dot.on")).to_have_count(0)
    show(tab, "visible")
    expect(tab.locator("#live-dot.on")).to_be_attached()
    assert len(streams) == 1
