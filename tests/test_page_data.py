"""What the dashboard's pages read to show: here, a tool's setting history from the audit trail."""

from __future__ import annotations

import re

import httpx

import signoff as so
from signoff._approval import ApprovalArg
from signoff._audit_trail import record_tool_settings
from signoff.server import TokenAuth, create_app

from .test_server_common import PLAIN, TOKENS, auth, running

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
