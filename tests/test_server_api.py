"""The HTTP API over real HTTP (uvicorn on a loopback port, httpx as the client): approvals,
questions, messages and cancels from start to end, the queue, two server processes on one
SQLite file, and the session's event stream.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app

from ._server_api import (
    _stored,
    alice,
    base,
    client,
    error,
    start,
    store,
)
from .test_server_common import (
    TOKENS,
    auth,
    make_runtime,
    read_sse,
    running,
    served,
    server_processes,
    tool_output,
)

__all__ = ["alice", "base", "store"]  # the fixtures, used by name


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


def test_generate_runs_the_next_turn_or_resumes_as_runtime_generate_does(
    base: str, store: str
) -> None:
    """`POST /v1/sessions/{id}/generate` is `Runtime.generate(session_id=...)`: a message while
    the turn waits on a request is 422 `partial_answer`, another agent's name and a key without
    a message 400 `usage_error`, a body of `null` 422 `invalid_request`, a foreign session 404,
    each storing nothing; no body (or no message) resumes the turn as it stands, and a message
    runs the next turn once its key is repeated."""
    with client(base, "alice-token") as alice, client(base, "mallory-token") as mallory:
        body = start(alice)
        sid, rid = body["session_id"], body["pending"][0]["id"]
        path = f"/v1/sessions/{sid}/generate"
        before = _stored(store)
        error(alice.post(path, json={"message": "approve"}), 422, "partial_answer")
        error(alice.post(path, json={"message": "hi", "agent": "batch"}), 400, "usage_error")
        error(alice.post(path, json={}, headers={"Idempotency-Key": "k-1"}), 400, "usage_error")
        null = {"content": b"null", "headers": {"Content-Type": "application/json"}}
        error(alice.post(path, **null), 422, "invalid_request")  # type: ignore[arg-type]
        error(mallory.post(path, json={}), 404, "unknown_session")
        for resumed in (alice.post(path), alice.post(path, json={"agent": "support"})):
            assert resumed.status_code == 200, resumed.text
            assert resumed.json()["status"] == "waiting"
            assert [p["id"] for p in resumed.json()["pending"]] == [rid]
        assert _stored(store) == before
        assert alice.get(f"/v1/requests/{rid}").json()["status"] == "pending"
        approve = {"approvals": [{"id": rid, "approved": True}]}
        assert alice.post(f"/v1/sessions/{sid}/approvals", json=approve).status_code == 200
        key = {"Idempotency-Key": "k-2"}
        first = alice.post(path, json={"message": "Refund 1042 again"}, headers=key)
        assert first.status_code == 200, first.text
        assert first.json()["turn_id"] != body["turn_id"] and not first.json()["replayed"]
        again = alice.post(path, json={"message": "Refund 1042 again"}, headers=key)
        assert again.json()["replayed"] and again.json()["turn_id"] == first.json()["turn_id"]


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
    said = [
        json.loads(x[5:])
        for x in events.splitlines()
        if x.startswith("data:") and "customer left" in x
    ]
    # the cancel, and the request it withdrew (whose reason carries the cancel's), by alice
    assert [e["type"] for e in said] == ["input.resolved", "turn.cancelled"]
    assert said[0]["data"]["reason"] == "turn cancelled: customer left"
    assert [e["data"]["by"]["principal_id"] for e in said] == ["alice", "alice"]


def test_a_cancel_body_of_null_is_refused_and_cancels_nothing(store_url: str) -> None:
    """A cancel whose body is JSON `null` was taken for one sent without a body and cancelled
    the turn. A body that is sent must be an object (`{}` or `{reason}`), as every other POST's
    must: `null` is 422 `invalid_request` and nothing is stored, on both stores; no body at all
    still cancels."""
    with served(store_url) as base, client(base, "alice-token") as alice:
        sid = start(alice)["session_id"]
        before = _stored(store_url)
        json_type = {"Content-Type": "application/json"}
        for null in (b"null", b" null\n"):
            r = alice.post(f"/v1/sessions/{sid}/cancel", content=null, headers=json_type)
            detail = error(r, 422, "invalid_request")
            assert detail["message"] == "the body must be a JSON object, not null", detail
            assert detail["fields"] == [{"field": "body", "problem": detail["message"]}]
        assert _stored(store_url) == before
        assert alice.get(f"/v1/sessions/{sid}").json()["status"] == "waiting"
        r = alice.post(f"/v1/sessions/{sid}/cancel")
        assert r.status_code == 200 and r.json()["status"] == "cancelled"
        doc = alice.get("/v1/openapi.json").json()  # says so too: a fuzzer sends no `null`
        sent = doc["paths"]["/v1/sessions/{session_id}/cancel"]["post"]["requestBody"]
        assert not sent.get("required")
        assert sent["content"]["application/json"]["schema"]["anyOf"] == [
            {"$ref": "#/components/schemas/CancelBody"}
        ]


def test_a_cancel_naming_a_turn_cancels_only_that_turn(store_url: str) -> None:
    """`{turnId}` cancels that turn only: one not the session's, or one that has ended, leaves
    the session as it is (200, its current turn reported); a malformed id is 422, nothing
    stored. `Client.cancel(turn_id=)` sends it."""
    with served(store_url) as base, client(base, "alice-token") as alice:
        body = start(alice)
        sid, turn = body["session_id"], body["turn_id"]
        before = _stored(store_url)
        url = f"/v1/sessions/{sid}/cancel"
        for bad in ("", 5, ["trn_x"]):
            error(alice.post(url, json={"turnId": bad}), 422, "invalid_request")
        r = alice.post(url, json={"turnId": "trn_another"})
        assert r.status_code == 200, r.text
        assert r.json()["status"] == "waiting"
        assert r.json()["turn_id"] == turn and _stored(store_url) == before
        assert r.json()["cancelled"] is False
        with so.Client(base, token="alice-token") as remote:
            done = remote.cancel(sid, "no longer needed", turn_id=turn)
            assert done.status == "cancelled" and done.turn_id == turn and done.cancelled
            again = remote.cancel(sid, "sent twice", turn_id=turn)  # reported, not cancelled
            assert (again.status, again.turn_id, again.cancelled) == ("cancelled", turn, False)
            later = alice.post(f"/v1/sessions/{sid}/messages", json={"text": "thanks"})
            assert later.status_code == 200 and later.json()["turn_id"] != turn, later.text
            after = _stored(store_url)
            stale = remote.cancel(sid, turn_id=turn)  # the page's form, sent again: nothing
            assert (stale.status, stale.turn_id) == ("completed", later.json()["turn_id"])
        assert _stored(store_url) == after


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


async def test_the_queue_lists_without_inputs_when_asked(tmp_path: Path) -> None:
    """A listing of requests whose calls each carry 600 KB of arguments was 600 KB an item (a
    page of 500 of 1 MB ones, 500 MB, which `Client.pending` refuses past 64 MB), with no way to
    list them lighter. `inputs=false` sends each `action.input` and `payload` as null, the rest
    (`input_hash` too) as it is; `GET /v1/requests/{id}` has all of one."""
    blob = "z" * 600_000

    @so.tool
    def upload(ctx: so.ToolContext, blob: str) -> str:
        """Upload a file."""
        ctx.request_approval({"bytes": len(blob), "head": blob[:100_000]})
        return "stored"

    call = so.ToolCall(name="upload", input={"blob": blob})
    agent = so.Agent(
        name="files",
        model=so.models.Scripted([so.ModelResponse(tool_calls=[call])], repeat_last=True),
        tools=[upload],
    )
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/big.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=transport, base_url="http://t", headers=auth("alice-token")
        ) as c,
    ):
        for _ in range(3):
            r = await c.post("/v1/sessions", json={"agent": "files", "message": "store it"})
            assert r.json()["status"] == "waiting", r.text
        whole = await c.get("/v1/requests")
        assert len(whole.content) > 2_100_000
        light = await c.get("/v1/requests", params={"inputs": "false"})
        assert light.status_code == 200
        assert len(light.content) < 10_000
        page = light.json()
        assert page["total"] == 3 and len(page["items"]) == 3
        for item, full in zip(page["items"], whole.json()["items"], strict=True):
            assert item["id"] == full["id"]
            assert item["action"]["input"] is None and item["payload"] is None
            assert item["action"]["input_hash"] == full["action"]["input_hash"]
            assert full["action"]["input"] == {"blob": blob}
            assert full["payload"]["bytes"] == 600_000
            one = (await c.get(f"/v1/requests/{item['id']}")).json()["request"]
            assert one["action"]["input"] == {"blob": blob}
        async with so.AsyncClient("http://t", token="alice-token", transport=transport) as api:
            items, total = await api.pending(inputs=False)
        assert total == 3 and all(q.input is None and q.payload is None for q in items)
        hashes = [i["action"]["input_hash"] for i in page["items"]]
        assert [q.action.input_hash for q in items if q.action] == hashes
