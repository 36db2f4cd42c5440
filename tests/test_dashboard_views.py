"""What the dashboard shows: the tools page, the queue and its stream, the audit, pages past the
end, odd query strings, demo models, tool settings and a parked turn's trace row.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard import (
    base,
    signed_in,
    start,
)
from .test_server_common import PLAIN, TOKENS, auth, make_runtime, running

__all__ = ["base"]  # the fixture, used by name


def test_tools_page_and_visibility(base: str) -> None:
    start(base)
    with signed_in(base, "mallory-token") as c:
        assert "All caught up" in c.get("/_signoff/").text  # another tenant's queue is empty
    with signed_in(base, "bob-token") as c:
        page = c.get("/_signoff/").text
        assert "issue_refund" in page  # same tenant: visible
        tools = c.get("/_signoff/tools").text
        assert "Conditional" in tools and "Never" in tools and "lookup_order" in tools


@pytest.mark.parametrize("token", ["alice-token", "admin-token"])
def test_queue_stream_announces_changes(base: str, token: str) -> None:
    with httpx.Client(base_url=base, headers=auth(token), timeout=10, verify=PLAIN) as c:
        with c.stream("GET", "/_signoff/stream") as s:
            lines = s.iter_lines()
            first = _next_data(lines)
            assert first["total"] == 0
            one = start(base)
            second = _next_data(lines)
            assert second["total"] == 1 and second["version"] != first["version"]
            start(base)
            assert _next_data(lines)["total"] == 2
            # one settled and one new (within one poll: same count, still a change)
            rid = one["pending"][0]["id"]
            r = httpx.post(
                f"{base}/v1/sessions/{one['session_id']}/responses",
                json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
                headers=auth("alice-token"),
                verify=PLAIN,
            )
            assert r.status_code == 200
            start(base)
            totals = [_next_data(lines)["total"]]
            while totals[-1] != 2:
                totals.append(_next_data(lines)["total"])
            assert totals in ([2], [1, 2])


def test_the_queue_stream_outlives_a_store_outage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store failing for a while (the database restarting) must not end the queue's stream:
    the page's EventSource, reconnecting meanwhile, would get a 503 and give up for good."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/state.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05, heartbeat=0.1)
    real = runtime.store.count_pending
    calls = [0]

    async def down_a_while(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        if 2 <= calls[0] <= 6:  # after the first look, the database goes away for a while
            raise so.StoreError("counting failed: the database is restarting")
        return await real(*args, **kwargs)

    monkeypatch.setattr(runtime.store, "count_pending", down_a_while)
    with (
        running(app) as base,
        httpx.Client(base_url=base, headers=auth("admin-token"), verify=PLAIN) as c,
    ):
        with c.stream("GET", "/_signoff/stream") as s:
            lines = s.iter_lines()
            assert _next_data(lines)["total"] == 0
            while calls[0] <= 6:
                next(lines)  # keep-alives while the store is away
            start(base)
            assert _next_data(lines)["total"] == 1


def test_an_admin_sees_every_tenant(base: str) -> None:
    start(base)
    r = httpx.post(
        f"{base}/v1/sessions",
        json={"agent": "support", "message": "x"},
        headers=auth("mallory-token"),
        verify=PLAIN,
    )
    assert r.status_code == 201
    queue = httpx.get(f"{base}/v1/requests", headers=auth("admin-token"), verify=PLAIN).json()
    assert queue["total"] == 2
    assert {r["requested_by"]["principal_id"] for r in queue["items"]} == {"alice", "mallory"}
    page = httpx.get(f"{base}/_signoff/", headers=auth("admin-token"), verify=PLAIN).text
    assert page.count("data-request-id=") == 2


def test_the_sessions_page_lists_the_viewers_sessions_without_javascript(base: str) -> None:
    """A session no longer waiting was reachable only by its URL: the Sessions page (linked in
    the navigation) lists every session the viewer may see, filtered by plain GET forms and
    paged, and another tenant's sessions are not there, nor counted."""
    waiting = start(base)["session_id"]
    with httpx.Client(
        base_url=base, headers=auth("alice-token"), timeout=10, verify=PLAIN
    ) as alice:
        opened = [alice.post("/v1/sessions", json={"agent": "batch"}) for _ in range(50)]
    assert all(r.status_code == 201 for r in opened)
    opened_ids = [r.json()["session_id"] for r in opened]
    theirs = httpx.post(
        f"{base}/v1/sessions",
        json={"agent": "support"},
        headers=auth("mallory-token"),
        verify=PLAIN,
    ).json()["session_id"]
    with signed_in(base) as c:
        assert 'href="/_signoff/sessions"' in c.get("/_signoff/").text
        first = c.get("/_signoff/sessions").text
        assert 'href="/_signoff/sessions" class="active"' in first  # the nav marks the page
        assert "51 sessions" in first and theirs not in first
        assert opened_ids[-1] in first and waiting not in first  # newest first, 50 a page
        assert 'href="?page=2"' in first
        second = c.get("/_signoff/sessions", params={"page": 2}).text
        assert waiting in second and opened_ids[-1] not in second
        assert f'href="/_signoff/sessions/{waiting}"' in second
        picked = c.get("/_signoff/sessions", params={"status": "waiting"}).text
        assert "1 session," in picked and waiting in picked and opened_ids[0] not in picked
        assert '<option value="waiting" selected>' in picked
        none = c.get("/_signoff/sessions", params={"agent": "support", "status": "idle"}).text
        assert "No sessions match these filters" in none
        paged = c.get("/_signoff/sessions", params={"agent": "batch", "page": 9}).text
        assert "50 sessions" in paged and opened_ids[0] in paged  # past the end: the last page
        odd = c.get("/_signoff/sessions", params={"status": "<script>", "page": "²"})
        assert odd.status_code == 200 and "51 sessions" in odd.text
        hostile = '"><script>alert(1)</script>'
        odd = c.get("/_signoff/sessions", params={"agent": hostile, "page": "2"})
        assert odd.status_code == 200 and "No sessions match" in odd.text
        assert "alert(1)" not in odd.text  # an unknown agent is not reflected, escaped or not
    mallory = httpx.get(
        f"{base}/_signoff/sessions", headers=auth("mallory-token"), verify=PLAIN
    ).text
    assert "1 session," in mallory and theirs in mallory
    assert not any(sid in mallory for sid in (waiting, *opened_ids))
    admin = httpx.get(f"{base}/_signoff/sessions", headers=auth("admin-token"), verify=PLAIN).text
    assert "52 sessions" in admin and theirs in admin


def _next_data(lines: Iterator[str]) -> dict[str, Any]:
    for line in lines:
        if line.startswith("data: "):
            data: dict[str, Any] = json.loads(line[6:])
            return data
    raise AssertionError("stream ended")


def test_audit_lists_newest_first_and_by_status(base: str) -> None:
    rids = []
    for option in ("approve", "cancel"):
        body = start(base)
        rid = body["pending"][0]["id"]
        r = httpx.post(
            f"{base}/v1/sessions/{body['session_id']}/responses",
            json={"inputResponses": [{"requestId": rid, "optionId": option}]},
            headers=auth("alice-token"),
            verify=PLAIN,
        )
        assert r.status_code == 200
        rids.append(rid)
    withdrawn = start(base)
    httpx.post(
        f"{base}/v1/sessions/{withdrawn['session_id']}/cancel",
        headers=auth("alice-token"),
        verify=PLAIN,
    )
    with signed_in(base) as c:
        html = c.get("/_signoff/audit").text
        assert "2 settled requests" in html
        assert html.index(rids[1]) < html.index(rids[0])  # newest first
        assert ">denied<" in html and ">approved<" in html
        assert withdrawn["pending"][0]["id"] not in html
        other = c.get("/_signoff/audit", params={"status": "withdrawn"}).text
        assert withdrawn["pending"][0]["id"] in other and rids[0] not in other


def test_odd_query_strings_are_not_server_errors(base: str) -> None:
    sid = start(base)["session_id"]
    h = auth("alice-token")
    for path in (
        "/_signoff/?page=%C2%B2",
        "/_signoff/?page=99999999999999999999999999",
        "/_signoff/?page=-1&agent=%00&kind=nope",
        "/_signoff/audit?page=0&status=%3Cscript%3E",
        f"/_signoff/fragments/sessions/{sid}?after=%C2%B2",
        f"/_signoff/fragments/sessions/{sid}?after=99999999999999999999999",
        "/_signoff/fragments/queue?page=2",
    ):
        r = httpx.get(base + path, headers=h, verify=PLAIN)
        assert r.status_code == 200, (path, r.status_code)
    r = httpx.get(
        f"{base}/_signoff/fragments/sessions/{sid}?after=2", headers=h, verify=PLAIN
    ).json()
    assert r["seq"] == 5 and r["rows"].count("<li") == 3


@pytest.mark.parametrize("token", ["alice-token", "admin-token"])
def test_a_page_past_the_end_of_the_queue_shows_its_last_page(base: str, token: str) -> None:
    """A reviewer left on page 2 after the queue shrank (or following an old link) sees the
    last page, not "All caught up" beside a count of open requests; and is told so (with one
    page left there is no "Page 1 of 1" to tell it)."""
    rid = start(base)["pending"][0]["id"]
    for path, asked in (("/_signoff/?page=2", 2), ("/_signoff/fragments/queue?page=7", 7)):
        page = httpx.get(base + path, headers=auth(token), verify=PLAIN).text
        assert rid in page and "All caught up" not in page, path
        assert f"Page {asked} is gone (fewer are open now): showing page 1." in page, path
    page = httpx.get(f"{base}/_signoff/", headers=auth(token), verify=PLAIN).text
    assert "is gone" not in page


def test_a_page_past_the_end_of_the_audit_shows_its_last_page(base: str) -> None:
    """An old link to page 5 of a one-page audit showed "Nothing here yet" beside a count of
    settled requests, and no pager to go back: it shows the last page, as the queue does."""
    body = start(base)
    rid = body["pending"][0]["id"]
    httpx.post(
        f"{base}/v1/sessions/{body['session_id']}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
        headers=auth("alice-token"),
        verify=PLAIN,
    )
    page = httpx.get(
        f"{base}/_signoff/audit?page=5", headers=auth("alice-token"), verify=PLAIN
    ).text
    assert rid in page and "Nothing here yet" not in page


def test_demo_models_are_labelled(base: str, tmp_path: Path) -> None:
    start(base)
    page = httpx.get(f"{base}/_signoff/", headers=auth("alice-token"), verify=PLAIN).text
    assert "Demo model" in page and "demo model</span>" in page

    class Echo:
        async def complete(self, request: so.models.ModelRequest) -> so.ModelResponse:
            return so.ModelResponse(text="hi")

    runtime = so.Runtime([so.Agent(name="real", model=Echo())], store=f"sqlite:///{tmp_path}/r.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as other:
        page = httpx.get(f"{other}/_signoff/", headers=auth("alice-token"), verify=PLAIN).text
        assert "Demo model" not in page


def test_demo_agents_names_are_isolated(tmp_path: Path) -> None:
    """The banner joined the demo agents' names bare: a right-to-left name reordered the commas
    and words beside it. Each is isolated, in the banner as `<bdi>` and in the new
    conversation's menu (an option holds no markup) between U+2068 and U+2069."""
    script = so.models.Scripted([so.ModelResponse(text="hi")])
    agents = [so.Agent(name=n, model=script) for n in ("עזרה 2", "support")]
    runtime = so.Runtime(agents, store=f"sqlite:///{tmp_path}/d.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as other:
        page = httpx.get(f"{other}/_signoff/", headers=auth("alice-token"), verify=PLAIN).text
        assert "— <bdi>support</bdi>, <bdi>עזרה 2</bdi> run an offline" in page
        new = httpx.get(f"{other}/_signoff/new", headers=auth("alice-token"), verify=PLAIN).text
        assert ">&#x2068;עזרה 2&#x2069; (demo model)</option>" in new


async def test_tool_setting_changes_are_shown(tmp_path: Path) -> None:
    store = f"sqlite:///{tmp_path}/t.db"

    def runtime(policy: so.ApprovalPolicy) -> so.Runtime:
        @so.tool(approval=policy)
        async def delete_account(email: str) -> str:
            """Delete a customer's account."""
            return "deleted"

        model = so.models.Scripted([so.ModelResponse(text="ok")])
        return so.Runtime([so.Agent(name="ops", model=model, tools=[delete_account])], store=store)

    first = runtime(so.always())
    await first.open()
    await first.close()
    second = runtime(so.never())  # someone turned approval off
    with running(create_app(second, auth=TokenAuth(TOKENS))) as base:
        h = auth("admin-token")
        tools = httpx.get(f"{base}/_signoff/tools", headers=h, verify=PLAIN).text
        assert "first seen as <strong>Always</strong>" in tools
        assert '<span class="muted">Always</span> → <strong>Never</strong>' in tools
        changes = httpx.get(f"{base}/_signoff/audit/tools", headers=h, verify=PLAIN).text
        table = changes[changes.index('id="tool-changes"') :]
        assert table.index("<strong>Never</strong>") < table.index("<strong>Always</strong>")
        verified = httpx.get(f"{base}/_signoff/audit/tools?verify=1", headers=h, verify=PLAIN).text
        assert "nothing was altered" in verified
        # only admins may run the check
        plain = httpx.get(
            f"{base}/_signoff/audit/tools?verify=1", headers=auth("alice-token"), verify=PLAIN
        )
        assert "nothing was altered" not in plain.text and "delete_account" in plain.text


async def test_the_audit_lists_the_changes_of_tools_this_server_lacks(store_url: str) -> None:
    """The audit's tool settings page is every recorded change: it listed only the tools of the
    serving runtime's agents, so once a deployment dropped a tool (or this server runs other
    agents) the record of when it stopped needing approval was gone from the page."""

    @so.tool(approval=so.always())
    async def delete_account(email: str) -> str:
        """Delete a customer's account."""
        return "deleted"

    model = so.models.Scripted([so.ModelResponse(text="ok")])
    eu = so.Agent(name="ops.eu", model=model, tools=[delete_account])
    old = so.Runtime([eu], store=store_url)
    await old.open()  # records delete_account's setting
    await old.close()
    now = so.Runtime([so.Agent(name="ops", model=model)], store=store_url)  # the tool is gone
    with running(create_app(now, auth=TokenAuth(TOKENS), sweep_every=None)) as base:
        changes = httpx.get(
            f"{base}/_signoff/audit/tools", headers=auth("admin-token"), verify=PLAIN
        ).text
        table = changes[changes.index('id="tool-changes"') :]
        assert "No tool settings recorded yet" not in table
        assert "<td><bdi>ops.eu</bdi></td>" in table
        assert '<td class="mono"><bdi>delete_account</bdi></td>' in table
        assert "<strong>Always</strong>" in table


def test_a_parked_turns_trace_row_names_what_it_awaits(base: str) -> None:
    """The `turn.waiting` row says what the turn awaits: an approval of which tool, an answer to
    which question (helix: a run waiting on approval shows as awaiting approval)."""
    refund = start(base)
    question = start(base, "helper", "My mug arrived broken")
    with signed_in(base) as c:
        page = c.get(f"/_signoff/sessions/{refund['session_id']}").text
        assert "Awaiting approval: <bdi>issue_refund</bdi>" in page
        page = c.get(f"/_signoff/sessions/{question['session_id']}").text
        assert "Awaiting an answer: <bdi>Which size should the replacement be?</bdi>" in page
        assert "Awaiting approval" not in page


def test_the_audit_says_what_was_asked_and_answered(store_url: str) -> None:
    """An answered question's audit row named the tool that asked it (`ask_question`) and
    showed no answer (the page read a `value` the record keeps under `answer`): what was
    asked and what the person answered were on no page once the session moved on."""
    runtime = make_runtime(store_url)
    with running(create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)) as base:
        picked, typed = start(base, "helper"), start(base, "helper")
        for body, answer in ((picked, {"optionId": "2"}), (typed, {"text": "<b>Medium</b>"})):
            rid = body["pending"][0]["id"]
            r = httpx.post(
                f"{base}/v1/sessions/{body['session_id']}/responses",
                json={"inputResponses": [{"requestId": rid, **answer}]},
                headers=auth("alice-token"),
                verify=PLAIN,
            )
            assert r.status_code == 200, r.text
        html = httpx.get(f"{base}/_signoff/audit", headers=auth("alice-token"), verify=PLAIN).text
        rows = html[html.index('id="audit"') :].split("<tr>")[2:]
        assert len(rows) == 2
        for row in rows:
            assert "Which size should the replacement be?" in row
            assert "ask_question" not in row
        assert "<bdi>Large</bdi>" in rows[1]  # oldest last
        assert "<bdi>&lt;b&gt;Medium&lt;/b&gt;</bdi>" in rows[0]


def test_the_audit_shows_the_arguments_an_approver_edited(base: str) -> None:
    """An approval with edited arguments read on the audit page as a plain "approved": the
    arguments the tool ran with, and that a reviewer changed them, were on no page but inside
    the session's raw event. The row says who edited them and shows both, escaped (a model's
    arguments and a reviewer's edit are untrusted), and a large one cut with a link to all."""
    edited_reason = "</pre><script>alert('x')</script><b>bold</b> " + "y" * 12_000
    body = start(base)
    rid, sid = body["pending"][0]["id"], body["session_id"]
    edit = {"order_id": "1042", "amount": 120, "reason": edited_reason}
    r = httpx.post(
        f"{base}/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "approve", "editedInput": edit}]},
        headers=auth("alice-token"),
        verify=PLAIN,
    )
    assert r.status_code == 200, r.text
    plain = start(base)  # approved as proposed: no edit to show
    r = httpx.post(
        f"{base}/v1/sessions/{plain['session_id']}/responses",
        json={"inputResponses": [{"requestId": plain["pending"][0]["id"], "optionId": "approve"}]},
        headers=auth("alice-token"),
        verify=PLAIN,
    )
    assert r.status_code == 200, r.text
    with signed_in(base) as c:
        html = c.get("/_signoff/audit").text
        rows = html[html.index('id="audit"') :].split("<tr>")[2:]
        assert len(rows) == 2 and rid in rows[1]
        assert "edited" not in rows[0].lower()  # newest first: the plain approval
        row = rows[1]
        assert "Arguments edited by <bdi>Alice (alice)</bdi>" in row
        assert "<script>" not in row and "<b>bold" not in row
        assert "&lt;/pre&gt;&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in row
        assert "&#34;arrived broken&#34;" in row  # what the model proposed
        assert "&#34;amount&#34;: 180.0," in row and "&#34;amount&#34;: 120.0," in row
        assert "Showing the first 10,000 of" in row  # the edit is cut, with a link to all
        link = f"/_signoff/requests/{rid}/edited"
        assert f'href="{link}"' in row
        whole = c.get(link)
        assert whole.status_code == 200
        assert whole.headers["content-type"].startswith("text/plain")
        assert json.loads(whole.text) == {**edit, "amount": 120.0}
        # the session's trace says so on the approval's line, not only in its raw data
        trace = c.get(f"/_signoff/sessions/{sid}").text
        assert "Approved by <bdi>Alice (alice)</bdi> with edited arguments" in trace
    # someone who may not see the request may not read its edit either
    other = httpx.get(f"{base}{link}", headers=auth("mallory-token"), verify=PLAIN)
    assert other.status_code == 404 and edited_reason[:40] not in other.text


def test_the_audit_cuts_a_long_reason_with_a_link_to_all_of_it(base: str) -> None:
    """A deny reason of megabytes (any field may reach the body's 4 MiB) was shown whole: a
    page of megabytes, of hundreds with 50 such rows. It is cut as an answer is, at 300
    characters, with a link to all of it as text; a short one is shown whole, with no link."""
    long, short = "why " * 250_000, "wrong order"
    bodies = [start(base), start(base)]
    for body, reason in zip(bodies, (long, short), strict=True):
        r = httpx.post(
            f"{base}/v1/sessions/{body['session_id']}/responses",
            json={
                "inputResponses": [
                    {"requestId": body["pending"][0]["id"], "optionId": "cancel", "text": reason}
                ]
            },
            headers=auth("alice-token"),
            timeout=30,
            verify=PLAIN,
        )
        assert r.status_code == 200, r.text
    rid = bodies[0]["pending"][0]["id"]
    with signed_in(base) as c:
        html = c.get("/_signoff/audit").text
        assert len(html) < 50_000, len(html)
        rows = html[html.index('id="audit"') :].split("<tr>")[2:]
        assert len(rows) == 2 and rid in rows[1]  # newest first
        link = f"/_signoff/requests/{rid}/reason"
        assert f"<bdi>{long[:300]}…</bdi>" in rows[1] and f'href="{link}"' in rows[1]
        assert f"<bdi>{short}</bdi>" in rows[0] and "/reason" not in rows[0]
        whole = c.get(link)
        assert whole.status_code == 200 and whole.text == long
        assert whole.headers["content-type"].startswith("text/plain")
    # someone who may not see the request may not read its reason either
    other = httpx.get(f"{base}{link}", headers=auth("mallory-token"), verify=PLAIN)
    assert other.status_code == 404 and "why why" not in other.text


async def test_under_an_apps_own_access_rule_no_one_verifies_every_tenants_trail(
    tmp_path: Path,
) -> None:
    """The check reads every tenant's trail and names the sessions it finds altered: an admin
    of one tenant (under an app's own rule, which `/metrics` and prune refuse to everyone) ran it
    from the tool changes page and read another tenant's session ids."""

    def own_tenant(caller: so.Principal, initiator: so.Principal | None) -> bool:
        return initiator is not None and caller.attributes.get("tenant") == (
            initiator.attributes.get("tenant")
        )

    admin = so.Principal(
        authenticator="token", principal_id="a-admin", attributes={"tenant": "A", "admin": True}
    )
    rt = so.Runtime([], store=f"sqlite:///{tmp_path}/t.db")
    app = create_app(rt, auth=TokenAuth({"a-admin-token": admin}), access=own_tenant)
    with running(app) as base:
        page = httpx.get(
            f"{base}/_signoff/audit/tools?verify=1", headers=auth("a-admin-token"), verify=PLAIN
        )
        assert page.status_code == 200
        assert 'id="verify-result"' not in page.text and "?verify=1" not in page.text
