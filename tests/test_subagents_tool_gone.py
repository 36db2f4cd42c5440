"""A parked delegate call whose tool a deploy renamed or removed, on both stores.

The call can no longer go on: no tool of its name runs it. An answer given through the parent
is refused (`UnknownTool`), nothing recorded, rather than accepted and never acted on; when the
parent's turn takes the call up anyway, its child is cancelled as a steer cancels it and what
the child spent is counted in the call's end, never left running undriven nor uncounted.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, NamedTuple

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import call, call_tools, reply, scripted_agent, store_contents, tool_results

from ._server_api import error
from ._subagents import ALICE, Counted, refund_agents
from .test_subagents_missing import MIRROR_ANSWERS, _answering_the_mirror

GONE = (
    "unknown tool 'billing': it was removed from the agent (or renamed) after this call started, "
    "so the call cannot finish; what the call did before that (the steps it recorded) ran and is "
    "not undone; available: billing_agent"
)
"""What the model reads of a delegate call its tool went from after it started: its child ran."""


U = so.Usage(input_tokens=100, output_tokens=10)  # each model call the child makes


def _agents(
    ran: list[dict[str, Any]], after: Counted, *, name: str = "billing"
) -> tuple[so.Agent, so.Agent]:
    """A support agent delegating a refund to billing by its tool `name` (a deploy renames it
    `billing_agent`); billing's refund needs approval and each of its model calls costs `U`."""
    issue_refund = refund_agents(ran, after)[1].tools["issue_refund"]
    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042", amount=180), usage=U),
            lambda conv: reply(f"Refunded: {tool_results(conv)[-1].content}", usage=U),
        ],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund order 1042")), after],
        tools=[so.delegate("billing", name=name)],
    )
    return parent, child


class _Parked(NamedTuple):
    r: so.GenerateResult  # the parent's turn, waiting
    mirror: so.InputRequest  # the child's approval, as the parent shows it
    ran: list[dict[str, Any]]  # the refunds the child's tool made
    after: Counted  # the parent's step after the delegate call
    parent: so.Agent  # the agents after the deploy
    child: so.Agent


async def _parked(store_url: str, *, unresumed: bool = False) -> _Parked:
    """A parent waiting on its child's approval, made before the deploy renamed its delegate
    tool; `unresumed`: the approval given through the parent then with `resume=False`."""
    ran: list[dict[str, Any]] = []
    after = Counted("Done.")
    async with so.Runtime(list(_agents(ran, after)), store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        assert r.status == "waiting"
        [mirror] = r.pending
        if unresumed:
            approve = so.InputResponse(request_id=mirror.id, option_id="approve")
            await rt.respond(r.session_id, [approve], principal=ALICE, resume=False)
    return _Parked(r, mirror, ran, after, *_agents(ran, after, name="billing_agent"))


async def _spent(rt: so.Runtime, session_id: str) -> so.Usage:
    state = await rt.state(session_id)
    return state.usage + state.delegated


@pytest.mark.parametrize("how", ["respond", "respond-unresumed", "decision", "send", "send-queue"])
async def test_an_answer_through_a_parent_whose_delegate_tool_is_gone_is_refused(
    store_url: str, how: str
) -> None:
    """The answer settled the child's request, closed the mirror and ended the delegate call
    with `unknown tool` without driving the child: accepted, never acted on, the child left
    running with no one to drive it and its spend never counted in the parent. Now it is
    `UnknownTool`, by id (resumed or not), as a decision or by message, and records nothing in
    either session; the child's own request answered directly goes through, and the parent's
    call then ends with the error the model reads, counting what the child spent."""
    r, mirror, ran, after, parent, child = await _parked(store_url)
    assert mirror.child is not None
    kid_id, kid_request = mirror.child.session_id, mirror.child.request_id
    async with so.Runtime([parent, child], store=store_url) as rt:
        before = await store_contents(rt.store, r.session_id)
        kid = await store_contents(rt.store, kid_id)
        with pytest.raises(so.UnknownTool, match="unknown tool 'billing'") as refused:
            await asyncio.wait_for(_answering_the_mirror(how, rt, r.session_id, mirror.id), 30)
        assert kid_request in str(refused.value) and "billing_agent" in str(refused.value)
        assert await store_contents(rt.store, r.session_id) == before
        assert await store_contents(rt.store, kid_id) == kid
        assert ran == [] and after.calls == 0
        direct = so.InputResponse(request_id=kid_request, option_id="approve")
        done = await asyncio.wait_for(rt.respond(kid_id, [direct], principal=ALICE), 30)
        assert done.status == "completed"
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        [result] = tool_results(after.capture.last)
        assert result.is_error and result.content == {"error": GONE}
        assert state.delegated == await _spent(rt, kid_id) != so.Usage()
        assert await rt.pending() == []
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1


@pytest.mark.parametrize("how", ["resumed", "steered"])
async def test_a_call_ended_for_its_gone_tool_cancels_its_child_and_counts_it(
    store_url: str, how: str
) -> None:
    """The parent's turn takes the call up after the deploy: the approval given through it
    before (`resume=False`) and the parent resumed, or a message steering it while the child
    waits. The call ended with `unknown tool`, its child left live (running with its approved
    refund, or waiting with its request open) until an orphan sweep, and its spend never
    counted in the parent. Now the child is cancelled as a steer cancels it, its refund never
    run and its request withdrawn, and the call's end records what it spent."""
    r, mirror, ran, after, parent, child = await _parked(store_url, unresumed=how == "resumed")
    assert mirror.child is not None
    kid_id = mirror.child.session_id
    async with so.Runtime([parent, child], store=store_url) as rt:
        if how == "resumed":
            done = await asyncio.wait_for(rt.generate(session_id=r.session_id), 30)
        else:
            done = await asyncio.wait_for(rt.send(r.session_id, "never mind", principal=ALICE), 30)
        assert (done.status, done.text) == ("completed", "Done.")
        [result] = tool_results(after.capture.last)
        assert result.is_error and result.content == {"error": GONE}
        kid = await rt.state(kid_id)
        assert kid.turn is not None and kid.turn.status == "cancelled"
        assert [q.status for q in kid.requests.values()] == [
            "settled" if how == "resumed" else "withdrawn"
        ]
        why = [
            e.data["reason"]
            async for e in rt.events(kid_id, follow=False)
            if e.type == "turn.cancelled"
        ]
        assert why == [
            "the parent's delegate call ended without its tool running"
            if how == "resumed"
            else "the parent turn was steered by a new message"
        ]
        state = await rt.state(r.session_id)
        assert state.delegated == await _spent(rt, kid_id) != so.Usage()
        assert state.owed == {} and await rt.pending() == []
        assert await rt.expire_due() == 0  # nothing left for the orphan sweep
        assert (await rt.state(r.session_id)).delegated == state.delegated  # counted once
    assert ran == [] and after.calls == 1


def _chain(ran: list[dict[str, Any]], *, mid_tool: str = "leaf") -> list[so.Agent]:
    """top -> mid -> leaf, the leaf's refund needing approval; `mid_tool`, the name of mid's
    delegate tool (a deploy renames it)."""
    issue_refund = refund_agents(ran, Counted("unused"))[1].tools["issue_refund"]
    leaf = scripted_agent(
        "leaf",
        [
            call_tools(call("issue_refund", order_id="1042", amount=180), usage=U),
            lambda conv: reply(f"leaf: {tool_results(conv)[-1].content}", usage=U),
        ],
        tools=[issue_refund],
    )
    mid = scripted_agent(
        "mid",
        [
            call_tools(call("leaf", call_id="m1", message="Refund order 1042"), usage=U),
            lambda conv: reply(f"mid: {tool_results(conv)[-1].content}", usage=U),
        ],
        tools=[so.delegate("leaf", name=mid_tool)],
    )
    top = scripted_agent(
        "top",
        [
            call_tools(call("mid", call_id="t1", message="Please refund")),
            lambda conv: reply(f"top: {tool_results(conv)[-1].content}"),
        ],
        tools=[so.delegate("mid")],
    )
    return [top, mid, leaf]


async def _chain_parked(store_url: str, ran: list[dict[str, Any]]) -> so.GenerateResult:
    """The top waiting on the leaf's approval, mirrored through mid, before the deploy."""
    async with so.Runtime(_chain(ran), store=store_url) as rt:
        r = await rt.generate("top", prompt="Refund order 1042", auth=ALICE)
    assert r.status == "waiting" and len(r.pending) == 1
    return r


async def test_an_answer_through_a_chain_whose_middle_lost_its_delegate_tool_is_refused(
    store_url: str,
) -> None:
    """Three levels; a deploy renames mid's delegate tool: the leaf's approval answered through
    the top is `UnknownTool` naming mid's call, and no session records anything."""
    ran: list[dict[str, Any]] = []
    r = await _chain_parked(store_url, ran)
    [mirror] = r.pending
    async with so.Runtime(_chain(ran, mid_tool="leaf_agent"), store=store_url) as rt:
        before = {s.id: await store_contents(rt.store, s.id) for s in await rt.sessions()}
        approve = so.InputResponse(request_id=mirror.id, option_id="approve")
        with pytest.raises(so.UnknownTool, match="unknown tool 'leaf'.* call m1"):
            await asyncio.wait_for(rt.respond(r.session_id, [approve], principal=ALICE), 30)
        assert {s.id: await store_contents(rt.store, s.id) for s in await rt.sessions()} == before
    assert ran == []


async def test_a_chain_whose_middle_lost_its_delegate_tool_counts_the_cancelled_leaf(
    store_url: str,
) -> None:
    """The leaf's approval given through the top before the deploy (`resume=False`), the top
    resumed after it: mid's call ends with `unknown tool`, the leaf is cancelled (its refund
    never run) and counted in mid, which the top counts in turn; nothing is left to sweep."""
    ran: list[dict[str, Any]] = []
    r = await _chain_parked(store_url, ran)
    [mirror] = r.pending
    assert mirror.child is not None
    async with so.Runtime(_chain(ran), store=store_url) as rt:
        approve = so.InputResponse(request_id=mirror.id, option_id="approve")
        await rt.respond(r.session_id, [approve], principal=ALICE, resume=False)
    async with so.Runtime(_chain(ran, mid_tool="leaf_agent"), store=store_url) as rt:
        done = await asyncio.wait_for(rt.generate(session_id=r.session_id), 30)
        assert done.status == "completed" and "unknown tool 'leaf'" in done.text
        [leaf_id] = [s.id for s in await rt.sessions() if s.agent == "leaf"]
        leaf = await rt.state(leaf_id)
        assert leaf.turn is not None and leaf.turn.status == "cancelled"
        mid = await rt.state(mirror.child.session_id)
        assert mid.delegated == leaf.usage != so.Usage()
        assert (await rt.state(r.session_id)).delegated == mid.usage + mid.delegated
        assert await rt.pending() == [] and await rt.expire_due() == 0
    assert ran == []


async def test_a_child_answered_directly_after_the_deploy_is_counted_in_its_parent(
    store_url: str,
) -> None:
    """The child's own request answered in its session after the deploy: its refund runs and
    its turn completes, and the parent's call then ends with `unknown tool`, its end recording
    what the child spent (it recorded nothing: the parent's budgets never saw it)."""
    r, mirror, ran, after, parent, child = await _parked(store_url)
    assert mirror.child is not None
    kid_id = mirror.child.session_id
    async with so.Runtime([parent, child], store=store_url) as rt:
        direct = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        done = await asyncio.wait_for(rt.respond(kid_id, [direct], principal=ALICE), 30)
        assert done.status == "completed"
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        [result] = tool_results(after.capture.last)
        assert result.is_error and result.content == {"error": GONE}
        assert state.delegated == await _spent(rt, kid_id) == U + U
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1


@pytest.mark.parametrize(
    ("path", "payload"),
    MIRROR_ANSWERS,
)
async def test_a_server_refuses_an_answer_through_a_delegate_tool_gone(
    store_url: str, path: str, payload: dict[str, Any]
) -> None:
    """Over HTTP each route answers 422 `unknown_tool`, both sessions as they were; the client
    raises it as `so.UnknownTool`."""
    r, mirror, ran, after, parent, child = await _parked(store_url)
    assert mirror.child is not None
    body = json.loads(json.dumps(payload).replace("MIRROR", mirror.id))
    runtime = so.Runtime([parent, child], store=store_url)
    app = create_app(runtime, auth=TokenAuth({"alice": ALICE}), sweep_every=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app),
            base_url="http://t",
            headers={"Authorization": "Bearer alice"},
        ) as c,
    ):
        before = await store_contents(runtime.store, r.session_id)
        kid = await store_contents(runtime.store, mirror.child.session_id)
        got = await c.post(f"/v1/sessions/{r.session_id}/{path}", json=body)
        assert "unknown tool 'billing'" in error(got, 422, "unknown_tool")["message"]
        assert await store_contents(runtime.store, r.session_id) == before
        assert await store_contents(runtime.store, mirror.child.session_id) == kid
    await runtime.close()
    assert ran == [] and after.calls == 0
    from signoff._wire import error as as_raised

    assert type(as_raised({"code": "unknown_tool", "message": "m"}, 422)) is so.UnknownTool


def _replaced(ran: list[dict[str, Any]], after: Counted, plain: list[str]) -> so.Agent:
    """The support agent after a deploy made `billing` a plain tool of the same name."""

    @so.tool(name="billing")
    async def billing(message: str) -> str:
        """Bill directly."""
        plain.append(message)
        return "billed"

    return scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund order 1042")), after],
        tools=[billing],
    )


async def test_a_delegate_tool_made_a_plain_tool_of_its_name_is_gone_for_its_call(
    store_url: str,
) -> None:
    """A deploy kept the name but made it a plain tool: the answer through the parent was
    accepted, the plain body ran against the call's journal (a ReplayError the model read), the
    approved refund never ran and the child was left live and uncounted. The answer is
    `UnknownTool` now, and a drive of the parent ends the call unrun, the child cancelled and
    counted, the plain body never run."""
    r, mirror, ran, after, _, child = await _parked(store_url)
    plain: list[str] = []
    parent = _replaced(ran, after, plain)
    assert mirror.child is not None
    kid_id = mirror.child.session_id
    async with so.Runtime([parent, child], store=store_url) as rt:
        before = await store_contents(rt.store, r.session_id)
        with pytest.raises(so.UnknownTool, match="no longer has it as a delegate tool"):
            await _answering_the_mirror("respond", rt, r.session_id, mirror.id)
        assert await store_contents(rt.store, r.session_id) == before
        done = await asyncio.wait_for(rt.send(r.session_id, "never mind", principal=ALICE), 30)
        assert done.status == "completed"
        [result] = tool_results(after.capture.last)
        gone = "tool 'billing' is no longer the delegate tool this call started"
        assert result.is_error and result.content == {"error": gone}
        kid = await rt.state(kid_id)
        assert kid.turn is not None and kid.turn.status == "cancelled"
        state = await rt.state(r.session_id)
        assert state.delegated == await _spent(rt, kid_id) != so.Usage()
    assert plain == [] and ran == []


async def test_who_may_not_answer_is_refused_as_such_before_a_gone_tool_is_told(
    store_url: str,
) -> None:
    """Someone who may not answer the child's request was told `unknown_tool`, with the child's
    session and request ids, instead of `NotAllowed`: who may answer is checked first."""
    r, mirror, *_, parent, child = await _parked(store_url)
    bob = so.Principal(authenticator="okta", principal_id="bob")
    async with so.Runtime([parent, child], store=store_url) as rt:
        approve = so.InputResponse(request_id=mirror.id, option_id="approve")
        with pytest.raises(so.NotAllowed):
            await rt.respond(r.session_id, [approve], principal=bob)
        with pytest.raises(so.UnknownTool):
            await rt.respond(r.session_id, [approve], principal=ALICE)


async def test_a_model_of_the_users_with_a_stand_in_attribute_is_checked_as_any(
    store_url: str,
) -> None:
    """Only the runtime's own stand-ins (`StandIn`: the command line's, a mirror's close) skip the
    check; a model of the user's that happens to answer `stand_in` (a mock, a wrapper forwarding
    attributes) was taken for one, and the answer accepted and never acted on."""
    r, mirror, *_, parent, child = await _parked(store_url)
    parent.model.stand_in = True  # type: ignore[attr-defined]
    async with so.Runtime([parent, child], store=store_url) as rt:
        with pytest.raises(so.UnknownTool):
            await _answering_the_mirror("respond", rt, r.session_id, mirror.id)
