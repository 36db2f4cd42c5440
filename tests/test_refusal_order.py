"""Who may answer is checked before whether the answers are complete: someone who may not
settle a session's approvals is told so (`NotAllowed`), whatever rule gates them, not that
their decisions leave requests unanswered."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import (
    ExecutionLog,
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    store_contents,
)

from .test_server_common import TOKENS, auth, in_process

ALICE = so.Principal(authenticator="sso", principal_id="alice")
CAROL = so.Principal(authenticator="sso", principal_id="carol")

RULES = {
    "default": (so.always(), CAROL),
    "four-eyes": (so.always(exclude_requester=True), ALICE),
    "quorum-anonymous": (so.always(approvers=2), None),
}


def two_deploys(log: ExecutionLog, approval: Any) -> so.Agent:
    @log.tool(approval=approval)
    async def deploy(service: str) -> str:
        """Deploy a service to production."""
        return f"{service} live"

    both = call_tools(call("deploy", service="api"), call("deploy", service="web"))
    return scripted_agent("ops", [both, reply("done")], tools=[deploy])


@pytest.mark.parametrize(("approval", "who"), list(RULES.values()), ids=list(RULES))
async def test_an_ineligible_partial_set_of_decisions_is_not_allowed(
    store_url: str, approval: Any, who: so.Principal | None
) -> None:
    """Under the default rule carol's one decision of two was `NotAllowed`; under four eyes
    (the requester) or a quorum (anonymous) the same call was `PartialAnswer`."""
    log = ExecutionLog()
    async with so.Runtime([two_deploys(log, approval)], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy both", auth=ALICE)
        first, _ = r.pending
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.NotAllowed) as refused:
            await rt.generate(
                session_id=r.session_id,
                approvals=[so.Decision(id=first.id, approved=True)],
                auth=who,
            )
        assert refused.value.request_ids == [first.id]
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0


async def test_an_ineligible_partial_set_of_decisions_on_mirrors_is_not_allowed(
    store_url: str,
) -> None:
    """A subagent's two four-eyes approvals, mirrored in the parent: the requester deciding one
    of them through the parent was told the other was unanswered (`PartialAnswer`), where the
    same call on the subagent's own session is `NotAllowed`."""
    ran: list[str] = []

    @so.tool(approval=so.always(exclude_requester=True))
    async def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "ok"

    both = call_tools(call("refund", order_id="8"), call("refund", order_id="9"))
    child = scripted_agent("billing", [both, reply("refunded")], tools=[refund])
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 8 and 9")), reply("done")],
        tools=[so.delegate("billing")],
    )
    async with so.Runtime([parent, child], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 8 and 9", auth=ALICE)
        first, _ = r.pending
        assert first.child is not None
        before = await store_contents(rt.store, r.session_id)
        for session_id, rid in (
            (first.child.session_id, first.child.request_id),
            (r.session_id, first.id),
        ):
            with pytest.raises(so.NotAllowed, match="the requester may not"):
                await rt.generate(
                    session_id=session_id,
                    approvals=[so.Decision(id=rid, approved=True)],
                    auth=ALICE,
                )
        assert await store_contents(rt.store, r.session_id) == before
        assert ran == []


def asking(name: str) -> so.Agent:
    """An agent whose turn asks a question (options yes and no), then ends; a later message
    ends a turn of its own."""

    @so.tool
    async def ship(ctx: so.ToolContext, order_id: str) -> str:
        """Ship an order once a person says so."""
        answer = await ctx.ask("Ship it?", options=["yes", "no"])
        return str(answer.option_id)

    script = [call_tools(call("ship", order_id="1")), reply("ok"), reply("again")]
    return scripted_agent(name, script, tools=[ship])


async def refused_to_carol(rt: so.Runtime, session_id: str, rid: str) -> None:
    """Carol's decision on Alice's `rid` is refused as her answer to it is (`NotAllowed`)."""
    with pytest.raises(so.NotAllowed, match="carol may not") as decided:
        await rt.generate(
            session_id=session_id, approvals=[so.Decision(id=rid, approved=True)], auth=CAROL
        )
    assert decided.value.request_ids == [rid]
    with pytest.raises(so.NotAllowed) as answered:
        answer = so.InputResponse(request_id=rid, option_id="yes")
        await rt.respond(session_id, [answer], principal=CAROL)
    assert str(decided.value) == str(answered.value)


async def told_alice(rt: so.Runtime, session_id: str, rid: str) -> None:
    """Alice, who may answer `rid`, is told a decision does not answer a question."""
    with pytest.raises(so.InvalidAnswer, match=f"request {rid} is a question") as refused:
        await rt.generate(
            session_id=session_id, approvals=[so.Decision(id=rid, approved=True)], auth=ALICE
        )
    assert refused.value.request_ids == [rid]


async def test_a_decision_on_a_question_is_refused_to_who_may_not_answer_it(
    store_url: str,
) -> None:
    """Carol's decision naming Alice's question was told it named a question (`InvalidAnswer`)
    where her answer to it in any other way is `NotAllowed`, against README's "Who may answer
    is checked first"; open, settled, and left behind by a later turn alike. Alice, who may
    answer it, is still told it is a question."""
    async with so.Runtime([asking("a")], store=store_url) as rt:
        r = await rt.generate("a", prompt="go", auth=ALICE)
        (question,) = r.pending
        for stage in ("open", "settled", "left behind"):
            before = await store_contents(rt.store, r.session_id)
            await refused_to_carol(rt, r.session_id, question.id)
            await told_alice(rt, r.session_id, question.id)
            assert await store_contents(rt.store, r.session_id) == before, stage
            if stage == "open":
                answer = so.InputResponse(request_id=question.id, option_id="yes")
                done = await rt.respond(r.session_id, [answer], principal=ALICE)
                assert (done.status, done.text) == ("completed", "ok")
            elif stage == "settled":  # a later turn leaves it behind: read from the store then
                more = await rt.generate(session_id=r.session_id, prompt="more", auth=ALICE)
                assert more.status == "completed"


async def test_a_decision_on_a_mirrored_question_is_refused_to_who_may_not_answer_it(
    store_url: str,
) -> None:
    """The same through a subagent's mirror in the parent, whose kind was checked before
    anything else: Carol is refused as for her answer to it, which the subagent's own question
    refuses, open or settled; nothing changes in either session."""
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="ship 1")), reply("done")],
        tools=[so.delegate("billing")],
    )
    async with so.Runtime([parent, asking("billing")], store=store_url) as rt:
        r = await rt.generate("support", prompt="ship 1", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None and mirror.kind == "question"
        sessions = (r.session_id, mirror.child.session_id)
        for settled in (False, True):
            before = [await store_contents(rt.store, s) for s in sessions]
            await refused_to_carol(rt, r.session_id, mirror.id)
            await told_alice(rt, r.session_id, mirror.id)
            assert [await store_contents(rt.store, s) for s in sessions] == before, settled
            if not settled:
                answer = so.InputResponse(request_id=mirror.id, option_id="yes")
                done = await rt.respond(r.session_id, [answer], principal=ALICE)
                assert (done.status, done.text) == ("completed", "done")


async def test_a_decision_on_a_question_over_http_is_a_403_to_who_may_not_answer_it(
    store_url: str,
) -> None:
    """Over HTTP Bob (Alice's tenant, who may read her session) deciding her question got 422
    `invalid_answer`, before and after she answered it; he gets 403 `not_allowed`, as for any
    other answer of his to it, and Alice still gets the 422."""
    async with in_process(store_url) as (rt, c):
        started = await c.post(
            "/v1/sessions", json={"agent": "helper", "message": "hi"}, headers=auth("alice-token")
        )
        assert started.status_code == 201, started.text
        sid, (question,) = started.json()["session_id"], started.json()["pending"]
        decision = {"approvals": [{"id": question["id"], "approved": True}]}
        for settled in (False, True):
            before = await store_contents(rt.store, sid)
            for token, status, code in (
                ("bob-token", 403, "not_allowed"),
                ("alice-token", 422, "invalid_answer"),
            ):
                got = await c.post(
                    f"/v1/sessions/{sid}/approvals", json=decision, headers=auth(token)
                )
                assert (got.status_code, got.json()["error"]["code"]) == (status, code), got.text
            assert await store_contents(rt.store, sid) == before
            if not settled:
                pick = {"requestId": question["id"], "optionId": question["options"][0]["id"]}
                answered = await c.post(
                    f"/v1/sessions/{sid}/responses",
                    json={"inputResponses": [pick]},
                    headers=auth("alice-token"),
                )
                assert answered.status_code == 200, answered.text


@pytest.mark.parametrize("levels", [2, 3], ids=["mirror", "mirror-of-a-mirror"])
async def test_a_mirror_left_behind_is_refused_naming_the_mirror(
    store_url: str, levels: int
) -> None:
    """Once Alice's next turn left her answered mirror behind, Carol's answer to it was refused
    naming the subagent's request (`request req_<leaf> was asked by alice`, request_ids the
    leaf's), where the same answer open or settled names the mirror: the other words told her
    the turn had moved on. Now each is refused in the same words, naming the mirror."""
    agents, below = [asking("leaf")], "leaf"
    for level in range(levels - 1):
        name = f"level{level}"
        script = [call_tools(call(below, message="ship 1")), reply("done"), reply("again")]
        agents.append(scripted_agent(name, script, tools=[so.delegate(below)]))
        below = name
    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate(below, prompt="ship 1", auth=ALICE)
        (mirror,) = r.pending
        assert mirror.child is not None
        said: dict[str, set[str]] = {}
        for stage in ("open", "settled", "left behind"):
            before = await store_contents(rt.store, r.session_id)
            for option, text in (("yes", None), ("yes", "and now")):
                answer = so.InputResponse(request_id=mirror.id, option_id=option, text=text)
                with pytest.raises(so.NotAllowed) as answered:
                    await rt.respond(r.session_id, [answer], principal=CAROL)
                assert answered.value.request_ids == [mirror.id], (stage, str(answered.value))
                said.setdefault(stage, set()).add(str(answered.value))
            with pytest.raises(so.NotAllowed) as decided:
                await rt.generate(
                    session_id=r.session_id,
                    approvals=[so.Decision(id=mirror.id, approved=True)],
                    auth=CAROL,
                )
            assert decided.value.request_ids == [mirror.id], (stage, str(decided.value))
            said[stage].add(str(decided.value))
            assert await store_contents(rt.store, r.session_id) == before, stage
            if stage == "open":
                answer = so.InputResponse(request_id=mirror.id, option_id="yes")
                done = await rt.respond(r.session_id, [answer], principal=ALICE)
                assert (done.status, done.text) == ("completed", "done")
            elif stage == "settled":
                more = await rt.generate(session_id=r.session_id, prompt="more", auth=ALICE)
                assert more.status == "completed"
                assert mirror.id not in (await rt.state(r.session_id)).requests  # left behind
        (words,) = {w for ws in said.values() for w in ws}  # one refusal, whatever the stage
        named = f"request {mirror.id} (asked for {mirror.child.agent}'s {mirror.child.request_id})"
        assert words.startswith(named) and "was asked by alice; carol may not" in words, words


def one_deploy(log: ExecutionLog, approval: Any = None, ttl: float | None = None) -> so.Agent:
    """Agent `ops`, whose turn asks to approve one deploy (`approval`, `so.always()` unless
    given), in a session with `ttl` if given."""

    @log.tool(approval=approval or so.always())
    async def deploy(service: str) -> str:
        """Deploy a service to production."""
        return f"{service} live"

    script = [call_tools(call("deploy", service="api")), reply("done")]
    return scripted_agent("ops", script, tools=[deploy], limits=so.Limits(ttl=ttl))


@pytest.mark.parametrize(
    ("answers", "who"),
    [
        ([("known", "approve"), ("req_nope", "approve")], CAROL),
        ([("req_nope", "approve"), ("known", "approve")], CAROL),
        ([("known", "maybe"), ("req_nope", "approve")], ALICE),
    ],
    ids=["stranger-then-unknown", "unknown-then-stranger", "bad-option-then-unknown"],
)
async def test_an_unknown_id_beside_a_known_one_is_refused_first(
    store_url: str, answers: list[tuple[str, str]], who: so.Principal
) -> None:
    """A batch naming an unknown request id beside one carol may not answer (or alice answers
    with an option it lacks) was `NotAllowed` (`InvalidAnswer`): unknown ids were raised only
    after every known answer was checked, against docs/server.md's order (404 first)."""
    log = ExecutionLog()
    async with so.Runtime([one_deploy(log)], store=store_url) as rt:
        r = await rt.generate("ops", prompt="deploy", auth=ALICE)
        rid = r.pending[0].id
        batch = [
            so.InputResponse(request_id=rid if i == "known" else i, option_id=o) for i, o in answers
        ]
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.UnknownRequest) as refused:
            await rt.respond(r.session_id, batch, principal=who)
        assert refused.value.request_ids == ["req_nope"]
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0


async def test_an_unknown_id_beside_a_known_one_over_http_is_a_404(store_url: str) -> None:
    """The same over HTTP: bob (alice's tenant, who may not answer her approval) got 403
    `not_allowed`, and alice answering hers wrongly 422 `invalid_answer`, for a batch that
    also names an unknown id; both now get 404 `unknown_request`."""
    async with in_process(store_url) as (rt, c):
        started = await c.post(
            "/v1/sessions",
            json={"agent": "support", "message": "Refund order 1042, it broke"},
            headers=auth("alice-token"),
        )
        sid, rid = started.json()["session_id"], started.json()["pending"][0]["id"]
        nope = {"requestId": "req_nope", "optionId": "approve"}
        before = await store_contents(rt.store, sid)
        for token, known in (
            ("bob-token", {"requestId": rid, "optionId": "approve"}),
            ("alice-token", {"requestId": rid, "optionId": "maybe"}),
            ("alice-token", {"requestId": rid}),
        ):
            for body in ([known, nope], [nope, known]):
                got = await c.post(
                    f"/v1/sessions/{sid}/responses",
                    json={"inputResponses": body},
                    headers=auth(token),
                )
                assert got.status_code == 404, got.text
                assert got.json()["error"]["code"] == "unknown_request"
        decisions = {
            "approvals": [{"id": rid, "approved": True}, {"id": "req_nope", "approved": True}]
        }
        got = await c.post(
            f"/v1/sessions/{sid}/approvals", json=decisions, headers=auth("bob-token")
        )
        assert (got.status_code, got.json()["error"]["code"]) == (404, "unknown_request")
        assert await store_contents(rt.store, sid) == before


@pytest.mark.parametrize("recorded", [True, False], ids=["expiry-recorded", "unrecorded"])
async def test_a_stranger_is_refused_as_before_the_session_expired(
    store_url: str, recorded: bool
) -> None:
    """Once the session's TTL passed, carol (who may not answer alice's approval) was told
    `SessionExpired` naming the requests it closed, where before it (and after the request's
    own deadline) she is `NotAllowed`: README's "refused as they would have been then", told
    not whether or how it closed. Alice is still told the session expired."""
    clock, log = ManualClock(), ExecutionLog()
    async with so.Runtime([one_deploy(log, ttl=60)], store=store_url, clock=clock) as rt:
        r = await rt.generate("ops", prompt="deploy", auth=ALICE)
        answer = [so.InputResponse(request_id=r.pending[0].id, option_id="approve")]
        with pytest.raises(so.NotAllowed) as before_ttl:
            await rt.respond(r.session_id, answer, principal=CAROL)
        clock.advance(120)
        if recorded:
            await rt.state(r.session_id)  # records the expiry
        with pytest.raises(so.NotAllowed) as after_ttl:
            await rt.respond(r.session_id, answer, principal=CAROL)
        assert str(after_ttl.value) == str(before_ttl.value)
        before = await store_contents(rt.store, r.session_id)
        for resume in (True, False):
            with pytest.raises(so.NotAllowed):
                await rt.respond(r.session_id, answer, principal=CAROL, resume=resume)
            with pytest.raises(so.UnknownRequest):
                unknown = [so.InputResponse(request_id="req_nope", option_id="approve")]
                await rt.respond(r.session_id, [*answer, *unknown], principal=CAROL)
            with pytest.raises(so.SessionExpired):
                await rt.respond(r.session_id, answer, principal=ALICE, resume=resume)
        assert await store_contents(rt.store, r.session_id) == before
        assert log.count() == 0


async def test_a_stranger_over_http_is_a_403_once_the_session_expired(store_url: str) -> None:
    """Over HTTP bob got 410 `session_expired` (naming the request ids its expiry closed) for
    alice's approval once the TTL passed, where before it he got 403 `not_allowed`."""
    clock, log = ManualClock(), ExecutionLog()
    runtime = so.Runtime([one_deploy(log, ttl=60)], store=store_url, clock=clock)
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://t") as c,
    ):
        started = await c.post(
            "/v1/sessions", json={"agent": "ops", "message": "deploy"}, headers=auth("alice-token")
        )
        sid, rid = started.json()["session_id"], started.json()["pending"][0]["id"]
        body = {"inputResponses": [{"requestId": rid, "optionId": "approve"}]}
        said = []
        for _ in range(2):
            got = await c.post(
                f"/v1/sessions/{sid}/responses", json=body, headers=auth("bob-token")
            )
            said.append((got.status_code, got.json()["error"]))
            clock.advance(120)
        assert said[0] == said[1] and said[0][0] == 403, said
        got = await c.post(f"/v1/sessions/{sid}/responses", json=body, headers=auth("alice-token"))
        assert (got.status_code, got.json()["error"]["code"]) == (410, "session_expired")


async def test_a_runtime_lacking_the_agent_refuses_unknown_ids_and_strangers_first(
    store_url: str,
) -> None:
    """A runtime without the session's agent (a split deployment's other process) told carol,
    who may not answer alice's approval, and an unknown request id, `UnknownAgent`: it is now
    told after them, as `UnknownTool` is, so only alice hears of the deployment's fault. A
    request a response policy decides is `NotAllowed` there, as README says of a runtime
    without its tool."""

    def anyone(ctx: so.ResponseContext) -> so.Allowed:
        return so.Allowed()

    log = ExecutionLog()
    gated = so.ApprovalSpec(request=so.always(), response=anyone)
    for approval in (so.always(), gated):
        async with so.Runtime([one_deploy(log, approval)], store=store_url) as rt:
            r = await rt.generate("ops", prompt="deploy", auth=ALICE)
        rid = r.pending[0].id
        async with so.Runtime([scripted_agent("other", [reply("hi")])], store=store_url) as rt2:
            before = await store_contents(rt2.store, r.session_id)
            for resume in (True, False):
                unknown = [so.InputResponse(request_id="req_nope", option_id="approve")]
                with pytest.raises(so.UnknownRequest):
                    await rt2.respond(r.session_id, unknown, principal=ALICE, resume=resume)
                for who, option in ((CAROL, "approve"), (CAROL, "maybe"), (ALICE, "approve")):
                    answer = [so.InputResponse(request_id=rid, option_id=option)]
                    if approval is gated:
                        with pytest.raises(so.NotAllowed, match="runs agent 'ops'"):
                            await rt2.respond(r.session_id, answer, principal=who, resume=resume)
                    elif who is CAROL:
                        with pytest.raises(so.NotAllowed, match="carol may not"):
                            await rt2.respond(r.session_id, answer, principal=who, resume=resume)
                    else:
                        with pytest.raises(so.UnknownAgent):
                            await rt2.respond(r.session_id, answer, principal=who, resume=resume)
            assert await store_contents(rt2.store, r.session_id) == before
    assert log.count() == 0
