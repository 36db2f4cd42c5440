"""Right-to-left text on the dashboard: what models, tools, people and channels wrote (a prompt,
a reply, a tool's name or description, a reviewer's name and reason, a question) is isolated
(`<bdi>`, or an element with `dir`), so Hebrew or Arabic in one item cannot reorder the words and
punctuation around it, as in a trace row's one-line summary."""

from __future__ import annotations

import asyncio
import re
from html.parser import HTMLParser
from pathlib import Path

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard import signed_in
from .test_server_common import auth, running, served

DANA = so.Principal(
    authenticator="token", principal_id="dana", attributes={"admin": True, "name": "דנה כהן"}
)
TOKENS = {"dana-token": DANA}
RTL = re.compile("[\u0590-\u08ff\ufb1d-\ufdff\ufe70-\ufeff]")
OWN_BOX = {"pre", "textarea", "option", "title", "script", "style"}
"""Elements whose text is a block or a control of its own, not inline among other items."""


class _Unisolated(HTMLParser):
    """Collects right-to-left text that no open element isolates."""

    def __init__(self) -> None:
        super().__init__()
        self.open: list[tuple[str, bool]] = []
        self.found: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("br", "input", "meta", "link", "img", "hr", "wbr"):
            return
        isolates = tag in ("bdi", *OWN_BOX) or any(name == "dir" for name, _ in attrs)
        self.open.append((tag, isolates))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.open) - 1, -1, -1):
            if self.open[i][0] == tag:
                del self.open[i:]
                return

    def handle_data(self, data: str) -> None:
        if RTL.search(data) and not any(isolates for _, isolates in self.open):
            where = " > ".join(tag for tag, _ in self.open[-3:])
            self.found.append(f"{where}: {data.strip()[:60]!r}")


class _TextBoxes(HTMLParser):
    """Collects the text boxes a person types words into (not JSON): each with its `dir`."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str | None]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        typed = tag == "textarea" or (tag == "input" and a.get("type") in (None, "text", "search"))
        if typed and a.get("name") != "edited_input":
            self.found.append(
                (str(a.get("aria-label") or a.get("id") or a.get("name")), a.get("dir"))
            )


def _unisolated(page: str) -> list[str]:
    parser = _Unisolated()
    parser.feed(page)
    return parser.found


@so.tool(approval=so.always())
async def refund(order: str) -> str:
    """החזר כספי ללקוח על הזמנה."""
    return "הוחזר"


def _session(tmp_path: Path) -> tuple[str, str]:
    """A session whose trace holds right-to-left text from everyone: the prompt, the model's
    reply and calls (one to a tool it lacks), a reviewer's name and reason, and a question."""
    first = so.ModelResponse(
        text="سأرد المبلغ الآن",
        tool_calls=[
            so.ToolCall(name="refund", input={"order": "طلب 42"}),
            so.ToolCall(name="עזרה", input={}),
            so.ToolCall(name="חיפוש", input={}),
        ],
    )
    ask = so.ToolCall(
        name="ask_question",
        input={
            "question": "האם להמשיך?",
            "options": [
                {"label": "כן", "description": "להמשיך"},
                {"label": "لا", "description": "توقف"},
            ],
        },
    )
    script = [first, so.ModelResponse(tool_calls=[ask])]
    agent = so.Agent(
        name="desk", model=so.models.Scripted(script), tools=[refund, so.ask_question()]
    )
    store = f"sqlite:///{tmp_path}/rtl.db"

    async def run() -> str:
        async with so.Runtime([agent], store=store) as rt:
            parked = await rt.generate("desk", prompt="أريد استرداد 42 من فضلك", auth=DANA)
            rid = next(r.id for r in parked.pending if r.kind == "tool-approval")
            decision = so.Decision(id=rid, approved=True, reason="בסדר גמור, 42 ₪")
            asked = await rt.generate(session_id=parked.session_id, approvals=[decision], auth=DANA)
            assert asked.status == "waiting", asked.error
            return asked.session_id

    return store, asyncio.run(run())


def test_right_to_left_text_is_isolated_on_every_page(tmp_path: Path) -> None:
    store, sid = _session(tmp_path)
    agent = so.Agent(name="desk", model=so.models.Scripted([]), tools=[refund, so.ask_question()])
    app = create_app(so.Runtime([agent], store=store), auth=TokenAuth(TOKENS))
    with running(app) as base, signed_in(base, "dana-token") as c:
        session = c.get(f"/_signoff/sessions/{sid}").text
        # the trace's one-line summaries, item by item
        assert "<summary>“<bdi>أريد استرداد 42 من فضلك</bdi>”</summary>" in session
        calls = "calls <bdi>refund</bdi>, <bdi>עזרה</bdi>, <bdi>חיפוש</bdi>"
        assert f"“<bdi>سأرد المبلغ الآن</bdi>” — {calls}" in session
        assert "<summary><bdi>עזרה</bdi> → error</summary>" in session
        assert (
            "Approved by <bdi>דנה כהן (dana)</bdi>: “<bdi>בסדר גמור, 42 ₪</bdi>”</summary>"
            in session
        )
        assert "Awaiting an answer: <bdi>האם להמשיך?</bdi>" in session
        live = c.get(f"/_signoff/fragments/sessions/{sid}?after=0").json()["rows"]
        assert "<bdi>עזרה</bdi> → error" in live
        for path in ("/_signoff/", "/_signoff/audit", "/_signoff/sessions", "/_signoff/tools"):
            page = c.get(path)
            assert page.status_code == 200, path
            assert RTL.search(page.text), path  # the page shows some
            assert _unisolated(page.text) == [], path
        assert _unisolated(session) == []
        assert _unisolated(live) == []


def test_every_text_box_takes_the_direction_of_what_is_typed(tmp_path: Path) -> None:
    """A reviewer's reason, a session's message and a new conversation's message lacked
    `dir="auto"`, unlike the other boxes: Hebrew typed there showed left to right."""
    with served(f"sqlite:///{tmp_path}/s.db") as base, signed_in(base) as c:
        r = c.post(
            "/v1/sessions",
            json={"agent": "support", "message": "Refund order 1042"},
            headers=auth("alice-token"),
        )
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        boxes: list[tuple[str, str | None]] = []
        for path in ("/_signoff/", f"/_signoff/sessions/{sid}", "/_signoff/new"):
            page = c.get(path)
            assert page.status_code == 200, path
            parser = _TextBoxes()
            parser.feed(page.text)
            boxes += parser.found
        names = {name for name, _ in boxes}
        assert {"Reason", "Send a message", "Message", "cancel-reason"} <= names
        assert [name for name, d in boxes if d != "auto"] == []
