"""What every route asks of the server's context: who may see a session is decided before its
state is loaded, so a foreign session's 404 costs what a missing one's does."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, _context, create_app, default_access

from ._audit import alter
from ._procs import query
from ._spies import CallSpy
from ._subagents import Counted, refund_agents
from ._ttl import ttl_agent
from .test_server_common import ALICE, MALLORY, TOKENS, auth, in_process, make_agents


def custom_access(caller: so.Principal, initiator: so.Principal | None) -> bool:
    """The default rule, passed as `access=`: a rule the server cannot hand to the store."""
    return default_access(caller, initiator)


def _spy(runtime: so.Runtime, monkeypatch: pytest.MonkeyPatch) -> CallSpy:
    """Records the state loads and store reads made during a call."""
    spy = CallSpy(monkeypatch)
    spy.wrap(runtime, ("_state", "state"), "runtime.")
    reads = ("read_events", "head", "get_request", "load_session", "audit_heads")
    spy.wrap(runtime.store, reads, "store.")
    return spy


async def test_a_foreign_session_is_refused_before_its_state_is_loaded(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mallory (another tenant) asking for Alice's session got a 404 only after its whole state
    was loaded, which a missing id skips: the time a 404 took told which ids exist. Now both
    make the same reads, and a foreign session's state is never loaded, for reads and writes."""
    async with in_process(store_url) as (runtime, c):
        r = await c.post(
            "/v1/sessions",
            json={"agent": "support", "message": "Refund order 1042"},
            headers=auth("alice-token"),
        )
        assert r.status_code == 201, r.text
        sid = r.json()["session_id"]
        spy = _spy(runtime, monkeypatch)
        mallory = auth("mallory-token")
        # Alice's own reads keep working, and remember who started the session.
        assert (await c.get(f"/v1/sessions/{sid}", headers=auth("alice-token"))).status_code == 200
        for attempt in range(2):  # the second time, the initiator is remembered
            calls = {}
            for name, target in (("foreign", sid), ("missing", "ses_" + "x" * 22)):
                for method, path, body in (
                    ("GET", f"/v1/sessions/{target}", None),
                    ("POST", f"/v1/sessions/{target}/cancel", None),
                    ("POST", f"/v1/sessions/{target}/messages", {"text": "hi"}),
                ):
                    call = c.request(method, path, json=body, headers=mallory)
                    response, made = await spy.during(call)
                    assert response.status_code == 404, (attempt, name, path, response.text)
                    assert response.json()["error"]["code"] == "unknown_session"
                    assert not any(m.startswith("runtime.") for m in made), (name, path, made)
                    calls[name, method, path.rsplit("/", 1)[-1] if method == "POST" else "get"] = (
                        made
                    )
            for (name, method, what), made in calls.items():
                if name == "foreign":
                    assert made == calls["missing", method, what] == ["store.read_events"], (
                        attempt,
                        what,
                        made,
                    )
        # Nothing Mallory did changed the session.
        r = await c.get(f"/v1/sessions/{sid}", headers=auth("alice-token"))
        assert r.json()["status"] == "waiting"


async def test_a_request_is_shown_without_loading_its_sessions_state(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Who may see a request is decided from its session's first event: its whole state was
    loaded only to be dropped, for its reviewer too. A foreign request and a missing one are the
    same 404, and neither loads a state."""
    async with in_process(store_url) as (runtime, c):
        r = await c.post(
            "/v1/sessions",
            json={"agent": "support", "message": "Refund order 1042"},
            headers=auth("alice-token"),
        )
        assert r.status_code == 201, r.text
        request_id = r.json()["pending"][0]["id"]
        spy = _spy(runtime, monkeypatch)
        own = c.get(f"/v1/requests/{request_id}", headers=auth("alice-token"))
        response, made = await spy.during(own)
        assert response.status_code == 200 and response.json()["request"]["id"] == request_id
        assert not any(m.startswith("runtime.") for m in made), made
        assert "store.load_session" not in made, made
        answers = {}
        for name, target in (("foreign", request_id), ("missing", "req_" + "x" * 20)):
            foreign = c.get(f"/v1/requests/{target}", headers=auth("mallory-token"))
            response, made = await spy.during(foreign)
            assert response.status_code == 404, (name, response.text)
            assert not any(m.startswith("runtime.") for m in made), (name, made)
            answers[name] = response.json()["error"]["code"]
        assert answers == {"foreign": "unknown_request", "missing": "unknown_request"}


async def test_a_session_listing_shows_whole_pages_of_only_what_the_caller_may_see(
    store_url: str,
) -> None:
    """`GET /v1/sessions` lists by the rule `GET /v1/sessions/{id}` follows: Mallory (another
    tenant) never sees Alice's sessions nor their count, and Alice's pages come back full
    although the store's rows (more than one 500-row chunk) interleave the two."""
    async with in_process(store_url) as (runtime, c):
        mine: list[str] = []
        theirs: list[str] = []
        for _ in range(260):
            mine.append(await runtime.create_session("support", auth=ALICE))
            theirs.append(await runtime.create_session("support", auth=MALLORY))
        mine.append(await runtime.create_session("batch", auth=ALICE))
        unowned = await runtime.create_session("support")  # from Python: no tenant sees it
        newest_first = mine[::-1]

        async def listed(token: str, **params: Any) -> dict[str, Any]:
            r = await c.get("/v1/sessions", params=params, headers=auth(token))
            assert r.status_code == 200, r.text
            body: dict[str, Any] = r.json()
            return body

        everything = await listed("alice-token", limit=500)
        assert everything["total"] == 261
        assert [s["id"] for s in everything["items"]] == newest_first
        assert everything["items"][0] == {
            "id": mine[-1],
            "agent": "batch",
            "status": "idle",
            "seq": 1,
            "created_at": everything["items"][0]["created_at"],
            "updated_at": everything["items"][0]["updated_at"],
            "expires_at": None,
        }
        paged: list[str] = []
        for offset in range(0, 300, 100):
            page = await listed("alice-token", limit=100, offset=offset)
            assert (page["total"], page["limit"], page["offset"]) == (261, 100, offset)
            assert len(page["items"]) == min(100, 261 - offset)  # never short
            paged += [s["id"] for s in page["items"]]
        assert paged == newest_first
        assert (await listed("bob-token", limit=500))["total"] == 261  # the same tenant
        for params in ({}, {"agent": "support"}, {"status": "idle"}, {"offset": 250}):
            shown = await listed("mallory-token", **params)
            assert shown["total"] == 260, params
            assert not {s["id"] for s in shown["items"]} & {*mine, unowned}, params
        assert (await listed("mallory-token", agent="batch")) == {
            "items": [],
            "total": 0,
            "limit": 50,
            "offset": 0,
        }
        assert (await listed("alice-token", agent="batch"))["total"] == 1
        assert (await listed("alice-token", status="idle"))["total"] == 261
        assert (await listed("alice-token", status="waiting"))["total"] == 0
        admin = await listed("admin-token", limit=3, offset=1)
        assert admin["total"] == 522
        assert [s["id"] for s in admin["items"]] == [mine[-1], theirs[-1], mine[-2]]
        assert (await listed("admin-token", agent="batch"))["total"] == 1
        assert (await listed("admin-token", status="idle", offset=600))["items"] == []


async def test_a_session_whose_ttl_passed_is_listed_and_counted_as_failed(store_url: str) -> None:
    """A session whose TTL passed while it waited is recorded before the listing reads: it is
    listed and counted under `failed`, not `waiting`, for its initiator and for an admin."""
    now = [1_700_000_000.0]
    runtime = so.Runtime([ttl_agent()], store=store_url, clock=lambda: now[0])
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        sid = (await runtime.generate("desk", "reset it", auth=ALICE)).session_id
        now[0] += 61
        for token in ("alice-token", "admin-token"):
            for status, listed in (("waiting", []), ("failed", [sid]), (None, [sid])):
                params = {} if status is None else {"status": status}
                r = await c.get("/v1/sessions", params=params, headers=auth(token))
                body = r.json()
                assert [s["id"] for s in body["items"]] == listed, (token, status, body)
                assert body["total"] == len(listed), (token, status, body)
                assert all(s["status"] == "failed" for s in body["items"])
        assert (await runtime.store.sessions())[0].status == "failed"


async def test_under_a_custom_rule_a_listing_reads_a_bounded_number_of_sessions(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under an `access` rule of its own the server filters listings itself, so it looks through
    only the `SESSION_SCAN` most recently active matching sessions: one call cannot make the
    server read (and hold) every session in the store. `total` counts what those pages can
    reach, an admin's too (the rule is not the default one, so admin is only an attribute)."""
    monkeypatch.setattr(_context, "SESSION_SCAN", 120)
    async with in_process(store_url, custom_access) as (runtime, c):
        mine = [await runtime.create_session("support", auth=ALICE) for _ in range(100)]
        for _ in range(50):
            await runtime.create_session("support", auth=MALLORY)
        newest = [await runtime.create_session("support", auth=ALICE) for _ in range(30)]
        read: list[int] = []
        real = runtime.store.sessions

        async def counted(**kwargs: Any) -> Any:
            rows = await real(**kwargs)
            read.append(len(rows))
            return rows

        monkeypatch.setattr(runtime.store, "sessions", counted)
        r = await c.get("/v1/sessions", params={"limit": 500}, headers=auth("alice-token"))
        body = r.json()
        # the 120 newest: Alice's last 30, Mallory's 50, then Alice's 40 newest of the first 100
        reachable = [*newest[::-1], *mine[::-1][:40]]
        assert [s["id"] for s in body["items"]] == reachable
        assert body["total"] == 70
        assert sum(read) <= 120 + 1
        r = await c.get("/v1/sessions", params={"offset": 60}, headers=auth("alice-token"))
        assert [s["id"] for s in r.json()["items"]] == reachable[60:]
        r = await c.get("/v1/sessions", params={"limit": 1}, headers=auth("admin-token"))
        assert r.json()["total"] == 120


async def test_a_lapsed_session_this_server_cannot_record_is_filtered_as_failed(
    store_url: str,
) -> None:
    """A session whose TTL passed is listed under `failed` and counted there, not under
    `waiting`, even when this server cannot record it (its agent runs elsewhere): the store's
    own status filter would still call it waiting."""
    now = [1_700_000_000.0]
    elsewhere = so.Runtime([ttl_agent()], store=store_url, clock=lambda: now[0])
    async with elsewhere:
        sid = (await elsewhere.generate("desk", "reset it", auth=ALICE)).session_id
    now[0] += 61
    runtime = so.Runtime(make_agents(), store=store_url, clock=lambda: now[0])
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        for token in ("alice-token", "admin-token"):
            for status, listed in (("waiting", []), ("failed", [sid]), (None, [sid])):
                for agent in (None, "desk"):
                    params = {k: v for k, v in (("status", status), ("agent", agent)) if v}
                    r = await c.get("/v1/sessions", params=params, headers=auth(token))
                    body = r.json()
                    assert [s["id"] for s in body["items"]] == listed, (token, params, body)
                    assert body["total"] == len(listed), (token, params, body)
                    assert all(s["status"] == "failed" for s in body["items"])
            r = await c.get("/v1/sessions", params={"agent": "support"}, headers=auth(token))
            assert r.json()["total"] == 0
        assert (await runtime.store.sessions())[0].status == "waiting"  # not this server's


async def test_a_session_whose_first_event_is_damaged_is_left_out_of_listings(
    store_url: str,
) -> None:
    """A session whose first event was damaged after it was created is still listed to whom its
    row says started it, and to no one else; where the row does not say either (an upgrade that
    could not read that event leaves it unknown), the listings of anyone but an admin leave it
    out (as a foreign one) instead of failing for every caller with a 503. The session's own
    read still names the damage."""
    async with so.Runtime(make_agents(), store=store_url) as rt:
        good = (await rt.generate("support", "refund it", auth=ALICE)).session_id
        bad = (await rt.generate("support", "refund it", auth=ALICE)).session_id
        theirs = await rt.create_session("support", auth=MALLORY)
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", bad)
    alter(store_url, "UPDATE {t}events SET type='?' WHERE sk={p} AND seq=1", sk)
    async with in_process(store_url) as (_, c):
        for token, seen in (("alice-token", {good, bad}), ("mallory-token", {theirs})):
            r = await c.get("/v1/sessions", headers=auth(token))
            assert {s["id"] for s in r.json()["items"]} == seen, r.text
            r = await c.get("/v1/requests", headers=auth(token))
            assert {q["session_id"] for q in r.json()["items"]} == seen - {theirs}, r.text
    alter(store_url, "UPDATE {t}sessions SET initiator=NULL, tenant=NULL WHERE sk={p}", sk)
    async with in_process(store_url) as (_, c):
        for token, listed in (("alice-token", [good]), ("mallory-token", [theirs])):
            r = await c.get("/v1/sessions", headers=auth(token))
            assert r.status_code == 200, r.text
            assert [s["id"] for s in r.json()["items"]] == listed
            assert r.json()["total"] == 1
            r = await c.get("/v1/requests", headers=auth(token))
            assert r.status_code == 200, r.text
            shown = {q["session_id"] for q in r.json()["items"]}
            assert shown == ({good} if token == "alice-token" else set()), r.text
            r = await c.get("/_signoff/sessions", headers=auth(token))
            assert r.status_code == 200 and listed[0] in r.text and bad not in r.text
        r = await c.get("/v1/sessions", headers=auth("admin-token"))
        assert r.json()["total"] == 3
        r = await c.get(f"/v1/sessions/{bad}", headers=auth("alice-token"))
        assert r.status_code == 503


async def test_a_listing_fails_when_who_started_a_session_cannot_be_read_for_a_moment(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a rule of its own the server reads who started each session from its first event.
    A read that fails with a plain `StoreError` (SQLite's disk I/O error, PostgreSQL's statement
    cancelled) is not damage: the listing and the queue fail with 503 `store_error`, as any
    call the store fails does. They answered 200 leaving the session out (its request too), a
    page the caller could not tell was short. Read again once the store mends, it is listed."""
    async with in_process(store_url, custom_access) as (runtime, c):
        good = (await runtime.generate("support", "refund it", auth=ALICE)).session_id
        bad = (await runtime.generate("support", "refund it", auth=ALICE)).session_id
        real = runtime.store.read_events
        failing = [True]

        async def read_events(session_id: str, *args: Any, **kwargs: Any) -> Any:
            if session_id == bad and failing[0]:
                raise so.StoreError("SQLite read state.db failed: disk I/O error")
            return await real(session_id, *args, **kwargs)

        monkeypatch.setattr(runtime.store, "read_events", read_events)
        for path in ("/v1/sessions", "/v1/requests"):
            r = await c.get(path, headers=auth("alice-token"))
            assert r.status_code == 503, (path, r.text)
            assert r.json()["error"]["code"] == "store_error", r.text
        failing[0] = False
        r = await c.get("/v1/sessions", headers=auth("alice-token"))
        assert {s["id"] for s in r.json()["items"]} == {good, bad}, r.text
        r = await c.get("/v1/requests", headers=auth("alice-token"))
        assert {q["session_id"] for q in r.json()["items"]} == {good, bad}, r.text


@pytest.mark.parametrize("first", ["b", "?"])
async def test_a_session_whose_first_event_is_not_its_start_is_left_out_of_listings(
    store_url: str, first: str
) -> None:
    """A first event that reads back but is no `session.created` (its type code edited to
    another event's, `b`) does not say who started the session: its state is read, whose own
    checks fail on it, and a listing under a rule of its own leaves the session out (it is
    `StoreDamaged`, as one whose first event does not read back, `?`, is) rather than fail
    for every caller; the session's own read answers 503 `store_error`."""
    async with so.Runtime(make_agents(), store=store_url) as rt:
        good = (await rt.generate("support", "refund it", auth=ALICE)).session_id
        bad = (await rt.generate("support", "refund it", auth=ALICE)).session_id
    ((sk,),) = query(store_url, "SELECT sk FROM {t}sessions WHERE id={p}", bad)
    alter(store_url, "UPDATE {t}events SET type={p} WHERE sk={p} AND seq=1", first, sk)
    async with in_process(store_url, custom_access) as (_, c):
        r = await c.get("/v1/sessions", headers=auth("alice-token"))
        assert r.status_code == 200, r.text
        assert [s["id"] for s in r.json()["items"]] == [good], r.text
        r = await c.get("/v1/requests", headers=auth("alice-token"))
        assert r.status_code == 200, r.text
        assert {q["session_id"] for q in r.json()["items"]} == {good}, r.text
        r = await c.get(f"/v1/sessions/{bad}", headers=auth("alice-token"))
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_error", r.text


async def test_a_subagents_session_is_listed_to_whoever_may_see_its_parent(
    store_url: str,
) -> None:
    """A child session carries its parent's initiator: the parent's tenant lists and counts
    it (also by the child's agent), another tenant neither."""
    parent, child = refund_agents([], Counted("done"))
    runtime = so.Runtime([parent, child], store=store_url)
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        assert (await runtime.generate("support", "refund", auth=ALICE)).status == "waiting"
        for token, seen in (("alice-token", 2), ("bob-token", 2), ("mallory-token", 0)):
            body = (await c.get("/v1/sessions", headers=auth(token))).json()
            assert body["total"] == len(body["items"]) == seen, (token, body)
            r = await c.get("/v1/sessions", params={"agent": "billing"}, headers=auth(token))
            assert [s["agent"] for s in r.json()["items"]] == ["billing"] * (seen // 2)


async def test_a_session_opened_while_a_listing_reads_shifts_no_session_in_twice(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sessions opened between the store reads of one listing (under a rule of its own, read
    session by session) push the rows down a chunk: the row read again is listed once, and
    `total` counts exactly the items listed."""
    monkeypatch.setattr(_context, "SESSION_CHUNK", 5)
    async with in_process(store_url, custom_access) as (runtime, c):
        mine = [await runtime.create_session("support", auth=ALICE) for _ in range(12)]
        real = runtime.store.sessions
        reads: list[int] = []

        async def meanwhile(**kwargs: Any) -> Any:
            rows = await real(**kwargs)
            reads.append(len(rows))
            if len(reads) <= 2:  # opened between this chunk and the next
                await runtime.create_session("support", auth=ALICE)
            return rows

        monkeypatch.setattr(runtime.store, "sessions", meanwhile)
        body = (await c.get("/v1/sessions", headers=auth("alice-token"))).json()
        ids = [s["id"] for s in body["items"]]
        assert len(ids) == len(set(ids)) == body["total"]
        assert ids == mine[::-1]
        assert reads == [5, 5, 4]  # the last row of each chunk read again


async def test_a_request_of_a_session_whose_ttl_passed_reads_expired(store_url: str) -> None:
    """A request left open when its session's TTL passed read `pending` at
    `GET /v1/requests/{id}`, though the queue left it out and any answer to it was 410
    `session_expired`. It reads `expired` now: recorded first, as the session's own read
    records it, or shown so where this server cannot record it (its agent runs elsewhere)."""
    now = [1_700_000_000.0]
    elsewhere = so.Runtime([ttl_agent()], store=store_url, clock=lambda: now[0])
    async with elsewhere:
        rid = (await elsewhere.generate("desk", "reset it", auth=ALICE)).pending[0].id
    now[0] += 61
    for agents, recorded in ((make_agents(), "pending"), ([ttl_agent()], "expired")):
        runtime = so.Runtime(agents, store=store_url, clock=lambda: now[0])
        app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
        ):
            queue = await c.get("/v1/requests", headers=auth("alice-token"))
            assert queue.json()["total"] == 0, queue.text
            r = await c.get(f"/v1/requests/{rid}", headers=auth("alice-token"))
            assert r.status_code == 200, r.text
            body = r.json()
            assert (body["status"], body["outcome"]) == ("expired", "expired"), body
            assert body["request"]["status"] == "expired"
            assert body["resolution"]["outcome"] == "expired"
            stored = await runtime.store.get_request(rid)
            assert stored is not None and stored.status == recorded


def _desk() -> so.Agent:
    """An agent whose one call, `reset_password`, waits 60 s for an approval, then says done."""

    @so.tool(approval=so.always(expires_in=60))
    async def reset_password(email: str) -> str:
        """Reset a password."""
        return "reset"

    asked = so.ModelResponse(tool_calls=[so.ToolCall(name="reset_password", input={"email": "a"})])
    model = so.models.Scripted([asked, so.ModelResponse(text="done")])
    return so.Agent(name="desk", model=model, tools=[reset_password])


async def test_a_sessions_read_applies_a_deadline_that_passed(store_url: str) -> None:
    """An approval whose deadline passed with no sweep since was still listed under `pending` by
    `GET /v1/sessions/{id}` (the session `waiting` on it), though the queue and the request's
    own read both apply the deadline first and any answer was refused. The session's read
    applies it too, and the turn goes on as the deadline left it."""
    now = [1_700_000_000.0]
    runtime = so.Runtime([_desk()], store=store_url, clock=lambda: now[0])
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        first = await runtime.generate("desk", "reset it", auth=ALICE)
        (request,) = first.pending
        now[0] += 61
        r = await c.get(f"/v1/sessions/{first.session_id}", headers=auth("alice-token"))
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["pending"] == [] and body["status"] == "idle", body
        assert body["turn"]["text"] == "done"
        stored = await runtime.store.get_request(request.id)
        assert stored is not None and stored.status == "expired"


async def test_a_sessions_read_by_a_front_without_its_agent_shows_a_passed_deadline(
    store_url: str,
) -> None:
    """Served by a process without the session's agent (it cannot apply the deadline: that is
    left to one that has it), `GET /v1/sessions/{id}` listed the approval past its deadline under
    `pending`, though the queue leaves it out and `GET /v1/requests/{id}` reads it expired. The
    session's read shows it as the deadline leaves it too, and the store is left alone."""
    now = [1_700_000_000.0]
    back = so.Runtime([_desk()], store=store_url, clock=lambda: now[0])
    front = so.Runtime([], store=store_url, clock=lambda: now[0])
    app = create_app(front, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    async with (
        back,
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c,
    ):
        first = await back.generate("desk", "reset it", auth=ALICE)
        (request,) = first.pending
        now[0] += 61
        r = await c.get(f"/v1/sessions/{first.session_id}", headers=auth("alice-token"))
        assert r.status_code == 200, r.text
        assert r.json()["pending"] == [], r.json()
        one = await c.get(f"/v1/requests/{request.id}", headers=auth("alice-token"))
        assert one.json()["status"] == "expired"
        stored = await back.store.get_request(request.id)
        assert stored is not None and stored.status == "pending"  # left to `back`
