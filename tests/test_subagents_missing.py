"""A runtime that lacks the agent a `delegate()` tool names, on both stores.

Making such a runtime only logs a warning (a process may hold some agents only). At run time
each path gives a named error or a tool error the model reads, never a crash or a hang, and
leaves the store as a process with every agent can carry on from.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Coroutine
from typing import Any, Literal, NamedTuple

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import (
    call,
    call_tools,
    reply,
    scripted_agent,
    store_contents,
    tool_results,
)

from ._server_api import error
from ._subagents import ALICE, Counted, refund_agents


async def test_a_delegate_call_to_a_missing_agent_is_a_named_tool_error(store_url: str) -> None:
    """The model reads `UnknownAgent` naming the agents this runtime has; no child session is
    made, the turn completes, nothing stays pending; a runtime that has the agent later finds
    the session as it was left."""
    after = Counted("I could not reach billing.")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="Refund 1042")), after],
        tools=[so.delegate("billing")],
    )
    async with so.Runtime([parent], store=store_url) as rt:
        r = await asyncio.wait_for(rt.generate("support", prompt="Refund 1042"), 30)
        assert r.status == "completed" and r.text == "I could not reach billing."
        [result] = tool_results(after.capture.last)
        assert result.is_error
        assert result.content == {
            "error": "UnknownAgent: unknown agent 'billing'; this runtime has: support"
        }
        assert [s.id for s in await rt.sessions()] == [r.session_id]
        before = await store_contents(rt.store, r.session_id)
        assert before.pending == [] and before.requests == []
    child = scripted_agent("billing", [reply("never")])
    async with so.Runtime([parent, child], store=store_url) as rt:
        state = await rt.state(r.session_id)
        assert state.status == "idle" and state.turn is not None
        assert state.turn.status == "completed"
        assert await store_contents(rt.store, r.session_id) == before


class _Parked(NamedTuple):
    r: so.GenerateResult  # the parent's turn, waiting
    mirror: so.InputRequest  # the child's approval, as the parent shows it
    ran: list[dict[str, Any]]  # the refunds the child's tool made
    after: Counted  # the parent's step after the child answers
    parent: so.Agent  # the two agents, made anew for the runtimes that go on
    child: so.Agent


async def _parked(store_url: str, text: str) -> _Parked:
    """A parent waiting on its child's approval, made by a runtime with both agents; `text` is
    what the parent says once the child has answered."""
    ran: list[dict[str, Any]] = []
    after = Counted(text)
    parent, child = refund_agents(ran, after)
    async with so.Runtime([parent, child], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    assert r.status == "waiting"
    [mirror] = r.pending
    return _Parked(r, mirror, ran, after, *refund_agents(ran, after))


async def test_answering_a_child_in_a_process_lacking_its_agent_is_refused_unchanged(
    store_url: str,
) -> None:
    """The answer given through the parent, or to the child, is `UnknownAgent` and records
    nothing; a runtime with both agents then takes the same answer."""
    r, mirror, ran, after, parent, child = await _parked(store_url, "The refund went through.")
    assert mirror.child is not None
    async with so.Runtime([parent], store=store_url) as rt:
        before = await store_contents(rt.store, r.session_id)
        kid = await store_contents(rt.store, mirror.child.session_id)
        approve = so.InputResponse(request_id=mirror.id, option_id="approve")
        with pytest.raises(so.UnknownAgent, match="unknown agent 'billing'"):
            await asyncio.wait_for(rt.respond(r.session_id, [approve], principal=ALICE), 30)
        direct = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        with pytest.raises(so.UnknownAgent, match="unknown agent 'billing'"):
            await rt.respond(mirror.child.session_id, [direct], principal=ALICE)
        assert await store_contents(rt.store, r.session_id) == before
        assert await store_contents(rt.store, mirror.child.session_id) == kid
    async with so.Runtime([parent, child], store=store_url) as rt:
        done = await asyncio.wait_for(rt.respond(r.session_id, [approve], principal=ALICE), 30)
        assert done.status == "completed" and done.text == "The refund went through."
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1


async def test_cancelling_a_parent_in_a_process_lacking_its_childs_agent(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The parent's cancel is recorded and returned, not raised as `UnknownAgent` after it was
    committed; the child it cannot cancel is logged and left to a process that has its agent,
    where cancelling the parent again (or the orphan sweep) cancels it."""
    r, mirror, ran, after, parent, child = await _parked(store_url, "never")
    assert mirror.child is not None
    async with so.Runtime([parent], store=store_url) as rt:
        with caplog.at_level(logging.WARNING, logger="signoff.runtime"):
            done = await asyncio.wait_for(rt.cancel(r.session_id, "not needed"), 30)
            again = await asyncio.wait_for(rt.cancel(r.session_id, "not needed"), 30)
        assert done.status == again.status == "cancelled"
        left = [m for m in caplog.messages if "left to a process" in m]
        assert len(left) == 2 and mirror.child.session_id in left[0] and "'billing'" in left[0]
        state = await rt.state(mirror.child.session_id)
        assert state.turn is not None and state.turn.status == "waiting"
    async with so.Runtime([parent, child], store=store_url) as rt:
        await asyncio.wait_for(rt.cancel(r.session_id, "not needed"), 30)
        state = await rt.state(mirror.child.session_id)
        assert state.turn is not None and state.turn.status == "cancelled"
        assert await rt.pending() == []
    assert ran == [] and after.calls == 0


async def test_steering_a_parent_in_a_process_lacking_its_childs_agent(store_url: str) -> None:
    """A message to the parent while its child waits: the delegate call cannot cancel the child
    here, so the model reads `UnknownAgent` as the call's error and the turn goes on; the child,
    orphaned, is cancelled by a process that has its agent, not run: its answer is refused."""
    r, mirror, ran, after, parent, child = await _parked(store_url, "Left it.")
    assert mirror.child is not None
    async with so.Runtime([parent], store=store_url) as rt:
        done = await asyncio.wait_for(rt.send(r.session_id, "never mind", principal=ALICE), 30)
        assert done.status == "completed" and done.text == "Left it."
        [result] = tool_results(after.capture.last)
        assert result.is_error and "UnknownAgent: unknown agent 'billing'" in str(result.content)
    async with so.Runtime([parent, child], store=store_url) as rt:
        direct = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        with pytest.raises(so.RequestClosed, match="withdrawn"):
            await asyncio.wait_for(
                rt.respond(mirror.child.session_id, [direct], principal=ALICE), 30
            )
        state = await rt.state(mirror.child.session_id)
        assert state.turn is not None and state.turn.status == "cancelled"
        assert await rt.pending() == []
    assert ran == [] and after.calls == 1


async def test_a_parent_resumed_where_its_childs_agent_is_missing_takes_the_childs_result(
    store_url: str,
) -> None:
    """The child answered and finished in a process with its agent only (the parent, whose
    agent that process lacks, is left running); a process with the parent's agent only resumes
    the parent: its delegate call reads the child's result, which needs no drive, instead of
    telling the model `UnknownAgent` about a refund that went through."""
    r, mirror, ran, after, parent, child = await _parked(store_url, "The refund went through.")
    assert mirror.child is not None
    async with so.Runtime([child], store=store_url) as rt:
        direct = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        done = await asyncio.wait_for(
            rt.respond(mirror.child.session_id, [direct], principal=ALICE), 30
        )
        assert done.status == "completed"
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "running"
    async with so.Runtime([parent], store=store_url) as rt:
        resumed = await asyncio.wait_for(rt.generate(session_id=r.session_id), 30)
        assert resumed.status == "completed" and resumed.text == "The refund went through."
        [result] = tool_results(after.capture.last)
        assert not result.is_error and result.content == "Refunded: {'refunded': 180.0}"
        assert await rt.pending() == []
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1


async def test_a_parent_resumed_where_its_childs_agent_is_missing_leaves_the_childs_work(
    store_url: str,
) -> None:
    """The approval was recorded through the parent without resuming (as `signoff approve`
    without the runtime does), so the child owed the refund; a process with the parent's agent
    only then resumed the parent: its delegate call ended as `UnknownAgent`, the model was
    told the call failed, and the child, orphaned, was cancelled with its approved refund never
    run. Now that resume raises `UnknownAgent` and records nothing: a process with the child's
    agent runs the refund, and the parent then takes its result."""
    r, mirror, ran, after, parent, child = await _parked(store_url, "The refund went through.")
    assert mirror.child is not None
    async with so.Runtime([parent, child], store=store_url) as rt:
        approve = so.InputResponse(request_id=mirror.id, option_id="approve")
        await rt.respond(r.session_id, [approve], principal=ALICE, resume=False)
    async with so.Runtime([parent], store=store_url) as rt:
        before = await store_contents(rt.store, r.session_id)
        kid = await store_contents(rt.store, mirror.child.session_id)
        with pytest.raises(so.UnknownAgent, match="unknown agent 'billing'"):
            await asyncio.wait_for(rt.generate(session_id=r.session_id), 30)
        assert await store_contents(rt.store, r.session_id) == before
        assert await store_contents(rt.store, mirror.child.session_id) == kid
    assert after.calls == 0
    async with so.Runtime([child], store=store_url) as rt:
        done = await asyncio.wait_for(rt.generate(session_id=mirror.child.session_id), 30)
        assert done.status == "completed"
    assert ran == [{"order_id": "1042", "amount": 180.0}]
    async with so.Runtime([parent], store=store_url) as rt:
        resumed = await asyncio.wait_for(rt.generate(session_id=r.session_id), 30)
        assert resumed.status == "completed" and resumed.text == "The refund went through."
        [result] = tool_results(after.capture.last)
        assert not result.is_error and result.content == "Refunded: {'refunded': 180.0}"
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1


async def test_a_process_with_only_the_childs_agent_sweeps_the_child_a_cancel_left(
    store_url: str,
) -> None:
    """The parent's cancel, in a process lacking the child's agent, leaves the child to one that
    has it: the orphan sweep of a process running only the child's agent (`signoff worker` for
    `billing`) cancels it, which its agents' lack of delegate tools used to skip."""
    r, mirror, ran, after, parent, child = await _parked(store_url, "never")
    assert mirror.child is not None
    async with so.Runtime([parent], store=store_url) as rt:
        assert (await asyncio.wait_for(rt.cancel(r.session_id), 30)).status == "cancelled"
    async with so.Runtime([child], store=store_url) as rt:
        assert await rt.pending() != []
        assert await rt.expire_due() == 1
        state = await rt.state(mirror.child.session_id)
        assert state.turn is not None and state.turn.status == "cancelled"
        assert await rt.pending() == []
    assert ran == [] and after.calls == 0


def _answering_the_mirror(
    how: str, rt: so.Runtime, session_id: str, mirror: str
) -> Coroutine[Any, Any, so.GenerateResult]:
    """The call `how` answering the parent's mirror `mirror` (approve) in `rt`, as ALICE."""
    approve = so.InputResponse(request_id=mirror, option_id="approve")
    if how == "respond":
        return rt.respond(session_id, [approve], principal=ALICE)
    if how == "respond-unresumed":
        return rt.respond(session_id, [approve], principal=ALICE, resume=False)
    if how == "decision":
        decision = so.Decision(id=mirror, approved=True)
        return rt.generate(session_id=session_id, approvals=[decision], auth=ALICE)
    policy: Literal["steer", "queue"] = "queue" if how == "send-queue" else "steer"
    return rt.send(session_id, "approve", principal=ALICE, turn_policy=policy)


@pytest.mark.parametrize("how", ["respond", "respond-unresumed", "decision", "send", "send-queue"])
async def test_answering_a_mirror_in_a_process_lacking_the_parents_agent_is_refused_unchanged(
    store_url: str, how: str
) -> None:
    """A process with the child's agent only took an answer given through the parent: it
    settled the child's request (the refund ran) and closed the mirror, then raised
    `UnknownAgent` driving the parent, which says nothing was stored. Now such an answer, by id
    (resumed or not), as a decision or by message, is refused first and records nothing in
    either session; the child's own request answered there directly still goes through, and a
    process with the parent's agent then takes the child's result."""
    r, mirror, ran, after, parent, child = await _parked(store_url, "The refund went through.")
    assert mirror.child is not None
    kid_id, kid_request = mirror.child.session_id, mirror.child.request_id
    async with so.Runtime([child], store=store_url) as rt:
        before = await store_contents(rt.store, r.session_id)
        kid = await store_contents(rt.store, kid_id)
        assert {mirror.id, kid_request} <= set(before.pending)
        with pytest.raises(so.UnknownAgent, match="unknown agent 'support'"):
            await asyncio.wait_for(_answering_the_mirror(how, rt, r.session_id, mirror.id), 30)
        assert await store_contents(rt.store, r.session_id) == before
        assert await store_contents(rt.store, kid_id) == kid
        assert ran == []
        direct = so.InputResponse(request_id=kid_request, option_id="approve")
        done = await asyncio.wait_for(rt.respond(kid_id, [direct], principal=ALICE), 30)
        assert done.status == "completed"
    assert ran == [{"order_id": "1042", "amount": 180.0}]
    async with so.Runtime([parent], store=store_url) as rt:
        resumed = await asyncio.wait_for(rt.generate(session_id=r.session_id), 30)
        assert resumed.status == "completed" and resumed.text == "The refund went through."
        assert await rt.pending() == []
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1


MIRROR_ANSWERS = [
    ("responses", {"inputResponses": [{"requestId": "MIRROR", "optionId": "approve"}]}),
    ("approvals", {"approvals": [{"id": "MIRROR", "approved": True}]}),
    ("messages", {"text": "approve"}),
]
"""Each HTTP route's approval of a parent's mirror (`MIRROR`: its request id, filled in)."""


@pytest.mark.parametrize(
    ("path", "payload"),
    MIRROR_ANSWERS,
)
async def test_a_server_lacking_the_parents_agent_refuses_an_answer_to_its_mirror(
    store_url: str, path: str, payload: dict[str, Any]
) -> None:
    """Over HTTP a server running the child's agent only answered the parent's mirror with 422
    `unknown_agent` ("nothing is stored") after settling the child's request and closing the
    mirror. Now each route refuses first, both sessions as they were and both requests still
    pending; the child's own request is answered there."""
    r, mirror, ran, after, parent, child = await _parked(store_url, "The refund went through.")
    assert mirror.child is not None
    kid_id, kid_request = mirror.child.session_id, mirror.child.request_id
    body = json.loads(json.dumps(payload).replace("MIRROR", mirror.id))
    runtime = so.Runtime([child], store=store_url)
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
        kid = await store_contents(runtime.store, kid_id)
        got = await c.post(f"/v1/sessions/{r.session_id}/{path}", json=body)
        assert "'support'" in error(got, 422, "unknown_agent")["message"]
        assert await store_contents(runtime.store, r.session_id) == before
        assert await store_contents(runtime.store, kid_id) == kid
        assert {mirror.id, kid_request} <= set(before.pending) and ran == []
        got = await c.post(
            f"/v1/sessions/{kid_id}/responses",
            json={"inputResponses": [{"requestId": kid_request, "optionId": "approve"}]},
        )
        assert got.status_code == 200, got.text
    await runtime.close()
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 0
