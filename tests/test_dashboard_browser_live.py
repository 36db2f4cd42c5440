"""The dashboard's live pages in a real browser converge to the store's truth: a request
answered elsewhere leaves the page whenever it was answered, and however the page's reads of
the queue come back; a session that expires while its page is open shows it, and an answer to
its request is told it is closed."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, Request, Route, expect

from signoff.server import _page_data

from ._dashboard_browser import base, browser, expiring, page, start
from .test_server_common import PLAIN, auth

__all__ = ["base", "browser", "page"]  # the fixtures, used by name


def deny(base: str, body: dict[str, Any]) -> None:
    """Deny the session's open request over the API: answered elsewhere than the page."""
    rid = body["pending"][0]["id"]
    r = httpx.post(
        f"{base}/v1/sessions/{body['session_id']}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "cancel"}]},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 200, r.text


def test_a_request_answered_before_the_stream_opened_leaves_the_page(page: Page, base: str) -> None:
    """The queue's first live event only noted the queue's version, taken for the page's: a
    request answered between the page's rendering and its stream's opening stayed on the page,
    with its buttons, until the queue changed again."""
    body = start(base)
    rid = body["pending"][0]["id"]
    opened: list[str] = []

    def late(route: Route) -> None:
        if not opened:  # the first connection only: answered while the page loads
            deny(base, body)
        opened.append(route.request.url)
        route.continue_()

    page.route("**/_signoff/stream", late)
    page.goto("/_signoff/")
    expect(page.locator("#live-dot.on")).to_be_attached()
    expect(page.locator(f"[data-request-id='{rid}']")).to_have_count(0)
    expect(page.get_by_text("All caught up")).to_be_visible()
    expect(page.locator(".page-head .sub")).to_have_text("0 open requests · updates live")


def test_a_slow_read_of_the_queue_does_not_bring_an_answered_request_back(
    page: Page, base: str
) -> None:
    """Each live event fetched the queue's cards anew, and each answer was merged as it came:
    a read overtaken by a later one (a slow server, another connection) brought back a request
    answered meanwhile, with its buttons, until the queue changed again."""
    first, second = start(base), start(base)
    gone = page.locator(f"[data-request-id='{second['pending'][0]['id']}']")
    page.goto("/_signoff/")
    expect(page.locator("#live-dot.on")).to_be_attached()
    expect(gone).to_have_count(1)
    held: list[tuple[Route, Any]] = []

    def slow(route: Route) -> None:
        if held:
            route.continue_()
        else:  # read now, answered late: the queue as it was, second request still open
            held.append((route, route.fetch()))

    page.route("**/_signoff/fragments/queue*", slow)
    deny(base, first)
    for _ in range(200):
        if held:
            break
        page.wait_for_timeout(50)
    assert held, "the page did not read the queue after a request was answered"
    deny(base, second)
    expect(gone).to_have_count(0)  # a later read, answered at once, shows the queue empty
    route, response = held[0]
    route.fulfill(response=response)
    page.wait_for_timeout(1000)  # the slow read's answer arrives
    expect(gone).to_have_count(0)
    expect(page.get_by_text("All caught up")).to_be_visible()  # once


def test_a_session_page_open_when_its_session_expires_offers_no_answer(
    browser: Browser, tmp_path: Path
) -> None:
    """A session's stream ends with `stream.end` the moment its TTL passes, before anything
    records the expiry, and the page closed it there: it still called the session waiting and
    offered Approve and Deny for a request its expiry had closed, until reloaded."""
    with expiring(browser, tmp_path) as (p, clock, url):
        body = start(url, "desk")
        p.goto(f"/_signoff/sessions/{body['session_id']}")
        expect(p.locator("#live-dot.on")).to_be_attached()
        card = p.locator(f"[data-request-id='{body['pending'][0]['id']}']")
        expect(card.get_by_role("button", name="Approve")).to_be_visible()
        clock.advance(120)  # past the session's TTL (60 s)
        expect(p.locator("#live-dot.on")).to_have_count(0)  # the stream ended
        expect(card).to_have_count(0)
        expect(p.locator("[data-session-status]")).to_have_text("failed")
        expect(p.locator("#trace")).to_contain_text("session_expired")
        # The message box goes too, as a reload shows: the session takes no more messages.
        expect(p.locator("#send")).to_have_count(0)
        expect(p.locator("#send-expired")).to_contain_text("Start a new conversation")


def test_answering_a_request_whose_session_expired_offers_no_more_buttons(
    browser: Browser, tmp_path: Path
) -> None:
    """An answer to a request whose session had expired while its form was open (the page's
    live updates lost) showed the 410 as an error beside the buttons, which were offered again
    though every press could only fail the same way; the form goes, as for a closed request."""
    with expiring(browser, tmp_path) as (p, clock, url):
        body = start(url, "desk")
        p.route("**/_signoff/stream", lambda route: route.abort())  # no live removal
        p.goto("/_signoff/")
        card = p.locator(f"[data-request-id='{body['pending'][0]['id']}']")
        card.locator("input[name=text]").fill("ok")
        clock.advance(120)  # past the session's TTL (60 s)
        card.get_by_role("button", name="Approve").click()
        expect(card.locator(".result-note")).to_have_text(
            f"session {body['session_id']!r} expired. Nothing was changed."
        )
        expect(card.get_by_role("button")).to_have_count(0)
        expect(card.locator(".result-note")).to_be_focused()  # the keyboard's place, read out


@pytest.mark.parametrize("where", ["queue", "session"])
def test_a_stream_refused_on_reconnecting_says_the_sign_in_ended(
    page: Page, base: str, where: str
) -> None:
    """A page's stream dropped (a laptop asleep, a proxy restarting) and the sign-in ended
    meanwhile: the browser's reconnect was refused (sent to the sign-in form, or a 401), and it
    gave up in silence, leaving a page that followed nothing, its buttons offered as if live.
    The page now reads itself once more, and says to sign in again."""
    body = start(base)
    rid = body["pending"][0]["id"]
    dropping = [True]

    def drop(route: Route) -> None:
        if dropping[0]:  # the connection ends at once: the browser reconnects, again and again
            route.fulfill(status=200, content_type="text/event-stream", body="retry: 200\n\n")
        else:
            route.continue_()

    if where == "queue":
        page.route("**/_signoff/stream", drop)
        page.goto("/_signoff/")
    else:
        page.route("**/v1/sessions/*/events*", drop)
        page.goto(f"/_signoff/sessions/{body['session_id']}")
    expect(page.locator(f"[data-request-id='{rid}']")).to_have_count(1)
    other = page.context.new_page()
    other.goto("/_signoff/tools")
    other.get_by_role("button", name="Sign out").click()
    expect(other).to_have_url(re.compile("/_signoff/login"))
    other.close()
    dropping[0] = False
    expect(page.locator("#signed-out")).to_contain_text("Sign in")


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "no-js"])
def test_the_queue_says_it_updates_live_only_when_it_does(
    browser: Browser, base: str, javascript: bool
) -> None:
    """Without JavaScript the queue's heading still said it "updates live", and a reviewer
    waited for requests that would only show on a reload."""
    context = browser.new_context(base_url=base, java_script_enabled=javascript)
    p = context.new_page()
    p.set_default_timeout(10_000)
    p.goto("/_signoff/login")
    p.fill("input[name=token]", "alice-token")
    p.click("button[type=submit]")
    heading = p.locator(".page-head .sub")
    if javascript:
        expect(heading).to_have_text("0 open requests · updates live")
    else:
        expect(heading).to_have_text("0 open requests · reload to see new ones")
    context.close()


def test_the_pager_follows_the_queue_as_it_shrinks_and_grows(
    page: Page, base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pager was drawn once, with the page: when the queue shrank below the page shown, the
    live read showed the last page's cards under "Page 2 of 2", and a queue grown past one page
    offered no way to the next. It now says what the cards are, and the address says it too."""
    monkeypatch.setattr(_page_data, "PAGE_SIZE", 2)
    bodies = [start(base) for _ in range(3)]
    page.goto("/_signoff/?page=2")
    expect(page.locator("#live-dot.on")).to_be_attached()
    pager = page.locator(".pager")
    expect(pager).to_contain_text("Page 2 of 2")
    expect(page.locator("[data-request-id]")).to_have_count(1)
    deny(base, bodies[0])
    deny(base, bodies[1])  # one request left: one page, shown as page 1
    expect(page.locator(".page-head .sub")).to_contain_text("1 open request ")
    expect(page.locator(f"[data-request-id='{bodies[2]['pending'][0]['id']}']")).to_have_count(1)
    expect(pager).to_have_count(0)
    expect(page).to_have_url(f"{base}/_signoff/")
    # With one page left, no "Page 1 of 1" told the reviewer their page 2 was gone: a note does,
    # kept by the live reads of page 1 that follow, gone once another page is shown.
    note = page.locator(".pager-note")
    expect(note).to_have_text("Page 2 is gone (fewer are open now): showing page 1.")
    more = [start(base) for _ in range(2)]  # three again: page 1 of 2, and a way to the next
    expect(page.locator("[data-request-id]")).to_have_count(2)
    expect(pager).to_contain_text("Page 1 of 2")
    expect(note).to_have_count(1)
    pager.get_by_role("link", name="Next →").click()
    expect(page).to_have_url(f"{base}/_signoff/?page=2")
    expect(page.locator(f"[data-request-id='{more[1]['pending'][0]['id']}']")).to_have_count(1)
    expect(pager).to_contain_text("Page 2 of 2")
    expect(note).to_have_count(0)


# The pauses the page's script sets before it tries a stream again, in order: its only timers
# of a random length (the others' are whole milliseconds).
PAUSES = """
const setTimer = window.setTimeout;
window.pauses = [];
window.setTimeout = (f, ms, ...args) => {
  if (!Number.isInteger(ms)) window.pauses.push(ms);
  return setTimer(f, ms, ...args);
};
"""


def _stream(page: Page, base: str, where: str, answer: Callable[[Route], None]) -> dict[str, Any]:
    """Open the queue's page, or a session's, with its stream's requests answered by `answer`."""
    body = start(base)
    if where == "queue":
        page.route("**/_signoff/stream", answer)
        page.goto("/_signoff/")
    else:
        page.route("**/v1/sessions/*/events*", answer)
        page.goto(f"/_signoff/sessions/{body['session_id']}")
    return body


@pytest.mark.parametrize("where", ["queue", "session"])
def test_a_stream_the_browser_gave_up_on_is_opened_again_with_a_backoff(
    page: Page, base: str, where: str
) -> None:
    """A proxy's 502 (or a 429) on reconnecting: the browser gives up on an EventSource for
    good, and the page, read once more, followed nothing until reloaded. It says it is
    reconnecting and tries again (a HEAD, which tells the status the browser hides), each pause
    longer than the last, and is live again once the stream is back."""
    tried: list[tuple[str, float]] = []

    def refuse(route: Route) -> None:
        tried.append((route.request.method, time.monotonic()))
        if len(tried) <= 3:  # the stream and the next two tries fail
            route.fulfill(status=502, content_type="text/plain", body="Bad Gateway")
        else:
            route.continue_()

    page.add_init_script(PAUSES)
    body = _stream(page, base, where, refuse)
    status = page.locator("#live-status")
    expect(status).to_have_text("Reconnecting…")
    expect(page.locator("#live-dot.on")).to_be_attached(timeout=20_000)
    expect(status).to_have_text("")
    assert [m for m, _ in tried] == ["GET", "HEAD", "HEAD", "HEAD", "GET"], tried
    # Backing off, not hammering: each pause the page set is twice the last (1 s, 2 s, 4 s, each
    # give or take a fifth), and was waited out. The pauses are the script's, not the measured
    # gaps, which a busy machine stretches (a page read before the first try, say).
    pauses = [ms / 1000 for ms in page.evaluate("window.pauses")]
    assert len(pauses) == 3, pauses
    for n, (pause, (_, a), (_, b)) in enumerate(zip(pauses, tried, tried[1:], strict=False)):
        assert 0.8 * 2**n <= pause <= 1.2 * 2**n, pauses
        assert b - a >= pause - 0.05, (pauses, tried)
    if where == "queue":
        later = start(base)  # live again: a new request shows without a reload
        expect(page.locator(f"[data-request-id='{later['pending'][0]['id']}']")).to_have_count(1)
    else:
        deny(base, body)  # live again: the answer shows without a reload
        expect(page.locator("[data-session-status]")).not_to_have_text("waiting")


def test_a_stream_that_is_gone_is_not_tried_again(page: Page, base: str) -> None:
    """A 410 or 404 is a stream that will never come back (the session expired, or is gone):
    one HEAD tells it, and the page stops trying rather than ask every 30 s."""
    tried: list[str] = []

    def gone(route: Route) -> None:
        tried.append(route.request.method)
        route.fulfill(status=410, content_type="application/json", body="{}")

    _stream(page, base, "session", gone)
    expect(page.locator("#live-status")).to_have_text("Reconnecting…")
    expect(page.locator("#live-status")).to_have_text("", timeout=5_000)
    page.wait_for_timeout(3_000)
    assert tried == ["GET", "HEAD"]


def test_a_sessions_pager_follows_its_open_requests(
    page: Page, base: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A session's open requests are paged as the queue's are (a session that asked 5,000 at
    once drew them all, 13 MB): a live page reads the page it shows, and once fewer are open
    shows the last, as its pager and address say."""
    monkeypatch.setattr(_page_data, "PAGE_SIZE", 1)
    body = start(base, "batch")
    first, second = (r["id"] for r in body["pending"])
    page.goto(f"/_signoff/sessions/{body['session_id']}?page=2")
    expect(page.locator("#live-dot.on")).to_be_attached()
    expect(page.locator(".pager")).to_contain_text("Page 2 of 2")
    expect(page.locator("[data-pending-total]")).to_have_text("2")
    expect(page.locator(f"[data-request-id='{second}']")).to_have_count(1)
    deny(base, {"session_id": body["session_id"], "pending": [{"id": first}]})
    expect(page.locator("[data-pending-total]")).to_have_text("1")
    expect(page.locator(".pager")).to_have_count(0)
    expect(page).to_have_url(f"{base}/_signoff/sessions/{body['session_id']}")
    expect(page.locator(f"[data-request-id='{second}']")).to_have_count(1)
    expect(page.locator(f"[data-request-id='{first}']")).to_have_count(0)


@pytest.mark.parametrize("where", ["queue", "session"])
def test_a_store_the_server_cannot_reach_is_said_and_tried_again(
    page: Page, base: str, where: str
) -> None:
    """A 503 (the store's file deleted, its database down) only said "Reconnecting…" beside
    the live dot while the page asked again every 30 s, forever. A banner now says the server
    cannot reach its store and when it tries again, and goes once a stream opens again."""
    tried: list[tuple[str, float]] = []

    def down(route: Route) -> None:
        tried.append((route.request.method, time.monotonic()))
        if len(tried) <= 3:  # the stream and the next two tries
            route.fulfill(status=503, content_type="application/json", body="{}")
        else:
            route.continue_()

    _stream(page, base, where, down)
    banner = page.locator("#store-down[role=alert]")
    expect(banner).to_contain_text("The server cannot reach its store")
    expect(banner).to_contain_text("Trying again in about")
    expect(page.locator("#live-dot.on")).to_be_attached(timeout=20_000)
    expect(banner).to_have_count(0)
    assert [m for m, _ in tried] == ["GET", "HEAD", "HEAD", "HEAD", "GET"], tried


@pytest.mark.parametrize("where", ["queue", "session"])
def test_a_stream_ended_by_a_store_gone_is_said_and_tried_again(
    page: Page, base: str, where: str
) -> None:
    """A stream the server ended as its store is gone (`stream.end`, 503) left the page still,
    with nothing said: only a restart mends that, which the page now keeps trying to see,
    saying why it is not updated."""
    tried: list[str] = []
    end = {"status": 503, "error": {"code": "store_gone", "message": "the file was replaced"}}

    def gone(route: Route) -> None:
        tried.append(route.request.method)
        if len(tried) == 1:
            body = f"event: stream.end\ndata: {json.dumps(end)}\n\n"
            route.fulfill(status=200, content_type="text/event-stream", body=body)
        else:
            route.continue_()

    _stream(page, base, where, gone)
    banner = page.locator("#store-down[role=alert]")
    expect(banner).to_contain_text("The server cannot reach its store (the file was replaced)")
    expect(page.locator("#live-dot.on")).to_be_attached(timeout=20_000)
    expect(banner).to_have_count(0)
    assert tried[:3] == ["GET", "HEAD", "GET"], tried


def test_a_store_that_stays_gone_is_asked_ever_more_rarely(page: Page, base: str) -> None:
    """A store gone for good (a 503 on every try) was asked every 30 s for as long as the page
    stayed open; the pause now doubles on to 5 minutes (20 minutes of the browser's clock here:
    a dozen tries, not forty), and the banner says when the next one is."""
    tried: list[str] = []

    def down(route: Route) -> None:
        tried.append(route.request.method)
        route.fulfill(status=503, content_type="application/json", body="{}")

    page.clock.install()
    _stream(page, base, "queue", down)
    banner = page.locator("#store-down")
    for _ in range(80):  # 20 minutes, each try's fetch answered between the clock's steps
        page.clock.run_for(15_000)
        page.wait_for_timeout(40)
    assert 8 <= tried.count("HEAD") <= 14, tried
    expect(banner).to_contain_text(re.compile(r"Trying again in about [4-6] minutes\."))


def test_an_answer_whose_response_comes_after_the_live_update_keeps_its_note(
    page: Page, base: str
) -> None:
    """The live update saying a request closed can reach the page before the answer's own
    response (a turn that takes a while to resume): the card stays until its note is shown,
    where it was removed 300 ms after that update and the reviewer never saw "Approved"."""
    expect(page.locator("#live-dot.on")).to_be_attached()
    rid = start(base)["pending"][0]["id"]
    card = page.locator(f"[data-request-id='{rid}']")
    expect(card).to_be_visible()

    def late(route: Route) -> None:
        response = route.fetch()  # the approval is applied; its response is held back
        time.sleep(2)  # the browser meanwhile gets the live update (Python alone waits)
        route.fulfill(response=response)

    page.route(f"**/requests/{rid}/respond", late)
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".result-note")).to_have_text(
        "Approved — the run is now completed.", timeout=10_000
    )
    expect(card).to_have_count(0)  # then it leaves the queue, as any answered card


def test_a_session_page_whose_events_were_rewritten_is_read_anew(page: Page, base: str) -> None:
    """A stream ended as the store lost events the page shows (`events_rewritten`: a crash, a
    restored copy, then the session ran on from before them) had the page read on after the seq
    it had, appending what follows events it never showed. It reloads, showing the session as
    the store now has it."""
    tried: list[str] = []
    end = {
        "status": 409,
        "error": {"code": "events_rewritten", "message": "lost", "session_id": "s", "seq": 3},
    }

    def rewritten(route: Route) -> None:
        tried.append(route.request.method)
        if len(tried) == 1:
            body = f"event: stream.end\ndata: {json.dumps(end)}\n\n"
            route.fulfill(status=200, content_type="text/event-stream", body=body)
        else:
            route.continue_()

    # Counted as the page's document requests, not its `load` events: the stream's end can come
    # before the first load event, and a reload then leaves one `load` for two reads (seen once
    # in CI).
    reads: list[str] = []

    def read(request: Request) -> None:
        if request.is_navigation_request() and request.resource_type == "document":
            reads.append(request.url)

    page.on("request", read)
    _stream(page, base, "session", rewritten)
    for _ in range(600):  # 30 s: a loaded CI machine once took more than 10 s to reload
        if len(reads) >= 2:
            break
        page.wait_for_timeout(50)
    expect(page.locator("#live-dot.on")).to_be_attached(timeout=20_000)  # and live again
    assert len(reads) == 2 and reads[0] == reads[1], (reads, tried)  # read anew once
    assert tried[:2] == ["GET", "GET"], tried


def test_a_click_as_a_card_leaves_does_not_answer_the_card_slid_under_it(
    page: Page, base: str
) -> None:
    """A reviewer's pointer rested on Approve of one refund while another tab denied it: the
    live update removed the card, the next card's Approve slid up under the pointer, and the
    click meant for the first approved the second (order 2210, $149.50). A pointer's press on
    a button that moved under it a moment before sends nothing and says so; a second press
    then answers."""
    first, batch = start(base), start(base, "batch")
    moved_rid = batch["pending"][0]["id"]
    page.goto("/_signoff/")
    expect(page.locator("#live-dot.on")).to_be_attached()
    leaving = page.locator(f"[data-request-id='{first['pending'][0]['id']}']")
    box = leaving.get_by_role("button", name="Approve").bounding_box()
    assert box is not None
    x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
    page.mouse.move(x, y)
    deny(base, first)
    expect(leaving).to_have_count(0)
    slid = page.locator(f"[data-request-id='{moved_rid}']")
    assert slid.get_by_role("button", name="Approve").bounding_box() == box  # under the pointer
    page.mouse.click(x, y)
    expect(slid.locator(".form-error")).to_contain_text("nothing was sent")
    page.wait_for_timeout(500)
    pending = [
        r["id"]
        for r in httpx.get(
            f"{base}/v1/sessions/{batch['session_id']}", headers=auth("alice-token"), verify=PLAIN
        ).json()["pending"]
    ]
    assert moved_rid in pending  # not approved
    page.wait_for_timeout(800)  # it stays put: a press now is meant
    page.mouse.click(x, y)
    expect(slid.locator(".result-note")).to_contain_text("Approved")


NOTES = """
window.notes = [];
new MutationObserver((changes) => {
  changes.forEach((c) => c.addedNodes.forEach((n) => {
    if (n.classList && n.classList.contains("result-note")) window.notes.push(n.textContent);
  }));
}).observe(document, { childList: true, subtree: true });
"""


def test_an_answer_refused_as_closed_first_is_not_then_said_closed_before_it(
    page: Page, base: str
) -> None:
    """A reviewer's Approve on a card another tab had denied said "... Nothing was changed";
    the queue's next live update then added "Closed elsewhere ... before you answered", which
    contradicts it (the note had the focus, so the card counted as being written in). The
    card keeps its one note, and leaves."""
    held = [True]

    def stream(route: Route) -> None:
        if held[0]:
            route.abort()  # no live update until the answer's note is shown
        else:
            route.continue_()

    page.add_init_script(NOTES)
    page.route("**/_signoff/stream", stream)
    first = start(base)
    page.goto("/_signoff/")
    card = page.locator(f"[data-request-id='{first['pending'][0]['id']}']")
    card.locator("input[name=text]").fill("looks right")
    deny(base, first)
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".result-note")).to_contain_text("Nothing was changed")
    held[0] = False
    second = start(base)  # the live update that comes next brings this one's card
    arrived = page.locator(f"[data-request-id='{second['pending'][0]['id']}']")
    expect(arrived).to_be_attached(timeout=30_000)
    notes: list[str] = page.evaluate("window.notes")
    assert len(notes) == 1 and "Nothing was changed" in notes[0], notes
    expect(card).to_have_count(0, timeout=15_000)  # and it leaves
