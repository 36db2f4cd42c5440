"""What a reviewer is told from the dashboard: refused answers (with and without JavaScript), a
reply with a lone surrogate, sessions started and messages that wait for the turn's end.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx

import signoff as so
from signoff.server import TokenAuth, create_app

from ._dashboard import (
    base,
    csrf_of,
    signed_in,
    start,
)
from .test_server_common import PLAIN, TOKENS, auth, make_runtime, running

__all__ = ["base"]  # the fixture, used by name

JSON = {"Accept": "application/json"}


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


def test_a_reviewer_the_policy_refuses_is_not_told_a_settled_request_stays_open(
    base: str,
) -> None:
    """Bob, a manager, approved the invoice; alice, whom the response policy refuses, sends the
    form of a stale page: she is refused as she was while it was open (not told how it was
    settled), and the page no longer says it "stays open for someone else", which was false."""
    body = start(base, "finance")
    rid = body["pending"][0]["id"]
    approve = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
    url = f"{base}/v1/sessions/{body['session_id']}/responses"
    r = httpx.post(url, json=approve, headers=auth("bob-token"), timeout=10, verify=PLAIN)
    assert r.json()["outcomes"][0]["applied"] is True
    with signed_in(base, "alice-token") as c:
        token = csrf_of(c.get("/_signoff/").text)
        r = c.post(
            f"/_signoff/requests/{rid}/respond",
            data={"option": "approve", "csrf": token, "next": "/_signoff/"},
        )
        assert r.status_code == 409, (r.status_code, r.headers.get("location"))
        assert "Not accepted" in r.text and "only a manager may approve invoices" in r.text
        assert "stays open" not in r.text and "Already" not in r.text


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


def test_a_reviewer_named_with_a_lone_surrogate_does_not_fail_anothers_answer(
    tmp_path: Path,
) -> None:
    """A reviewer's display name may hold a lone surrogate (an authenticator's, recorded as
    given). Another reviewer's stale page answering after them got a 500 `internal_error` from
    the script's JSON answer naming them (`already_by`, a conflict's "Already approved by ..."),
    where the page without JavaScript was right. The JSON escapes the surrogate."""
    odd = so.Principal(
        authenticator="token",
        principal_id="odd",
        attributes={"tenant": "acme", "name": "Od\ud800d"},
    )
    runtime = make_runtime(f"sqlite:///{tmp_path}/state.db")
    app = create_app(runtime, auth=TokenAuth({**TOKENS, "odd-token": odd}))
    with (
        running(app) as base,
        signed_in(base, "odd-token") as last,
        signed_in(base, "admin-token") as stale,
    ):
        body = start(base, "treasury")  # two approvers: Bob, then Od?d's vote settles it
        sid, rid = body["session_id"], body["pending"][0]["id"]
        vote = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
        url = f"{base}/v1/sessions/{sid}/responses"
        r = httpx.post(url, json=vote, headers=auth("bob-token"), verify=PLAIN)
        assert r.status_code == 200, r.text
        path = f"/_signoff/requests/{rid}/respond"
        form = {"option": "approve", "csrf": csrf_of(stale.get("/_signoff/").text)}
        mine = {"option": "approve", "csrf": csrf_of(last.get("/_signoff/").text)}
        r = last.post(path, data=mine, headers=JSON)
        assert r.status_code == 200 and r.json()["outcome"] == "approved", r.text
        r = stale.post(path, data=form, headers=JSON)
        assert r.status_code == 200, r.text
        assert r.json()["already_by"] == "Od\ud800d (odd)"
        r = stale.post(path, data={**form, "option": "cancel"}, headers=JSON)
        assert r.status_code == 409, r.text
        error = r.json()["error"]
        assert error["code"] == "conflicting_answer"
        assert error["message"].startswith("Already approved by Od\ud800d (odd): "), error


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
        state = httpx.get(
            f"{base}/v1/sessions/{sid}", headers=auth("alice-token"), verify=PLAIN
        ).json()
        assert state["status"] == "waiting" and state["initiator"]["principal_id"] == "alice"
        # a message that steers: the open approval is ignored
        r = c.post(
            f"/_signoff/sessions/{sid}/messages",
            data={"message": "actually, never mind", "csrf": token},
            headers=j,
        )
        assert r.status_code == 200 and r.json()["ok"] is True
        state = httpx.get(
            f"{base}/v1/sessions/{sid}", headers=auth("alice-token"), verify=PLAIN
        ).json()
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
    state = httpx.get(f"{base}/v1/sessions/{sid}", headers=auth("alice-token"), verify=PLAIN).json()
    assert [p["id"] for p in state["pending"]] == [body["pending"][0]["id"]]


def test_a_queued_message_is_said_to_wait_without_javascript(base: str) -> None:
    """A plain form post (no script) of a message that waits for the turn's end was sent back
    to the session page as if it had been delivered: the page it lands on now shows the note
    the script shows, once (it landed on `?queued=1`, whose note came back on every reload); a
    message that did not wait shows none."""
    note = "Your message waits for the current turn to end; it then starts the next turn."
    script = (Path(so.__file__).parent / "server" / "static" / "forms.js").read_text()
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
