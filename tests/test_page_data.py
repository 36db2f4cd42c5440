"""What the dashboard's pages read to show: here, a tool's setting history from the audit trail."""

from __future__ import annotations

import asyncio
import html
import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import signoff as so
from signoff._approval import ApprovalArg
from signoff._audit_trail import record_tool_settings
from signoff.server import TokenAuth, create_app
from signoff.server._context import ServerContext

from .test_server_common import PLAIN, TOKENS, _echo, auth, in_process, running

T0 = 1_700_000_000.0
NEWEST = ["Conditional (large)", "Never", "Always"]


def _ops(policy: ApprovalArg) -> so.Agent:
    @so.tool(approval=policy)
    async def delete_account(email: str) -> str:
        """Delete a customer's account."""
        return "deleted"

    model = so.models.Scripted([so.ModelResponse(text="ok")])
    return so.Agent(name="ops", model=model, tools=[delete_account])


async def test_a_tool_changed_often_shows_its_newest_settings(store_url: str) -> None:
    """A tool whose setting changed more than 200 times showed the oldest 200 changes as its
    "newest first" history: the change that turned approval off was on neither page."""
    flips = 240
    seeding = so.Runtime([_ops(so.always())], store=store_url, clock=lambda: T0)
    await seeding.open()  # records "Always"
    for i in range(1, flips):
        agent = _ops(so.never() if i % 2 else so.always())
        await record_tool_settings(seeding.store, [agent], T0 + i)
    await seeding.close()

    def large(input: object) -> bool:
        return True

    last = so.Runtime([_ops(large)], store=store_url)  # opening records the newest
    with running(create_app(last, auth=TokenAuth(TOKENS), sweep_every=None)) as base:
        h = auth("admin-token")
        tools = httpx.get(f"{base}/_signoff/tools", headers=h, verify=PLAIN).text
        history = tools[tools.index('class="history"') :]
        shown = re.findall(r"<strong>([^<]+)</strong>", history[: history.index("</td>")])
        assert shown == NEWEST, shown
        changes = httpx.get(f"{base}/_signoff/audit/tools", headers=h, verify=PLAIN).text
        table = changes[changes.index('id="tool-changes"') :]
        rows = re.findall(r"<td><strong>([^<]+)</strong></td>", table)
        assert rows[:3] == NEWEST, rows[:3]
        assert len(rows) == 200  # the newest 200 of the 241 recorded


def _refunds() -> so.Agent:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    call = so.ToolCall(id="c1", name="issue_refund", input={"order_id": "1042"})
    turn = [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text="done")]
    return so.Agent(name="support", model=so.models.Scripted(turn * 2), tools=[issue_refund])


async def test_a_session_page_never_shows_events_past_the_state_it_draws(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A page read its state, then its events: another process committing between the two (an
    approval) put the page's `seq` past its header and cards, and the live page, which reads
    only events after `seq`, kept the closed request's Approve button for good."""
    reading = ServerContext.session
    meanwhile: list[Callable[[], None]] = []

    async def session(self: ServerContext, *args: Any, **kwargs: Any) -> Any:
        state = await reading(self, *args, **kwargs)
        while meanwhile:
            await asyncio.to_thread(meanwhile.pop())
        return state

    monkeypatch.setattr(ServerContext, "session", session)
    view = create_app(so.Runtime([_refunds()], store=store_url), auth=TokenAuth(TOKENS))
    other = create_app(so.Runtime([_refunds()], store=store_url), auth=TokenAuth(TOKENS))
    h = auth("alice-token")
    with running(view) as base, running(other) as elsewhere:

        def call(method: str, url: str, body: dict[str, Any] | None = None) -> Any:
            r = httpx.request(method, url, json=body, headers=h, verify=PLAIN, timeout=30)
            assert r.status_code in (200, 201), r.text
            return r.json() if method == "POST" or "/fragments/" in url else r.text

        def asked() -> tuple[str, Callable[[], None]]:
            body = {"agent": "support", "message": "refund order 1042"}
            started = call("POST", f"{elsewhere}/v1/sessions", body)
            sid, rid = started["session_id"], started["pending"][0]["id"]
            answer = {"approvals": [{"id": rid, "approved": True}]}
            return sid, lambda: call("POST", f"{elsewhere}/v1/sessions/{sid}/approvals", answer)

        sid, approve = asked()
        page = f"{base}/_signoff/fragments/sessions/{sid}"
        before = call("GET", f"{page}?after=0")
        meanwhile.append(approve)
        racing = call("GET", f"{page}?after={before['seq']}")
        assert 'value="approve"' in racing["pending"]  # drawn from the state read first
        assert racing["seq"] == before["seq"]  # so its trace ends where that state ended
        after = call("GET", f"{page}?after={racing['seq']}")
        assert after["seq"] > racing["seq"]  # app.js applies only a later seq
        assert after["total"] == 0 and 'value="approve"' not in after["pending"]

        sid, approve = asked()  # the whole page: its data-seq no further than its header
        meanwhile.append(approve)
        whole = call("GET", f"{base}/_signoff/sessions/{sid}")
        seq = re.search(r'data-seq="(\d+)"', whole)
        events = re.search(r"<dt>Events</dt><dd>(\d+)</dd>", whole)
        assert seq is not None and events is not None
        assert seq.group(1) == events.group(1)
        assert 'value="approve"' in whole


async def test_a_mirrors_card_says_why_naming_the_mirror(store_url: str) -> None:
    """Bob (Alice's tenant) seeing her mirror of a subagent's question was told on its card
    `You may not answer this: request req_<child> was asked by alice`, an id the card does not
    show; it names the mirror as his answer's refusal does."""
    handed = so.ModelResponse(tool_calls=[so.ToolCall(name="helper", input={"message": "go"})])
    desk = so.Agent(
        name="desk",
        model=so.models.Scripted([handed, _echo], repeat_last=True),
        tools=[so.delegate("helper")],
    )
    async with in_process(store_url, agents=[desk]) as (_, c):
        started = await c.post(
            "/v1/sessions", json={"agent": "desk", "message": "hi"}, headers=auth("alice-token")
        )
        assert started.status_code == 201, started.text
        sid, (mirror,) = started.json()["session_id"], started.json()["pending"]
        child = mirror["child"]
        refused = await c.post(
            f"/v1/sessions/{sid}/responses",
            json={"inputResponses": [{"requestId": mirror["id"], "optionId": "x"}]},
            headers=auth("bob-token"),
        )
        assert refused.status_code == 403, refused.text
        said = refused.json()["error"]["message"]
        assert said.startswith(f"request {mirror['id']} (asked for helper's {child['request_id']})")
        for path in ("/_signoff/", f"/_signoff/sessions/{sid}"):
            page = (await c.get(path, headers=auth("bob-token"))).text
            card = page[page.index(f'data-request-id="{mirror["id"]}"') :]
            barred = re.search(r"<p [^>]*data-not-allowed>You may not answer this: (.*?)</p>", card)
            assert barred, card[:2000]
            shown = re.sub(r"<[^>]+>", "", barred.group(1))  # ids set apart for bidi
            assert html.unescape(shown) == said, path
