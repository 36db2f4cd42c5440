"""The dashboard in a real browser against untrusted text: what agents, tools and models write
never runs as script, and a model's lines and right-to-left text read as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from playwright.sync_api import Browser, Dialog, Page, expect

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard_browser import base, browser, csp_violations, page
from .test_server_common import PLAIN, TOKENS, auth, running

__all__ = ["base", "browser", "page"]  # the fixtures, used by name


EVIL = (
    "<script>window.__pwned='script'</script>"
    '"><img src=x onerror="window.__pwned=\'img\'">'
    "'><svg onload=\"window.__pwned='svg'\"></svg>"
    "</script><script>window.__pwned='close'</script>"
    "javascript:window.__pwned='url' {{7*7}}"
)


def evil_agent() -> so.Agent:
    """An agent whose name, tool description, model text, tool input, question and options are all
    hostile (tool names must be letters, digits, _ or -; a model may still call any name)."""

    @so.tool(name="refund", description="Refunds " + EVIL, approval=so.always())
    async def refund(note: str, extra: dict[str, str]) -> dict[str, Any]:
        return {"note": note}

    @so.tool(name="ask")
    async def ask(ctx: so.ToolContext, topic: str) -> dict[str, Any]:
        options = [{"id": "a" + EVIL, "label": "A" + EVIL, "description": "D" + EVIL}]
        answer = await ctx.ask("Q" + EVIL, options=options, allow_text=True)
        return {"answer": answer.value}

    script = [
        so.ModelResponse(
            text="T" + EVIL,
            tool_calls=[
                so.ToolCall(name="refund", input={"note": EVIL, "extra": {EVIL: EVIL}}),
                so.ToolCall(name="nope" + EVIL, input={EVIL: EVIL}),  # unknown: an error result
            ],
        ),
        so.ModelResponse(tool_calls=[so.ToolCall(name="ask", input={"topic": EVIL})]),
        so.ModelResponse(text="done " + EVIL),
    ]
    return so.Agent(
        name="crm" + EVIL,
        instructions="I " + EVIL,
        model=so.models.Scripted(script, repeat_last=True),
        tools=[refund, ask],
    )


def injected(page: Page) -> list[str]:
    """What a payload would have left behind: the flag, or an element it brought in."""
    found: list[str] = page.evaluate(
        """() => {
          const out = [];
          if (window.__pwned !== undefined) out.push('ran: ' + window.__pwned);
          document.querySelectorAll('img, svg, script:not([src])').forEach(
            (el) => out.push('element: ' + el.outerHTML.slice(0, 80)));
          document.querySelectorAll('[href^="javascript:" i]').forEach(
            (el) => out.push('link: ' + el.outerHTML.slice(0, 80)));
          return out;
        }"""
    )
    return found


def test_untrusted_text_never_runs_as_script(browser: Browser, tmp_path: Path) -> None:
    runtime = so.Runtime([evil_agent()], store=f"sqlite:///{tmp_path}/evil.db", poll_interval=0.05)
    app = create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05)
    with running(app) as url:
        context = browser.new_context(base_url=url)
        p = context.new_page()
        p.set_default_timeout(10_000)
        refused = csp_violations(p)
        dialogs: list[str] = []

        def on_dialog(dialog: Dialog) -> None:
            dialogs.append(dialog.message)
            dialog.dismiss()

        p.on("dialog", on_dialog)
        p.goto("/_signoff/login")
        p.fill("input[name=token]", "alice-token")
        p.click("button[type=submit]")
        expect(p.locator("h1")).to_have_text("Approval queue")
        # the approval arrives live: the queue merges the fragment in
        r = httpx.post(
            f"{url}/v1/sessions",
            json={"agent": "crm" + EVIL, "message": "M" + EVIL},
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        card = p.locator("#queue [data-request-id]")
        expect(card.locator(".tool-name")).to_have_text("refund")
        assert injected(p) == []
        # the session page: deny with a hostile reason; the question arrives live
        p.goto(f"/_signoff/sessions/{sid}")
        pending = p.locator("#session-pending [data-request-id]")
        expect(pending.locator(".tool-name")).to_have_text("refund")
        pending.locator("input[name=text]").fill("R" + EVIL)
        pending.get_by_role("button", name="Deny").click()
        expect(p.locator(".toast").first).to_contain_text("Denied refund")
        question = p.locator("#session-pending [data-kind=question]")
        expect(question.locator(".tool-name")).to_have_text("Q" + EVIL)
        assert injected(p) == []
        # answering with the hostile option; the reply and the header update live
        question.get_by_role("button", name="A" + EVIL).click()
        expect(p.locator("[data-session-status]")).to_have_text("idle")
        expect(p.locator("blockquote.reply")).to_contain_text("done " + EVIL)
        expect(p.locator("#trace li .badge.type", has_text="turn.completed")).to_be_visible()
        p.locator("#trace details").evaluate_all("els => els.forEach(e => { e.open = true; })")
        assert injected(p) == []
        # a reload renders all of it on the server
        for path in (
            f"/_signoff/sessions/{sid}",
            "/_signoff/audit",
            "/_signoff/tools",
            "/_signoff/new",
        ):
            p.goto(path)
            assert injected(p) == [], path
            assert "{{7*7}}" in p.locator("main").inner_text(), path  # shown, not evaluated
        assert dialogs == [] and refused == []
        context.close()


def test_a_models_lines_and_right_to_left_text_read_as_written(
    browser: Browser, tmp_path: Path
) -> None:
    """A model's multi-line question, option and reply ran together into one line ("refund? 1.
    Order 1042 2. Order 1043"), and an Arabic question read left to right, its question mark at
    the wrong end. Lines are kept, and each such text takes the direction of its first letter."""
    question = "Which order should I refund?\n1. Order 1042\n2. Order 1043"
    arabic = "أي طلب يجب أن أعيد؟"

    @so.tool(name="ask")
    async def ask(ctx: so.ToolContext, topic: str) -> dict[str, Any]:
        text = question if topic == "en" else arabic
        options = [{"id": "a", "label": "نعم", "description": "first line\nsecond line"}]
        answer = await ctx.ask(text, options=options, allow_text=True)
        return {"answer": answer.value}

    calls = [so.ToolCall(name="ask", input={"topic": t}) for t in ("en", "ar")]
    reply = "Looking into it:\n- order 1042\n- order 1043"
    script = [so.ModelResponse(text=reply, tool_calls=calls)]
    agent = so.Agent(name="lines", model=so.models.Scripted(script), tools=[ask])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/lines.db", poll_interval=0.05)
    with running(create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05)) as url:
        r = httpx.post(
            f"{url}/v1/sessions",
            json={"agent": "lines", "message": "go"},
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        sid = r.json()["session_id"]
        context = browser.new_context(base_url=url, extra_http_headers=auth("alice-token"))
        p = context.new_page()
        p.set_default_timeout(10_000)
        p.goto(f"/_signoff/sessions/{sid}")
        shown = p.locator(".question-text")
        expect(shown).to_have_count(2)
        assert shown.first.inner_text() == question
        assert p.locator("blockquote.reply").inner_text() == reply
        assert p.locator(".options li").first.inner_text().endswith("first line\nsecond line")
        directions = shown.evaluate_all("els => els.map(e => getComputedStyle(e).direction)")
        assert directions == ["ltr", "rtl"]
        label = p.get_by_role("button", name="نعم").first
        assert label.evaluate("e => getComputedStyle(e).direction") == "rtl"
        context.close()
