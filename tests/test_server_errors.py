"""The errors the HTTP API sends over real HTTP: unknown ids, agents and answers named with a
4xx and a stable code, expired sessions and requests past their deadline, a server or store
failure as a JSON 500 or 503 that names no database, and every error in the documented table.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import DevAuth, TokenAuth, create_app
from signoff.testing import store_contents

from ._server_api import (
    alice,
    base,
    client,
    error,
    in_process,
    start,
    store,
)
from ._ttl import ttl_agent
from .test_server_common import (
    PLAIN,
    TOKENS,
    auth,
    make_agents,
    make_runtime,
    running,
)

__all__ = ["alice", "base", "store"]  # the fixtures, used by name


def test_unknown_ids_are_404(alice: httpx.Client) -> None:
    error(alice.get("/v1/sessions/ses_nope"), 404, "unknown_session")
    error(alice.get("/v1/sessions/ses_nope/events"), 404, "unknown_session")
    error(alice.post("/v1/sessions/ses_nope/cancel"), 404, "unknown_session")
    error(alice.get("/v1/requests/req_nope"), 404, "unknown_request")
    body = start(alice)
    r = alice.post(
        f"/v1/sessions/{body['session_id']}/responses",
        json={"inputResponses": [{"requestId": "req_typo", "optionId": "approve"}]},
    )
    assert error(r, 404, "unknown_request")["request_ids"] == ["req_typo"]
    assert "req_typo" in r.json()["error"]["message"]
    # a request of another session is unknown in this one
    other = start(alice)
    r = alice.post(
        f"/v1/sessions/{body['session_id']}/responses",
        json={"inputResponses": [{"requestId": other["pending"][0]["id"], "optionId": "approve"}]},
    )
    error(r, 404, "unknown_request")
    error(alice.get("/v1/nothing-here"), 404, "not_found")


async def test_ids_and_filters_with_a_nul_are_unknown_on_every_store(store_url: str) -> None:
    """No id or name holds a NUL, and PostgreSQL cannot even look one up: such a request is a 404
    (or an empty page) on every store, never a 503 `store_error` blaming the database."""
    runtime = make_runtime(store_url)
    async with in_process(runtime) as c:
        created = await c.post("/v1/sessions", json={"agent": "support", "message": "hi"})
        sid, rid = created.json()["session_id"], created.json()["pending"][0]["id"]
        nul = "ses_%00"
        error(await c.get(f"/v1/sessions/{nul}"), 404, "unknown_session")
        error(await c.get(f"/v1/sessions/{nul}/events"), 404, "unknown_session")
        error(await c.post(f"/v1/sessions/{nul}/cancel"), 404, "unknown_session")
        message = {"text": "approve"}
        error(await c.post(f"/v1/sessions/{nul}/messages", json=message), 404, "unknown_session")
        error(await c.get("/v1/requests/req_%00"), 404, "unknown_request")
        answer = {"inputResponses": [{"requestId": "req_\x00", "optionId": "approve"}]}
        r = await c.post(f"/v1/sessions/{sid}/responses", json=answer)
        assert error(r, 404, "unknown_request")["request_ids"] == ["req_\x00"]
        decisions = {"approvals": [{"id": rid, "approved": True}, {"id": "\x00", "approved": True}]}
        r = await c.post(f"/v1/sessions/{sid}/approvals", json=decisions)
        assert error(r, 404, "unknown_request")["request_ids"] == ["\x00"]
        for query in ("agent=%00", "tool=issue%00refund", "agent=support%00"):
            r = await c.get(f"/v1/requests?{query}")
            assert r.status_code == 200, (query, r.text)
            assert r.json()["items"] == [] and r.json()["total"] == 0
        assert (await c.get("/v1/requests?agent=support")).json()["total"] == 1
        page = await c.get(f"/_signoff/sessions/{nul}")
        assert page.status_code == 404, page.text
        page = await c.get("/_signoff/?agent=%00")
        assert page.status_code == 200 and rid not in page.text
        token = c.cookies["signoff_csrf"]
        form = {"csrf": token, "option": "approve"}
        page = await c.post("/_signoff/requests/req_%00/respond", data=form)
        assert page.status_code == 404, page.text
        page = await c.post(f"/_signoff/sessions/{nul}/messages", data={**form, "message": "x"})
        assert page.status_code == 404, page.text
        assert (await c.get(f"/v1/sessions/{sid}")).json()["status"] == "waiting"
    await runtime.close()


async def test_a_session_of_an_agent_this_server_lacks_is_422_unknown_agent(
    store_url: str,
) -> None:
    """A message, answer or cancel for a session another server started with an agent this one
    does not have was 400 `usage_error`, while naming that agent to start a session is 422
    `unknown_agent`: now both are 422 `unknown_agent` (`so.UnknownAgent` in Python), on every
    store, and nothing is stored. Reading the session still works."""
    runtime = make_runtime(store_url)
    others = so.Runtime([a for a in make_agents() if a.name != "support"], store=store_url)
    async with in_process(runtime) as c, in_process(others) as elsewhere:
        body = (
            await c.post("/v1/sessions", json={"agent": "support", "message": "Refund order 1042"})
        ).json()
        sid, rid = body["session_id"], body["pending"][0]["id"]
        before = await store_contents(runtime.store, sid)
        calls: list[tuple[str, Any]] = [
            ("messages", {"text": "hi"}),
            ("messages", {"text": "hi", "turnPolicy": "queue"}),
            ("responses", {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}),
            ("approvals", {"approvals": [{"id": rid, "approved": True}]}),
            ("cancel", None),
        ]
        for path, payload in calls:
            r = await elsewhere.post(f"/v1/sessions/{sid}/{path}", json=payload)
            assert "'support'" in error(r, 422, "unknown_agent")["message"], path
        r = await elsewhere.post("/v1/sessions", json={"agent": "support"})
        error(r, 422, "unknown_agent")
        assert (await elsewhere.get(f"/v1/sessions/{sid}")).json()["status"] == "waiting"
        with pytest.raises(so.UnknownAgent, match="'support'"):
            await others.send(sid, "hi")
        assert await store_contents(runtime.store, sid) == before
    await others.close()
    await runtime.close()


def test_conflicting_and_repeated_answers(alice: httpx.Client) -> None:
    body = start(alice)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    url = f"/v1/sessions/{sid}/responses"
    approve = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
    assert alice.post(url, json=approve).status_code == 200
    again = alice.post(url, json=approve)
    assert again.status_code == 200
    assert again.json()["outcomes"] == [
        {"request_id": rid, "outcome": "approved", "applied": False, "reason": None}
    ]
    deny = {"inputResponses": [{"requestId": rid, "optionId": "cancel"}]}
    assert error(alice.post(url, json=deny), 409, "conflicting_answer")["request_ids"] == [rid]


def test_openapi_is_served(base: str) -> None:
    doc = httpx.get(f"{base}/v1/openapi.json", verify=PLAIN).json()
    paths = doc["paths"]
    for path in (
        "/v1/sessions",
        "/v1/sessions/{session_id}",
        "/v1/sessions/{session_id}/messages",
        "/v1/sessions/{session_id}/responses",
        "/v1/sessions/{session_id}/approvals",
        "/v1/sessions/{session_id}/cancel",
        "/v1/sessions/{session_id}/events",
        "/v1/requests",
    ):
        assert path in paths, path
    assert not any(p.startswith("/_signoff") for p in paths)
    assert doc["components"]["schemas"]["CreateSession"]["properties"]["agent"]["enum"] == [
        "batch",
        "finance",
        "helper",
        "support",
        "treasury",
    ]
    assert httpx.get(f"{base}/v1/docs", verify=PLAIN).status_code == 200
    root = httpx.get(f"{base}/", verify=PLAIN)
    assert root.status_code == 307 and root.headers["location"] == "/_signoff/"


def _documented_errors() -> dict[int, str]:
    """The rows of docs/server.md's error table: status -> the text naming its codes."""
    text = (Path(__file__).resolve().parent.parent / "docs" / "server.md").read_text()
    table = text.split("### Errors", 1)[1].split("###", 1)[0]
    rows = [line.split("|") for line in table.splitlines() if line.startswith("| ")]
    return {int(row[1]): row[2] for row in rows if row[1].strip().isdigit()}


def _subclasses(cls: type[so.SignoffError]) -> list[type[so.SignoffError]]:
    return [cls] + [sub for direct in cls.__subclasses__() for sub in _subclasses(direct)]


def test_every_error_the_api_can_send_is_in_the_documented_table() -> None:
    """Each error class a call can raise reaches the client with a status and code that
    docs/server.md's table lists (append_conflict and lease_lost, from the store, were missing),
    and the OpenAPI document's error responses name every code of the table."""
    from signoff.server._errors import ERROR_RESPONSES, status_for

    documented = _documented_errors()
    # Bases never raised as such; the client's own error; errors raised inside a tool's body,
    # which the turn records as that call's failure. The channels' errors (a Slack signature)
    # are answered by their own routes; classes of other packages (tests) are not signoff's.
    never_sent = {so.SignoffError, so.SessionError, so.AnswerError, so.RemoteError}
    never_sent |= {so.ReplayError, so.StepFailed}
    for cls in _subclasses(so.SignoffError):
        module = cls.__module__
        if cls in never_sent or not module.startswith("signoff.") or ".channels" in module:
            continue
        status = status_for(cls.__new__(cls))
        assert f"`{cls.code}`" in documented.get(status, ""), (cls.__name__, status, cls.code)
    for status, row in documented.items():
        codes = {c for c in re.findall(r"`([a-z_]+)`", row) if c not in ("request_ids", "held_by")}
        if status == 405:  # any path's wrong method, not a route's own answer
            continue
        described = ERROR_RESPONSES[status]["description"]
        assert {c for c in codes if f"`{c}`" not in described} == set(), status


def test_expired_sessions_leave_the_queue_and_answers_are_410(tmp_path: Path) -> None:
    now = [1_000_000.0]

    agent = ttl_agent()
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/ttl.db", clock=lambda: now[0])
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        with client(base, "alice-token") as alice:
            body = alice.post("/v1/sessions", json={"agent": "desk", "message": "reset"}).json()
            sid, rid = body["session_id"], body["pending"][0]["id"]
            assert alice.get("/v1/requests").json()["total"] == 1
            now[0] += 120
            assert alice.get("/v1/requests").json()["total"] == 0
            assert "All caught up" in alice.get("/_signoff/").text
            r = alice.post(
                f"/v1/sessions/{sid}/responses",
                json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
            )
            assert error(r, 410, "session_expired")["session_id"] == sid


def test_an_expired_session_reads_failed_with_nothing_to_answer(tmp_path: Path) -> None:
    """Before any sweep or listing, reading a session whose TTL passed while it waited records
    that: it is failed (`session_expired`) with no open request, and its page offers none."""
    now = [1_000_000.0]

    agent = ttl_agent()
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/ttl.db", clock=lambda: now[0])
    with running(create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)) as base:
        with client(base, "alice-token") as alice:
            body = alice.post("/v1/sessions", json={"agent": "desk", "message": "reset"}).json()
            sid, rid = body["session_id"], body["pending"][0]["id"]
            now[0] += 120
            view = alice.get(f"/v1/sessions/{sid}").json()
            assert (view["status"], view["pending"]) == ("failed", [])
            assert view["turn"]["error"]["code"] == "session_expired"
            assert not view["turn"]["retryable"]
            assert rid not in alice.get("/_signoff/").text


def deadline_agent(name: str, tool: str) -> so.Agent:
    """An agent whose turn calls `tool`: `reset_password` (approval within 60 s, denied after)
    or `unlock_account` (approval within 60 s, escalated to `security` after)."""

    @so.tool(approval=so.always(expires_in=60))
    async def reset_password(email: str) -> str:
        """Reset a password."""
        return "reset"

    @so.tool(approval=so.always(expires_in=60, on_timeout="escalate", escalate_to="security"))
    async def unlock_account(email: str) -> str:
        """Unlock an account."""
        return "unlocked"

    call = so.ToolCall(name=tool, input={"email": "a@example.com"})
    return so.Agent(
        name=name,
        model=so.models.Scripted([so.ModelResponse(tool_calls=[call])]),
        tools=[reset_password, unlock_account],
    )


def test_requests_past_their_deadline_leave_the_queue_before_any_sweep(tmp_path: Path) -> None:
    """With the sweep off, the queue still never offers a request that cannot be answered, and
    offers an escalated one as escalated."""
    now = [1_000_000.0]

    agents = [deadline_agent("desk", "reset_password"), deadline_agent("locks", "unlock_account")]
    runtime = so.Runtime(agents, store=f"sqlite:///{tmp_path}/due.db", clock=lambda: now[0])
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    with running(app) as base, client(base, "alice-token") as alice:
        ids = [
            alice.post("/v1/sessions", json={"agent": name, "message": "help"}).json()["pending"][
                0
            ]["id"]
            for name in ("desk", "locks")
        ]
        assert alice.get("/v1/requests").json()["total"] == 2
        now[0] += 60
        # the request itself reads as the deadline left it, too
        record = alice.get(f"/v1/requests/{ids[0]}").json()
        assert (record["status"], record["outcome"]) == ("expired", "expired")
        record = alice.get(f"/v1/requests/{ids[1]}").json()
        assert (record["status"], record["request"]["escalated_to"]) == ("pending", "security")
        listed = alice.get("/v1/requests").json()
        assert listed["total"] == 1
        (item,) = listed["items"]
        assert (item["agent"], item["escalated_to"]) == ("locks", "security")
        assert item["expires_at"] is None


def test_a_server_failure_is_a_json_500(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = make_runtime(store)

    async def broken(session_id: str) -> so.SessionState:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(runtime, "state", broken)
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        # a session alice may see: whether she may is read before its state
        created = httpx.post(
            f"{base}/v1/sessions",
            json={"agent": "support"},
            headers=auth("alice-token"),
            verify=PLAIN,
        )
        sid = created.json()["session_id"]
        r = httpx.get(f"{base}/v1/sessions/{sid}", headers=auth("alice-token"), verify=PLAIN)
        detail = error(r, 500, "internal_error")
        assert "RuntimeError" in detail["message"] and "disk" not in detail["message"]


async def test_a_store_failure_is_a_503_that_names_no_database(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A failing store is the server's problem: the client gets `store_error` without the
    database's address or the driver's words (as with a 500); the server's log keeps them."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/state.db")
    where = "postgresql://signoff@db.internal.example:5432/prod"

    async def broken(session_id: str) -> so.SessionState:
        raise so.StoreError(f"loading session {session_id!r} failed at {where}: disk full")

    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        runtime.state = broken  # type: ignore[method-assign]
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=auth("alice-token")
        ) as c:
            sid = (await c.post("/v1/sessions", json={"agent": "support"})).json()["session_id"]
            with caplog.at_level("ERROR", logger="signoff.server"):
                r = await c.get(f"/v1/sessions/{sid}")
            detail = error(r, 503, "store_error")
            assert "db.internal" not in detail["message"] and "disk" not in detail["message"]
            assert where in caplog.text
            # both server failures are in the API's document
            doc = (await c.get("/v1/openapi.json")).json()
            for path, method in (("/v1/sessions/{session_id}", "get"), ("/v1/sessions", "post")):
                responses = doc["paths"][path][method]["responses"]
                assert {"500", "503"} <= set(responses), (path, sorted(responses))
                assert "store_error" in responses["503"]["description"]
    await runtime.close()


def test_a_request_past_its_deadline_reads_as_the_list_shows_it_when_not_recorded(
    tmp_path: Path,
) -> None:
    """A server whose runtime cannot record a passed deadline (the session is another agent's)
    leaves the request out of the queue; reading it alone said it was still pending."""
    now = [1_000_000.0]

    url = f"sqlite:///{tmp_path}/due.db"
    asking = so.Runtime(
        [deadline_agent("desk", "reset_password"), deadline_agent("locks", "unlock_account")],
        store=url,
        clock=lambda: now[0],
    )
    alice_p = TOKENS["alice-token"]
    ids = [
        asking.generate_sync(name, "help", auth=alice_p).pending[0].id for name in ("desk", "locks")
    ]
    asking.close_sync()
    other = so.Runtime([deadline_agent("other", "reset_password")], store=url, clock=lambda: now[0])
    app = create_app(other, auth=TokenAuth(TOKENS), sweep_every=None)
    with running(app) as base, client(base, "alice-token") as alice:
        now[0] += 60
        listed = alice.get("/v1/requests").json()
        assert [(i["id"], i["escalated_to"]) for i in listed["items"]] == [(ids[1], "security")]
        record = alice.get(f"/v1/requests/{ids[0]}").json()
        assert (record["status"], record["outcome"]) == ("expired", "expired"), record
        assert record["request"]["status"] == "expired"
        record = alice.get(f"/v1/requests/{ids[1]}").json()
        assert record["status"] == "pending"
        assert (record["request"]["escalated_to"], record["request"]["expires_at"]) == (
            "security",
            None,
        )


async def test_a_database_down_is_a_503_store_unavailable_with_retry_after(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A database that is down (`StoreUnavailable`) is a 503 `store_unavailable` telling the
    client when to try again (`Retry-After`), naming no database; the log keeps the address."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/state.db")
    where = "postgresql://signoff@db.internal.example:5432/prod"

    async def down(session_id: str) -> so.SessionState:
        raise so.StoreUnavailable(f"PostgreSQL unavailable at {where}: connection refused")

    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        runtime.state = down  # type: ignore[method-assign]
        async with httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=auth("alice-token")
        ) as c:
            sid = (await c.post("/v1/sessions", json={"agent": "support"})).json()["session_id"]
            with caplog.at_level("WARNING", logger="signoff.server"):
                r = await c.get(f"/v1/sessions/{sid}")
            detail = error(r, 503, "store_unavailable")
            assert r.headers["Retry-After"] == str(so.StoreUnavailable.retry_after)
            assert "db.internal" not in detail["message"] and "refused" not in detail["message"]
            assert where in caplog.text
            doc = (await c.get("/v1/openapi.json")).json()
            responses = doc["paths"]["/v1/sessions/{session_id}"]["get"]["responses"]
            assert "store_unavailable" in responses["503"]["description"]
    await runtime.close()


def test_a_lone_surrogate_a_model_wrote_is_served_escaped_not_a_500(tmp_path: Path) -> None:
    """A model's text may hold a lone surrogate, which the store keeps and UTF-8 cannot: the
    answer that resumed the turn was recorded, then answered with a 500, and so was every
    later read of the session. It is served as a JSON escape, as the event stream does."""
    import asyncio

    from signoff.testing import call_tools, reply, scripted_agent

    @so.tool(approval=so.always())
    async def refund(order_id: str) -> str:
        """Refund an order."""
        return "ok"

    agent = scripted_agent(
        "a",
        [call_tools(so.ToolCall(name="refund", input={"order_id": "1"})), reply("done \ud800")],
        tools=[refund],
    )
    rt = so.Runtime([agent], store=f"sqlite:///{tmp_path}/s.db")

    async def main() -> None:
        app = create_app(rt, auth=DevAuth())
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            r = await c.post("/v1/sessions", json={"agent": "a", "message": "go"})
            assert r.status_code == 201, r.text
            sid, rid = r.json()["session_id"], r.json()["pending"][0]["id"]
            r = await c.post(
                f"/v1/sessions/{sid}/approvals", json={"approvals": [{"id": rid, "approved": True}]}
            )
            assert r.status_code == 200, r.text
            assert b'"done \\ud800"' in r.content and r.json()["text"] == "done \ud800"
            r = await c.get(f"/v1/sessions/{sid}")
            assert r.status_code == 200, r.text
            assert r.json()["status"] == "idle"
            r = await c.get("/v1/requests", params={"session_id": sid})
            assert r.status_code == 200, r.text
        await rt.close()

    asyncio.run(main())


async def _cut_off(app: Any, path: str, content_type: bytes, part: bytes) -> list[dict[str, Any]]:
    """What `app` sends for a POST to `path` whose client closes its connection after `part`
    of a body of 100 bytes (uvicorn then hands the app `http.disconnect`)."""
    sent: list[dict[str, Any]] = []
    chunks = [{"type": "http.request", "body": part, "more_body": True}]

    async def receive() -> dict[str, Any]:
        return chunks.pop(0) if chunks else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    headers = [(b"host", b"t"), (b"authorization", b"Bearer alice-token")]
    headers += [(b"content-type", content_type), (b"content-length", b"100")]
    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": headers,
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 80),
    }
    await app(scope, receive, send)
    return sent


async def test_a_client_gone_before_its_body_arrived_is_no_server_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that closes its connection partway through its body (a phone losing its
    network while it uploads) was answered as a failure of the server's: the body's read raised
    Starlette's `ClientDisconnect`, logged as `Exception in ASGI application` with its
    traceback and counted as a 5xx (three aborted uploads to a served app: three 5xx). It is
    the client's doing: 499 `client_closed_request` (nginx's number), counted as a 4xx, nothing
    logged, nothing stored; the API's routes and the sign-in form alike. The body is refused
    before any store call, so the store does not matter."""
    from .test_server_metrics import metered, requests_of, scrape

    async with metered(f"sqlite:///{tmp_path}/s.db") as (runtime, c):
        app = c._transport.app  # type: ignore[attr-defined]
        posts = [
            ("/v1/sessions", b"application/json", b'{"agent": "supp'),
            ("/_signoff/login", b"application/x-www-form-urlencoded", b"token=ali"),
        ]
        for path, content_type, part in posts:
            with caplog.at_level("ERROR"):
                sent = await _cut_off(app, path, content_type, part)  # raised ClientDisconnect
            assert sent[0]["type"] == "http.response.start"
            assert sent[0]["status"] == 499, (path, sent)
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
        found = await scrape(c)
        assert requests_of(found, "POST", "/v1/sessions", "4xx") == 1
        assert requests_of(found, "POST", "/_signoff/login", "4xx") == 1
        assert not [k for k, v in found.items() if ("status", "5xx") in k[1] and v]
        assert await runtime.sessions() == []
