"""Answering from the dashboard as a reviewer: who may, stale pages, answers given twice."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.stores._codec import unpack

from ._audit import alter
from ._dashboard import PLAIN, csrf_of, signed_in, start
from ._procs import query
from .test_server_common import TOKENS, auth, running, served

JSON = {"Accept": "application/json"}
# httpx.get and .post with one TLS context, not one built per call (`PLAIN`), and the 10 s the
# suite's other clients wait (httpx's 5 s was once too short for a deny that ran a turn, in a
# full run beside other work)
get = partial(httpx.get, verify=PLAIN, timeout=10)
post = partial(httpx.post, verify=PLAIN, timeout=10)


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
    page = get(f"{base}/_signoff/", headers=auth("alice-token")).text
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
        mine = get(f"{base}/_signoff/", headers=auth("alice-token")).text
        assert 'value="approve"' not in mine
        assert "the requester may not approve or deny their own call" in mine
        # another reviewer of the tenant may
        assert 'value="approve"' in get(f"{base}/_signoff/", headers=auth("admin-token")).text


def test_an_edit_from_1_to_true_on_the_dashboard_is_an_edit(tmp_path: Path) -> None:
    """The dashboard compared the typed arguments with the proposed ones by `==`, for which
    `true` is `1`: the reviewer's edit was dropped, and the call ran with `1`, unedited."""

    @so.tool(approval=so.always())
    async def set_flag(name: str, value: int | bool) -> str:
        """Set a flag."""
        return f"{name}={value!r}"

    call = so.ToolCall(name="set_flag", input={"name": "beta", "value": 1})
    script = [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text="done")]
    agent = so.Agent(name="flags", model=so.models.Scripted(script), tools=[set_flag])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/flags.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        body = start(base, "flags")
        rid = body["pending"][0]["id"]
        with signed_in(base) as c:
            page = c.get(f"/_signoff/sessions/{body['session_id']}").text
            form = {
                "csrf": csrf_of(page),
                "option": "approve",
                "edited_input": '{"name": "beta", "value": true}',
            }
            r = c.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
        assert r.status_code == 200, r.text
        assert r.json()["edited"] is True and r.json()["outcome"] == "approved"
    events = runtime.events_sync(body["session_id"])
    (done,) = [e for e in events if e.type == "tool.completed"]
    assert done.data["result"]["result"] == "beta=True"
    (settled,) = [e for e in events if e.type == "approval.settled"]
    assert settled.data["edited_input"] == {"name": "beta", "value": True}
    runtime.close_sync()


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
            assert post(url, json=vote, headers=auth(who)).status_code == 200
        before = get(f"{base}/v1/requests/{rid}", headers=auth("admin-token")).json()
        form = {"option": "approve", "csrf": token}
        r = admin.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
        assert r.status_code == 200 and r.json()["outcome"] == "approved"
        assert r.json()["already_by"] == "Bob (bob)"
        r = admin.post(f"/_signoff/requests/{rid}/respond", data={**form, "next": "/_signoff/"})
        assert r.status_code == 200 and "Already approved by Bob (bob)" in r.text
        after = get(f"{base}/v1/requests/{rid}", headers=auth("admin-token")).json()
        assert after == before  # nothing changed
    with signed_in(base, "bob-token") as bob:
        form = {"option": "approve", "csrf": csrf_of(bob.get("/_signoff/").text)}
        r = bob.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
        assert r.status_code == 200 and r.json()["already_by"] is None
        r = bob.post(f"/_signoff/requests/{rid}/respond", data={**form, "next": "/_signoff/"})
        assert r.status_code == 303


def test_a_reason_sent_again_from_another_tab_is_said_to_have_changed_nothing(
    store_url: str,
) -> None:
    """Alice approved in one tab with a reason, then in another with other words: the approval
    stood with the first reason, and the page said "Approved" as if the second had reached the
    agent. She is told it was hers already and that this answer changed nothing; sending the very
    same answer again (a double click without JavaScript) is still not an error."""
    with served(store_url) as base:
        body = start(base)
        rid = body["pending"][0]["id"]
        url = f"/_signoff/requests/{rid}/respond"
        with signed_in(base) as c:
            token = csrf_of(c.get("/_signoff/").text)  # both tabs' pages, before the answer
            first = {"option": "approve", "text": "refund it", "csrf": token, "next": "/_signoff/"}
            assert c.post(url, data=first).status_code == 303
            before = get(f"{base}/v1/requests/{rid}", headers=auth("alice-token")).json()
            again = {**first, "text": "refund only the broken part"}
            r = c.post(url, data=again, headers=JSON)
            assert r.status_code == 200 and r.json()["outcome"] == "approved"
            assert r.json()["already_by"] == "you"
            r = c.post(url, data=again)
            assert r.status_code == 200
            assert "Already approved by you: your answer changed nothing." in r.text
            r = c.post(url, data=first, headers=JSON)  # the same answer: taken as given
            assert r.status_code == 200 and r.json()["already_by"] is None
            assert c.post(url, data=first).status_code == 303
        after = get(f"{base}/v1/requests/{rid}", headers=auth("alice-token")).json()
        assert after == before and after["resolution"]["reason"] == "refund it"


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
                assert post(url, json=vote, headers=auth(who)).status_code == 200
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


def test_a_reviewer_who_voted_on_a_quorum_is_told_so_and_may_still_deny(base: str) -> None:
    """Alice's approval counted toward a two-person approval. Her card offered no buttons at
    all, though the runtime takes a deny from her (one deny closes a quorum: a deny is not a
    vote). It says she approved, and how far the quorum is, and offers Deny but not an Approve
    that would count nothing; Bob, who has not voted, still gets both."""
    body = start(base, "treasury")
    sid, rid = body["session_id"], body["pending"][0]["id"]
    vote = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
    url = f"{base}/v1/sessions/{sid}/responses"
    assert post(url, json=vote, headers=auth("alice-token")).json()["status"] == "waiting"
    with signed_in(base, "alice-token") as c:
        for path in ("/_signoff/", f"/_signoff/sessions/{sid}"):
            page = c.get(path).text
            card = page[page.index(f'data-request-id="{rid}"') :]
            card = card[: card.index("</article>")]
            assert 'value="approve"' not in card and 'name="edited_input"' not in card, path
            assert f"/requests/{rid}/respond" in card and 'value="cancel"' in card, path
            told = 'You approved this (<span data-votes="note">1 of 2</span>)'  # redrawn live
            assert "data-voted" in card and told in card, path
        pending = c.get(f"/_signoff/fragments/sessions/{sid}").json()["pending"]
        assert "data-voted" in pending and 'value="approve"' not in pending
        assert 'value="cancel"' in pending
        form = {"option": "cancel", "text": "wrong account", "csrf": csrf_of(page)}
        r = c.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
        assert r.status_code == 200 and r.json()["outcome"] == "cancelled", r.text
    got = get(f"{base}/v1/requests/{rid}", headers=auth("admin-token")).json()
    assert (got["status"], got["outcome"]) == ("settled", "cancelled"), got
    body = start(base, "treasury")
    bobs = get(f"{base}/_signoff/", headers=auth("bob-token")).text
    card = bobs[bobs.index(f'data-request-id="{body["pending"][0]["id"]}"') :]
    card = card[: card.index("</article>")]
    assert 'value="approve"' in card and 'value="cancel"' in card and "data-voted" not in card


# -- every button shown is one the runtime takes, and every answer it takes has its button -------

ASK = so.ToolCall(
    name="ask_question",
    input={
        "question": "Which size?",
        "options": [
            {"label": "Small", "description": "One size down."},
            {"label": "Large", "description": "One size up."},
        ],
    },
)
RULES: dict[str, so.ApprovalPolicy | so.ApprovalSpec] = {
    "single": so.always(),
    "four-eyes": so.always(exclude_requester=True),
    "quorum": so.always(approvers=2),
    "quorum-excl": so.always(approvers=2, exclude_requester=True),
    "loose": so.always(approvers=2, distinct=False),
    "open": so.ApprovalSpec(request=so.always(), response=lambda ctx: so.Allowed()),
}
DESKS = ("single", "quorum", "open")
"""Agents a `desk-` agent delegates to: their requests are answered through the desk's mirror."""


def _gate_agents() -> list[so.Agent]:
    agents = []
    for name, rule in RULES.items():

        @so.tool(approval=rule)
        async def deploy(ref: str) -> str:
            """Deploy a ref."""
            return f"{ref} live"

        call = so.ToolCall(name="deploy", input={"ref": "v1"})
        script = so.models.Scripted(
            [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text="done")], repeat_last=True
        )
        agents.append(so.Agent(name=name, model=script, tools=[deploy]))
    for name in DESKS:
        call = so.ToolCall(name=name, input={"message": "deploy v1"})
        script = so.models.Scripted(
            [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text="done")], repeat_last=True
        )
        agents.append(so.Agent(name=f"desk-{name}", model=script, tools=[so.delegate(name)]))
    script = so.models.Scripted(
        [so.ModelResponse(tool_calls=[ASK]), so.ModelResponse(text="ok")], repeat_last=True
    )
    agents.append(so.Agent(name="ask", model=script, tools=[so.ask_question()]))

    @so.tool
    async def lookup(n: int) -> int:
        """Look something up."""
        return n

    spend = so.ModelResponse(
        tool_calls=[so.ToolCall(name="lookup", input={"n": 1})],
        usage=so.Usage(input_tokens=60, output_tokens=0),
    )
    script = so.models.Scripted([spend, spend, so.ModelResponse(text="ok")], repeat_last=True)
    limits = so.Limits(max_tokens=100)
    agents.append(so.Agent(name="limit", model=script, tools=[lookup], limits=limits))
    return agents


APPROVE, DENY, EDIT = "approve", "cancel", "edit"
ALL = {APPROVE, DENY, EDIT}
BOTH = {APPROVE, DENY}
# (agent, who voted first) -> per viewer, what their card offers (a question: options, text)
CASES: dict[tuple[str, tuple[str, ...]], dict[str, set[str]]] = {
    ("single", ()): {"alice": ALL, "bob": set(), "admin": set()},
    ("four-eyes", ()): {"alice": set(), "bob": ALL, "admin": ALL},
    ("quorum", ()): {"alice": BOTH, "bob": BOTH, "admin": BOTH},
    ("quorum", ("alice",)): {"alice": {DENY}, "bob": BOTH, "admin": BOTH},
    ("quorum-excl", ("bob",)): {"alice": set(), "bob": {DENY}, "admin": BOTH},
    ("loose", ("alice",)): {"alice": BOTH, "bob": BOTH, "admin": BOTH},
    ("ask", ()): {"alice": {"option", "text"}, "bob": set(), "admin": set()},
    ("limit", ()): {"alice": {"option"}, "bob": set(), "admin": set()},
    # a subagent's request, answered through its parent's mirror under the subagent's rules
    ("desk-single", ()): {"alice": ALL, "bob": set(), "admin": set()},
    ("desk-quorum", ("alice",)): {"alice": {DENY}, "bob": BOTH, "admin": BOTH},
    ("desk-open", ()): {"alice": ALL, "bob": ALL, "admin": ALL},
}


def _offered(card: str, request: dict[str, object], rid: str) -> set[str]:
    """The answers a request's card offers its viewer, read from its form."""
    if f"/requests/{rid}/respond" not in card:
        return set()
    if request["kind"] != "tool-approval":
        options = [o["id"] for o in request["options"]]  # type: ignore[attr-defined]
        got = {"option"} if all(f'value="{o}"' in card for o in options) else set()
        return got | ({"text"} if 'aria-label="Your answer"' in card else set())
    shown = {APPROVE: 'value="approve"', DENY: 'value="cancel"', EDIT: 'name="edited_input"'}
    return {action for action, mark in shown.items() if mark in card}


def _answer(action: str, request: dict[str, object]) -> dict[str, str]:
    if action == EDIT:
        return {"option": "approve", "edited_input": '{"ref": "v2"}'}
    if action == "option":
        return {"option": request["options"][-1]["id"]}  # type: ignore[index]
    if action == "text":
        return {"text": "Medium"}
    return {"option": action}


@pytest.mark.parametrize(
    ("agent", "voted"), list(CASES), ids=[f"{a}-voted-{'+'.join(v) or 'none'}" for a, v in CASES]
)
def test_every_answer_the_card_offers_is_taken_and_no_other(
    tmp_path: Path, agent: str, voted: tuple[str, ...]
) -> None:
    """A card offered buttons by a rule of its own (a quorum voter got none, though the runtime
    takes their deny; a quorum's card offered an edit the runtime refuses; a subagent's request
    mirrored on its parent was judged by the parent's tools, not the subagent's that settle it).
    For each viewer, each answer is tried on a fresh request: the runtime takes exactly those
    the card offers."""
    runtime = so.Runtime(_gate_agents(), store=f"sqlite:///{tmp_path}/gates.db")
    expected = CASES[(agent, voted)]
    actions = {"option", "text"} if agent in ("ask", "limit") else ALL
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        for viewer, offers in expected.items():
            with signed_in(base, f"{viewer}-token") as c:
                for action in sorted(actions):
                    body = start(base, agent)
                    sid, request = body["session_id"], body["pending"][0]
                    rid = request["id"]
                    for who in voted:
                        vote = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
                        url = f"{base}/v1/sessions/{sid}/responses"
                        r = post(url, json=vote, headers=auth(f"{who}-token"))
                        assert r.json()["status"] == "waiting", r.text
                    page = c.get(f"/_signoff/sessions/{sid}").text
                    card = page[page.index(f'data-request-id="{rid}"') :]
                    card = card[: card.index("</article>")]
                    assert _offered(card, request, rid) == offers, (viewer, card)
                    form = {**_answer(action, request), "csrf": csrf_of(page)}
                    r = c.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
                    data = r.json()
                    took = r.status_code == 200 and (
                        data["outcome"] in ("approved", "cancelled", "answered")
                        or (
                            data["outcome"] == "counted"
                            and not data["reason"].startswith("already counted")
                        )
                    )
                    assert took == (action in offers), (viewer, action, r.text)
                    if not offers:
                        assert "You may not answer this" in card, (viewer, card)


def test_a_request_recorded_before_the_flag_offers_no_answer_its_policy_refuses(
    tmp_path: Path,
) -> None:
    """A request parked before requests carried `response_policy`, shown by a runtime without
    its tool: the card judged it by the default rule and offered its requester Approve, which
    the answer then refused (403 not_allowed, the trail records the tool's response policy).
    The card reads the trail too and says why; nothing changes."""
    url = f"sqlite:///{tmp_path}/old.db"

    def anyone(ctx: so.ResponseContext) -> so.Allowed:
        return so.Allowed()

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=anyone))
    async def deploy(ref: str) -> str:
        """Deploy a ref."""
        return "deployed"

    call = so.ToolCall(name="deploy", input={"ref": "v1"})
    script = so.models.Scripted([so.ModelResponse(tool_calls=[call])], repeat_last=True)

    async def park() -> tuple[str, str]:
        agent = so.Agent(name="ops", model=script, tools=[deploy])
        async with so.Runtime([agent], store=url) as rt:
            policy, deploy.response_policy = deploy.response_policy, None
            try:  # as a signoff older than the flag recorded it
                r = await rt.generate("ops", prompt="deploy", auth=TOKENS["alice-token"])
            finally:
                deploy.response_policy = policy
            (old,) = r.pending
            assert not old.response_policy
            return r.session_id, old.id

    sid, rid = asyncio.run(park())
    runtime = so.Runtime([so.Agent(name="ops", model=script)], store=url)
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base, signed_in(base) as c:
        page = c.get(f"/_signoff/sessions/{sid}").text
        card = page[page.index(f'data-request-id="{rid}"') :]
        card = card[: card.index("</article>")]
        assert f"/requests/{rid}/respond" not in card and 'value="approve"' not in card
        assert "You may not answer this" in card and "response policy of ops.deploy" in card
        form = {"option": "approve", "csrf": csrf_of(page)}
        r = c.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
        assert r.status_code == 403 and r.json()["error"]["code"] == "not_allowed", r.text
        assert f'data-request-id="{rid}"' in c.get(f"/_signoff/sessions/{sid}").text


def test_an_answer_that_conflicts_with_one_given_elsewhere_names_who_gave_it(base: str) -> None:
    """Bob denied a wire transfer (one deny closes a quorum) while Alice's page still showed
    it; her Approve was refused with "request req_… was already settled as 'cancelled'
    (denied)", naming no one, though a stale page's same answer names who gave it first. It
    names Bob (or "you", for her own other tab), with and without JavaScript; nothing changes."""
    body = start(base, "treasury")
    rid, sid = body["pending"][0]["id"], body["session_id"]
    with signed_in(base) as alice:
        token = csrf_of(alice.get("/_signoff/").text)  # the page, before the deny
        deny = {"inputResponses": [{"requestId": rid, "optionId": "cancel"}]}
        url = f"{base}/v1/sessions/{sid}/responses"
        assert post(url, json=deny, headers=auth("bob-token")).status_code == 200
        before = get(f"{base}/v1/requests/{rid}", headers=auth("alice-token")).json()
        form = {"option": "approve", "csrf": token}
        r = alice.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
        assert r.status_code == 409 and r.json()["error"]["code"] == "conflicting_answer"
        message = r.json()["error"]["message"]
        assert message.startswith("Already denied by Bob (bob): ") and "already settled" in message
        r = alice.post(f"/_signoff/requests/{rid}/respond", data={**form, "next": "/_signoff/"})
        assert r.status_code == 409 and "Already denied by Bob (bob): " in r.text
        assert get(f"{base}/v1/requests/{rid}", headers=auth("alice-token")).json() == before
    body = start(base)
    rid, sid = body["pending"][0]["id"], body["session_id"]
    with signed_in(base) as alice:
        token = csrf_of(alice.get("/_signoff/").text)
        approve = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
        url = f"{base}/v1/sessions/{sid}/responses"
        assert post(url, json=approve, headers=auth("alice-token")).status_code == 200
        form = {"option": "cancel", "csrf": token}
        r = alice.post(f"/_signoff/requests/{rid}/respond", data=form, headers=JSON)
        assert r.status_code == 409
        assert r.json()["error"]["message"].startswith("Already approved by you: ")


def test_an_options_button_pressed_with_an_answer_typed_is_refused_not_cut(
    tmp_path: Path,
) -> None:
    """A question of two options that takes free text: the reviewer typed "Large, gift-wrapped"
    and pressed Large. The option was recorded and what they typed dropped without a word (the
    menu of many options refused the same); now nothing is recorded, and either alone is the
    answer."""

    @so.tool
    async def size(ctx: so.ToolContext) -> str:
        """Ask which size."""
        answer = await ctx.ask("Which size?", options=["Small", "Large"], allow_text=True)
        return str(answer.value if answer.value is not None else answer.text)

    script = [
        so.ModelResponse(tool_calls=[so.ToolCall(name="size", input={})]),
        so.ModelResponse(text="Noted."),
    ]
    agent = so.Agent(name="shop", model=so.models.Scripted(script), tools=[size])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/sizes.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        body = start(base, "shop")
        sid, (request,) = body["session_id"], body["pending"]
        large = request["options"][1]["id"]
        with signed_in(base) as c:
            token = csrf_of(c.get(f"/_signoff/sessions/{sid}").text)
            respond = f"/_signoff/requests/{request['id']}/respond"
            form = {"csrf": token, "option": large, "text": "Large, gift-wrapped"}
            r = c.post(respond, data=form, headers=JSON)
            assert r.status_code == 422, r.text
            assert r.json()["error"]["code"] == "invalid_answer"
            assert "not both" in r.json()["error"]["message"]
            assert [q.id for q in runtime.pending_sync(session_id=sid)] == [request["id"]]
            r = c.post(respond, data={"csrf": token, "text": "Large, gift-wrapped"}, headers=JSON)
            assert r.status_code == 200, r.text
    events = runtime.events_sync(sid)
    (done,) = [e for e in events if e.type == "tool.completed"]
    assert done.data["result"] == "Large, gift-wrapped"
    runtime.close_sync()


def test_a_form_from_one_who_may_not_answer_is_not_allowed_before_its_faults(
    tmp_path: Path,
) -> None:
    """The dashboard refused a form's faults before asking who sent it: the requester of a
    four-eyes call typing arguments that are not JSON, and an admin (who sees alice's question
    but may not answer it) pressing an option with an answer typed, were told what was wrong
    with the answer (422 `invalid_answer`), where the runtime says `NotAllowed` first (README,
    "Who may answer is checked first"). Nothing is recorded either way."""

    @so.tool(approval=so.always(exclude_requester=True))
    async def deploy(ref: str) -> str:
        """Deploy a ref."""
        return "deployed"

    @so.tool
    async def size(ctx: so.ToolContext) -> str:
        """Ask which size."""
        answer = await ctx.ask("Which size?", options=["Small", "Large"], allow_text=True)
        return str(answer.value)

    def scripted(name: str, call: so.ToolCall, tool: Any) -> so.Agent:
        script = [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text="done")]
        return so.Agent(name=name, model=so.models.Scripted(script), tools=[tool])

    agents = [
        scripted("ops", so.ToolCall(name="deploy", input={"ref": "v1"}), deploy),
        scripted("shop", so.ToolCall(name="size", input={}), size),
    ]
    runtime = so.Runtime(agents, store=f"sqlite:///{tmp_path}/eyes.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        approval = start(base, "ops")["pending"][0]
        question = start(base, "shop")["pending"][0]
        sent = [
            ("alice-token", approval, {"option": "approve", "edited_input": "{not json"}),
            ("admin-token", question, {"option": question["options"][1]["id"], "text": "L"}),
        ]
        for token, request, fields in sent:
            with signed_in(base, token) as c:
                form = {"csrf": csrf_of(c.get("/_signoff/").text), **fields}
                r = c.post(f"/_signoff/requests/{request['id']}/respond", data=form, headers=JSON)
            assert r.status_code == 403, r.text
            assert r.json()["error"]["code"] == "not_allowed", r.text
        pending = {r.id for r in runtime.pending_sync()}
        assert pending == {approval["id"], question["id"]}
    runtime.close_sync()
