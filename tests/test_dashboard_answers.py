"""Answering from the dashboard as a reviewer: who may, stale pages, answers given twice."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.stores._codec import unpack

from ._procs import query
from .test_audit import alter
from .test_dashboard import csrf_of, signed_in, start
from .test_server_common import TOKENS, auth, running, served

JSON = {"Accept": "application/json"}


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


def test_a_request_the_viewer_may_not_answer_offers_no_buttons(base: str) -> None:
    """An admin sees every tenant's requests, but only the person whose turn asked may answer
    one: the card offered Approve and Deny that could only fail (403). It says why instead."""
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    with signed_in(base, "admin-token") as c:
        for path in ("/_signoff/", f"/_signoff/sessions/{sid}"):
            page = c.get(path).text
            card = page[page.index(f'data-request-id="{rid}"') :]
            assert 'value="approve"' not in card and "/respond" not in card, path
            assert "You may not answer this" in card and "asked by alice" in card, path
        pending = c.get(f"/_signoff/fragments/sessions/{sid}").json()["pending"]
        assert "data-not-allowed" in pending and 'value="approve"' not in pending
    page = httpx.get(f"{base}/_signoff/", headers=auth("alice-token")).text
    assert 'value="approve"' in page and "data-not-allowed" not in page


def test_the_requester_of_a_four_eyes_call_is_told_someone_else_must_approve(
    tmp_path: Path,
) -> None:
    @so.tool(approval=so.always(exclude_requester=True))
    async def deploy(ref: str) -> str:
        """Deploy a ref."""
        return "deployed"

    call = so.ToolCall(name="deploy", input={"ref": "v1"})
    script = [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text="done")]
    agent = so.Agent(name="ops", model=so.models.Scripted(script, repeat_last=True), tools=[deploy])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/eyes.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        start(base, "ops")
        mine = httpx.get(f"{base}/_signoff/", headers=auth("alice-token")).text
        assert 'value="approve"' not in mine
        assert "the requester may not approve their own call" in mine
        # another reviewer of the tenant may
        assert 'value="approve"' in httpx.get(f"{base}/_signoff/", headers=auth("admin-token")).text


def test_the_same_answer_from_a_stale_page_names_who_gave_it_first(base: str) -> None:
    """Bob's vote settled a two-person approval while the admin's page still showed it; the
    admin's Approve was reported as "Approved", as if it had been theirs. It names who settled
    it and that nothing changed; the same person sending their answer again is not told so."""
    body = start(base, "treasury")
    rid = body["pending"][0]["id"]
    url = f"{base}/v1/sessions/{body['session_id']}/responses"
    vote = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
    with signed_in(base, "admin-token") as admin:
        token = csrf_of(admin.get("/_signoff/").text)  # the page, before the votes
        for who in ("alice-token", "bob-token"):
            assert httpx.post(url, json=vote, headers=auth(who)).status_code == 200
        before = httpx.get(f"{base}/v1/requests/{rid}", headers=auth("admin-token")).json()
        form = {"option": "approve", "csrf": token}
        r = admin.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
        assert r.status_code == 200 and r.json()["outcome"] == "approved"
        assert r.json()["already_by"] == "Bob (bob)"
        r = admin.post(f"/_signoff/requests/{rid}/respond", data={**form, "next": "/_signoff/"})
        assert r.status_code == 200 and "Already approved by Bob (bob)" in r.text
        after = httpx.get(f"{base}/v1/requests/{rid}", headers=auth("admin-token")).json()
        assert after == before  # nothing changed
    with signed_in(base, "bob-token") as bob:
        form = {"option": "approve", "csrf": csrf_of(bob.get("/_signoff/").text)}
        r = bob.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
        assert r.status_code == 200 and r.json()["already_by"] is None
        r = bob.post(f"/_signoff/requests/{rid}/respond", data={**form, "next": "/_signoff/"})
        assert r.status_code == 303


@pytest.mark.parametrize(
    ("part", "damaged"),
    [
        ("by", {"principal_id": 7}),
        ("by", {"attributes": "bob"}),
        ("by", ["bob"]),
        ("by", 42),
        ("resolution", ["approve"]),
        ("resolution", 42),
        ("resolution", "approved"),
    ],
    ids=lambda v: v if isinstance(v, str) and v in ("by", "resolution") else repr(v),
)
def test_a_stale_answer_to_a_request_settled_by_a_damaged_principal_is_still_answered(
    store_url: str, part: str, damaged: object
) -> None:
    """A settled request whose stored `by` is not a principal, or whose stored resolution is not
    an object at all (an old or hand-edited store), made a stale page's repeated answer a 500;
    it is reported as answered by someone unknown."""
    with served(store_url) as base:
        body = start(base, "treasury")
        rid = body["pending"][0]["id"]
        url = f"{base}/v1/sessions/{body['session_id']}/responses"
        vote = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
        with signed_in(base, "admin-token") as admin:
            token = csrf_of(admin.get("/_signoff/").text)  # the page, before the votes
            for who in ("alice-token", "bob-token"):
                assert httpx.post(url, json=vote, headers=auth(who)).status_code == 200
            ((stored,),) = query(store_url, "SELECT resolution FROM {t}requests WHERE id={p}", rid)
            resolution = damaged if part == "resolution" else {**unpack(stored), "by": damaged}
            raw = json.dumps(resolution).encode()
            alter(store_url, "UPDATE {t}requests SET resolution={p} WHERE id={p}", raw, rid)
            form = {"option": "approve", "csrf": token}
            r = admin.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
            assert r.status_code == 200 and r.json()["outcome"] == "approved", r.text
            assert r.json()["already_by"] == "unknown"
            r = admin.post(f"/_signoff/requests/{rid}/respond", data={**form, "next": "/_signoff/"})
            assert r.status_code == 200 and "Already approved by unknown" in r.text
        ((after,),) = query(store_url, "SELECT resolution FROM {t}requests WHERE id={p}", rid)
        assert unpack(after) == resolution  # nothing changed


def test_an_answer_without_javascript_returns_to_the_filtered_queue(base: str) -> None:
    """A reviewer working through a filtered queue (no JavaScript) was sent back to the whole
    queue after each answer: the form named the page's path without its filter."""
    rid = start(base)["pending"][0]["id"]
    start(base, "helper")
    with signed_in(base) as c:
        page = c.get("/_signoff/?kind=tool-approval").text
        assert 'name="next" value="/_signoff/?kind=tool-approval"' in page
        form = {"option": "approve", "csrf": csrf_of(page), "next": "/_signoff/?kind=tool-approval"}
        r = c.post(f"/_signoff/requests/{rid}/respond", data=form)
        assert r.status_code == 303 and r.headers["location"] == "/_signoff/?kind=tool-approval"


def test_a_reviewer_who_voted_on_a_quorum_is_told_so_and_offered_no_buttons(base: str) -> None:
    """Alice's approval counted toward a two-person approval; her card still offered Approve
    and Deny, and Approve only said "already counted". It says she approved, and how far the
    quorum is, by the runtime's own rule; Bob, who has not voted, still gets the buttons."""
    body = start(base, "treasury")
    sid, rid = body["session_id"], body["pending"][0]["id"]
    vote = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
    url = f"{base}/v1/sessions/{sid}/responses"
    assert httpx.post(url, json=vote, headers=auth("alice-token")).json()["status"] == "waiting"
    with signed_in(base, "alice-token") as c:
        for path in ("/_signoff/", f"/_signoff/sessions/{sid}"):
            page = c.get(path).text
            card = page[page.index(f'data-request-id="{rid}"') :]
            card = card[: card.index("</article>")]
            assert "/respond" not in card and 'value="approve"' not in card, path
            assert 'value="cancel"' not in card, path
            assert "data-voted" in card and "You approved this (1 of 2)" in card, path
        pending = c.get(f"/_signoff/fragments/sessions/{sid}").json()["pending"]
        assert "data-voted" in pending and 'value="approve"' not in pending
    bobs = httpx.get(f"{base}/_signoff/", headers=auth("bob-token")).text
    card = bobs[bobs.index(f'data-request-id="{rid}"') :]
    assert 'value="approve"' in card and "data-voted" not in card
