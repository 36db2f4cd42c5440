"""`DELETE /v1/sessions/{id}` and `Client.delete_session`: whoever may cancel a session may
delete it; a live one is 409 with a stable code, an unknown or unseen one 404; once deleted,
its page, state and event stream are 404 and a stream following it ends with `stream.end`."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.stores._deletions import DELETIONS_STREAM
from signoff.testing import ManualClock

from .test_deletion import chat_with_ttl
from .test_server_common import PLAIN, TOKENS, auth, make_runtime, read_sse, running
from .test_store_edited_rows import edit


def _waiting(c: httpx.Client) -> dict[str, Any]:
    body = c.post("/v1/sessions", json={"agent": "support", "message": "refund order 1042"}).json()
    assert isinstance(body, dict) and body["status"] == "waiting", body
    return body


def test_a_deletion_over_http(tmp_path: Path) -> None:
    rt = make_runtime(f"sqlite:///{tmp_path / 's.db'}")
    with running(create_app(rt, auth=TokenAuth(TOKENS))) as base:
        with (
            httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as alice,
            httpx.Client(base_url=base, headers=auth("mallory-token"), verify=PLAIN) as mallory,
        ):
            sid = _waiting(alice)["session_id"]
            r = alice.delete(f"/v1/sessions/{sid}")
            assert r.status_code == 409 and r.json()["error"]["code"] == "session_waiting"
            assert r.json()["error"]["request_ids"]
            r = mallory.request("DELETE", f"/v1/sessions/{sid}", json={"reason": "mine now"})
            assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_session"
            assert alice.post(f"/v1/sessions/{sid}/cancel").status_code == 200
            with so.Client(base, token="alice-token") as client:
                assert client.delete_session(sid, reason="GDPR erasure") == [sid]
                with pytest.raises(so.UnknownSession):
                    client.delete_session(sid)
            for path in (f"/v1/sessions/{sid}", f"/v1/sessions/{sid}/events?follow=false"):
                r = alice.get(path)
                assert r.status_code == 404, path
            assert alice.get(f"/_signoff/sessions/{sid}").status_code == 404
            assert alice.get("/v1/sessions").json()["total"] == 0
    [entry] = rt.audit_sync(stream=DELETIONS_STREAM)
    assert entry.data["by"]["principal_id"] == "alice"
    assert entry.data["reason"] == "GDPR erasure"
    assert rt.verify_audit_sync() == []
    rt.close_sync()


def test_a_caller_whose_principal_holds_a_lone_surrogate_deletes(tmp_path: Path) -> None:
    """An authenticator's principal with a lone surrogate (here in an attribute) starts and
    cancels sessions; its DELETE was 400 naming `by`. It deletes, `by` escaped in the entry."""
    odd = so.Principal(authenticator="token", principal_id="odd", attributes={"name": "O\ud800"})
    rt = make_runtime(f"sqlite:///{tmp_path / 's.db'}")
    with running(create_app(rt, auth=TokenAuth({"odd-token": odd}))) as base:
        with httpx.Client(base_url=base, headers=auth("odd-token"), verify=PLAIN) as c:
            sid = _waiting(c)["session_id"]
            assert c.post(f"/v1/sessions/{sid}/cancel").status_code == 200
            r = c.delete(f"/v1/sessions/{sid}")
            assert r.status_code == 200, r.text
            assert r.json() == {"deleted": [sid]}
    [entry] = rt.audit_sync(stream=DELETIONS_STREAM)
    assert entry.data["by"]["attributes"] == {"name": "O\\ud800"}
    assert rt.verify_audit_sync() == []
    rt.close_sync()


def test_a_stream_following_a_deleted_session_ends(tmp_path: Path) -> None:
    rt = make_runtime(f"sqlite:///{tmp_path / 's.db'}")
    with running(create_app(rt, auth=TokenAuth(TOKENS))) as base:
        with httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as alice:
            sid = _waiting(alice)["session_id"]
            alice.post(f"/v1/sessions/{sid}/cancel")
            head = alice.get(f"/v1/sessions/{sid}").json()["seq"]
            got: list[dict[str, Any]] = []
            opened = threading.Event()

            def follow() -> None:
                with alice.stream("GET", f"/v1/sessions/{sid}/events?after={head}") as r:
                    assert r.status_code == 200
                    opened.set()  # the stream follows the session: deleted only now
                    got.extend(read_sse(r, until="stream.end", timeout=30))

            t = threading.Thread(target=follow)
            t.start()
            # A delete before the stream opened made it a 404 with no event (flaky under load).
            assert opened.wait(30)
            assert alice.delete(f"/v1/sessions/{sid}").status_code == 200
            t.join(40)
            assert not t.is_alive()
            assert got[-1]["event"] == "stream.end"
            assert got[-1]["data"]["error"]["code"] == "unknown_session"
    rt.close_sync()


def test_a_create_repeating_the_key_of_a_deleted_session_is_410(tmp_path: Path) -> None:
    """`POST /v1/sessions` repeating the `Idempotency-Key` of a session since deleted made a new
    session of the erased id; it is 410 `session_deleted` (`SessionDeleted` in the client), and
    nothing is made."""
    rt = make_runtime(f"sqlite:///{tmp_path / 's.db'}")
    with running(create_app(rt, auth=TokenAuth(TOKENS))) as base:
        with httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as alice:
            body = {"agent": "support", "message": "refund order 1042"}
            keyed = {"Idempotency-Key": "refund-1042"}
            sid = alice.post("/v1/sessions", json=body, headers=keyed).json()["session_id"]
            assert alice.post(f"/v1/sessions/{sid}/cancel").status_code == 200
            assert alice.delete(f"/v1/sessions/{sid}").status_code == 200
            again = alice.post("/v1/sessions", json=body, headers=keyed)
            assert again.status_code == 410, again.text
            assert again.json()["error"]["code"] == "session_deleted"
            assert again.json()["error"]["session_id"] == sid
            assert alice.get("/v1/sessions").json()["total"] == 0
            with so.Client(base, token="alice-token") as client:
                with pytest.raises(so.SessionDeleted) as raised:
                    client.generate("support", "refund order 1042", idempotency_key="refund-1042")
                assert raised.value.session_id == sid


def test_a_forced_deletion_over_http(tmp_path: Path) -> None:
    """`{"force": true}` deletes a session waiting on people without a cancel (one no cancel
    can finish); a `force` that is not a JSON boolean is 422, nothing deleted."""
    rt = make_runtime(f"sqlite:///{tmp_path / 's.db'}")
    with running(create_app(rt, auth=TokenAuth(TOKENS))) as base:
        with httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as alice:
            first, second = _waiting(alice)["session_id"], _waiting(alice)["session_id"]
            r = alice.request("DELETE", f"/v1/sessions/{first}", json={"force": "yes"})
            assert r.status_code == 422, r.text
            r = alice.request("DELETE", f"/v1/sessions/{first}", json={"force": True})
            assert r.status_code == 200 and r.json() == {"deleted": [first]}
            with so.Client(base, token="alice-token") as client:
                with pytest.raises(so.SessionWaiting) as waiting:
                    client.delete_session(second)
                assert waiting.value.held_by == [second]  # each open request's session
                assert waiting.value.request_ids == [r.id for r in rt.pending_sync()]
                assert client.delete_session(second, reason="erasure", force=True) == [second]
                with pytest.raises(so.UsageError):
                    client.delete_session(second, force=1)  # type: ignore[arg-type]
            assert alice.get("/v1/sessions").json()["total"] == 0
    entries = rt.audit_sync(stream=DELETIONS_STREAM)
    assert [(e.data["session_id"], e.data["force"]) for e in entries] == [
        (first, True),
        (second, True),
    ]
    assert rt.verify_audit_sync() == []
    rt.close_sync()


def _finished(c: httpx.Client) -> str:
    """A session whose turn was cancelled: finished, for a prune to take."""
    sid = str(_waiting(c)["session_id"])
    assert c.post(f"/v1/sessions/{sid}/cancel").json()["status"] == "cancelled"
    return sid


def test_a_prune_over_http_is_an_admins(tmp_path: Path) -> None:
    """`POST /v1/prune` deletes the finished sessions older than `olderThan`, a bounded batch
    at a time (`more` says whether older ones remain), each deletion recorded with the
    admin as `by`; `dryRun` lists them only. It deletes every tenant's sessions, so a caller
    who is not an admin is 403 `admin_only`, and a bad body 422; both delete nothing."""
    rt = make_runtime(f"sqlite:///{tmp_path / 's.db'}")
    with running(create_app(rt, auth=TokenAuth(TOKENS))) as base:
        with (
            httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as alice,
            httpx.Client(base_url=base, headers=auth("admin-token"), verify=PLAIN) as admin,
        ):
            done = [_finished(alice) for _ in range(3)]
            live = _waiting(alice)["session_id"]
            r = alice.post("/v1/prune", json={"olderThan": 0})
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_only", r.text
            for bad in (
                {},
                {"olderThan": -1},
                {"olderThan": "0"},
                {"olderThan": 0, "limit": 0},
                {"olderThan": 0, "limit": 10_001},
                {"olderThan": 0, "dryRun": "yes"},
                {"olderThan": 0, "purge": True},
            ):
                r = admin.post("/v1/prune", json=bad)
                assert r.status_code == 422, (bad, r.text)
            r = admin.post("/v1/prune", json={"olderThan": 0, "limit": 4.5})
            assert r.status_code == 422, r.text
            r = admin.post("/v1/prune", json={"olderThan": 0, "limit": 4.0, "dryRun": True})
            assert r.status_code == 200, r.text
            assert r.json() == {"deleted": [], "listed": done, "more": False, "damaged": []}
            # Exactly `limit` old enough: none left for another run (it said `more`).
            r = admin.post("/v1/prune", json={"olderThan": 0, "limit": 3, "dryRun": True})
            none = {"deleted": [], "listed": [], "more": False, "damaged": []}
            assert r.json() == {**none, "listed": done}, r.text
            assert alice.get("/v1/sessions").json()["total"] == 4
            body = {"olderThan": 0, "limit": 2, "reason": "retention"}
            r = admin.post("/v1/prune", json=body)
            assert r.json() == {**none, "deleted": done[:2], "listed": done[:2], "more": True}, (
                r.text
            )
            with so.Client(base, token="admin-token") as client:
                assert client.prune(older_than=3600) == none
                got = client.prune(older_than=0, reason="retention")
                assert got == {**none, "deleted": done[2:], "listed": done[2:]}
            [left] = alice.get("/v1/sessions").json()["items"]
            assert left["id"] == live
    entries = rt.audit_sync(stream=DELETIONS_STREAM)
    assert [e.data["session_id"] for e in entries] == done
    assert {e.data["by"]["principal_id"] for e in entries} == {"root"}
    assert {e.data["reason"] for e in entries} == {"retention"}
    assert rt.verify_audit_sync() == []
    rt.close_sync()


def test_a_prune_over_http_tells_the_sessions_it_could_not_read(tmp_path: Path) -> None:
    """A session whose TTL passed while it waited, its events damaged: its expiry cannot be
    recorded, so the prune leaves it and answers it in `damaged` (the client too), deleting
    the others; it failed every prune with a 503 `store_error`, deleting none."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    clock = ManualClock()
    with so.Runtime([chat_with_ttl()], store=url, clock=clock) as rt:
        ids = [rt.generate_sync("chat", prompt="refund it").session_id for _ in range(2)]
    damage = (
        "UPDATE events SET data = ? WHERE seq = 2 AND sk = (SELECT sk FROM sessions WHERE id = ?)"
    )
    edit(url, damage, b"\x01not deflate", ids[0])
    clock.advance(86400)
    rt = so.Runtime([chat_with_ttl()], store=url, clock=clock)
    with running(create_app(rt, auth=TokenAuth(TOKENS))) as base:
        with httpx.Client(base_url=base, headers=auth("admin-token"), verify=PLAIN) as admin:
            r = admin.post("/v1/prune", json={"olderThan": 3600})
            assert r.status_code == 200, r.text
            got = r.json()
            assert got == {"deleted": [ids[1]], "listed": ids, "more": False, "damaged": ids[:1]}
        with so.Client(base, token="admin-token") as client:
            got = client.prune(older_than=3600)
            assert got == {"deleted": [], "listed": ids[:1], "more": False, "damaged": ids[:1]}
    rt.close_sync()


def test_a_prune_over_http_tells_a_session_whose_row_it_could_not_read(tmp_path: Path) -> None:
    """The oldest finished session's chain head hand-edited (SQLite keeps text in a number's
    column): every prune was a 503 `store_error`, deleting none. It is answered in `damaged`,
    the other deleted, and a forced deletion takes it."""
    url = f"sqlite:///{tmp_path / 's.db'}"
    rt = make_runtime(url)
    with running(create_app(rt, auth=TokenAuth(TOKENS))) as base:
        with httpx.Client(base_url=base, headers=auth("admin-token"), verify=PLAIN) as admin:
            ids = [_finished(admin), _finished(admin)]
            edit(url, "UPDATE sessions SET audit_n = 'x' WHERE id = ?", ids[0])
            r = admin.post("/v1/prune", json={"olderThan": 0})
            assert r.status_code == 200, r.text
            got = {"deleted": ids[1:], "listed": ids, "more": False, "damaged": ids[:1]}
            assert r.json() == got
            r = admin.request("DELETE", f"/v1/sessions/{ids[0]}", json={"force": True})
            assert r.status_code == 200 and r.json() == {"deleted": ids[:1]}, r.text
    assert rt.verify_audit_sync() == []
    rt.close_sync()


def test_a_prune_over_http_is_no_ones_under_an_apps_own_access_rule(tmp_path: Path) -> None:
    """With an access rule of the app's own, `admin` may mean nothing to it: no caller is known
    to see every session, so none may prune them all over HTTP (403, nothing deleted)."""
    rt = make_runtime(f"sqlite:///{tmp_path / 's.db'}")
    app = create_app(rt, auth=TokenAuth(TOKENS), access=lambda caller, initiator: True)
    with running(app) as base:
        with httpx.Client(base_url=base, headers=auth("admin-token"), verify=PLAIN) as admin:
            sid = _finished(admin)
            r = admin.post("/v1/prune", json={"olderThan": 0})
            assert r.status_code == 403 and r.json()["error"]["code"] == "admin_only", r.text
            assert "signoff prune" in r.json()["error"]["message"]
            assert [s["id"] for s in admin.get("/v1/sessions").json()["items"]] == [sid]
    assert rt.audit_sync(stream=DELETIONS_STREAM) == []
    rt.close_sync()
