"""The HTTP API over real HTTP: uvicorn on a loopback port, httpx as the client."""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import DevAuth, TokenAuth, create_app, default_access
from signoff.testing import store_contents

from ._ttl import ttl_agent
from .test_server_common import (
    TOKENS,
    auth,
    make_agents,
    make_runtime,
    read_sse,
    running,
    served,
    server_processes,
    tool_output,
)


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


@pytest.fixture
def base(store: str) -> Iterator[str]:
    with served(store) as url:
        yield url


@pytest.fixture
def alice(base: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base, headers=auth("alice-token"), timeout=10) as c:
        yield c


def client(base: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers=auth(token), timeout=10)


@asynccontextmanager
async def in_process(runtime: so.Runtime) -> AsyncIterator[httpx.AsyncClient]:
    """An app serving `runtime`, running, and a client calling it in this process as alice."""
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://t",
            headers=auth("alice-token"),
        ) as c,
    ):
        yield c


def start(c: httpx.Client, agent: str = "support") -> dict[str, Any]:
    r = c.post("/v1/sessions", json={"agent": agent, "message": "Refund order 1042, it broke"})
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    assert body["status"] == "waiting"
    return body


def error(r: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    detail: dict[str, Any] = r.json()["error"]
    assert detail["code"] == code, detail
    assert detail["message"]
    return detail


# -- flows -----------------------------------------------------------------------------------


def test_approve_flow(alice: httpx.Client) -> None:
    body = start(alice)
    sid = body["session_id"]
    (req,) = body["pending"]
    assert req["action"]["tool_name"] == "issue_refund"
    assert req["action"]["input"] == {
        "order_id": "1042",
        "amount": 180.0,
        "reason": "arrived broken",
    }
    assert req["usage"] == {"input_tokens": 1200, "output_tokens": 80, "cost_usd": 0.0042}
    assert req["requested_by"]["principal_id"] == "alice"

    queue = alice.get("/v1/requests").json()
    assert queue["total"] == 1 and [r["id"] for r in queue["items"]] == [req["id"]]
    state = alice.get(f"/v1/sessions/{sid}").json()
    assert state["status"] == "waiting" and [r["id"] for r in state["pending"]] == [req["id"]]

    r = alice.post(
        f"/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": req["id"], "optionId": "approve", "text": "ok"}]},
    )
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["status"] == "completed"
    assert done["outcomes"] == [
        {"request_id": req["id"], "outcome": "approved", "applied": True, "reason": None}
    ]
    assert done["text"].startswith("tool ok: ")
    seen = tool_output(done["text"])
    assert seen["result"] == {"order_id": "1042", "refunded": 180.0}
    assert seen["approval"]["reason"] == "ok"  # the reviewer's reason reaches the model

    assert alice.get("/v1/requests").json() == {"items": [], "total": 0, "limit": 50, "offset": 0}
    record = alice.get(f"/v1/requests/{req['id']}").json()
    assert record["status"] == "settled" and record["outcome"] == "approved"
    assert record["resolution"]["by"]["principal_id"] == "alice"
    assert record["resolution"]["reason"] == "ok"
    settled = alice.get("/v1/requests", params={"status": "settled"}).json()
    assert [r["id"] for r in settled["items"]] == [req["id"]]


def test_deny_flow_reason_reaches_the_model(alice: httpx.Client) -> None:
    body = start(alice)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    r = alice.post(
        f"/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "cancel", "text": "over limit"}]},
    )
    assert r.status_code == 200, r.text
    done = r.json()
    assert done["status"] == "completed"
    assert done["outcomes"][0]["outcome"] == "cancelled"
    assert done["text"].startswith("tool error: ")
    assert '"reason": "over limit"' in done["text"]
    assert "refunded" not in done["text"]


def test_edit_then_approve(alice: httpx.Client) -> None:
    body = start(alice)
    sid, (req,) = body["session_id"], body["pending"]
    url = f"/v1/sessions/{sid}/responses"
    edited = {"order_id": "1042", "amount": 120, "reason": "partial refund"}

    def answer(**extra: Any) -> httpx.Response:
        item = {"requestId": req["id"], "optionId": "approve", **extra}
        return alice.post(url, json={"inputResponses": [item]})

    stale = answer(editedInput=edited, inputHash="sha256:" + "0" * 64)
    assert error(stale, 409, "stale_answer")["request_ids"] == [req["id"]]
    bad = answer(editedInput={"order_id": "1042", "amount": "lots", "reason": "x"})
    assert "amount" in error(bad, 422, "invalid_answer")["message"]
    r = answer(editedInput=edited, inputHash=req["action"]["input_hash"])
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"
    assert '"refunded": 120.0' in r.json()["text"]
    record = alice.get(f"/v1/requests/{req['id']}").json()
    assert record["resolution"]["edited_input"] == {**edited, "amount": 120.0}


def test_a_quorum_needs_two_approvers(base: str) -> None:
    with client(base, "alice-token") as alice, client(base, "bob-token") as bob:
        with client(base, "admin-token") as admin:
            body = start(alice, "treasury")
            sid, rid = body["session_id"], body["pending"][0]["id"]
            answer = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
            first = bob.post(f"/v1/sessions/{sid}/responses", json=answer)
            assert first.status_code == 200, first.text
            assert first.json()["status"] == "waiting"
            (vote,) = first.json()["outcomes"]
            assert vote["outcome"] == "counted" and vote["reason"] == "1 of 2"
            pending = bob.get(f"/v1/sessions/{sid}").json()["pending"]
            assert pending[0]["approved_by"] == ["bob"]
            page = bob.get("/_signoff/").text
            assert "1 of 2" in page and "wire_money" in page
            again = bob.post(f"/v1/sessions/{sid}/responses", json=answer)
            assert again.json()["outcomes"][0]["applied"] is False  # bob counts once
            done = admin.post(f"/v1/sessions/{sid}/responses", json=answer)
            assert done.json()["status"] == "completed", done.text
            assert done.json()["outcomes"][0]["outcome"] == "approved"


def test_a_response_policy_decides_who_may_settle(base: str) -> None:
    with client(base, "alice-token") as alice, client(base, "bob-token") as bob:
        body = start(alice, "finance")
        sid, rid = body["session_id"], body["pending"][0]["id"]
        answer = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
        refused = alice.post(f"/v1/sessions/{sid}/responses", json=answer)
        assert refused.status_code == 200, refused.text
        (outcome,) = refused.json()["outcomes"]
        assert outcome["outcome"] == "rejected" and outcome["applied"] is False
        assert outcome["reason"] == "only a manager may approve invoices"
        assert refused.json()["status"] == "waiting"  # still open, for someone else
        done = bob.post(f"/v1/sessions/{sid}/responses", json=answer)
        assert done.json()["status"] == "completed", done.text
        assert tool_output(done.json()["text"]) == {"paid": "INV-7"}


def test_helix_approvals_must_settle_everything(alice: httpx.Client) -> None:
    body = start(alice, "batch")
    sid = body["session_id"]
    first, second = (r["id"] for r in body["pending"])
    partial = alice.post(
        f"/v1/sessions/{sid}/approvals", json={"approvals": [{"id": first, "approved": True}]}
    )
    detail = error(partial, 422, "partial_answer")
    assert detail["request_ids"] == [second]
    assert second in detail["message"]
    assert alice.get(f"/v1/sessions/{sid}").json()["status"] == "waiting"  # nothing claimed

    r = alice.post(
        f"/v1/sessions/{sid}/approvals",
        json={
            "approvals": [
                {"id": first, "approved": True},
                {"id": second, "approved": False, "reason": "too much"},
            ]
        },
    )
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"
    outcomes = {o["request_id"]: o["outcome"] for o in r.json()["outcomes"]}
    assert outcomes == {first: "approved", second: "cancelled"}


def test_question_answered_by_option_or_text(alice: httpx.Client) -> None:
    for answer, expected in (({"optionId": "2"}, "Large"), ({"text": "Medium"}, "Medium")):
        body = start(alice, "helper")
        sid, (req,) = body["session_id"], body["pending"]
        assert req["kind"] == "question"
        assert req["question"] == "Which size should the replacement be?"
        assert [o["label"] for o in req["options"]] == ["Small", "Large"]
        assert alice.get("/v1/requests", params={"kind": "question"}).json()["total"] == 1
        r = alice.post(
            f"/v1/sessions/{sid}/responses",
            json={"inputResponses": [{"requestId": req["id"], **answer}]},
        )
        assert r.status_code == 200, r.text
        assert r.json()["outcomes"][0]["outcome"] == "answered"
        assert r.json()["status"] == "completed"
        assert f'"answer": "{expected}"' in r.json()["text"]


def test_a_bad_answer_to_a_question_is_422(alice: httpx.Client) -> None:
    body = start(alice, "helper")
    sid, rid = body["session_id"], body["pending"][0]["id"]
    url = f"/v1/sessions/{sid}/responses"
    r = alice.post(url, json={"inputResponses": [{"requestId": rid, "optionId": "9"}]})
    assert error(r, 422, "invalid_answer")["request_ids"] == [rid]
    both = {"requestId": rid, "optionId": "1", "text": "Small"}
    error(alice.post(url, json={"inputResponses": [both]}), 422, "invalid_answer")
    # a message that names an option answers the question
    r = alice.post(f"/v1/sessions/{sid}/messages", json={"text": "Small"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed" and '"answer": "Small"' in r.json()["text"]


def test_a_question_answered_for_another_calls_input_hash_is_409(alice: httpx.Client) -> None:
    """A question is bound to the call that asked it, as an approval is: an answer naming
    another input hash is stale and records nothing; the question's own hash is accepted."""
    body = start(alice, "helper")
    sid, (req,) = body["session_id"], body["pending"]
    url = f"/v1/sessions/{sid}/responses"
    before = alice.get(f"/v1/sessions/{sid}").json()
    item = {"requestId": req["id"], "optionId": "2", "inputHash": "sha256:" + "0" * 64}
    stale = alice.post(url, json={"inputResponses": [item]})
    assert error(stale, 409, "stale_answer")["request_ids"] == [req["id"]]
    assert alice.get(f"/v1/sessions/{sid}").json() == before
    item["inputHash"] = req["action"]["input_hash"]
    r = alice.post(url, json={"inputResponses": [item]})
    assert r.status_code == 200, r.text
    assert r.json()["outcomes"][0]["outcome"] == "answered"


def test_messages_start_the_next_turn(alice: httpx.Client) -> None:
    r = alice.post("/v1/sessions", json={"agent": "support"})
    assert r.status_code == 201 and r.json()["status"] == "idle"
    sid = r.json()["session_id"]
    r = alice.post(f"/v1/sessions/{sid}/messages", json={"text": "Refund 1042"})
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "waiting"
    rid = r.json()["pending"][0]["id"]
    # a message that steers: the open approval is ignored and the model reads the message
    r = alice.post(f"/v1/sessions/{sid}/messages", json={"text": "only the three-pack"})
    assert r.status_code == 200, r.text
    assert r.json()["pending"] == []
    record = alice.get(f"/v1/requests/{rid}").json()
    assert record["status"] != "pending" and record["outcome"] == "ignored"


def test_an_admins_message_to_another_persons_turn_says_it_is_queued(base: str) -> None:
    """An admin may see Alice's session, but her turn serves her: the admin's message neither
    steers nor answers it. It waits for the turn's end, and the answer says so (`queued`),
    where it read like a message the turn had taken; the turn it then starts is the admin's."""
    with client(base, "alice-token") as alice, client(base, "admin-token") as admin:
        body = start(alice)
        sid, rid = body["session_id"], body["pending"][0]["id"]
        r = admin.post(f"/v1/sessions/{sid}/messages", json={"text": "approve"})
        assert r.status_code == 200, r.text
        sent = r.json()
        assert sent["queued"] is True and sent["status"] == "waiting"
        assert sent["turn_id"] == body["turn_id"] and sent["outcomes"] == []
        assert [p["id"] for p in sent["pending"]] == [rid]  # "approve" answered nothing
        assert alice.get(f"/v1/requests/{rid}").json()["status"] == "pending"
        # Alice's own message steers her turn; once it ends, the admin's message starts one.
        own = alice.post(f"/v1/sessions/{sid}/messages", json={"text": "hello"})
        assert own.status_code == 200 and own.json()["queued"] is False
        events = alice.get(f"/v1/sessions/{sid}/events", params={"follow": "false"}).text
        starts = [
            json.loads(line[5:])["data"]
            for line in events.splitlines()
            if line.startswith("data:") and '"turn.started"' in line
        ]
        assert [(s["message"], s["principal"]["principal_id"]) for s in starts] == [
            ("Refund order 1042, it broke", "alice"),
            ("approve", "root"),
        ]


def test_cancel_withdraws_and_closes(alice: httpx.Client) -> None:
    body = start(alice)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    r = alice.post(f"/v1/sessions/{sid}/cancel", json={"reason": "customer left"})
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    again = alice.post(f"/v1/sessions/{sid}/cancel")  # no body: allowed, and a no-op now
    assert again.status_code == 200 and again.json()["status"] == "cancelled"
    late = alice.post(
        f"/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
    )
    assert error(late, 409, "request_closed")["request_ids"] == [rid]
    assert alice.get("/v1/requests", params={"status": "withdrawn"}).json()["total"] == 1
    events = alice.get(f"/v1/sessions/{sid}/events", params={"follow": "false"}).text
    (line,) = [x for x in events.splitlines() if x.startswith("data:") and "customer left" in x]
    assert json.loads(line[5:])["data"]["by"]["principal_id"] == "alice"


# -- errors ----------------------------------------------------------------------------------


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


@pytest.mark.parametrize("blank", ["", " ", "\n\t "])
async def test_a_blank_message_is_refused_everywhere_and_stores_nothing(
    store_url: str, blank: str
) -> None:
    """An empty or whitespace-only prompt is 422 invalid_request over HTTP and a UsageError in
    Python, on every store, before a session is made or an event appended."""
    runtime = make_runtime(store_url)
    async with in_process(runtime) as c:
        created = await c.post("/v1/sessions", json={"agent": "support"})
        sid = created.json()["session_id"]
        before = await store_contents(runtime.store, sid)
        r = await c.post("/v1/sessions", json={"agent": "support", "message": blank})
        assert "message" in error(r, 422, "invalid_request")["message"]
        r = await c.post(f"/v1/sessions/{sid}/messages", json={"text": blank})
        assert "text" in error(r, 422, "invalid_request")["message"]
        with pytest.raises(so.UsageError, match="empty"):
            await runtime.generate("support", prompt=blank)
        with pytest.raises(so.UsageError, match="empty"):
            await runtime.generate(session_id=sid, prompt=blank)
        with pytest.raises(so.UsageError, match="empty"):
            await runtime.schedule("support", blank, session_id=sid)
        with pytest.raises(so.UsageError, match="empty"):
            await runtime.send(sid, blank)
        assert [s.id for s in await runtime.sessions()] == [sid]
        assert await store_contents(runtime.store, sid) == before


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


BAD_RESPONSES: list[tuple[dict[str, Any], str]] = [
    ({}, "inputResponses"),
    ({"inputResponses": []}, "inputResponses"),
    ({"inputResponses": [{"optionId": "approve"}]}, "requestId"),
    ({"inputResponses": [{"requestId": "r"}]}, "optionId"),
    ({"inputResponses": [{"requestId": 7, "optionId": "approve"}]}, "requestId"),
    ({"inputResponses": [{"requestId": "r", "optionId": "approve", "extra": 1}]}, "extra"),
    ({"input_responses": [{"requestId": "r", "optionId": "approve"}]}, "input_responses"),
    (
        {"inputResponses": [{"requestId": "r", "optionId": "approve", "editedInput": []}]},
        "editedInput",
    ),
]


def test_bad_response_bodies_name_the_field(alice: httpx.Client) -> None:
    sid = start(alice)["session_id"]
    for payload, field in BAD_RESPONSES:
        r = alice.post(f"/v1/sessions/{sid}/responses", json=payload)
        assert field in error(r, 422, "invalid_request")["message"], payload
    assert alice.get(f"/v1/sessions/{sid}").json()["status"] == "waiting"


def test_a_body_in_another_encoding_than_utf8_is_refused(alice: httpx.Client, store: str) -> None:
    """JSON between systems is UTF-8 (RFC 8259, section 8.1) and the documented body is, but a
    UTF-16 or UTF-32 body started a conversation: Python's `json.loads` guesses the encoding
    of bytes. A gateway that inspects bodies as UTF-8 reads such a body as something else, so
    it is 400 `malformed_json`, naming UTF-8, and nothing is stored. A UTF-8 byte order mark,
    which a parser may ignore, is ignored."""
    body = json.dumps({"agent": "support", "message": "Refund order 1042, it broke"})
    sent = {"Content-Type": "application/json"}
    before = _stored(store)
    for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"):
        r = alice.post("/v1/sessions", content=body.encode(encoding), headers=sent)
        assert "UTF-8" in error(r, 400, "malformed_json")["message"], encoding
    assert _stored(store) == before
    sid = start(alice)["session_id"]
    before = _stored(store)
    cancel = json.dumps({"reason": "customer left"}).encode("utf-16")
    r = alice.post(f"/v1/sessions/{sid}/cancel", content=cancel, headers=sent)
    error(r, 400, "malformed_json")
    assert _stored(store) == before
    r = alice.post("/v1/sessions", content=body.encode("utf-8-sig"), headers=sent)
    assert r.status_code == 201, r.text


def test_bad_bodies_elsewhere(alice: httpx.Client, store: str) -> None:
    sid = start(alice)["session_id"]
    r = alice.post(
        f"/v1/sessions/{sid}/approvals", json={"approvals": [{"id": "r", "approved": "yes"}]}
    )
    assert "approved" in error(r, 422, "invalid_request")["message"]
    r = alice.post(
        f"/v1/sessions/{sid}/responses",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    error(r, 400, "malformed_json")
    error(alice.post("/v1/sessions", json={"agent": "nobody"}), 422, "unknown_agent")
    error(alice.post("/v1/sessions", json={"agent": 3}), 422, "invalid_request")
    before = _stored(store)
    r = alice.post("/v1/sessions", json={"agent": "support", "message": ""})  # as /messages does
    assert "message" in error(r, 422, "invalid_request")["message"]
    assert _stored(store) == before
    error(
        alice.post(f"/v1/sessions/{sid}/messages", json={"text": "x", "turnPolicy": "now"}),
        422,
        "invalid_request",
    )
    error(alice.get("/v1/requests", params={"limit": 0}), 422, "invalid_request")
    error(alice.get("/v1/requests", params={"status": "open"}), 422, "invalid_request")
    for last in ("abc", "-1", str(2**70)):
        r = alice.get(f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": last})
        error(r, 422, "invalid_request")
    error(alice.get(f"/v1/sessions/{sid}/events", params={"after": 2**70}), 422, "invalid_request")
    error(alice.get("/v1/requests", params={"offset": 2**70}), 422, "invalid_request")
    # an option that is not an approval's
    rid = alice.get(f"/v1/sessions/{sid}").json()["pending"][0]["id"]
    r = alice.post(
        f"/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "maybe"}]},
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_answer"


def test_authentication_and_visibility(base: str) -> None:
    with client(base, "alice-token") as alice, client(base, "bob-token") as bob:
        with client(base, "mallory-token") as mallory:
            body = start(alice)
            sid, rid = body["session_id"], body["pending"][0]["id"]
            error(httpx.get(f"{base}/v1/sessions/{sid}"), 401, "unauthenticated")
            error(httpx.get(f"{base}/v1/requests", headers=auth("wrong")), 401, "unauthenticated")
            # another tenant cannot see the session, its events, or its requests
            error(mallory.get(f"/v1/sessions/{sid}"), 404, "unknown_session")
            error(mallory.get(f"/v1/sessions/{sid}/events?follow=false"), 404, "unknown_session")
            error(mallory.get(f"/v1/requests/{rid}"), 404, "unknown_request")
            assert mallory.get("/v1/requests").json()["total"] == 0
            answer = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
            error(
                mallory.post(f"/v1/sessions/{sid}/responses", json=answer), 404, "unknown_session"
            )
            # the same tenant sees it, but the runtime's response rule lets only alice settle
            assert bob.get("/v1/requests").json()["total"] == 1
            r = bob.post(f"/v1/sessions/{sid}/responses", json=answer)
            assert error(r, 403, "not_allowed")["request_ids"] == [rid]
            assert alice.get(f"/v1/sessions/{sid}").json()["status"] == "waiting"
            assert alice.post(f"/v1/sessions/{sid}/responses", json=answer).status_code == 200


async def test_dev_mode_accepts_localhost_only(tmp_path: Path) -> None:
    runtime = make_runtime(f"sqlite:///{tmp_path}/dev.db")
    app = create_app(runtime, dev=True)
    for host, status in (("127.0.0.1", 200), ("::1", 200), ("10.1.2.3", 401)):
        transport = httpx.ASGITransport(app=app, client=(host, 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000") as c:
            r = await c.get("/v1/requests")
            assert r.status_code == status, (host, r.text)
            page = await c.get("/_signoff/")
            assert page.status_code == status
            assert ("Approval queue" in page.text) == (status == 200)
    await runtime.close()
    # A misconfigured app is a UsageError, like every error signoff raises (README)
    with pytest.raises(so.UsageError, match="auth"):
        create_app(runtime)
    with pytest.raises(so.UsageError, match="not both"):
        create_app(runtime, auth=TokenAuth(TOKENS), dev=True)
    with pytest.raises(so.UsageError, match="Runtime"):
        create_app(object(), dev=True)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="positive"):
        create_app(runtime, dev=True, poll_interval=0)
    with pytest.raises(so.UsageError, match="non-empty"):
        TokenAuth({"": so.Principal(authenticator="token", principal_id="a")})
    with pytest.raises(so.UsageError, match="not a Principal"):
        TokenAuth({"t0k3n": "alice"})  # type: ignore[dict-item]
    assert DevAuth().principal.principal_id == "dev"


@pytest.mark.parametrize(
    "settings",
    [
        {"auth": ...},  # the README's Channels example copied as it is
        {"auth": "s3cret"},
        {"dev": True, "access": "tenant"},
        {"dev": True, "poll_interval": float("nan")},
        {"dev": True, "heartbeat": float("nan")},
        {"dev": True, "heartbeat": float("inf")},
        {"dev": True, "sweep_every": float("nan")},
        {"dev": True, "sweep_every": 0},
        {"dev": True, "secret": "s\udcff"},  # a byte of SIGNOFF_SECRET that is not UTF-8
    ],
)
def test_create_app_refuses_settings_it_cannot_run_with(
    tmp_path: Path, settings: dict[str, Any]
) -> None:
    """An `auth` or `access` that is not a function was accepted, and then every request was a
    500 (`auth=...`, as the README's example shows it, included); NaN seconds passed the
    `<= 0` check. Each is now a `UsageError` when the app is made."""
    runtime = so.Runtime([], store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match=next(k for k in settings if k != "dev")):
        create_app(runtime, **settings)


def test_only_the_bearer_scheme_carries_an_api_token(base: str) -> None:
    """A token under another scheme (`Basic`, `Token`) or bare is not a bearer token: 401.
    The scheme's name is case-insensitive (RFC 9110)."""
    for header in ("Basic alice-token", "Token alice-token", "alice-token", "Bearer"):
        r = httpx.get(f"{base}/v1/requests", headers={"Authorization": header}, timeout=10)
        assert r.status_code == 401, header
    r = httpx.get(f"{base}/v1/requests", headers={"Authorization": "bearer alice-token"})
    assert r.status_code == 200, r.text


def test_default_access_is_the_initiator_the_same_tenant_or_an_admin() -> None:
    """Two callers without a tenant are not one tenant, and only `admin: true` (the boolean)
    makes an admin: a string such as "false" in a token's attributes must not."""

    def who(pid: str, **attributes: object) -> so.Principal:
        return so.Principal(authenticator="token", principal_id=pid, attributes=attributes)

    carol, dave = who("carol"), who("dave")
    assert default_access(carol, carol)
    assert not default_access(dave, carol)  # neither has a tenant: not the same one
    assert default_access(who("e", tenant="acme"), who("f", tenant="acme"))
    assert not default_access(who("e", tenant="acme"), who("f", tenant="evil"))
    assert not default_access(who("e", tenant="acme"), carol)
    assert default_access(carol, None) and not default_access(who("e", tenant="acme"), None)
    assert default_access(who("root", admin=True), carol)
    for not_admin in ("false", "yes", 1, ["true"]):
        assert not default_access(who("mallory", admin=not_admin), carol), not_admin
        assert not default_access(who("mallory", admin=not_admin, tenant="x"), None), not_admin


async def test_dev_mode_refuses_requests_addressed_to_another_name(tmp_path: Path) -> None:
    """DNS rebinding: a page of another site, resolved to 127.0.0.1, reaches the dev server from
    a browser on this machine with its own name in `Host`; it must not act as the dev admin."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/dev.db")
    app = create_app(runtime, dev=True, sweep_every=None)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with app.router.lifespan_context(app):
        for base, status in (
            ("http://attacker.example:8000", 401),
            ("http://127.0.0.1.attacker.example", 401),
            ("http://localhost.attacker.example:8000", 401),
            ("http://evillocalhost:8000", 401),  # a name ending in "localhost", not ".localhost"
            ("http://10.0.0.5:8000", 401),
            ("http://localhost:8000", 200),
            ("http://LOCALHOST", 200),
            ("http://app.localhost:8000", 200),
            ("http://127.0.0.1:8000", 200),
            ("http://127.1.2.3", 200),
            ("http://[::1]:8000", 200),
        ):
            async with httpx.AsyncClient(transport=transport, base_url=base) as c:
                r = await c.get("/v1/requests")
                assert r.status_code == status, (base, r.text)
                created = await c.post("/v1/sessions", json={"agent": "support"})
                assert created.status_code == (201 if status == 200 else 401), base
                page = await c.get("/_signoff/")
                assert ("Approval queue" in page.text) == (status == 200), base
    await runtime.close()


async def test_dev_mode_says_what_it_serves_when_it_refuses(tmp_path: Path) -> None:
    """A dev server reached by another name, or from another machine, has no tokens to ask for:
    its 401 says which requests dev mode serves and how to serve others, not "authenticate with
    a bearer token"; a token server's 401 asks for the token."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/dev.db")
    for app, client, base in (
        (create_app(runtime, dev=True, sweep_every=None), "127.0.0.1", "http://10.0.0.5:8000"),
        (create_app(runtime, dev=True, sweep_every=None), "10.0.0.9", "http://localhost:8000"),
        (create_app(runtime, auth=TokenAuth({}), sweep_every=None), "127.0.0.1", "http://x"),
    ):
        transport = httpx.ASGITransport(app=app, client=(client, 5000))
        async with httpx.AsyncClient(transport=transport, base_url=base) as c:
            r = await c.get("/v1/requests")
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthenticated"
        message = r.json()["error"]["message"]
        if isinstance(app.state.signoff.auth, DevAuth):
            assert "bearer" not in message and "localhost" in message, message
            assert "--token" in message, message
        else:
            assert "bearer token" in message, message
    await runtime.close()


async def test_dev_mode_refuses_requests_from_another_site(tmp_path: Path) -> None:
    """A page of another site, open in a browser on this machine, can POST to the dev server
    without a preflight (e.g. a bodiless cancel); its `Origin` names that site: not the dev
    admin. Same-origin requests (the dashboard's scripts) and clients sending no `Origin` are."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/dev.db")
    app = create_app(runtime, dev=True, sweep_every=None)
    transport = httpx.ASGITransport(app=app, client=("127.0.0.1", 5000))
    async with app.router.lifespan_context(app):
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost:8000") as c:
            created = await c.post("/v1/sessions", json={"agent": "support", "message": "x"})
            sid = created.json()["session_id"]
            for origin in (
                "http://evil.example",
                "null",
                "http://localhost:3000",
                "http://localhost:8000.evil.example",
                "http://[::1",  # not even a URL
            ):
                r = await c.post(f"/v1/sessions/{sid}/cancel", headers={"Origin": origin})
                assert r.status_code == 401, (origin, r.text)
                assert (await c.get(f"/v1/sessions/{sid}")).json()["status"] == "waiting"
            r = await c.get("/v1/requests", headers={"Origin": "http://LOCALHOST:8000"})
            assert r.status_code == 200
            r = await c.post(
                f"/v1/sessions/{sid}/cancel", headers={"Origin": "http://localhost:8000"}
            )
            assert r.status_code == 200 and r.json()["status"] == "cancelled"
    await runtime.close()


def test_queue_filters_and_pagination(alice: httpx.Client) -> None:
    for _ in range(3):
        start(alice)
    start(alice, "batch")
    everything = alice.get("/v1/requests").json()
    assert everything["total"] == 5
    page = alice.get("/v1/requests", params={"limit": 2, "offset": 2}).json()
    assert page["total"] == 5 and page["limit"] == 2 and page["offset"] == 2
    assert [r["id"] for r in page["items"]] == [r["id"] for r in everything["items"][2:4]]
    assert alice.get("/v1/requests", params={"agent": "batch"}).json()["total"] == 2
    assert alice.get("/v1/requests", params={"tool": "issue_refund"}).json()["total"] == 5
    assert alice.get("/v1/requests", params={"tool": "lookup_order"}).json()["total"] == 0
    assert alice.get("/v1/requests", params={"kind": "question"}).json()["total"] == 0
    assert alice.get("/v1/requests", params={"older_than": 3600}).json()["total"] == 0
    assert alice.get("/v1/requests", params={"older_than": 0}).json()["total"] == 5
    # Older than any time a store holds (schemathesis found the 400): no request matches.
    huge = alice.get("/v1/requests", params={"older_than": "1.291777083443892e+308"})
    assert huge.status_code == 200 and huge.json()["total"] == 0, huge.text


def test_openapi_is_served(base: str) -> None:
    doc = httpx.get(f"{base}/v1/openapi.json").json()
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
    assert httpx.get(f"{base}/v1/docs").status_code == 200
    root = httpx.get(f"{base}/")
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
        codes = {c for c in re.findall(r"`([a-z_]+)`", row) if c != "request_ids"}
        if status == 405:  # any path's wrong method, not a route's own answer
            continue
        described = ERROR_RESPONSES[status]["description"]
        assert {c for c in codes if f"`{c}`" not in described} == set(), status


# -- the stream ------------------------------------------------------------------------------


def test_sse_reconnect_with_last_event_id_loses_nothing(alice: httpx.Client) -> None:
    body = start(alice)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    url = f"/v1/sessions/{sid}/events"
    with alice.stream("GET", url) as s:
        assert s.headers["content-type"].startswith("text/event-stream")
        first = read_sse(s, 3)
    assert [e["id"] for e in first] == ["1", "2", "3"]
    assert [e["event"] for e in first] == ["session.created", "turn.started", "model.completed"]
    assert all(e["data"]["seq"] == int(e["id"]) for e in first)

    # while disconnected, the turn moves on
    r = alice.post(
        f"/v1/sessions/{sid}/responses",
        json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
    )
    assert r.json()["status"] == "completed"
    head = alice.get(f"/v1/sessions/{sid}").json()["seq"]

    # reconnect the way EventSource does: same URL (with ?after=0), Last-Event-ID wins
    with alice.stream("GET", url + "?after=0", headers={"Last-Event-ID": "3"}) as s:
        rest = read_sse(s, head - 3)
    seqs = [int(e["id"]) for e in first + rest]
    assert seqs == list(range(1, head + 1))
    types = [e["event"] for e in rest]
    assert "approval.settled" in types and "turn.completed" in types

    # then live: a stream opened now receives events appended later
    received: list[dict[str, Any]] = []

    def listen() -> None:
        with client(str(alice.base_url), "alice-token") as c:
            with c.stream("GET", url, headers={"Last-Event-ID": str(head)}) as s:
                received.extend(read_sse(s, 3))

    listener = threading.Thread(target=listen)
    listener.start()
    r = alice.post(f"/v1/sessions/{sid}/messages", json={"text": "and again"})
    assert r.status_code == 200
    listener.join(timeout=15)
    assert [int(e["id"]) for e in received] == [head + 1, head + 2, head + 3]
    assert received[0]["event"] == "turn.started"
    assert received[0]["data"]["data"]["message"] == "and again"


def test_sse_without_follow_ends_after_catching_up(alice: httpx.Client) -> None:
    sid = start(alice)["session_id"]
    with alice.stream(
        "GET", f"/v1/sessions/{sid}/events", params={"follow": "false", "after": 2}
    ) as s:
        events = read_sse(s, 100)
    assert [e["id"] for e in events] == ["3", "4", "5"]


def test_a_following_stream_outlives_a_store_outage(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store failing for a while (the database restarting) must not end a following stream:
    a browser's EventSource reconnecting meanwhile gets a 503 and gives up for good. The
    stream keeps its connection (with keep-alives), and sends what the store gains once back."""
    runtime = make_runtime(store)
    app = create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05, heartbeat=0.1)
    with running(app) as base, client(base, "alice-token") as alice:
        body = start(alice)
        sid, rid = body["session_id"], body["pending"][0]["id"]
        real = runtime.store.read_events
        calls = [0]

        async def down_a_while(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if 2 <= calls[0] <= 6:  # after the first read, the database goes away for a while
                raise so.StoreError("reading events failed: the database is restarting")
            return await real(*args, **kwargs)

        def answer_once_back() -> None:
            while calls[0] <= 6:
                time.sleep(0.02)
            with client(base, "alice-token") as other:
                r = other.post(
                    f"/v1/sessions/{sid}/responses",
                    json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
                )
                assert r.json()["status"] == "completed"

        monkeypatch.setattr(runtime.store, "read_events", down_a_while)
        answering = threading.Thread(target=answer_once_back)
        with alice.stream("GET", f"/v1/sessions/{sid}/events") as s:
            answering.start()
            events = read_sse(s, until="turn.completed")
        answering.join(timeout=10)
        seqs = [int(e["id"]) for e in events]
        assert seqs == list(range(1, seqs[-1] + 1)) and seqs[-1] > 3
        assert events[-1]["event"] == "turn.completed"


def test_two_server_processes_share_one_sqlite_file(store: str) -> None:
    token = "alice-token=alice"  # as `signoff serve --token SECRET=PRINCIPAL_ID` takes it
    with server_processes(store, 2, token) as (a, b):
        with client(a, "alice-token") as ca, client(b, "alice-token") as cb:
            body = start(ca)
            sid, rid = body["session_id"], body["pending"][0]["id"]
            seen = cb.get(f"/v1/sessions/{sid}").json()
            assert seen["status"] == "waiting" and seen["pending"][0]["id"] == rid
            assert [r["id"] for r in cb.get("/v1/requests").json()["items"]] == [rid]

            received: list[dict[str, Any]] = []
            ready = threading.Event()

            def listen() -> None:
                with client(b, "alice-token") as c:
                    with c.stream("GET", f"/v1/sessions/{sid}/events") as s:
                        ready.set()
                        received.extend(read_sse(s, until="turn.completed"))

            listener = threading.Thread(target=listen)
            listener.start()
            assert ready.wait(10)
            r = ca.post(
                f"/v1/sessions/{sid}/responses",
                json={"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
            )
            assert r.json()["status"] == "completed"
            listener.join(timeout=15)
            assert received[-1]["event"] == "turn.completed"
            assert [int(e["id"]) for e in received] == list(range(1, len(received) + 1))
            assert {"input.requested", "approval.settled", "tool.completed"} <= {
                e["event"] for e in received
            }
            final = cb.get(f"/v1/sessions/{sid}").json()
            assert final["status"] == "idle" and final["pending"] == []
            # B settling the same request again is a no-op; a different answer conflicts
            again = cb.post(
                f"/v1/sessions/{sid}/responses",
                json={"inputResponses": [{"requestId": rid, "optionId": "cancel"}]},
            )
            error(again, 409, "conflicting_answer")


def test_api_accepts_so_types() -> None:
    # the principal the tests use is the public type
    assert isinstance(TOKENS["alice-token"], so.Principal)


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


def test_idle_streams_send_keep_alive_comments(store: str) -> None:
    with served(store, heartbeat=0.2) as base, client(base, "alice-token") as alice:
        r = alice.post("/v1/sessions", json={"agent": "support"})
        sid = r.json()["session_id"]
        with alice.stream("GET", f"/v1/sessions/{sid}/events") as s:
            lines = s.iter_lines()
            seen = []
            for line in lines:
                seen.append(line)
                if line == ": keep-alive":
                    break
    assert "id: 1" in seen and "event: session.created" in seen
    assert seen[0].startswith("retry: ")


def test_a_server_failure_is_a_json_500(store: str, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = make_runtime(store)

    async def broken(session_id: str) -> so.SessionState:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(runtime, "state", broken)
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        # a session alice may see: whether she may is read before its state
        created = httpx.post(
            f"{base}/v1/sessions", json={"agent": "support"}, headers=auth("alice-token")
        )
        sid = created.json()["session_id"]
        r = httpx.get(f"{base}/v1/sessions/{sid}", headers=auth("alice-token"))
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


def _stored(store: str) -> list[tuple[str, int]]:
    """Each session in the store with the number of its events."""
    rt = make_runtime(store)
    try:
        sessions = rt.sessions_sync()
        return sorted((s.id, len(rt.events_sync(s.id))) for s in sessions)
    finally:
        rt.close_sync()


def test_an_idempotency_key_makes_a_retried_post_act_once(alice: httpx.Client, store: str) -> None:
    body = {"agent": "support", "message": "Refund order 1042"}
    key = {"Idempotency-Key": "order-1042-try"}
    first = alice.post("/v1/sessions", json=body, headers=key)
    again = alice.post("/v1/sessions", json=body, headers=key)
    assert first.status_code == again.status_code == 201
    assert set(first.json()) == set(again.json())
    assert first.json()["replayed"] is False and again.json()["replayed"] is True
    sid = first.json()["session_id"]
    assert again.json()["session_id"] == sid
    before = _stored(store)
    other = alice.post("/v1/sessions", json={**body, "message": "Refund 9"}, headers=key)
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    assert other.json()["error"]["session_id"] == sid
    for bad in ("", "x" * 201):
        r = alice.post("/v1/sessions", json=body, headers={"Idempotency-Key": bad})
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"
    msg = {"text": "never mind", "turnPolicy": "queue"}
    sent = alice.post(f"/v1/sessions/{sid}/messages", json=msg, headers={"Idempotency-Key": "m"})
    assert sent.status_code == 200 and sent.json()["replayed"] is False
    after_send = _stored(store)
    assert after_send != before
    repeat = alice.post(f"/v1/sessions/{sid}/messages", json=msg, headers={"Idempotency-Key": "m"})
    assert repeat.status_code == 200 and repeat.json()["replayed"] is True
    assert set(repeat.json()) == set(sent.json())
    assert _stored(store) == after_send


def test_a_repeated_post_answers_with_the_turn_its_message_went_to(store_url: str) -> None:
    """Message A parks on an approval (a repeat shows the request), is approved, then message B
    runs a turn of its own: A repeated still answers with A's turn, on both stores."""
    with served(store_url) as base, client(base, "alice-token") as alice:
        body = {"agent": "support", "message": "Refund order 1042"}
        key_a, key_b = {"Idempotency-Key": "refund-a"}, {"Idempotency-Key": "ask-b"}
        a = alice.post("/v1/sessions", json=body, headers=key_a).json()
        sid, (req,) = a["session_id"], a["pending"]
        parked = alice.post("/v1/sessions", json=body, headers=key_a)
        assert parked.status_code == 201 and parked.json() == {**a, "replayed": True}
        done = alice.post(
            f"/v1/sessions/{sid}/responses",
            json={"inputResponses": [{"requestId": req["id"], "optionId": "approve"}]},
        ).json()
        assert done["status"] == "completed" and done["text"].startswith("tool ok: ")
        url = f"/v1/sessions/{sid}/messages"
        b = alice.post(url, json={"text": "and order 7?"}, headers=key_b).json()
        assert b["turn_id"] != a["turn_id"] and b["text"] == "nothing to report"
        before = _stored(store_url)
        again = alice.post("/v1/sessions", json=body, headers=key_a)
        assert again.status_code == 201
        assert again.json() == {**done, "outcomes": [], "replayed": True}
        b_again = alice.post(url, json={"text": "and order 7?"}, headers=key_b)
        assert b_again.status_code == 200 and b_again.json() == {**b, "replayed": True}
        opened = alice.post("/v1/sessions", json={"agent": "support"}, headers=key_b)
        opened_again = alice.post("/v1/sessions", json={"agent": "support"}, headers=key_b)
        assert opened.status_code == opened_again.status_code == 201
        assert opened_again.json() == {**opened.json(), "replayed": True}
        assert opened.json()["replayed"] is False and opened.json()["status"] == "idle"
        assert len(_stored(store_url)) == len(before) + 1


def test_the_idempotency_key_is_in_the_openapi_document(base: str) -> None:
    doc = httpx.get(f"{base}/v1/openapi.json").json()
    for path in ("/v1/sessions", "/v1/sessions/{session_id}/messages"):
        params = doc["paths"][path]["post"]["parameters"]
        header = next(p for p in params if p["name"] == "Idempotency-Key")
        assert header["in"] == "header" and not header.get("required")
        assert header["schema"]["anyOf"][0]["maxLength"] == 200


# -- what a careless client sends ------------------------------------------------------------


def test_a_caller_without_credentials_is_401_whatever_it_sent(base: str, store: str) -> None:
    """Authentication comes first: a caller with no token (or a wrong one) is told so, not
    that its body, query or headers are wrong, which fixing would only lead to a 401."""
    with client(base, "alice-token") as alice:
        sid = start(alice)["session_id"]
    before = _stored(store)
    json_type = {"Content-Type": "application/json"}
    for headers in ({}, auth("wrong")):
        with httpx.Client(base_url=base, headers=headers, timeout=10) as anon:
            for r in (
                anon.post("/v1/sessions", json={"agent": 1}),
                anon.post("/v1/sessions", content=b"{not json", headers=json_type),
                anon.post(
                    "/v1/sessions", content=b'{"agent": "a", "agent": "b"}', headers=json_type
                ),
                anon.post(
                    "/v1/sessions", json={"agent": "support"}, headers={"Idempotency-Key": ""}
                ),
                anon.post(f"/v1/sessions/{sid}/responses", json={}),
                anon.post(f"/v1/sessions/{sid}/cancel", json=[]),
                anon.get("/v1/requests", params={"limit": 0}),
                anon.get(f"/v1/sessions/{sid}/events", params={"after": -1}),
                anon.get(f"/v1/sessions/{sid}/events", headers={"Last-Event-ID": "x"}),
            ):
                assert (
                    error(r, 401, "unauthenticated") and r.headers["www-authenticate"] == "Bearer"
                )
            # What the API does not have is told before who asks, as the docs say: a path
            # (404) or a method (405), which the public OpenAPI document lists anyway.
            error(anon.get("/v1/nothing"), 404, "not_found")
            error(anon.get("/v1/requests/"), 404, "not_found")
            error(anon.delete("/v1/sessions"), 405, "method_not_allowed")
    assert _stored(store) == before


def test_a_body_that_is_not_a_json_object_is_told_what_to_send(
    alice: httpx.Client, store: str
) -> None:
    """JSON sent with another Content-Type (or none), a form, an array, `null` or no body at all
    is 422 `invalid_request` saying what the body must be, not pydantic's "valid dictionary"."""
    sid = start(alice)["session_id"]
    before = _stored(store)
    as_json = b'{"agent": "support"}'
    for content_type in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {} if content_type is None else {"Content-Type": content_type}
        r = alice.post("/v1/sessions", content=as_json, headers=headers)
        detail = error(r, 422, "invalid_request")
        assert "Content-Type: application/json" in detail["message"], detail
        assert detail["fields"] == [{"field": "body", "problem": detail["message"]}]
        if content_type is not None:
            assert content_type in detail["message"]
    for url in (f"/v1/sessions/{sid}/responses", f"/v1/sessions/{sid}/cancel"):
        for payload in (b"[]", b'"approve"', b"7") + ((b"null",) if "responses" in url else ()):
            r = alice.post(url, content=payload, headers={"Content-Type": "application/json"})
            detail = error(r, 422, "invalid_request")
            assert "must be a JSON object" in detail["message"], (url, payload)
    r = alice.post(f"/v1/sessions/{sid}/responses")
    assert "needs a JSON object body" in error(r, 422, "invalid_request")["message"]
    r = alice.post("/v1/sessions", files={"agent": ("agent", b"support")})
    assert "multipart/form-data" in error(r, 422, "invalid_request")["message"]
    assert _stored(store) == before
    assert alice.get(f"/v1/sessions/{sid}").json()["status"] == "waiting"


def test_a_parameter_named_twice_is_refused_not_half_read(alice: httpx.Client, store: str) -> None:
    """`?status=pending&status=settled` read only the last, so a client asking for both got one
    silently; two `Idempotency-Key` headers (which a proxy may join or pick from) acted on one
    of them. Each is 422 `invalid_request` naming the parameter, and nothing is stored."""
    sid = start(alice)["session_id"]
    before = _stored(store)
    for query in ("status=pending&status=settled", "limit=1&limit=2", "agent=a&agent=b"):
        r = alice.get(f"/v1/requests?{query}")
        name = query.partition("=")[0]
        detail = error(r, 422, "invalid_request")
        assert detail["fields"] == [{"field": f"query.{name}", "problem": "given 2 times"}], detail
    r = alice.get(f"/v1/sessions/{sid}/events?follow=false&after=1&after=2")
    error(r, 422, "invalid_request")
    r = alice.get(
        f"/v1/sessions/{sid}/events?follow=false",
        headers=[("Last-Event-ID", "1"), ("Last-Event-ID", "2")],
    )
    assert error(r, 422, "invalid_request")["fields"][0]["field"] == "header.last-event-id"
    for url, body in (
        ("/v1/sessions", {"agent": "support", "message": "Refund order 1042"}),
        (f"/v1/sessions/{sid}/messages", {"text": "and order 7?"}),
    ):
        keys = [("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
        r = alice.post(url, json=body, headers=keys)
        assert "Idempotency-Key" in error(r, 422, "invalid_request")["message"]
    assert _stored(store) == before
    # one of each is as before; a parameter the route does not take is ignored (as documented)
    assert alice.get("/v1/requests?status=pending&limit=1").json()["total"] == 1
    assert alice.get("/v1/requests?tenant=nobody&limit=1").json()["total"] == 1


def test_two_authorization_headers_authenticate_no_one(base: str, store: str) -> None:
    """Two `Authorization` headers acted as the first one's principal, where a proxy in front
    (checking, logging or rate-limiting callers) may read the last, or join them: Mallory's
    token first and an admin's second read the queue as Mallory. Two credentials are no
    credential (401 `unauthenticated`, saying why), on the API and the dashboard, and nothing is
    stored; a sign-in cookie beside them does not stand in for them either."""
    with client(base, "alice-token") as alice:
        sid = start(alice)["session_id"]
    before = _stored(store)
    for tokens in (("alice-token", "alice-token"), ("mallory-token", "admin-token")):
        two = [("Authorization", f"Bearer {t}") for t in tokens]
        with httpx.Client(base_url=base, timeout=10) as c:
            r = c.get("/v1/requests", headers=two)
            assert "one Authorization header" in error(r, 401, "unauthenticated")["message"]
            r = c.post("/v1/sessions", json={"agent": "support", "message": "hi"}, headers=two)
            error(r, 401, "unauthenticated")
            r = c.post(f"/v1/sessions/{sid}/cancel", headers=two)
            error(r, 401, "unauthenticated")
            page = c.get("/_signoff/", headers=two)
            assert page.status_code == 303 and page.headers["location"].startswith(
                "/_signoff/login"
            )
    with client(base, "alice-token") as alice:
        signed = alice.get("/_signoff/login")
        token = re.search(r'name="csrf" value="([^"]+)"', signed.text)
        assert token is not None
        r = alice.post("/_signoff/login", data={"token": "alice-token", "csrf": token[1]})
        assert r.status_code == 303
        two = [("Authorization", "Bearer alice-token"), ("Authorization", "Bearer x")]
        r = alice.get("/v1/requests", headers=two)
        error(r, 401, "unauthenticated")
        alice.headers.pop("Authorization")
        assert alice.get("/v1/requests").status_code == 200  # the cookie alone reads
    assert _stored(store) == before


def test_numbers_in_the_query_are_plain_digits(alice: httpx.Client) -> None:
    """`after`, `limit` and `offset` take plain digits, as `Last-Event-ID` does: `1_0` (read as
    10), `+5` or ` 5` are refused, not read as some other number; `older_than` is a finite
    number of seconds (`inf` is refused, as `Runtime.pending` refuses it)."""
    sid = start(alice)["session_id"]
    for param in ("limit", "offset"):
        for raw in ("5_0", "+5", " 5", "5 ", "٥"):
            r = alice.get("/v1/requests", params={param: raw})
            detail = error(r, 422, "invalid_request")
            assert detail["fields"][0]["field"] == f"query.{param}", (raw, detail)
        assert alice.get("/v1/requests", params={param: "05"}).status_code == 200
    for raw in ("1_0", "+1", " 1"):
        r = alice.get(f"/v1/sessions/{sid}/events", params={"after": raw, "follow": "false"})
        assert error(r, 422, "invalid_request")["fields"][0]["field"] == "query.after"
    for raw in ("inf", "Infinity", "1e400", "nan", "-1"):
        r = alice.get("/v1/requests", params={"older_than": raw})
        assert error(r, 422, "invalid_request")["fields"][0]["field"] == "query.older_than", raw
    assert alice.get("/v1/requests", params={"older_than": "1e3"}).json()["total"] == 0
    assert alice.get("/v1/requests", params={"older_than": "0"}).json()["total"] == 1


def test_a_trailing_slash_is_an_unknown_path_not_a_redirect(
    alice: httpx.Client, store: str
) -> None:
    """`/v1/requests/` was a 307 to a Location built from the Host header, which behind a proxy
    terminating TLS named plain `http://`. A path with a slash too many is now 404 `not_found`,
    as any unknown path is, on the API and the dashboard alike, and a POST there stores nothing;
    the dashboard's own paths and the root's relative redirect are as before."""
    sid = start(alice)["session_id"]
    before = _stored(store)
    proxied = {"Host": "signoff.example", "X-Forwarded-Proto": "https"}
    for path in (
        "/v1/requests/",
        "/v1/sessions/",
        f"/v1/sessions/{sid}/",
        f"/v1/sessions/{sid}/events/",
        "/_signoff/tools/",
        "/_signoff/audit/",
        "/_signoff/static",
    ):
        r = alice.get(path, headers=proxied)
        assert "location" not in r.headers, (path, r.headers)
        error(r, 404, "not_found")
    for path in ("/v1/sessions/", f"/v1/sessions/{sid}/messages/", f"/v1/sessions/{sid}/cancel/"):
        r = alice.post(path, json={"agent": "support", "text": "hi"}, headers=proxied)
        assert "location" not in r.headers, (path, r.headers)
        error(r, 404, "not_found")
    assert _stored(store) == before
    for path in ("/_signoff", "/_signoff/", "/_signoff/tools", "/v1/requests"):
        assert alice.get(path).status_code == 200, path
    root = alice.get("/", headers=proxied)
    assert root.status_code == 307 and root.headers["location"] == "/_signoff/"


def _raw_post(base: str, path: str, body: bytes, *headers: str) -> tuple[int, Any]:
    """POST over a bare socket, so header lines go out exactly as written (httpx refuses a
    value with spaces around it)."""
    host, port = base.removeprefix("http://").split(":")
    head = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", "Connection: close"]
    head += ["Content-Type: application/json", f"Content-Length: {len(body)}", *headers]
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status, _, rest = data.partition(b"\r\n\r\n")
    return int(status.split()[1]), json.loads(rest)


def test_spaces_around_an_idempotency_key_are_not_part_of_it(
    alice: httpx.Client, base: str
) -> None:
    """Over HTTP, spaces and tabs around a header's value are no part of it (RFC 9110 5.5), and
    uvicorn's parser strips them: `Idempotency-Key:  k-ows ` is the key `k-ows`."""
    body = {"agent": "support", "message": "Refund order 1042"}
    status, first = _raw_post(
        base,
        "/v1/sessions",
        json.dumps(body).encode(),
        "Authorization: Bearer alice-token",
        "Idempotency-Key: \t k-ows  ",
    )
    assert status == 201 and first["replayed"] is False, first
    again = alice.post("/v1/sessions", json=body, headers={"Idempotency-Key": "k-ows"})
    assert again.status_code == 201 and again.json()["replayed"] is True
    assert again.json()["session_id"] == first["session_id"]


async def test_an_idempotency_key_with_spaces_around_it_is_refused(store: str) -> None:
    """A server that hands the header's value on unstripped (an ASGI server other than uvicorn,
    or the app called in process) could take ` k` as a key other than `k`; the rule is strict
    instead, as `Runtime`'s and the client's are: 1 to 200 printable ASCII characters, no space
    at either end, else 422 `invalid_request` naming the header, and nothing is stored."""
    runtime = make_runtime(store)
    async with in_process(runtime) as c:
        first = await c.post("/v1/sessions", json={"agent": "support"})
        sid = first.json()["session_id"]
        before = await store_contents(runtime.store, sid)
        for key in (" k", "k ", " ", "  k  ", "k\t"):
            for url, body in (
                ("/v1/sessions", {"agent": "support", "message": "hi"}),
                (f"/v1/sessions/{sid}/messages", {"text": "hi"}),
            ):
                r = await c.post(url, json=body, headers={"Idempotency-Key": key})
                detail = error(r, 422, "invalid_request")
                assert detail["fields"][0]["field"] == "header.Idempotency-Key", detail
        assert await store_contents(runtime.store, sid) == before
        assert len(await runtime.sessions()) == 1
        inner = await c.post(
            f"/v1/sessions/{sid}/messages",
            json={"text": "hi"},
            headers={"Idempotency-Key": "a b"},
        )
        assert inner.status_code == 200, inner.text
    await runtime.close()


def test_an_integer_too_long_for_python_is_named_not_malformed(
    alice: httpx.Client, store: str
) -> None:
    """JSON bounds no number's digits, but Python reads an integer of at most 4300 of them
    (`sys.get_int_max_str_digits()`): a longer one was 400 `malformed_json`, though the body is
    valid JSON. It is 422 `invalid_request` saying the number is too long; nothing is stored."""
    body = start(alice)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    before = _stored(store)
    limit = sys.get_int_max_str_digits()
    long, json_type = "9" * (limit + 1), {"Content-Type": "application/json"}
    answer = f'{{"requestId": "{rid}", "optionId": "approve", "value": -{long}}}'
    for url, payload in (
        ("/v1/sessions", f'{{"agent": "support", "message": "hi", "n": {long}}}'),
        (f"/v1/sessions/{sid}/responses", f'{{"inputResponses": [{answer}]}}'),
    ):
        r = alice.post(url, content=payload, headers=json_type)
        detail = error(r, 422, "invalid_request")
        assert "too long" in detail["message"] and f"{limit} digits" in detail["message"], detail
        assert detail["fields"] == [{"field": "body", "problem": detail["message"]}]
    assert _stored(store) == before
    # at the limit the number is read, and the field it is in judged as any other
    r = alice.post(
        "/v1/sessions", content=f'{{"agent": "support", "n": {"9" * limit}}}', headers=json_type
    )
    assert error(r, 422, "invalid_request")["fields"][0]["field"] == "n"


async def test_an_answer_value_that_is_not_plain_json_is_refused_for_a_question_too(
    store_url: str,
) -> None:
    """A question's answer with a `value` of NaN, Infinity or nested over 100 levels was taken
    (200) and the value dropped, where an approval's is 422 `invalid_answer`, as the docs say
    of every answer; now both are refused and nothing is stored, on every store."""
    runtime = make_runtime(store_url)
    json_type = {"Content-Type": "application/json"}
    async with in_process(runtime) as c:
        created = await c.post("/v1/sessions", json={"agent": "helper", "message": "hi"})
        sid, rid = created.json()["session_id"], created.json()["pending"][0]["id"]
        before = await store_contents(runtime.store, sid)
        deep = "[" * 101 + "]" * 101
        for value in ("NaN", "Infinity", "-Infinity", "1e400", deep):
            for answer in ('"text": "Large"', '"optionId": "2"'):
                body = f'{{"inputResponses": [{{"requestId": "{rid}", {answer}, '
                body += f'"value": {value}}}]}}'
                r = await c.post(f"/v1/sessions/{sid}/responses", content=body, headers=json_type)
                assert error(r, 422, "invalid_answer")["request_ids"] == [rid], value
        with pytest.raises(so.InvalidAnswer, match="plain JSON"):
            await runtime.respond(
                sid, [so.InputResponse(request_id=rid, text="Large", value=float("nan"))]
            )
        assert await store_contents(runtime.store, sid) == before
        ok = {"inputResponses": [{"requestId": rid, "text": "Large", "value": {"size": "L"}}]}
        r = await c.post(f"/v1/sessions/{sid}/responses", json=ok)
        assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    await runtime.close()
