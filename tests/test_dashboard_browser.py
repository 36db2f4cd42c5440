"""The dashboard in a real browser (Playwright for Python driving Debian's Chromium): reviewers
approve, edit, deny and answer live, across tabs, sign-ins and keyboards."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard_browser import base, browser, page, session, settled, start
from .test_server_common import PLAIN, ROOT, TOKENS, auth, running, tool_output

__all__ = ["base", "browser", "page"]  # the fixtures, used by name


def test_reviewer_approves_a_refund_live(page: Page, base: str, tmp_path: Path) -> None:
    expect(page.get_by_text("All caught up")).to_be_visible()
    expect(page.locator("#live-dot.on")).to_be_attached()
    # the request arrives while the page is open: no reload
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    card = page.locator(f"[data-request-id='{rid}']")
    expect(card).to_be_visible()
    expect(card.locator(".tool-name")).to_have_text("issue_refund")
    expect(card.get_by_label("Tool input")).to_contain_text('"order_id": "1042"')
    expect(card.get_by_label("Tool input")).to_contain_text('"amount": 180.0')
    expect(card).to_contain_text("Alice (alice)")
    expect(card).to_contain_text("1,280 tokens · $0.0042")
    expect(page.locator("[data-live-total]")).to_have_text("1")

    # two more for a realistic screenshot of the queue
    start(base, "batch")
    expect(page.locator("[data-request-id]")).to_have_count(3)
    expect(page.locator("[data-live-total]")).to_have_text("3")
    shot = tmp_path / "queue.png"
    page.screenshot(path=str(shot), full_page=True, animations="disabled")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("SIGNOFF_UPDATE_SCREENSHOT"):
        (ROOT / "docs").mkdir(exist_ok=True)
        shutil.copy(shot, ROOT / "docs" / "queue.png")

    card.locator("input[name=text]").fill("Customer sent photos of the damage")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".result-note")).to_have_text("Approved — the run is now completed.")
    expect(card).to_have_count(0)  # it leaves the queue
    expect(page.locator("[data-live-total]")).to_have_text("2")

    state = session(base, sid)
    assert state["status"] == "idle" and state["turn"]["status"] == "completed"
    seen = tool_output(state["turn"]["text"])
    assert seen["result"] == {"order_id": "1042", "refunded": 180.0}
    assert seen["approval"]["reason"] == "Customer sent photos of the damage"
    record = httpx.get(
        f"{base}/v1/requests/{rid}", headers=auth("alice-token"), verify=PLAIN
    ).json()
    assert record["resolution"]["reason"] == "Customer sent photos of the damage"

    # the audit page lists the settlement
    page.goto("/_signoff/audit")
    row = page.locator("#audit tbody tr").first
    expect(row).to_contain_text("issue_refund")
    expect(row).to_contain_text("approved")
    expect(row).to_contain_text("Customer sent photos of the damage")


def test_reviewer_edits_the_amount_then_approves(page: Page, base: str) -> None:
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    card = page.locator(f"[data-request-id='{rid}']")
    card.get_by_text("Edit arguments before approving").click()
    expect(card.locator("pre.schema")).to_contain_text('"amount"')  # the schema is shown
    box = card.locator("textarea[name=edited_input]")
    box.fill(box.input_value().replace("180.0", "120"))
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".result-note")).to_have_text(
        "Approved with edited arguments — the run is now completed."
    )
    text = session(base, sid)["turn"]["text"]
    assert '"result": {"order_id": "1042", "refunded": 120.0}' in text  # ran with the edit
    assert "a reviewer edited the arguments" in text  # and the model is told so


def test_deny_with_a_reason_reaches_the_model(page: Page, base: str) -> None:
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    page.reload()
    card = page.locator(f"[data-request-id='{rid}']")
    card.locator("input[name=text]").fill("Refunds over 100 need a manager")
    card.get_by_role("button", name="Deny").click()
    expect(card.locator(".result-note")).to_contain_text("Denied")
    text = session(base, sid)["turn"]["text"]
    assert text.startswith("tool error: ")
    assert "Refunds over 100 need a manager" in text


def test_session_page_follows_the_run_live(page: Page, base: str) -> None:
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    page.goto(f"/_signoff/sessions/{sid}")
    expect(page.locator("[data-session-status]")).to_have_text("waiting")
    expect(page.locator("#trace li")).to_have_count(5)
    expect(page.locator(f"#session-pending [data-request-id='{rid}']")).to_be_visible()
    # someone approves from elsewhere (the API); the page follows over SSE
    r = httpx.post(
        f"{base}/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    )
    assert r.json()["status"] == "completed"
    expect(page.locator("#trace li .badge.type", has_text="turn.completed")).to_be_visible()
    expect(page.locator("[data-session-status]")).to_have_text("idle")
    expect(page.locator(f"#session-pending [data-request-id='{rid}']")).to_have_count(0)
    expect(page.locator("blockquote.reply")).to_contain_text("refunded")
    seqs = page.locator("#trace li").evaluate_all("els => els.map(e => Number(e.dataset.seq))")
    assert seqs == list(range(1, len(seqs) + 1))


def test_tools_page_shows_approval_settings(page: Page) -> None:
    page.goto("/_signoff/tools")
    refund = page.locator("tr", has_text="issue_refund").first
    expect(refund.locator(".badge").first).to_have_text("Conditional")
    lookup = page.locator("tr", has_text="lookup_order")
    expect(lookup.locator(".badge").first).to_have_text("Never")


def test_reviewer_answers_a_question(page: Page, base: str) -> None:
    body = start(base, "helper")
    sid, rid = body["session_id"], body["pending"][0]["id"]
    card = page.locator(f"[data-request-id='{rid}']")
    expect(card.locator(".tool-name")).to_have_text("Which size should the replacement be?")
    expect(card.locator(".badge").first).to_have_text("question")
    card.get_by_role("button", name="Large").click()
    expect(card.locator(".result-note")).to_have_text("Answered — the run is now completed.")
    assert '"answer": "Large"' in session(base, sid)["turn"]["text"]


def test_a_conversation_started_and_answered_from_the_browser(page: Page, base: str) -> None:
    page.goto("/_signoff/new")
    page.select_option("select[name=agent]", "helper")
    page.fill("textarea[name=message]", "My shoes are too small")
    page.get_by_role("button", name="Start").click()
    expect(page).to_have_url(re.compile(r"/_signoff/sessions/ses_\w+$"))
    expect(page.locator("[data-session-status]")).to_have_text("waiting")
    pending = page.locator("#session-pending [data-request-id]")
    expect(pending.locator(".tool-name")).to_have_text("Which size should the replacement be?")
    # a typed message that names an option answers the question; the trace follows live
    page.fill("#send textarea[name=message]", "Large")
    page.locator("#send").get_by_role("button", name="Send").focus()
    page.keyboard.press("Enter")
    expect(page.locator("#trace li .badge.type", has_text="turn.completed")).to_be_visible()
    expect(page.locator("[data-session-status]")).to_have_text("idle")
    expect(pending).to_have_count(0)
    expect(page.locator("blockquote.reply")).to_contain_text('"answer": "Large"')
    expect(page.locator("#send textarea")).to_have_value("")
    expect(page.locator("#send textarea")).to_be_focused()  # not lost with the disabled button


def test_a_message_to_someone_elses_turn_says_it_waits(page: Page, base: str) -> None:
    """Alice may see Bob's session (one tenant), but his turn serves him: her message waits for
    its end, and the page says so instead of showing nothing."""
    r = httpx.post(
        f"{base}/v1/sessions",
        json={"agent": "support", "message": "Refund order 1042, it arrived broken"},
        headers=auth("bob-token"),
        timeout=10,
        verify=PLAIN,
    )
    sid = r.json()["session_id"]
    page.goto(f"/_signoff/sessions/{sid}")
    note = page.locator("#send .form-note")
    expect(note).to_be_hidden()
    page.fill("#send textarea[name=message]", "I can take this one")
    page.locator("#send").get_by_role("button", name="Send").click()
    expect(note).to_have_text(
        "Your message waits for the current turn to end; it then starts the next turn."
    )
    expect(page.locator("#send textarea")).to_have_value("")
    assert session(base, sid)["status"] == "waiting"


def test_a_page_left_from_another_sign_in_does_not_post(page: Page, base: str) -> None:
    """Alice's queue stays open while, in another tab, she signs out and Bob signs in: a click
    on the old page is refused (its token was made for Alice's sign-in) and says to reload."""
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    card = page.locator(f"[data-request-id='{rid}']")
    expect(card).to_be_visible()
    other = page.context.new_page()
    other.goto("/_signoff/")
    other.get_by_role("button", name="Sign out").click()
    expect(other).to_have_url(f"{base}/_signoff/login")
    other.fill("input[name=token]", "bob-token")
    other.click("button[type=submit]")
    expect(other.locator(".viewer-name")).to_contain_text("Bob")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".form-error")).to_contain_text("reload the page")
    assert session(base, sid)["pending"][0]["id"] == rid  # nothing was settled
    page.reload()
    expect(page.locator(".viewer-name")).to_contain_text("Bob")
    fresh = page.locator(f"[data-request-id='{rid}']")
    expect(fresh.locator("[data-not-allowed]")).to_contain_text("bob may not settle it")
    expect(fresh.get_by_role("button")).to_have_count(0)  # Alice's request: not Bob's to answer
    r = httpx.post(
        f"{base}/v1/sessions",
        json={"agent": "support", "message": "Refund order 7"},
        headers=auth("bob-token"),
        timeout=10,
        verify=PLAIN,
    )
    mine = page.locator(f"[data-request-id='{r.json()['pending'][0]['id']}']")
    mine.get_by_role("button", name="Approve").click()  # Bob's own page posts (as Bob)
    expect(mine.locator(".result-note")).to_contain_text("Approved")


def test_a_filtered_queue_counts_its_own_requests_live(page: Page, base: str) -> None:
    """A queue filtered to one agent says how many of *its* requests are open, also after live
    updates; the navigation's badge counts the whole queue."""
    start(base)
    start(base, "batch")  # two more requests, of another agent
    page.goto("/_signoff/?agent=support")
    expect(page.locator("#live-dot.on")).to_be_attached()
    heading = page.locator(".page-head .sub")
    expect(page.locator("#queue-count")).to_have_text("3")
    expect(heading).to_have_text("1 open request · updates live")
    start(base, "batch")  # the filter hides these: the count stays
    expect(page.locator("#queue-count")).to_have_text("5")
    expect(heading).to_have_text("1 open request · updates live")
    start(base)  # one more of the filter's: the count follows, in the plural
    expect(page.locator("#queue [data-request-id]")).to_have_count(2)
    expect(heading).to_have_text("2 open requests · updates live")
    expect(page.locator("#queue-count")).to_have_text("6")


def request_record(base: str, rid: str) -> dict[str, Any]:
    r = httpx.get(
        f"{base}/v1/requests/{rid}", headers=auth("alice-token"), timeout=10, verify=PLAIN
    )
    body: dict[str, Any] = r.json()
    return body


@pytest.mark.parametrize("javascript", [True, False], ids=["js", "no-js"])
def test_enter_in_a_text_box_never_picks_an_action(
    browser: Browser, base: str, javascript: bool
) -> None:
    """Enter in a form's text box submits it with its first button: a reason typed to deny with
    approved the call, and a typed answer was dropped for the first option. Now Enter in a
    reason does nothing (Approve and Deny are a Tab away), and in an answer it sends the text."""
    context = browser.new_context(base_url=base, java_script_enabled=javascript)
    p = context.new_page()
    p.set_default_timeout(10_000)
    p.goto("/_signoff/login")
    p.fill("input[name=token]", "alice-token")
    p.click("button[type=submit]")
    expect(p.locator("h1")).to_have_text("Approval queue")
    rid = start(base)["pending"][0]["id"]
    qid = start(base, "helper")["pending"][0]["id"]
    p.goto("/_signoff/")
    reason = p.locator(f"[data-request-id='{rid}'] input[name=text]")
    reason.fill("Refunds over 100 need a manager")
    reason.press("Enter")
    answer = p.locator(f"[data-request-id='{qid}'] input[name=text]")
    answer.fill("Medium, please")
    answer.press("Enter")
    expect(p.locator(f"[data-request-id='{qid}']")).to_have_count(0)  # answered, gone
    assert request_record(base, qid)["resolution"]["answer"]["value"] == "Medium, please"
    assert request_record(base, rid)["status"] == "pending"  # not approved
    if javascript:
        expect(reason).to_have_value("Refunds over 100 need a manager")  # still typed
        card = p.locator(f"[data-request-id='{rid}']")
        settled(p, rid)  # the answered card's leaving shortened the page: this one slid down
        card.get_by_text("Edit arguments before approving").click()
        card.locator("textarea[name=edited_input]").fill("{")
        card.get_by_role("button", name="Approve").click()
        expect(card.locator(".form-error")).to_contain_text("not JSON")
        expect(card.locator("button[hidden]")).to_be_disabled()  # the buttons came back, not it
        reason.press("Enter")
        reason.press("Tab")
        p.keyboard.press("Tab")  # past Approve, to Deny
        expect(p.get_by_role("button", name="Deny")).to_be_focused()
        p.keyboard.press("Enter")
        expect(p.locator(f"[data-request-id='{rid}'] .result-note")).to_contain_text("Denied")
        assert request_record(base, rid)["resolution"]["reason"] == (
            "Refunds over 100 need a manager"
        )
    context.close()


def test_approving_what_another_tab_denied_says_it_is_closed(page: Page, base: str) -> None:
    """Two tabs show one request (their live updates lost): one denies, then the other approves.
    The second is told the request is closed and offered no more buttons; nothing changes."""
    rid = start(base)["pending"][0]["id"]
    page.route("**/_signoff/stream", lambda route: route.abort())  # no live removal
    page.reload()
    other = page.context.new_page()
    other.route("**/_signoff/stream", lambda route: route.abort())
    other.goto("/_signoff/")
    other.locator(f"[data-request-id='{rid}']").get_by_role("button", name="Deny").click()
    expect(other.locator(f"[data-request-id='{rid}'] .result-note")).to_contain_text("Denied")
    card = page.locator(f"[data-request-id='{rid}']")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".result-note")).to_contain_text("already settled")
    expect(card.get_by_role("button")).to_have_count(0)
    assert request_record(base, rid)["outcome"] == "cancelled"


def test_an_edit_a_response_policy_refuses_keeps_the_form(browser: Browser, tmp_path: Path) -> None:
    """A response policy refusing an edit removed the whole form: what the reviewer typed was
    lost and there was no way to correct it without a reload. The form stays, with the reason,
    and the corrected edit is then approved."""

    def no_bigger_edits(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
        edit = ctx.response.edited_input
        if edit is not None and edit.amount > ctx.request.tool_input.amount:
            return so.Rejected("an edit may only lower the amount")
        return so.Allowed()

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=no_bigger_edits))
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": amount}

    call = so.ToolCall(name="issue_refund", input={"order_id": "1042", "amount": 180})
    script = [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text="done")]
    agent = so.Agent(name="support", model=so.models.Scripted(script), tools=[issue_refund])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/edit.db", poll_interval=0.05)
    with running(create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05)) as url:
        rid = start(url)["pending"][0]["id"]
        context = browser.new_context(base_url=url, extra_http_headers=auth("alice-token"))
        p = context.new_page()
        p.set_default_timeout(10_000)
        p.goto("/_signoff/")
        card = p.locator(f"[data-request-id='{rid}']")
        card.get_by_text("Edit arguments before approving").click()
        box = card.locator("textarea[name=edited_input]")
        typed = box.input_value().replace("180.0", "900")
        box.fill(typed)
        card.get_by_role("button", name="Approve").click()
        expect(card.locator(".form-error")).to_contain_text("an edit may only lower the amount")
        expect(box).to_have_value(typed)
        assert request_record(url, rid)["status"] == "pending"
        box.fill(typed.replace("900", "120"))
        card.get_by_role("button", name="Approve").click()
        expect(card.locator(".result-note")).to_contain_text("Approved with edited arguments")
        context.close()


def test_double_clicking_start_starts_one_conversation(browser: Browser, tmp_path: Path) -> None:
    """The new-conversation form posted once per click: a double click on Start started the
    conversation twice (two runs, each free to call its tools). The second click is ignored."""

    def slow(conversation: list[so.Message]) -> so.ModelResponse:
        time.sleep(0.5)  # the first post is still being answered when the second click comes
        return so.ModelResponse(text="hello")

    agent = so.Agent(name="greeter", model=so.models.Scripted([slow], repeat_last=True))
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/start.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as url:
        context = browser.new_context(base_url=url, extra_http_headers=auth("alice-token"))
        p = context.new_page()
        p.set_default_timeout(10_000)
        p.goto("/_signoff/new")
        p.fill("textarea[name=message]", "hi")
        box = p.get_by_role("button", name="Start").bounding_box()
        assert box is not None
        x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
        p.mouse.click(x, y)
        p.mouse.click(x, y, delay=100)  # again, the page still showing while the first is sent
        expect(p).to_have_url(re.compile(r"/_signoff/sessions/ses_\w+$"))
        p.wait_for_timeout(1500)  # a second post would have been answered by now
        with sqlite3.connect(tmp_path / "start.db") as db:
            assert db.execute("select count(*) from sessions").fetchone() == (1,)
        context.close()


def test_a_keyboard_reviewer_goes_on_from_the_card_they_answered(page: Page, base: str) -> None:
    """Answering with the keyboard removed the focused button, then the card: the focus fell
    to the page's start, and the next Tab went back through the top bar and the filters. It
    stays in the queue: on the card's note, then on the card that follows. An answer refused
    (arguments that are not JSON) gave the focus back to no one either: the button has it."""
    first = start(base)["pending"][0]["id"]
    second = start(base)["pending"][0]["id"]
    page.reload()
    cards = page.locator("[data-request-id]")
    expect(cards).to_have_count(2)
    top = cards.first.get_attribute("data-request-id")
    after = second if top == first else first
    card = page.locator(f"[data-request-id='{top}']")
    card.get_by_text("Edit arguments before approving").click()
    card.locator("textarea[name=edited_input]").fill("{")
    card.get_by_role("button", name="Approve").focus()
    page.keyboard.press("Enter")
    expect(card.locator(".form-error")).to_contain_text("not JSON")
    expect(card.get_by_role("button", name="Approve")).to_be_focused()
    page.keyboard.press("Tab")
    expect(card.get_by_role("button", name="Deny")).to_be_focused()
    page.keyboard.press("Enter")
    note = page.locator(f"[data-request-id='{top}'] .result-note")
    expect(note).to_contain_text("Denied")
    expect(note).to_be_focused()
    expect(page.locator(f"[data-request-id='{top}']")).to_have_count(0)
    expect(page.locator(f"[data-request-id='{after}']")).to_be_focused()
    page.keyboard.press("Tab")
    inside = page.evaluate("() => document.activeElement.closest('[data-request-id]')?.id")
    assert inside == after


def test_approving_what_others_just_approved_says_it_was_theirs(page: Page, base: str) -> None:
    """A two-person approval settled by others while this page was stale: Approve here repeated
    their answer and the page said "Approved", as if it had been this reviewer's."""
    body = start(base, "treasury")
    rid = body["pending"][0]["id"]
    page.route("**/_signoff/stream", lambda route: route.abort())  # no live removal
    page.reload()
    vote = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
    for who in ("alice-token", "bob-token"):
        r = httpx.post(
            f"{base}/v1/sessions/{body['session_id']}/responses",
            json=vote,
            headers=auth(who),
            timeout=10,
            verify=PLAIN,
        )
        assert r.status_code == 200, r.text
    card = page.locator(f"[data-request-id='{rid}']")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".result-note")).to_have_text(
        "Already approved by Bob (bob): your answer changed nothing."
    )


def test_a_counted_vote_leaves_deny_in_place(page: Page, base: str) -> None:
    """Alice's Approve counted toward a two-person approval and her card lost its form: the
    Deny the runtime still takes from her (one deny closes a quorum) was gone until a reload.
    Only Approve goes; her Deny then closes the request."""
    rid = start(base, "treasury")["pending"][0]["id"]
    card = page.locator(f"[data-request-id='{rid}']")
    card.get_by_role("button", name="Approve").click()
    expect(card.locator(".result-note")).to_contain_text("Your approval is counted (1 of 2)")
    expect(card.get_by_role("button", name="Approve")).to_have_count(0)
    card.locator("input[name=text]").fill("wrong account")
    card.get_by_role("button", name="Deny").click()
    expect(card.locator(".result-note").last).to_contain_text("Denied")
    got = httpx.get(
        f"{base}/v1/requests/{rid}", headers=auth("admin-token"), timeout=10, verify=PLAIN
    ).json()
    assert (got["status"], got["outcome"]) == ("settled", "cancelled"), got
    assert got["resolution"]["reason"] == "wrong account"


def test_live_changes_are_announced_to_a_screen_reader(page: Page, base: str) -> None:
    """The queue's count and a session's status change while the page is open, silently for a
    screen reader: neither was in a live region. The count is one, and a new status is said in
    the page's announcements (the toasts, a polite live region)."""
    expect(page.locator("[aria-live=polite] [data-live-total]")).to_have_text("0")
    body = start(base)
    expect(page.locator("[aria-live=polite] [data-live-total]")).to_have_text("1")
    sid, rid = body["session_id"], body["pending"][0]["id"]
    page.goto(f"/_signoff/sessions/{sid}")
    expect(page.locator("[data-session-status]")).to_have_text("waiting")
    r = httpx.post(
        f"{base}/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 200, r.text
    expect(page.locator("[data-session-status]")).to_have_text("idle")
    expect(page.locator("#toasts[aria-live=polite]")).to_contain_text("The session is now idle")


def test_an_answer_after_the_sign_in_expired_leads_to_signing_in_and_back(
    page: Page, base: str
) -> None:
    """The browser dropped the sign-in cookie (its lifetime passed) while a session page was
    open: Approve said only "sign in first". It says the sign-in expired, and its link signs in
    and returns to the page."""
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    page.goto(f"/_signoff/sessions/{sid}")
    card = page.locator(f"[data-request-id='{rid}']")
    expect(card).to_be_visible()
    page.context.clear_cookies(name="signoff_token")
    card.get_by_role("button", name="Approve").click()
    note = page.locator("#signed-out")
    expect(note).to_contain_text("Your sign-in has expired")
    note.get_by_role("link", name="Sign in").click()
    expect(page.locator("[data-expired]")).to_be_visible()
    page.fill("input[name=token]", "alice-token")
    page.click("button[type=submit]")
    expect(page).to_have_url(f"{base}/_signoff/sessions/{sid}")
    approve = page.locator(f"[data-request-id='{rid}']").get_by_role("button", name="Approve")
    expect(approve).to_be_visible()
    assert session(base, sid)["status"] == "waiting"  # the refused click changed nothing


def test_a_question_of_many_choices_is_answered_from_its_menu(
    browser: Browser, tmp_path: Path
) -> None:
    """Past 12 choices a question's card offers one menu (numbered as the list above it) and an
    Answer button, not a button per choice: the reviewer picks one and the turn gets it."""
    labels = [f"Warehouse {n:02d}" for n in range(1, 21)]

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Pick a warehouse."""
        answer = await ctx.ask("Ship from where?", options=labels, allow_text=False)
        return str(answer.value)

    script = [
        so.ModelResponse(tool_calls=[so.ToolCall(name="pick", input={})]),
        so.ModelResponse(text="Shipping."),
    ]
    agent = so.Agent(name="depot", model=so.models.Scripted(script), tools=[pick])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/many.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as served_at:
        r = httpx.post(
            f"{served_at}/v1/sessions",
            json={"agent": "depot", "message": "ship it"},
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
        context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=served_at)
        try:
            p = context.new_page()
            p.set_default_timeout(10_000)
            p.goto("/_signoff/login")
            p.fill("input[name=token]", "alice-token")
            p.click("button[type=submit]")
            card = p.locator(f'[data-request-id="{rid}"]')
            expect(card.locator("button.option")).to_have_count(0)
            menu = card.get_by_label("Choose one of 20")
            menu.select_option(label="7. Warehouse 07")
            card.get_by_role("button", name="Answer").click()
            expect(card).to_contain_text("Answered")
        finally:
            context.close()
    with so.Runtime([agent], store=f"sqlite:///{tmp_path}/many.db") as rt:
        (done,) = [e for e in rt.events_sync(sid) if e.type == "tool.completed"]
        assert done.data["result"] == "Warehouse 07"


def test_a_choice_made_in_a_menu_and_not_sent_counts_as_work_in_progress(
    browser: Browser, tmp_path: Path
) -> None:
    """A reviewer picked one of 20 choices in a question's menu, then looked elsewhere on the
    page before pressing Answer, and the question was answered in another tab: the card left
    without a word, as one nobody had touched, where typed text keeps it to say it was closed
    elsewhere and that nothing was sent. A choice made and not sent is work too."""
    labels = [f"Warehouse {n:02d}" for n in range(1, 21)]

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Pick a warehouse."""
        answer = await ctx.ask("Ship from where?", options=labels, allow_text=False)
        return str(answer.value)

    script = [
        so.ModelResponse(tool_calls=[so.ToolCall(name="pick", input={})]),
        so.ModelResponse(text="Shipping."),
    ]
    agent = so.Agent(name="depot", model=so.models.Scripted(script), tools=[pick])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/many.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as served_at:
        r = httpx.post(
            f"{served_at}/v1/sessions",
            json={"agent": "depot", "message": "ship it"},
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        sid, request = r.json()["session_id"], r.json()["pending"][0]
        context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=served_at)
        try:
            p = context.new_page()
            p.set_default_timeout(10_000)
            p.goto("/_signoff/login")
            p.fill("input[name=token]", "alice-token")
            p.click("button[type=submit]")
            expect(p.locator("#live-dot.on")).to_be_attached()
            card = p.locator(f'[data-request-id="{request["id"]}"]')
            card.get_by_label("Choose one of 20").select_option(label="7. Warehouse 07")
            p.locator("h1").click()  # the focus leaves the card: only the choice is left
            assert p.evaluate("document.activeElement === document.body")
            httpx.post(
                f"{served_at}/v1/sessions/{sid}/responses",
                json={
                    "inputResponses": [
                        {"requestId": request["id"], "optionId": request["options"][2]["id"]}
                    ]
                },
                headers=auth("alice-token"),
                timeout=10,
                verify=PLAIN,
            ).raise_for_status()
            expect(card.locator(".result-note")).to_contain_text("Closed elsewhere")
            expect(card.get_by_role("button")).to_have_count(0)
        finally:
            context.close()


def test_a_choice_and_typed_text_sent_together_from_a_menu_are_refused_not_cut(
    browser: Browser, tmp_path: Path
) -> None:
    """A question of 20 choices that takes free text: the reviewer typed their own answer with a
    choice still picked in the menu and pressed Answer. The choice was recorded and what they
    typed dropped without a word; now the form says to send one or the other, nothing
    recorded, and with the menu back at its blank choice the typed text is the answer."""
    labels = [f"Warehouse {n:02d}" for n in range(1, 21)]

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Pick a warehouse."""
        answer = await ctx.ask("Ship from where?", options=labels, allow_text=True)
        return str(answer.value if answer.value is not None else answer.text)

    script = [
        so.ModelResponse(tool_calls=[so.ToolCall(name="pick", input={})]),
        so.ModelResponse(text="Shipping."),
    ]
    agent = so.Agent(name="depot", model=so.models.Scripted(script), tools=[pick])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/many.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as served_at:
        r = httpx.post(
            f"{served_at}/v1/sessions",
            json={"agent": "depot", "message": "ship it"},
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
        context = browser.new_context(viewport={"width": 1280, "height": 900}, base_url=served_at)
        try:
            p = context.new_page()
            p.set_default_timeout(10_000)
            p.goto("/_signoff/login")
            p.fill("input[name=token]", "alice-token")
            p.click("button[type=submit]")
            card = p.locator(f'[data-request-id="{rid}"]')
            menu = card.get_by_label("Choose one of 20")
            menu.select_option(label="7. Warehouse 07")
            card.get_by_label("Your answer").fill("the new one on the quay")
            card.get_by_role("button", name="Answer").click()
            expect(card.locator(".form-error")).to_contain_text("not both")
            assert [q.id for q in runtime.pending_sync(session_id=sid)] == [rid]
            menu.select_option(label="Choose…")
            card.get_by_role("button", name="Answer").click()
            expect(card).to_contain_text("Answered")
        finally:
            context.close()
    with so.Runtime([agent], store=f"sqlite:///{tmp_path}/many.db") as rt:
        (done,) = [e for e in rt.events_sync(sid) if e.type == "tool.completed"]
        assert done.data["result"] == "the new one on the quay"
