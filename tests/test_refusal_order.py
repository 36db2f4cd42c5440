"""Who may answer is checked before whether the answers are complete: someone who may not
settle a session's approvals is told so (`NotAllowed`), whatever rule gates them, not that
their decisions leave requests unanswered."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.testing import ExecutionLog, call, call_tools, reply, scripted_agent, store_contents

from .test_server_common import auth, in_process

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
