"""The dashboard's one-time form tokens: a form that starts a conversation or sends a message
acts once, however often it is posted (a double click, a browser sending it again, a restart
between the two posts, two processes), and a forged token is a clear 400."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.server._forms import check_form, form_token
from signoff.stores import SessionSummary
from signoff.stores._audit import AuditRow

from ._dashboard import csrf_of, signed_in, start
from .test_server_common import (
    ALICE,
    BOB,
    PLAIN,
    TOKENS,
    auth,
    make_runtime,
    running,
    served,
)

SECRET = "forms-test-secret"


def form_of(html: str) -> str:
    match = re.search(r'name="form" value="([^"]+)"', html)
    assert match, "no form token in the page"
    return match.group(1)


def sessions_of(url: str) -> list[SessionSummary]:
    async def read() -> list[SessionSummary]:
        rt = make_runtime(url)
        try:
            return await rt.sessions(limit=1000)
        finally:
            await rt.close()

    return asyncio.run(read())


def messages_in(base: str, sid: str) -> list[str]:
    r = httpx.get(
        f"{base}/v1/sessions/{sid}/events?follow=false",
        headers=auth("alice-token"),
        timeout=10,
        verify=PLAIN,
    )
    assert r.status_code == 200, r.text
    found = []
    for line in r.text.splitlines():
        if line.startswith("data: "):
            event = json.loads(line[6:])
            if event.get("type") in ("turn.started", "turn.message"):
                found.append(event["data"]["message"])
    return found


def test_a_new_conversation_form_sent_twice_starts_one(store_url: str) -> None:
    with served(store_url, secret=SECRET) as base, signed_in(base) as c:
        page = c.get("/_signoff/new").text
        form = {"agent": "support", "message": "Refund 1042", "csrf": csrf_of(page)}
        form["form"] = form_of(page)
        first = c.post("/_signoff/sessions", data=form)
        second = c.post("/_signoff/sessions", data=form)
        assert first.status_code == second.status_code == 303
        assert first.headers["location"] == second.headers["location"]
        # as a script sees it too: the same session, and no second one
        again = c.post("/_signoff/sessions", data=form, headers={"Accept": "application/json"})
        assert again.json()["repeated"] is True
        assert again.json()["url"] == first.headers["location"]
        # a fresh page is a fresh form: it starts another conversation
        page = c.get("/_signoff/new").text
        other = c.post(
            "/_signoff/sessions", data={**form, "form": form_of(page), "csrf": csrf_of(page)}
        )
        assert other.status_code == 303 and other.headers["location"] != first.headers["location"]
    assert len(sessions_of(store_url)) == 2


def test_a_message_form_sent_twice_sends_one(store_url: str) -> None:
    with served(store_url, secret=SECRET) as base, signed_in(base) as c:
        sid = start(base)["session_id"]
        page = c.get(f"/_signoff/sessions/{sid}").text
        form = {"message": "actually, never mind", "csrf": csrf_of(page), "form": form_of(page)}
        first = c.post(f"/_signoff/sessions/{sid}/messages", data=form)
        second = c.post(f"/_signoff/sessions/{sid}/messages", data=form)
        assert first.status_code == second.status_code == 303
        assert second.headers["location"] == f"/_signoff/sessions/{sid}"
        assert messages_in(base, sid) == ["Refund 1042", "actually, never mind"]


def test_a_restart_between_the_two_posts_does_not_act_again(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    with served(url, secret=SECRET) as base, signed_in(base) as c:
        page = c.get("/_signoff/new").text
        form = {"agent": "support", "message": "Refund 1042", "form": form_of(page)}
        first = c.post("/_signoff/sessions", data={**form, "csrf": csrf_of(page)})
        assert first.status_code == 303
    with served(url, secret=SECRET) as base, signed_in(base) as c:
        token = csrf_of(c.get("/_signoff/").text)
        second = c.post("/_signoff/sessions", data={**form, "csrf": token})
        assert second.status_code == 303
        assert second.headers["location"] == first.headers["location"]
    assert len(sessions_of(url)) == 1


def test_a_double_click_racing_itself_acts_once(store_url: str) -> None:
    with served(store_url, secret=SECRET) as base, signed_in(base) as c:
        page = c.get("/_signoff/new").text
        form = {"agent": "support", "message": "Refund 1042", "csrf": csrf_of(page)}
        form["form"] = form_of(page)

        async def both() -> list[httpx.Response]:
            async with httpx.AsyncClient(
                base_url=base, cookies=c.cookies, timeout=10, verify=PLAIN
            ) as a:
                return list(
                    await asyncio.gather(*(a.post("/_signoff/sessions", data=form) for _ in "ab"))
                )

        answers = asyncio.run(both())
        assert [r.status_code for r in answers] == [303, 303]
        assert answers[0].headers["location"] == answers[1].headers["location"]
    assert len(sessions_of(store_url)) == 1


@pytest.mark.parametrize(
    "token", ["", "nonsense", "1.2.3", "9" * 16 + ".x.y", "\u00e9" * 3, "1" * 300]
)
def test_a_forged_or_broken_token_is_a_400_and_acts_not(tmp_path: Path, token: str) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    with served(url, secret=SECRET) as base, signed_in(base) as c:
        page = c.get("/_signoff/new").text
        form = {"agent": "support", "message": "Refund 1042", "csrf": csrf_of(page)}
        r = c.post("/_signoff/sessions", data={**form, "form": token})
        assert r.status_code == 400 and "reload the page" in r.text
        j = c.post(
            "/_signoff/sessions",
            data={**form, "form": token},
            headers={"Accept": "application/json"},
        )
        assert j.status_code == 400 and j.json()["error"]["code"] == "invalid_form"
    assert sessions_of(url) == []


def test_another_viewers_or_an_old_token_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    key = SECRET.encode()
    with served(url, secret=SECRET) as base, signed_in(base) as c:
        sid = start(base)["session_id"]
        page = c.get(f"/_signoff/sessions/{sid}").text
        form = {"message": "hello", "csrf": csrf_of(page)}
        now = httpx.get(
            f"{base}/v1/sessions/{sid}", headers=auth("alice-token"), verify=PLAIN
        ).json()
        bobs = form_token(key, BOB, now["created_at"])
        r = c.post(f"/_signoff/sessions/{sid}/messages", data={**form, "form": bobs})
        assert r.status_code == 400
        old = form_token(key, ALICE, now["created_at"] - 13 * 3600)
        r = c.post(f"/_signoff/sessions/{sid}/messages", data={**form, "form": old})
        assert r.status_code == 400
        assert messages_in(base, sid) == ["Refund 1042"]


def test_the_scripts_message_form_gets_a_new_token_each_time(store_url: str) -> None:
    with served(store_url, secret=SECRET) as base, signed_in(base) as c:
        sid = start(base)["session_id"]
        page = c.get(f"/_signoff/sessions/{sid}").text
        j = {"Accept": "application/json"}
        form = {"csrf": csrf_of(page), "form": form_of(page)}
        r = c.post(f"/_signoff/sessions/{sid}/messages", data={**form, "message": "one"}, headers=j)
        assert r.status_code == 200 and r.json()["ok"] is True
        spent, form["form"] = form["form"], r.json()["form"]
        r = c.post(f"/_signoff/sessions/{sid}/messages", data={**form, "message": "two"}, headers=j)
        assert r.status_code == 200 and "repeated" not in r.json()
        r = c.post(
            f"/_signoff/sessions/{sid}/messages",
            data={**form, "form": spent, "message": "one"},
            headers=j,
        )
        assert r.json()["repeated"] is True and r.json()["form"] != spent
        assert messages_in(base, sid) == ["Refund 1042", "one", "two"]


def test_a_form_the_runtime_refused_may_be_sent_again(tmp_path: Path) -> None:
    """A refusal (here a session whose time is up) does nothing, so it is not remembered."""
    url = f"sqlite:///{tmp_path}/state.db"
    with served(url, secret=SECRET) as base, signed_in(base) as c:
        sid = start(base)["session_id"]
        page = c.get(f"/_signoff/sessions/{sid}").text
        form = {"message": "hello", "csrf": csrf_of(page), "form": form_of(page)}
        r = c.post(f"/_signoff/sessions/{sid}/messages", data={**form, "message": " "})
        assert r.status_code == 422  # refused before the token is spent
        first = c.post(f"/_signoff/sessions/{sid}/messages", data=form)
        assert first.status_code == 303
        assert messages_in(base, sid) == ["Refund 1042", "hello"]


def test_answering_a_request_twice_settles_it_once(store_url: str) -> None:
    """The runtime takes the same answer again as the one already given (no token needed);
    a different one is refused as already settled."""
    with served(store_url, secret=SECRET) as base, signed_in(base) as c:
        body = start(base)
        rid = body["pending"][0]["id"]
        page = c.get("/_signoff/").text
        form = {"option": "approve", "next": "/_signoff/", "csrf": csrf_of(page)}
        first = c.post(f"/_signoff/requests/{rid}/respond", data=form)
        second = c.post(f"/_signoff/requests/{rid}/respond", data=form)
        assert first.status_code == second.status_code == 303
        assert second.headers["location"] == "/_signoff/"
        other = c.post(f"/_signoff/requests/{rid}/respond", data={**form, "option": "cancel"})
        assert other.status_code == 409 and "already settled" in other.text
        r = httpx.get(
            f"{base}/v1/sessions/{body['session_id']}/events?follow=false",
            headers=auth("alice-token"),
            timeout=10,
            verify=PLAIN,
        )
        assert (
            r.text.count('"type":"input.resolved"') + r.text.count('"type": "input.resolved"') == 1
        )


# -- across processes, and what the store keeps ---------------------------------------------


def test_a_form_sent_to_two_servers_on_one_store_acts_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/state.db"
    with (
        served(url, secret=SECRET) as one,
        served(url, secret=SECRET) as two,
        signed_in(one) as c,
        signed_in(two) as d,
    ):
        page = c.get("/_signoff/new").text
        form = {"agent": "support", "message": "Refund 1042", "form": form_of(page)}
        first = c.post("/_signoff/sessions", data={**form, "csrf": csrf_of(page)})
        token = csrf_of(d.get("/_signoff/").text)
        second = d.post("/_signoff/sessions", data={**form, "csrf": token})
        assert first.status_code == second.status_code == 303
        assert second.headers["location"] == first.headers["location"]
    assert len(sessions_of(url)) == 1


def test_a_form_sent_again_with_another_message_is_refused(store_url: str) -> None:
    with served(store_url, secret=SECRET) as base, signed_in(base) as c:
        sid = start(base)["session_id"]
        page = c.get(f"/_signoff/sessions/{sid}").text
        form = {"message": "one", "csrf": csrf_of(page), "form": form_of(page)}
        assert c.post(f"/_signoff/sessions/{sid}/messages", data=form).status_code == 303
        r = c.post(
            f"/_signoff/sessions/{sid}/messages",
            data={**form, "message": "two"},
            headers={"Accept": "application/json"},
        )
        assert r.status_code == 409 and r.json()["error"]["code"] == "form_already_sent"
        assert "reload the page" in r.json()["error"]["message"]
        assert messages_in(base, sid) == ["Refund 1042", "one"]


async def test_forms_write_no_audit_stream_and_old_entries_still_verify(store_url: str) -> None:
    """Forms sent once wrote a `dashboard:forms` audit stream: an old store's entries of it
    still verify, and forms sent now add none (the key is in the message's event)."""
    rt = make_runtime(store_url)
    try:
        await rt.open()
        old = {"form": "n1", "claim": "c1", "issued": 100, "target": None}
        row = AuditRow(
            stream="dashboard:forms", type="dashboard.form_sent", at=100.0, seq=None, data=old
        )
        await rt.store.record_audit([row])
        assert await rt.verify_audit() == []
        key = "form:n2"
        first = await rt.generate("support", prompt="Refund", auth=ALICE, idempotency_key=key)
        again = await rt.generate("support", prompt="Refund", auth=ALICE, idempotency_key=key)
        assert again.replayed and again.session_id == first.session_id
        assert len(await rt.store.audit(stream="dashboard:forms")) == 1
        assert await rt.verify_audit() == []
    finally:
        await rt.close()


def test_a_token_past_its_lifetime_is_refused() -> None:
    token = form_token(b"k", ALICE, 10.0)
    assert check_form(b"k", ALICE, token, 109.0, 100.0) is not None
    assert check_form(b"k", ALICE, token, 110.0, 100.0) is None
    assert check_form(b"k", BOB, token, 50.0, 100.0) is None


def test_a_token_is_bound_to_the_viewers_full_identity() -> None:
    """A token was bound to the viewer's authenticator and id alone, joined with NUL: a viewer
    of another issuer or type with the same id, or one whose NUL split the fields elsewhere,
    could send it. A viewer of the default issuer and type is bound as before."""
    other_issuer = ALICE.model_copy(update={"issuer": "https://idp-b.example"})
    other_type = ALICE.model_copy(update={"principal_type": "service"})
    token = form_token(b"k", ALICE, 10.0)
    assert check_form(b"k", ALICE, token, 50.0, 100.0) is not None
    for other in (other_issuer, other_type):
        assert check_form(b"k", other, token, 50.0, 100.0) is None
        theirs = form_token(b"k", other, 10.0)
        assert check_form(b"k", other, theirs, 50.0, 100.0) is not None
        assert check_form(b"k", ALICE, theirs, 50.0, 100.0) is None
    one = ALICE.model_copy(update={"authenticator": "a\0b", "principal_id": "c"})
    two = ALICE.model_copy(update={"authenticator": "a", "principal_id": "b\0c"})
    assert check_form(b"k", two, form_token(b"k", one, 10.0), 50.0, 100.0) is None
    # a page made before the upgrade still sends: the default viewer's token as it was made
    raw = "\0".join(("signoff-form", "token", "alice", "10", "nonce")).encode()
    mac = base64.urlsafe_b64encode(hmac.new(b"k", raw, hashlib.sha256).digest()[:18]).decode()
    assert check_form(b"k", ALICE, f"10.nonce.{mac}", 50.0, 100.0) == ("nonce", 10)


# A principal may hold a lone surrogate (an authenticator passing a JWT claim's "\ud800" on).
EVE = so.Principal(authenticator="token", principal_id="eve", attributes={"tenant": "acme"})
ODD_EVE = EVE.model_copy(update={"principal_id": "eve\ud800"})


def test_a_viewer_with_a_lone_surrogate_gets_the_forms_pages_and_sends_them(
    tmp_path: Path,
) -> None:
    """The token's MAC encoded the viewer strictly as UTF-8: every page carrying a form token
    (a session's page, its fragment, /new) was a 500 for such a viewer."""
    app = create_app(
        make_runtime(f"sqlite:///{tmp_path}/state.db"),
        auth=TokenAuth({**TOKENS, "odd-token": ODD_EVE}),
        secret=SECRET,
    )
    with running(app) as base, signed_in(base, "odd-token") as c:
        page = c.get("/_signoff/new")
        assert page.status_code == 200, page.text
        form = {"agent": "support", "message": "Refund 1042", "csrf": csrf_of(page.text)}
        first = c.post("/_signoff/sessions", data={**form, "form": form_of(page.text)})
        assert first.status_code == 303, first.text
        where = first.headers["location"]
        page = c.get(where)
        assert page.status_code == 200, page.text
        fragment = c.get(where.replace("/_signoff/", "/_signoff/fragments/"))
        assert fragment.status_code == 200, fragment.text
        sent = {"message": "thanks", "csrf": csrf_of(page.text), "form": form_of(page.text)}
        r = c.post(f"{where}/messages", data=sent)
        assert r.status_code == 303, r.text
        assert c.post(f"{where}/messages", data=sent).status_code == 303  # acts once
        sid = where.rsplit("/", 1)[1]
        r = httpx.get(
            f"{base}/v1/sessions/{sid}/events?follow=false", headers=auth("odd-token"), verify=PLAIN
        )
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
        said = [e["data"]["message"] for e in events if e.get("type") == "turn.message"]
        assert said == ["thanks"]


def test_a_token_for_a_viewer_with_a_lone_surrogate_is_theirs_alone() -> None:
    mine, theirs = form_token(b"k", ODD_EVE, 10.0), form_token(b"k", EVE, 10.0)
    assert check_form(b"k", ODD_EVE, mine, 50.0, 100.0) is not None
    assert check_form(b"k", EVE, mine, 50.0, 100.0) is None
    assert check_form(b"k", ODD_EVE, theirs, 50.0, 100.0) is None
    # nor for the viewer whose id is that surrogate's escape, or its UTF-8 bytes as text
    for other in ("eve\\ud800", "eve\xed\xa0\x80", "eve\udced\udca0\udc80", "eve\ufffd"):
        named = EVE.model_copy(update={"principal_id": other})
        assert check_form(b"k", named, mine, 50.0, 100.0) is None
        assert check_form(b"k", ODD_EVE, form_token(b"k", named, 10.0), 50.0, 100.0) is None
