"""The dashboard's message pages (errors, refused or repeated answers): a signed-in reviewer
keeps the navigation every other page has; a visitor not signed in gets none."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from starlette.testclient import TestClient

import signoff as so
from signoff.server import create_app
from signoff.testing import store_contents

from ._dashboard import csrf_of, signed_in, start
from .test_server_common import PLAIN, _echo, auth, in_process, make_runtime, served


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


def _nav(html: str) -> str:
    match = re.search(r'<nav class="nav"[^>]*>.*?</nav>', html, re.S)
    assert match, "no navigation in the page"
    return match.group(0)


def test_error_pages_of_a_signed_in_reviewer_lead_back_to_the_queue(base: str) -> None:
    """An error page (an unknown request, arguments that are not JSON, an unknown session, an
    answer someone else gave first) showed no navigation: only the browser's Back button."""
    body = start(base, "treasury")
    sid, rid = body["session_id"], body["pending"][0]["id"]
    with signed_in(base, "admin-token") as c:
        page = c.get(f"/_signoff/sessions/{sid}")
        nav, token = _nav(page.text), csrf_of(page.text)
        assert 'href="/_signoff/"' in nav and 'href="/_signoff/audit"' in nav
        failures = [
            c.post("/_signoff/requests/req_nope/respond", data={"option": "x", "csrf": token}),
            c.post(
                f"/_signoff/requests/{rid}/respond",
                data={"option": "approve", "edited_input": "{nope", "csrf": token},
            ),
            c.get("/_signoff/sessions/ses_nope"),
            c.post("/_signoff/sessions", data={"agent": "nope", "message": "hi", "csrf": token}),
        ]
        for who in ("alice-token", "bob-token"):  # the quorum settles elsewhere
            vote = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
            url = f"{base}/v1/sessions/{sid}/responses"
            assert httpx.post(url, json=vote, headers=auth(who), verify=PLAIN).status_code == 200
        failures.append(
            c.post(f"/_signoff/requests/{rid}/respond", data={"option": "approve", "csrf": token})
        )
        statuses = [r.status_code for r in failures]
        assert statuses == [404, 422, 404, 422, 200], statuses
        assert "Already approved by Bob (bob)" in failures[-1].text
        for r in failures:
            assert _nav(r.text) == nav, r.url
            assert 'class="viewer-name" title="root"' in r.text, r.url
            assert "Back to the queue" in r.text


def test_a_message_page_for_a_visitor_not_signed_in_has_no_navigation(tmp_path: Path) -> None:
    """In dev mode a caller from elsewhere is not recognised: the page says so, and offers no
    navigation of pages it may not see."""
    runtime = make_runtime(f"sqlite:///{tmp_path}/state.db")
    with TestClient(create_app(runtime, dev=True), base_url="http://signoff.test") as c:
        r = c.get("/_signoff/sessions/ses_nope")
    assert r.status_code == 401 and "Not signed in" in r.text
    assert '<nav class="nav"' not in r.text and 'class="viewer-name"' not in r.text


def _front(name: str, subagent: str) -> so.Agent:
    """An agent whose turn delegates to `subagent`, whose request it then mirrors."""
    handed = so.ModelResponse(tool_calls=[so.ToolCall(name=subagent, input={"message": "go"})])
    model = so.models.Scripted([handed, _echo], repeat_last=True)
    return so.Agent(name=name, model=model, tools=[so.delegate(subagent)])


@pytest.mark.parametrize(
    ("agent", "fault"),
    [("desk", {"text": "Large"}), ("front", {"edited_input": "{nope"})],
    ids=["question", "approval"],
)
async def test_a_forms_fault_on_a_mirror_is_refused_naming_the_mirror(
    store_url: str, agent: str, fault: dict[str, str]
) -> None:
    """Bob (Alice's tenant, who may see her session but not answer it) sending a mirror's form
    with a fault (an option with an answer typed; an edit that is not JSON) was refused naming
    the subagent's request (`request req_<child> was asked by alice`), where the same answer
    through the API, or the form without the fault, names the mirror answered. Now they all say
    the same; nothing is recorded."""
    agents = [_front("desk", "helper"), _front("front", "support")]  # a question, an approval
    async with in_process(store_url, agents=agents) as (rt, c):
        alice, bob = auth("alice-token"), {**auth("bob-token"), "Accept": "application/json"}
        page = await c.get("/_signoff/", headers=bob)
        match = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert match, page.text[:300]
        started = await c.post(
            "/v1/sessions", json={"agent": agent, "message": "hi"}, headers=alice
        )
        assert started.status_code == 201, started.text
        sid, (mirror,) = started.json()["session_id"], started.json()["pending"]
        child = mirror["child"]
        option = mirror["options"][0]["id"]
        before = [await store_contents(rt.store, s) for s in (sid, child["session_id"])]
        api = await c.post(
            f"/v1/sessions/{sid}/responses",
            json={"inputResponses": [{"requestId": mirror["id"], "optionId": option}]},
            headers=bob,
        )
        assert api.status_code == 403, api.text
        said = api.json()["error"]["message"]
        named = f"request {mirror['id']} (asked for {child['agent']}'s {child['request_id']})"
        assert said.startswith(named), said
        for fields in ({}, fault):
            form = {"csrf": match.group(1), "option": option, **fields}
            sent = await c.post(
                f"/_signoff/requests/{mirror['id']}/respond", data=form, headers=bob
            )
            assert sent.status_code == 403, (agent, fields, sent.text)
            assert sent.json()["error"] == {"code": "not_allowed", "message": said}, fields
        assert [await store_contents(rt.store, s) for s in (sid, child["session_id"])] == before


def _not_bob(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    who = ctx.response.principal
    return (
        so.Rejected("bob approves no deploys")
        if who and who.principal_id == "bob"
        else so.Allowed()
    )


@so.tool(approval=so.ApprovalSpec(request=so.always(), response=_not_bob))
async def _deploy(ref: str, count: int) -> str:
    """Deploy a ref."""
    return "deployed"


async def test_an_edit_that_is_no_json_from_whom_the_policy_rejects_gets_its_verdict(
    store_url: str,
) -> None:
    """Bob, whom the tool's response policy rejects, approving with an edit that is not JSON was
    told the edit is not JSON (422 `invalid_answer`), where his wrong-typed edit (on the form or
    over the API) gets the policy's verdict: `form_fault` checked only the rules a response
    policy is not. Now he gets the verdict either way, as the runtime judges the bare decision
    of an answer it cannot settle; Alice, whom it allows, is still told the edit's fault."""
    call = so.ToolCall(name="_deploy", input={"ref": "v1", "count": 1})
    model = so.models.Scripted([so.ModelResponse(tool_calls=[call])], repeat_last=True)
    gate = so.Agent(name="gate", model=model, tools=[_deploy])
    async with in_process(store_url, agents=[gate]) as (rt, c):
        alice = {**auth("alice-token"), "Accept": "application/json"}
        bob = {**auth("bob-token"), "Accept": "application/json"}
        page = await c.get("/_signoff/", headers=bob)
        match = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert match, page.text[:300]
        started = await c.post(
            "/v1/sessions", json={"agent": "gate", "message": "go"}, headers=alice
        )
        assert started.status_code == 201, started.text
        sid, rid = started.json()["session_id"], started.json()["pending"][0]["id"]
        before = await store_contents(rt.store, sid)
        said = []
        for box in ('{"ref": "v1", "count": "many"}', "{oops"):
            form = {"csrf": match.group(1), "option": "approve", "edited_input": box}
            sent = await c.post(f"/_signoff/requests/{rid}/respond", data=form, headers=bob)
            assert sent.status_code == 200, (box, sent.text)
            said.append(sent.json())
        assert said[0] == said[1], said
        assert (said[1]["outcome"], said[1]["reason"]) == ("rejected", "bob approves no deploys")
        html = {**auth("bob-token"), "Accept": "text/html"}
        sent = await c.post(f"/_signoff/requests/{rid}/respond", data=form, headers=html)
        assert sent.status_code == 409 and "bob approves no deploys" in sent.text, sent.text
        alice_page = await c.get("/_signoff/", headers=alice)
        alice_csrf = re.search(r'name="csrf" value="([^"]+)"', alice_page.text)
        assert alice_csrf
        form = {"csrf": alice_csrf.group(1), "option": "approve", "edited_input": "{oops"}
        sent = await c.post(f"/_signoff/requests/{rid}/respond", data=form, headers=alice)
        assert sent.status_code == 422 and sent.json()["error"]["code"] == "invalid_answer"
        assert await store_contents(rt.store, sid) == before
