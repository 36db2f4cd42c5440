"""The dashboard over plain HTTP: sign-in, CSRF, escaping, the form flow without JavaScript."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import httpx
import pytest
from fastapi import Request
from starlette.testclient import TestClient

import signoff as so
from signoff.server import TokenAuth, create_app

from .test_server_common import TOKENS, auth, make_runtime, running, served


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


@contextmanager
def signed_in(base: str, token: str = "alice-token") -> Iterator[httpx.Client]:
    """A browser-like client: cookies, the login form, the CSRF token from the page."""
    with httpx.Client(base_url=base, timeout=10) as c:
        page = c.get("/_signoff/login")
        r = c.post("/_signoff/login", data={"token": token, "csrf": csrf_of(page.text)})
        assert r.status_code == 303 and r.headers["location"] == "/_signoff"
        yield c


def cookie_of(base: str, token: str = "alice-token") -> dict[str, str]:
    """The sign-in cookie a browser gets for `token` from the login form (a new sign-in)."""
    with signed_in(base, token) as c:
        return {"signoff_token": c.cookies["signoff_token"]}


def csrf_of(html: str) -> str:
    match = re.search(r'name="csrf-token" content="([^"]+)"', html)
    assert match, "no CSRF token in the page"
    return match.group(1)


def start(base: str, agent: str = "support", message: str = "Refund 1042") -> dict[str, Any]:
    r = httpx.post(
        f"{base}/v1/sessions",
        json={"agent": agent, "message": message},
        headers=auth("alice-token"),
        timeout=10,
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def test_pages_need_a_signed_in_reviewer(base: str) -> None:
    r = httpx.get(base + "/_signoff/")
    assert r.status_code == 303 and r.headers["location"] == "/_signoff/login"
    for path in (
        "/_signoff/tools",
        "/_signoff/audit",
        "/_signoff/sessions",
        "/_signoff/sessions/x",
    ):
        r = httpx.get(base + path)
        # back to the page once signed in
        assert r.status_code == 303, path
        assert r.headers["location"] == "/_signoff/login?" + urlencode({"next": path}), path
    r = httpx.get(base + "/_signoff/fragments/queue", headers={"Accept": "application/json"})
    assert r.status_code == 401
    with httpx.Client(base_url=base) as c:
        page = c.get("/_signoff/login")
        r = c.post("/_signoff/login", data={"token": "nope", "csrf": csrf_of(page.text)})
        assert r.status_code == 401 and "not recognised" in r.text
    # a bearer token works for the pages too
    assert httpx.get(base + "/_signoff/", headers=auth("alice-token")).status_code == 200


def test_forms_without_the_csrf_token_are_refused(base: str) -> None:
    body = start(base)
    rid = body["pending"][0]["id"]
    with signed_in(base) as c:
        url = f"/_signoff/requests/{rid}/respond"
        for data in ({"option": "approve"}, {"option": "approve", "csrf": "forged" * 8}):
            r = c.post(url, data=data, headers={"Accept": "application/json"})
            assert r.status_code == 403, r.text
            assert r.json()["error"]["code"] == "csrf_failed"
        # without a cookie, a token copied from a page does not help either
        token = csrf_of(c.get("/_signoff/").text)
        r = httpx.post(
            base + url,
            data={"option": "approve", "csrf": token},
            headers={**auth("alice-token"), "Accept": "application/json"},
        )
        assert r.status_code == 403
        # logging out is a CSRF-protected form too
        assert c.post("/_signoff/logout", data={}).status_code == 403
        state = httpx.get(f"{base}/v1/sessions/{body['session_id']}", headers=auth("alice-token"))
        assert state.json()["status"] == "waiting"  # nothing was settled


def test_the_form_flow_without_javascript(base: str) -> None:
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    with signed_in(base) as c:
        page = c.get("/_signoff/")
        assert rid in page.text and "issue_refund" in page.text
        r = c.post(
            f"/_signoff/requests/{rid}/respond",
            data={
                "option": "cancel",
                "text": "not without a photo",
                "next": "/_signoff/",
                "csrf": csrf_of(page.text),
            },
        )
        assert r.status_code == 303 and r.headers["location"] == "/_signoff/"
        after = c.get("/_signoff/")
        assert rid not in after.text and "All caught up" in after.text
        audit = c.get("/_signoff/audit").text
        assert rid in audit and "not without a photo" in audit and "cancelled" in audit
        trace = c.get(f"/_signoff/sessions/{sid}").text
        assert "approval.settled" in trace and "turn.completed" in trace
        # answering again conflicts, shown as a page
        r = c.post(
            f"/_signoff/requests/{rid}/respond",
            data={"option": "approve", "csrf": csrf_of(page.text)},
        )
        assert r.status_code == 409 and "already settled" in r.text
        r = c.post(
            "/_signoff/requests/req_nope/respond",
            data={"option": "approve", "csrf": csrf_of(page.text)},
            headers={"Accept": "application/json"},
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_request"
        assert c.get("/_signoff/sessions/ses_nope").status_code == 404


def test_everything_shown_is_escaped(tmp_path: Path) -> None:
    evil = "<script>alert(1)</script>"

    @so.tool(approval=so.always())
    async def run_sql(query: str) -> str:
        """Run <b>SQL</b>."""
        return "ok"

    agent = so.Agent(
        name="dba",
        model=so.models.Scripted(
            [so.ModelResponse(tool_calls=[so.ToolCall(name="run_sql", input={"query": evil})])]
        ),
        tools=[run_sql],
    )
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/x.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        r = httpx.post(
            f"{base}/v1/sessions",
            json={"agent": "dba", "message": evil},
            headers=auth("alice-token"),
        )
        sid = r.json()["session_id"]
        for path in ("/_signoff/", f"/_signoff/sessions/{sid}", "/_signoff/tools"):
            html = httpx.get(base + path, headers=auth("alice-token")).text
            assert evil not in html, path
            assert "<b>SQL</b>" not in html
        queue = httpx.get(base + "/_signoff/", headers=auth("alice-token")).text
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in queue


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
    with httpx.Client(base_url=base, headers=auth(token), timeout=10) as c:
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
    with running(app) as base, httpx.Client(base_url=base, headers=auth("admin-token")) as c:
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
    )
    assert r.status_code == 201
    queue = httpx.get(f"{base}/v1/requests", headers=auth("admin-token")).json()
    assert queue["total"] == 2
    assert {r["requested_by"]["principal_id"] for r in queue["items"]} == {"alice", "mallory"}
    page = httpx.get(f"{base}/_signoff/", headers=auth("admin-token")).text
    assert page.count("data-request-id=") == 2


def test_the_sessions_page_lists_the_viewers_sessions_without_javascript(base: str) -> None:
    """A session no longer waiting was reachable only by its URL: the Sessions page (linked in
    the navigation) lists every session the viewer may see, filtered by plain GET forms and
    paged, and another tenant's sessions are not there, nor counted."""
    waiting = start(base)["session_id"]
    with httpx.Client(base_url=base, headers=auth("alice-token"), timeout=10) as alice:
        opened = [alice.post("/v1/sessions", json={"agent": "batch"}) for _ in range(50)]
    assert all(r.status_code == 201 for r in opened)
    opened_ids = [r.json()["session_id"] for r in opened]
    theirs = httpx.post(
        f"{base}/v1/sessions", json={"agent": "support"}, headers=auth("mallory-token")
    ).json()["session_id"]
    with signed_in(base) as c:
        assert 'href="/_signoff/sessions"' in c.get("/_signoff/").text
        first = c.get("/_signoff/sessions").text
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
    mallory = httpx.get(f"{base}/_signoff/sessions", headers=auth("mallory-token")).text
    assert "1 session," in mallory and theirs in mallory
    assert not any(sid in mallory for sid in (waiting, *opened_ids))
    admin = httpx.get(f"{base}/_signoff/sessions", headers=auth("admin-token")).text
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
        )
        assert r.status_code == 200
        rids.append(rid)
    withdrawn = start(base)
    httpx.post(f"{base}/v1/sessions/{withdrawn['session_id']}/cancel", headers=auth("alice-token"))
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
        r = httpx.get(base + path, headers=h)
        assert r.status_code == 200, (path, r.status_code)
    r = httpx.get(f"{base}/_signoff/fragments/sessions/{sid}?after=2", headers=h).json()
    assert r["seq"] == 5 and r["rows"].count("<li") == 3


@pytest.mark.parametrize("token", ["alice-token", "admin-token"])
def test_a_page_past_the_end_of_the_queue_shows_its_last_page(base: str, token: str) -> None:
    """A reviewer left on page 2 after the queue shrank (or following an old link) sees the
    last page, not "All caught up" beside a count of open requests."""
    rid = start(base)["pending"][0]["id"]
    for path in ("/_signoff/?page=2", "/_signoff/fragments/queue?page=7"):
        page = httpx.get(base + path, headers=auth(token)).text
        assert rid in page and "All caught up" not in page, path


def test_a_page_past_the_end_of_the_audit_shows_its_last_page(base: str) -> None:
    """An old link to page 5 of a one-page audit showed "Nothing here yet" beside a count of
    settled requests, and no pager to go back: it shows the last page, as the queue does."""
    body = start(base)
    rid = body["pending"][0]["id"]
    httpx.post(
        f"{base}/v1/sessions/{body['session_id']}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
        headers=auth("alice-token"),
    )
    page = httpx.get(f"{base}/_signoff/audit?page=5", headers=auth("alice-token")).text
    assert rid in page and "Nothing here yet" not in page


def test_demo_models_are_labelled(base: str, tmp_path: Path) -> None:
    start(base)
    page = httpx.get(f"{base}/_signoff/", headers=auth("alice-token")).text
    assert "Demo model" in page and "demo model</span>" in page

    class Echo:
        async def complete(self, request: so.models.ModelRequest) -> so.ModelResponse:
            return so.ModelResponse(text="hi")

    runtime = so.Runtime([so.Agent(name="real", model=Echo())], store=f"sqlite:///{tmp_path}/r.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as other:
        page = httpx.get(f"{other}/_signoff/", headers=auth("alice-token")).text
        assert "Demo model" not in page


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
        tools = httpx.get(f"{base}/_signoff/tools", headers=h).text
        assert "first seen as <strong>Always</strong>" in tools
        assert '<span class="muted">Always</span> → <strong>Never</strong>' in tools
        changes = httpx.get(f"{base}/_signoff/audit/tools", headers=h).text
        table = changes[changes.index('id="tool-changes"') :]
        assert table.index("<strong>Never</strong>") < table.index("<strong>Always</strong>")
        verified = httpx.get(f"{base}/_signoff/audit/tools?verify=1", headers=h).text
        assert "nothing was altered" in verified
        # only admins may run the check
        plain = httpx.get(f"{base}/_signoff/audit/tools?verify=1", headers=auth("alice-token"))
        assert "nothing was altered" not in plain.text and "delete_account" in plain.text


def test_a_refused_reviewer_is_told_why(base: str) -> None:
    body = start(base, "finance")
    rid = body["pending"][0]["id"]
    with signed_in(base, "alice-token") as c:
        token = csrf_of(c.get("/_signoff/").text)
        r = c.post(
            f"/_signoff/requests/{rid}/respond",
            data={"option": "approve", "csrf": token},
            headers={"Accept": "application/json"},
        )
        assert r.status_code == 200
        assert r.json()["outcome"] == "rejected"
        assert r.json()["reason"] == "only a manager may approve invoices"
        assert rid in c.get("/_signoff/").text  # still in the queue


def test_a_refused_reviewer_without_javascript_is_told_why(base: str) -> None:
    """The plain form post of an answer a response policy refuses shows the refusal, instead of
    redirecting to the queue as if the request had been settled."""
    body = start(base, "finance")
    rid = body["pending"][0]["id"]
    with signed_in(base, "alice-token") as c:
        token = csrf_of(c.get("/_signoff/").text)
        r = c.post(
            f"/_signoff/requests/{rid}/respond",
            data={"option": "approve", "csrf": token, "next": "/_signoff/"},
        )
        assert r.status_code == 409, (r.status_code, r.headers.get("location"))
        assert "only a manager may approve invoices" in r.text
        assert "Not accepted" in r.text
        assert rid in c.get("/_signoff/").text  # still in the queue


def test_a_reply_with_a_lone_surrogate_does_not_fail_the_answer(tmp_path: Path) -> None:
    """The model's reply after an approval held a lone surrogate (JSON carries one, UTF-8
    cannot): the answer was recorded but the form's JSON answer was a 500, so the reviewer was
    told it failed. It is a success, the surrogate shown as U+FFFD."""

    @so.tool(approval=so.always())
    async def upload(note: str) -> str:
        """Upload a note."""
        return "stored"

    call = so.ToolCall(name="upload", input={"note": "n"})
    script = [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text="done \ud800")]
    agent = so.Agent(
        name="files", model=so.models.Scripted(script, repeat_last=True), tools=[upload]
    )
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/reply.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base, signed_in(base) as c:
        body = start(base, "files")
        token = csrf_of(c.get("/_signoff/").text)
        r = c.post(
            f"/_signoff/requests/{body['pending'][0]['id']}/respond",
            data={"option": "approve", "csrf": token},
            headers={"Accept": "application/json"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["outcome"] == "approved" and r.json()["text"] == "done \ufffd"
        r = c.post(
            f"/_signoff/sessions/{body['session_id']}/messages",
            data={"message": "again", "csrf": token},
            headers={"Accept": "application/json"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["text"] == "done \ufffd"


def test_starting_and_messaging_from_the_dashboard(base: str) -> None:
    with signed_in(base) as c:
        token = csrf_of(c.get("/_signoff/new").text)
        j = {"Accept": "application/json"}
        assert c.post("/_signoff/sessions", data={"agent": "support"}, headers=j).status_code == 403
        r = c.post("/_signoff/sessions", data={"agent": "nobody", "message": "x", "csrf": token})
        assert r.status_code == 422 and "unknown agent" in r.text
        r = c.post("/_signoff/sessions", data={"agent": "support", "message": " ", "csrf": token})
        assert r.status_code == 422
        r = c.post(
            "/_signoff/sessions",
            data={"agent": "support", "message": "Refund 1042", "csrf": token},
        )
        assert r.status_code == 303
        sid = r.headers["location"].rsplit("/", 1)[1]
        state = httpx.get(f"{base}/v1/sessions/{sid}", headers=auth("alice-token")).json()
        assert state["status"] == "waiting" and state["initiator"]["principal_id"] == "alice"
        # a message that steers: the open approval is ignored
        r = c.post(
            f"/_signoff/sessions/{sid}/messages",
            data={"message": "actually, never mind", "csrf": token},
            headers=j,
        )
        assert r.status_code == 200 and r.json()["ok"] is True
        state = httpx.get(f"{base}/v1/sessions/{sid}", headers=auth("alice-token")).json()
        assert state["pending"] == []
    with signed_in(base, "mallory-token") as m:
        token = csrf_of(m.get("/_signoff/").text)
        r = m.post(f"/_signoff/sessions/{sid}/messages", data={"message": "hi", "csrf": token})
        assert r.status_code == 404


def test_a_message_that_waits_for_the_turns_end_is_said_to_wait(base: str) -> None:
    """An admin's message to Alice's waiting turn waits for its end: the page's script is told
    (`queued`), and the page has the place it says so in."""
    body = start(base)
    sid = body["session_id"]
    with signed_in(base, "admin-token") as c:
        page = c.get(f"/_signoff/sessions/{sid}").text
        assert 'class="form-note"' in page
        r = c.post(
            f"/_signoff/sessions/{sid}/messages",
            data={"message": "approve", "csrf": csrf_of(page)},
            headers={"Accept": "application/json"},
        )
        assert r.status_code == 200, r.text
        assert r.json()["ok"] is True and r.json()["queued"] is True
        assert r.json()["status"] == "waiting"
    state = httpx.get(f"{base}/v1/sessions/{sid}", headers=auth("alice-token")).json()
    assert [p["id"] for p in state["pending"]] == [body["pending"][0]["id"]]


def test_a_queued_message_is_said_to_wait_without_javascript(base: str) -> None:
    """A plain form post (no script) of a message that waits for the turn's end was sent back
    to the session page as if it had been delivered: the page it lands on now shows the note
    the script shows, once (it landed on `?queued=1`, whose note came back on every reload); a
    message that did not wait shows none."""
    note = "Your message waits for the current turn to end; it then starts the next turn."
    script = (Path(so.__file__).parent / "server" / "static" / "app.js").read_text()
    assert f'"{note}"' in script  # the same words as the script's
    body = start(base)
    sid, other = body["session_id"], start(base)["session_id"]
    with signed_in(base, "admin-token") as c:
        page = c.get(f"/_signoff/sessions/{sid}").text
        assert note not in page and re.search(r'class="form-note" role="status" hidden>', page)
        r = c.post(
            f"/_signoff/sessions/{sid}/messages",
            data={"message": "approve", "csrf": csrf_of(page)},
        )
        assert r.status_code == 303 and r.headers["location"].endswith(f"/sessions/{sid}")
        assert note not in c.get(f"/_signoff/sessions/{other}").text  # another session's page
        landed = c.get(r.headers["location"]).text
        assert re.search(rf'class="form-note" role="status">{re.escape(note)}</p>', landed)
        again = c.get(r.headers["location"]).text  # a reload
        assert note not in again and re.search(r'class="form-note" role="status" hidden>', again)
        assert note not in c.get(f"/_signoff/sessions/{sid}?queued=1").text
    with signed_in(base) as c:  # Alice's own message answers her turn: no note
        page = c.get(f"/_signoff/sessions/{sid}").text
        r = c.post(
            f"/_signoff/sessions/{sid}/messages",
            data={"message": "never mind", "csrf": csrf_of(page)},
        )
        assert r.status_code == 303 and r.headers["location"].endswith(f"/sessions/{sid}")
        assert note not in c.get(r.headers["location"]).text


def test_pages_name_their_script_and_style_by_content(base: str) -> None:
    """The script and style are served without a lifetime, so a browser may keep an old copy
    for days: an upgraded page ran the previous script. Their URLs carry a hash of them."""
    page = httpx.get(f"{base}/_signoff/", headers=auth("alice-token")).text
    static = Path(so.__file__).parent / "server" / "static"
    for name in ("app.js", "app.css"):
        url = re.search(rf'"(/_signoff/static/{re.escape(name)}[^"]*)"', page)
        assert url, name
        version = url.group(1).partition("?v=")[2]
        digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(static.iterdir())))
        assert version == digest.hexdigest()[:12], url.group(1)
        assert httpx.get(base + url.group(1)).status_code == 200


def test_pages_carry_security_headers(base: str) -> None:
    """A page may not be framed (clickjacking an Approve button), may run only its own script,
    and no response is sniffed into another type."""
    with signed_in(base) as c:
        for path in ("/_signoff/", "/_signoff/login", "/_signoff/tools", "/_signoff/static/app.js"):
            r = c.get(path)
            assert r.status_code == 200, path
            assert r.headers["x-content-type-options"] == "nosniff", path
            assert r.headers["x-frame-options"] == "DENY", path
            policy = r.headers["content-security-policy"]
            assert "frame-ancestors 'none'" in policy, path
            assert "script-src 'self'" in policy and "unsafe-inline" not in policy, path
        assert c.get("/_signoff/").headers["cache-control"] == "no-store"
    api = httpx.get(f"{base}/v1/requests", headers=auth("alice-token"))
    assert api.headers["x-content-type-options"] == "nosniff"
    assert api.headers["x-frame-options"] == "DENY"


def test_the_csrf_cookie_is_secure_over_https(tmp_path: Path) -> None:
    """Behind https both cookies the dashboard sets carry `Secure`."""
    runtime = so.Runtime([], store=f"sqlite:///{tmp_path}/x.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS))
    with TestClient(app, base_url="https://dash.example") as c:
        page = c.get("/_signoff/login")
        cookie = page.headers["set-cookie"]
        assert cookie.startswith("signoff_csrf=") and "Secure" in cookie, cookie
        assert "HttpOnly" in cookie and "samesite=strict" in cookie.lower()
        r = c.post(
            "/_signoff/login",
            data={"token": "alice-token", "csrf": csrf_of(page.text)},
            follow_redirects=False,
        )
        assert r.status_code == 303 and "Secure" in r.headers["set-cookie"]


def test_another_tenant_reaches_nothing_through_dashboard_urls(base: str) -> None:
    """Mallory (tenant evil) knows the ids of alice's session and request: every dashboard URL
    answers as if they did not exist, and nothing changes."""
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    with signed_in(base, "mallory-token") as c:
        csrf = csrf_of(c.get("/_signoff/").text)
        json_only = {"Accept": "application/json"}
        assert c.get(f"/_signoff/sessions/{sid}").status_code == 404
        assert c.get(f"/_signoff/fragments/sessions/{sid}").status_code == 404
        assert rid not in c.get("/_signoff/fragments/queue").text
        assert rid not in c.get("/_signoff/audit?status=settled").text
        r = c.post(
            f"/_signoff/requests/{rid}/respond",
            data={"option": "approve", "csrf": csrf},
            headers=json_only,
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_request"
        r = c.post(
            f"/_signoff/sessions/{sid}/messages",
            data={"message": "approve", "csrf": csrf},
            headers=json_only,
        )
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_session"
    state = httpx.get(f"{base}/v1/sessions/{sid}", headers=auth("alice-token")).json()
    assert state["status"] == "waiting" and [p["id"] for p in state["pending"]] == [rid]


@pytest.mark.parametrize(
    "target",
    [
        "https://evil.example/",
        "//evil.example/",
        "/\\evil.example",
        "javascript:alert(1)",
        "/v1",
        "/_signoff.evil.example",
        # a path under the prefix that leaves the dashboard, or is no page to return to
        "/_signoff/../v1/requests",
        "/_signoff/%2e%2e/v1/requests",
        "/_signoff/logout",
    ],
)
def test_after_a_form_post_the_redirect_stays_on_the_dashboard(base: str, target: str) -> None:
    body = start(base)
    rid = body["pending"][0]["id"]
    with signed_in(base) as c:
        r = c.post(
            f"/_signoff/requests/{rid}/respond",
            data={"option": "approve", "next": target, "csrf": csrf_of(c.get("/_signoff/").text)},
            headers={"Referer": "https://evil.example/"},
        )
        assert r.status_code == 303 and r.headers["location"] == "/_signoff"


def test_the_sign_in_cookie_is_not_honoured_beside_the_dashboard(tmp_path: Path) -> None:
    """The cookie authenticates writes under `/_signoff/` only (whose forms carry a CSRF token),
    not on a path that merely begins alike, such as an application's own `/_signoffs` route."""
    runtime = so.Runtime([], store=f"sqlite:///{tmp_path}/x.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)

    async def whoami(request: Request) -> dict[str, str | None]:
        found = await app.state.signoff.principal(request)
        return {"who": None if found is None else found.principal_id}

    for path in ("/_signoffs/delete", "/_signoff-admin", "/_signoff/whoami"):
        app.add_api_route(path, whoami, methods=["POST"])
    with TestClient(app) as c:
        page = c.get("/_signoff/login")
        c.post("/_signoff/login", data={"token": "alice-token", "csrf": csrf_of(page.text)})
        assert c.cookies["signoff_token"]
        assert c.post("/_signoffs/delete").json() == {"who": None}
        assert c.post("/_signoff-admin").json() == {"who": None}
        assert c.post("/_signoff/whoami").json() == {"who": "alice"}
        assert c.get("/_signoff/").status_code == 200


def test_a_parked_turns_trace_row_names_what_it_awaits(base: str) -> None:
    """The `turn.waiting` row says what the turn awaits: an approval of which tool, an answer to
    which question (helix: a run waiting on approval shows as awaiting approval)."""
    refund = start(base)
    question = start(base, "helper", "My mug arrived broken")
    with signed_in(base) as c:
        page = c.get(f"/_signoff/sessions/{refund['session_id']}").text
        assert "Awaiting approval: issue_refund" in page
        page = c.get(f"/_signoff/sessions/{question['session_id']}").text
        assert "Awaiting an answer: Which size should the replacement be?" in page
        assert "Awaiting approval" not in page
