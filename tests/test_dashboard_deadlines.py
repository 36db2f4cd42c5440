"""What the dashboard says of the approvals' steps: a call its deadline approved (no one did),
a deadline's escalation, a quorum's vote and a response policy's refusal, on a session's trace
and on the audit page."""

from __future__ import annotations

import html
import re
from pathlib import Path

import httpx

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._deadline_tools import escalated, guarded, lapsed, paired, refused
from .test_server_common import ALICE, TOKENS, auth

TOOLS = [escalated, lapsed, refused, paired, guarded]


def _summaries(page: str) -> list[str]:
    """The one-line summaries of a session page's trace rows, as read (tags dropped)."""
    found = re.findall(r"<summary>(.*?)</summary>", page, flags=re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", s)) for s in found]


def _audit_rows(page: str) -> dict[str, str]:
    """The audit table's outcome badges, by request id."""
    table = page[page.index('id="audit"') :]
    rows = table.split("<tr>")[2:]
    badge = re.compile(r'<span class="badge (outcome-[\w-]+)"[^>]*>([^<]*)</span>')
    shown = {}
    for row in rows:
        rid = re.search(r"req_\w+", row)
        found = badge.search(row)
        if rid and found:
            shown[rid.group()] = f"{found.group(1)}: {found.group(2)}"
    return shown


async def test_the_trace_and_audit_say_what_a_deadline_did(tmp_path: Path) -> None:
    """A call its deadline approved read on the trace as `Approved by the application`, the
    name of a caller with no principal, though no one approved it; the audit's Expired tab gave
    it the same `expired` as a call its deadline denied, though it ran. An escalation, a
    quorum's vote and a response policy's answers read only as `approval.candidate`. Each says
    what happened now, in the channels' words."""
    clock = ManualClock()
    calls = [call(t.name, x="1") for t in TOOLS]
    agent = scripted_agent("desk", [call_tools(*calls), reply("done")], tools=TOOLS)
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db", clock=clock)
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=auth("alice-token")
        ) as c,
    ):
        parked = await rt.generate("desk", prompt="go", auth=ALICE)
        ids = {str(r.tool_name): r.id for r in parked.pending}
        for tool in ("paired", "guarded"):
            answer = so.InputResponse(request_id=ids[tool], option_id="approve")
            await rt.respond(parked.session_id, [answer], principal=ALICE)
        clock.advance(61)
        await rt.expire_due()

        trace = (await c.get(f"/_signoff/sessions/{parked.session_id}")).text
        said = _summaries(trace)
        assert "Approved automatically when the deadline passed" in said
        assert not [s for s in said if "the application" in s], said
        assert "Escalated to finance: no one decided before the deadline" in said
        assert "Approval by Alice (alice) counted (1 of 2)" in said
        assert "Approval by Alice (alice): awaiting the response policy" in said
        assert (
            "Approval by Alice (alice) not accepted (rejected: only finance approves payouts)"
        ) in said
        assert "approval.candidate" not in said  # each row says what it was
        assert "<bdi>finance</bdi>" in trace  # the group, as a name set apart

        audit = (await c.get("/_signoff/audit?status=expired")).text
        assert _audit_rows(audit) == {
            ids["lapsed"]: "outcome-approved: approved automatically",
            ids["refused"]: "outcome-expired: expired",
        }
