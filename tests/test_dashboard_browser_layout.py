"""The dashboard's layout in a real browser: long and unbroken text, huge inputs and phones
still leave the buttons in reach and words whole."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.sync_api import Browser, Page, expect

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard_browser import base, browser, start
from .test_server_common import PLAIN, TOKENS, auth, running

__all__ = ["base", "browser"]  # the fixtures, used by name


def test_long_unbroken_text_keeps_the_buttons_in_reach(browser: Browser, tmp_path: Path) -> None:
    """A model's 3,000-character word in a question, an option or a reply, and a long agent name,
    wrap inside the page: nothing scrolls sideways and every button is on screen."""
    word = "W" * 3000

    @so.tool(name="ask")
    async def ask(ctx: so.ToolContext, topic: str) -> dict[str, Any]:
        options = [{"id": "a", "label": "A" + word, "description": "D" + word}]
        answer = await ctx.ask("Q" + word, options=options, allow_text=True)
        return {"answer": answer.value}

    call = so.ToolCall(name="ask", input={"topic": "size"})
    script = [so.ModelResponse(text="T" + word, tool_calls=[call])]
    agent = so.Agent(name="n" * 300, model=so.models.Scripted(script), tools=[ask])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/long.db", poll_interval=0.05)
    with running(create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05)) as url:
        r = httpx.post(
            f"{url}/v1/sessions",
            json={"agent": agent.name, "message": "M" + word},
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        sid = r.json()["session_id"]
        context = browser.new_context(
            viewport={"width": 1280, "height": 900},
            base_url=url,
            extra_http_headers=auth("alice-token"),
        )
        p = context.new_page()
        p.set_default_timeout(10_000)
        for path in ("/_signoff/", f"/_signoff/sessions/{sid}", "/_signoff/new"):
            p.goto(path)
            if path != "/_signoff/new":
                expect(p.locator("main [data-kind=question] button:visible")).to_have_count(2)
            p.locator("details").evaluate_all("els => els.forEach(e => { e.open = true; })")
            wide = p.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
            assert wide <= 0, (path, wide)
            for button in p.locator("main button:visible").all():
                box = button.bounding_box()
                assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 1280, (
                    path,
                    button.inner_text()[:20],
                    box,
                )
        context.close()


def test_a_huge_input_leaves_approve_on_the_first_screen(browser: Browser, tmp_path: Path) -> None:
    """A 1 MB tool input is shown clipped in a box of its own: the Approve button stays on the
    first screen, and a link opens the whole input."""
    blob = "x" * 1_000_000

    @so.tool(approval=so.always())
    async def upload(blob: str) -> str:
        """Upload a file."""
        return "stored"

    script = [so.ModelResponse(tool_calls=[so.ToolCall(name="upload", input={"blob": blob})])]
    agent = so.Agent(name="files", model=so.models.Scripted(script), tools=[upload])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/big.db", poll_interval=0.05)
    with running(create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05)) as url:
        r = httpx.post(
            f"{url}/v1/sessions",
            json={"agent": "files", "message": "store it"},
            headers=auth("alice-token"),
            timeout=30,
            verify=PLAIN,
        )
        rid = r.json()["pending"][0]["id"]
        context = browser.new_context(
            viewport={"width": 1280, "height": 900},
            base_url=url,
            extra_http_headers=auth("alice-token"),
        )
        p = context.new_page()
        p.set_default_timeout(10_000)
        p.goto("/_signoff/")
        card = p.locator(f"[data-request-id='{rid}']")
        approve = card.get_by_role("button", name="Approve")
        box = approve.bounding_box()
        assert box is not None and box["y"] + box["height"] <= 900, box
        whole = card.get_by_role("link", name="See all of it")
        with context.expect_page() as opened:
            whole.click()
        whole_page = opened.value
        whole_page.wait_for_load_state()  # a new tab: read before its body arrived, it was empty
        assert whole_page.locator("body").inner_text().count("x") == 1_000_000
        approve.click()
        expect(card.locator(".result-note")).to_contain_text("Approved")
        context.close()


@pytest.mark.parametrize("width", [1280, 375])
@pytest.mark.parametrize("name", ["Alice", "Alice " * 60])
def test_the_top_bar_fits_a_phone(browser: Browser, tmp_path: Path, width: int, name: str) -> None:
    """At 375px the top bar's links broke letter by letter ("Q u e u e"), taller than the bar:
    they spilled over the page and above the screen. Each stays on one line, inside the bar,
    and a long name of the reviewer does not push Sign out off the screen."""
    viewer = so.Principal(authenticator="token", principal_id="alice", attributes={"name": name})
    runtime = so.Runtime([], store=f"sqlite:///{tmp_path}/bar.db")
    app = create_app(runtime, auth=TokenAuth({"alice-token": viewer}))
    with running(app) as url:
        context = browser.new_context(
            viewport={"width": width, "height": 800},
            base_url=url,
            extra_http_headers=auth("alice-token"),
        )
        p = context.new_page()
        p.goto("/_signoff/")
        expect(p.get_by_role("button", name="Sign out")).to_be_visible()
        top_bar_fits(p, width)
        context.close()


def top_bar_fits(p: Page, width: int) -> None:
    """Each link and button of the page's top bar is on one line, inside the bar and screen."""
    bar = p.locator("header.topbar").bounding_box()
    assert bar is not None
    for item in p.locator("header.topbar a, header.topbar button").all():
        box = item.bounding_box()
        name = item.inner_text().split()[0]
        assert box is not None, name
        assert 0 <= box["x"] and box["x"] + box["width"] <= width, (name, box)
        assert bar["y"] <= box["y"] and box["y"] + box["height"] <= bar["y"] + bar["height"], (
            name,
            box,
            bar,
        )
        assert box["height"] <= 40, (name, box)  # one line


def test_tables_and_tabs_keep_their_words_whole_on_a_phone(browser: Browser, base: str) -> None:
    """At 375px the audit's and tools' tables squeezed their columns to a letter or two, so
    "When asked" or "Settled" read a letter per line: a table scrolls sideways in its own box,
    and the page itself does not."""
    body = start(base)
    httpx.post(
        f"{base}/v1/sessions/{body['session_id']}/responses",
        json={"inputResponses": [{"requestId": body["pending"][0]["id"], "optionId": "approve"}]},
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    )
    context = browser.new_context(
        viewport={"width": 375, "height": 800},
        base_url=base,
        extra_http_headers=auth("alice-token"),
    )
    p = context.new_page()
    for path in (
        "/_signoff/audit",
        "/_signoff/tools",
        "/_signoff/audit/tools",
        "/_signoff/sessions",
    ):
        p.goto(path)
        broken = p.locator("main th, main .tabs a, #audit td:first-child").evaluate_all(
            """els => els.filter((el) => {
                 const range = document.createRange();
                 range.selectNodeContents(el);
                 const tops = Array.from(range.getClientRects(), (r) => Math.round(r.top));
                 const lines = new Set(tops);
                 return lines.size > el.textContent.trim().split(/\\s+/).length;
               }).map((el) => el.textContent.trim())"""
        )
        assert broken == [], (path, broken)
        clipped = p.locator("main table").evaluate_all(
            """els => els.filter((t) => t.parentElement.scrollWidth > t.parentElement.clientWidth
                                 && getComputedStyle(t.parentElement).overflowX !== "auto")"""
        )
        assert clipped == [], path  # a wide table scrolls: none of it is cut off
        wide = p.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
        assert wide <= 0, (path, wide)
    context.close()


def _asking(question: str, options: list[dict[str, str]] | None = None) -> so.Tool:
    """A tool that asks a person `question` (free text when no `options`) and returns the
    answer."""

    @so.tool(name="consult")
    async def consult(ctx: so.ToolContext) -> str:
        """Ask a person."""
        return str((await ctx.ask(question, options=options)).value)

    return consult


@pytest.mark.parametrize("width", [1280, 375])
def test_long_model_text_leaves_the_buttons_near_the_top(
    browser: Browser, tmp_path: Path, width: int
) -> None:
    """A 60 KB question, or 60 KB a model said before a tool call, was shown in full above the
    buttons: they sat tens of thousands of pixels down. The text scrolls in a box of its own
    and the trace's one-line summaries are cut; the buttons stay within two screens. (The
    question is a tool's `ctx.ask`: the model's own `ask_question` takes 2,000 characters.)"""
    text = "lorem ipsum dolor sit amet " * 2400

    @so.tool(approval=so.always())
    async def upload(note: str) -> str:
        """Upload a note."""
        return "stored"

    yes_no = [
        {"id": "yes", "label": "Yes", "description": "Go ahead."},
        {"id": "no", "label": "No", "description": "Stop."},
    ]
    question = so.ToolCall(name="consult", input={})
    asker = so.Agent(
        name="asker",
        model=so.models.Scripted([so.ModelResponse(tool_calls=[question])]),
        tools=[_asking(text, yes_no)],
    )
    said = so.ModelResponse(text=text, tool_calls=[so.ToolCall(name="upload", input={"note": "n"})])
    talker = so.Agent(name="talker", model=so.models.Scripted([said]), tools=[upload])
    runtime = so.Runtime([asker, talker], store=f"sqlite:///{tmp_path}/long.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as url:
        sessions = []
        for agent, message in (("asker", "hi"), ("talker", text)):
            r = httpx.post(
                f"{url}/v1/sessions",
                json={"agent": agent, "message": message},
                headers=auth("alice-token"),
                timeout=30,
                verify=PLAIN,
            )
            sessions.append(r.json()["session_id"])
        context = browser.new_context(
            viewport={"width": width, "height": 900},
            base_url=url,
            extra_http_headers=auth("alice-token"),
        )
        p = context.new_page()
        paths = ["/_signoff/?agent=asker", "/_signoff/?agent=talker"]
        paths += [f"/_signoff/sessions/{sid}" for sid in sessions]
        for path in paths:
            p.goto(path)
            buttons = p.locator("main .request button:visible, #send button").all()
            assert len(buttons) >= 2, path
            for button in buttons:
                box = button.bounding_box()
                assert box is not None and box["y"] + box["height"] <= 1800, (path, box)
            height = p.evaluate("() => document.documentElement.scrollHeight")
            assert height <= 6000, (path, height)
        context.close()


def test_opening_the_edit_box_of_a_long_input_keeps_approve_in_reach(
    browser: Browser, tmp_path: Path
) -> None:
    """The edit box was as tall as the input has lines: 1,000 of them put Approve some 20,000
    pixels down once it was opened. The box's height is capped; it scrolls and can be resized."""

    @so.tool(approval=so.always())
    async def tag(ids: list[int]) -> str:
        """Tag records."""
        return "tagged"

    call = so.ToolCall(name="tag", input={"ids": list(range(1000))})
    agent = so.Agent(
        name="tags", model=so.models.Scripted([so.ModelResponse(tool_calls=[call])]), tools=[tag]
    )
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/rows.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as url:
        rid = start(url, "tags")["pending"][0]["id"]
        context = browser.new_context(
            viewport={"width": 1280, "height": 900},
            base_url=url,
            extra_http_headers=auth("alice-token"),
        )
        p = context.new_page()
        p.goto("/_signoff/")
        card = p.locator(f"[data-request-id='{rid}']")
        card.get_by_text("Edit arguments before approving").click()
        expect(card.locator("textarea[name=edited_input]")).to_be_visible()
        box = card.get_by_role("button", name="Approve").bounding_box()
        assert box is not None and box["y"] + box["height"] <= 1800, box
        context.close()


def test_the_toast_after_answering_a_long_question_stays_small(
    browser: Browser, tmp_path: Path
) -> None:
    """The toast named the request by its whole text: a 20 KB question (a tool's `ctx.ask`)
    made a toast taller than the screen, covering the page's buttons for five seconds. Its text
    is cut."""
    ask = so.ToolCall(name="consult", input={})
    script = [so.ModelResponse(tool_calls=[ask]), so.ModelResponse(text="ok")]
    agent = so.Agent(
        name="asker", model=so.models.Scripted(script), tools=[_asking("Which one? " * 2000)]
    )
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/toast.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as url:
        rid = start(url, "asker")["pending"][0]["id"]
        context = browser.new_context(
            viewport={"width": 1280, "height": 900},
            base_url=url,
            extra_http_headers=auth("alice-token"),
        )
        p = context.new_page()
        p.goto("/_signoff/")
        card = p.locator(f"[data-request-id='{rid}']")
        card.locator("input[name=text]").fill("The second")
        card.get_by_role("button", name="Send answer").click()
        toast = p.locator(".toast").first
        expect(toast).to_contain_text("Answered")
        box = toast.bounding_box()
        assert box is not None and box["height"] <= 200, box
        context.close()


def test_long_option_descriptions_leave_the_buttons_near_the_top(
    browser: Browser, tmp_path: Path
) -> None:
    """`ctx.ask` takes options of any length: 30 options described in 10 KB each made a list
    50,000 pixels tall above the buttons. The list scrolls in a box of its own, and the menu
    that takes the answer (past 12 options, one menu rather than a button each) is near the
    top."""

    @so.tool(name="pick")
    async def pick(ctx: so.ToolContext, topic: str) -> dict[str, Any]:
        """Pick a plan."""
        options = [
            {"id": f"o{i}", "label": f"Plan {i}", "description": "details " * 1200}
            for i in range(30)
        ]
        answer = await ctx.ask("Which plan?", options=options)
        return {"plan": answer.value}

    call = so.ToolCall(name="pick", input={"topic": "plans"})
    agent = so.Agent(
        name="picker", model=so.models.Scripted([so.ModelResponse(tool_calls=[call])]), tools=[pick]
    )
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/options.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as url:
        start(url, "picker")
        context = browser.new_context(
            viewport={"width": 1280, "height": 900},
            base_url=url,
            extra_http_headers=auth("alice-token"),
        )
        p = context.new_page()
        p.goto("/_signoff/")
        menu = p.get_by_label("Choose one of 30").bounding_box()
        assert menu is not None and menu["y"] + menu["height"] <= 1800, menu
        answer = p.get_by_role("button", name="Answer").bounding_box()
        assert answer is not None and answer["y"] + answer["height"] <= 1900, answer
        context.close()


def test_a_long_option_label_is_cut_on_its_button_and_whole_elsewhere(
    browser: Browser, tmp_path: Path
) -> None:
    """A model's option label has no bound: one of 3,000 characters made a button 520 pixels
    tall, and two pushed the buttons after them off the first screen. A button shows two lines
    of it, cut with an ellipsis; the whole label stays its name, its tooltip and the list's."""
    label = "Plan with words " * 200
    unbroken = "x" * 3000

    @so.tool(name="pick")
    async def pick(ctx: so.ToolContext, topic: str) -> dict[str, Any]:
        """Pick a plan."""
        options = [
            {"id": "long", "label": label, "description": "The wordy one."},
            {"id": "unbroken", "label": unbroken},
            {"id": "short", "label": "Short"},
        ]
        answer = await ctx.ask("Which plan?", options=options)
        return {"plan": answer.value}

    call = so.ToolCall(name="pick", input={"topic": "plans"})
    agent = so.Agent(
        name="picker", model=so.models.Scripted([so.ModelResponse(tool_calls=[call])]), tools=[pick]
    )
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/labels.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as url:
        start(url, "picker")
        context = browser.new_context(
            viewport={"width": 1280, "height": 900},
            base_url=url,
            extra_http_headers=auth("alice-token"),
        )
        p = context.new_page()
        p.goto("/_signoff/")
        card = p.locator("[data-request-id]").bounding_box()
        assert card is not None
        for value, whole in (("long", label), ("unbroken", unbroken), ("short", "Short")):
            button = p.locator(f"button[value={value}]")
            box = button.bounding_box()
            assert box is not None and box["height"] <= 64, (value, box)  # two lines
            assert box["x"] + box["width"] <= card["x"] + card["width"], (value, box, card)
            assert box["y"] + box["height"] <= 900, (value, box)  # all on the first screen
            assert button.text_content() == whole  # its accessible name: the whole label
            assert whole in (button.get_attribute("title") or ""), value
        assert p.locator(".options li").first.text_content() == f"{label} — The wordy one."
        assert p.locator("button[value=long]").get_attribute("title") == (
            f"{label} — The wordy one."
        )
        context.close()


def test_a_long_error_leaves_the_message_box_and_trace_in_reach(
    browser: Browser, tmp_path: Path
) -> None:
    """A model's error can carry a provider's whole error page (a turn's error keeps a quarter
    of `max_response_bytes`): 60 KB of it in the session's header put the message box and the
    trace tens of thousands of pixels down. It scrolls in a box of its own, as a reply does."""
    page = "<html><body>502 Bad Gateway: the upstream is down</body></html>\n" * 1000
    model = so.models.Scripted([so.ModelError(page)])
    agent = so.Agent(name="broken", model=model)
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/error.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as url:
        sid = start(url, "broken")["session_id"]
        context = browser.new_context(
            viewport={"width": 1280, "height": 900},
            base_url=url,
            extra_http_headers=auth("alice-token"),
        )
        p = context.new_page()
        p.goto(f"/_signoff/sessions/{sid}")
        warning = p.locator(".session-head .warning")
        expect(warning).to_contain_text("Turn failed: ModelError: <html><body>502 Bad Gateway")
        for where in ("#send button", "#trace"):
            box = p.locator(where).bounding_box()
            assert box is not None and box["y"] <= 1200, (where, box)
        assert warning.evaluate("e => e.scrollHeight > e.clientHeight")  # all of it, scrolled
        context.close()


def test_the_audits_ids_names_and_times_stay_whole_beside_a_long_reason(
    browser: Browser, base: str
) -> None:
    """On a wide screen the audit's auto-laid table gave a reviewer's reason of two ordinary
    sentences nearly all the room (the page breaks words anywhere, so every column's least width
    was a letter): "Alice (alice)" read five lines of two letters, a session id four. Ids, times,
    outcomes and names keep their words whole, ids take two lines at most, the reason keeps most
    of the room, and an unbroken one still wraps in the page."""
    sentence = (
        "The customer already got a replacement shipped last week, so a refund on top of it "
        "would pay them twice for the same broken order; check the shipment first. "
    )
    for reason in (sentence * 2, "R" * 400):
        body = start(base)
        r = httpx.post(
            f"{base}/v1/sessions/{body['session_id']}/responses",
            json={
                "inputResponses": [
                    {"requestId": body["pending"][0]["id"], "optionId": "cancel", "text": reason}
                ]
            },
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        assert r.status_code == 200, r.text
    context = browser.new_context(
        viewport={"width": 1280, "height": 900},
        base_url=base,
        extra_http_headers=auth("alice-token"),
    )
    p = context.new_page()
    p.goto("/_signoff/audit")
    expect(p.locator("#audit tbody tr")).to_have_count(2)
    lines = """els => els.map((el) => {
        const range = document.createRange();
        range.selectNodeContents(el.querySelector(".badge") || el);
        const tops = Array.from(range.getClientRects(), (r) => Math.round(r.top));
        return [el.textContent.trim(), new Set(tops).size];
      })"""
    words = "#audit td:nth-child(1), #audit td:nth-child(4), #audit td:nth-child(5)"
    broken = [
        (text, n) for text, n in p.locator(words).evaluate_all(lines) if n > len(text.split())
    ]
    assert broken == [], broken  # "a few seconds ago", "denied", "Alice (alice)"
    ids = "#audit td:nth-child(2) .small, #audit td:nth-child(3) a"
    cut = [(text, n) for text, n in p.locator(ids).evaluate_all(lines) if n > 2]
    assert cut == [], cut
    answer = p.locator("#audit tbody tr:first-child td:nth-child(6)")
    assert answer.evaluate("el => el.getBoundingClientRect().width") >= 360
    wide = p.evaluate("() => document.documentElement.scrollWidth - window.innerWidth")
    assert wide <= 0, wide
    table = p.locator("#audit").evaluate(
        "t => t.parentElement.scrollWidth - t.parentElement.clientWidth"
    )
    assert table <= 0, table  # the unbroken reason wraps: the table needs no sideways scroll
    context.close()


@pytest.mark.parametrize("count", [15, 120])
def test_a_long_menus_numbers_and_its_label_show_where_they_belong(
    browser: Browser, tmp_path: Path, count: int
) -> None:
    """A question of more than 12 options lists them numbered and offers a menu. The list's
    markers from 10 on were cut at its left edge ("1." beside option 11), and the menu's label,
    "Choose one of 15", sat beside the "Your answer" box, not above the menu it names."""

    @so.tool
    async def pick(ctx: so.ToolContext) -> str:
        """Pick a warehouse."""
        labels = [f"Warehouse {n:03d}" for n in range(1, count + 1)]
        answer = await ctx.ask("Ship from where?", options=labels, allow_text=True)
        return str(answer.value)

    script = [so.ModelResponse(tool_calls=[so.ToolCall(name="pick", input={})])]
    agent = so.Agent(name="depot", model=so.models.Scripted(script), tools=[pick])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/menu.db", poll_interval=0.05)
    with running(create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05)) as url:
        start(url, "depot")
        context = browser.new_context(
            viewport={"width": 1280, "height": 900},
            base_url=url,
            extra_http_headers=auth("alice-token"),
        )
        p = context.new_page()
        p.goto("/_signoff/")
        listed = p.locator("ol.options")
        expect(listed.locator("li")).to_have_count(count)
        # Each marker ("15.", "120.") fits in the room left of its option, or sits inside it.
        cut = listed.evaluate(
            """ol => {
                const canvas = document.createElement("canvas").getContext("2d");
                return Array.from(ol.children).flatMap((li, i) => {
                    const style = getComputedStyle(li);
                    if (style.listStylePosition === "inside") return [];
                    canvas.font = style.font;
                    const needs = canvas.measureText((i + 1) + ". ").width;
                    const room = li.getBoundingClientRect().left - ol.getBoundingClientRect().left;
                    return room >= needs ? [] : [[i + 1, room, needs]];
                });
            }"""
        )
        assert cut == [], cut
        label = p.get_by_text(f"Choose one of {count}").bounding_box()
        menu = p.get_by_label(f"Choose one of {count}").bounding_box()
        typed = p.get_by_label("Your answer").bounding_box()
        assert label and menu and typed
        assert label["y"] >= typed["y"] + typed["height"], (label, typed)  # below the box
        assert label["y"] + label["height"] <= menu["y"], (label, menu)  # just above its menu
        assert abs(label["x"] - menu["x"]) <= 1, (label, menu)
        context.close()
