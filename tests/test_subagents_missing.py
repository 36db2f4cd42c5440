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
from ._workers import is_, until, working
from .test_subagents_calls import _SlowRefund


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


# Split workers: one runs the parent's agent only, another the child's (docs/subagents.md).
_SPLIT_TTL = 30.0  # the workers' lease TTL: a parent kept a whole TTL would outlast each wait


def _worker_lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "signoff.worker" and r.levelno >= level
    ]


async def test_a_parents_worker_waits_for_the_childs_worker_holding_the_child(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The child's request answered directly, a worker with the child's agent only runs its
    refund; a worker with the parent's agent only claims the parent. Its delegate call raised
    `UnknownAgent` at once, the worker logged "the turn failed in the worker" with a traceback
    and kept the parent's lease a whole TTL, though the child finished a moment later (workers3
    hunt). It waits for the child's worker's drive, and the parent goes on when it ends."""
    tree = _SlowRefund()
    async with so.Runtime([tree.parent, tree.child], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    direct = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
    kw: dict[str, Any] = {"store": store_url, "lease_ttl": _SPLIT_TTL, "inline": False}
    async with (
        so.Runtime([tree.parent], **kw) as p,
        so.Runtime([tree.child], **kw) as b,
    ):
        await b.respond(mirror.child.session_id, [direct], principal=ALICE)
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(b):
                await asyncio.wait_for(tree.entered.wait(), 10)  # the child's worker holds it
                async with working(p):
                    await until(lambda: _said(caplog, f"claimed session {r.session_id}"))
                    await asyncio.sleep(0.5)  # the parent's drive waits on the child
                    tree.release.set()
                    await until(lambda: is_(p, r.session_id, "completed"), _SPLIT_TTL / 3)
        state = await p.state(r.session_id)
        assert state.turn is not None and state.turn.text == "parent saw: Refund done."
    assert _worker_lines(caplog, logging.WARNING) == []
    assert tree.ran == ["1042"] and tree.after.calls == 1


async def test_a_parent_claimed_before_its_childs_worker_runs_is_given_back_soon(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The approval recorded through the parent (no drive), the worker with the parent's agent
    only claims the parent before any worker with the child's agent runs: the child's work is
    no drive's. It is not kept a whole lease TTL as a failure: the worker says so in a warning,
    no traceback, and gives the lease back (sooner the first times), so the parent goes on soon
    after a worker with the child's agent has run the child."""
    tree = _SlowRefund()
    tree.release.set()
    async with so.Runtime([tree.parent, tree.child], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        approve = so.InputResponse(request_id=mirror.id, option_id="approve")
        await rt.respond(r.session_id, [approve], principal=ALICE, resume=False)
    kw: dict[str, Any] = {"store": store_url, "lease_ttl": _SPLIT_TTL, "inline": False}
    async with (
        so.Runtime([tree.parent], **kw) as p,
        so.Runtime([tree.child], **kw) as b,
    ):
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(p):
                await until(lambda: _said(caplog, "not driven here"))
                assert tree.ran == []
                async with working(b):
                    await until(lambda: is_(p, r.session_id, "completed"), _SPLIT_TTL / 3)
        state = await p.state(r.session_id)
        assert state.turn is not None and state.turn.text == "parent saw: Refund done."
    said = _worker_lines(caplog, logging.WARNING)
    assert said and all("not driven here: unknown agent 'billing'" in s for s in said), said
    assert not [rec for rec in caplog.records if rec.levelno >= logging.ERROR or rec.exc_info]
    assert tree.ran == ["1042"] and tree.after.calls == 1


async def _said(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    """Whether the workers logged a line with `text` (at INFO or above)."""
    return any(text in line for line in _worker_lines(caplog, logging.INFO))


async def test_a_call_lacking_the_childs_agent_waits_lease_wait_for_the_childs_worker(
    store_url: str,
) -> None:
    """A call resuming the parent in a process lacking the child's agent, while a worker with
    that agent runs the child, raised `UnknownAgent`, as if no one would run the child's work.
    It waits `lease_wait` for that drive, as any delegate call does, then answers `running`,
    recording nothing of the call; once the child's drive ended, a resume takes its result."""
    tree = _SlowRefund()
    async with so.Runtime([tree.parent, tree.child], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        kid = mirror.child.session_id
        approve = so.InputResponse(request_id=mirror.id, option_id="approve")
        await rt.respond(r.session_id, [approve], principal=ALICE, resume=False)
    async with (
        so.Runtime([tree.parent], store=store_url, lease_wait=0.2) as p,
        so.Runtime([tree.child], store=store_url, inline=False) as b,
        working(b),
    ):
        await asyncio.wait_for(tree.entered.wait(), 10)
        held = await asyncio.wait_for(p.generate(session_id=r.session_id), 10)
        assert held.status == "running" and tree.after.calls == 0
        tree.release.set()
        await until(lambda: is_(b, kid, "completed"))
        done = await asyncio.wait_for(p.generate(session_id=r.session_id), 10)
        assert (done.status, done.text) == ("completed", "parent saw: Refund done.")
    assert tree.ran == ["1042"] and tree.after.calls == 1


async def test_a_child_ended_between_its_read_and_its_lease_probe_is_not_taken_for_undriven(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The parent's worker read the child's turn `running`, then probed its lease: the child's
    worker ending the turn and giving its lease back between the two (1 run in 17 of the test
    above on PostgreSQL under load) read as a runnable child no one drives, `UnknownAgent`, a
    warning and the parent given back. The child is read again before that is concluded."""
    tree = _SlowRefund()
    async with so.Runtime([tree.parent, tree.child], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    kid = mirror.child.session_id
    direct = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
    kw: dict[str, Any] = {"store": store_url, "lease_ttl": _SPLIT_TTL, "inline": False}
    async with so.Runtime([tree.parent], **kw) as p, so.Runtime([tree.child], **kw) as b:
        busy = p._busy
        probed: list[str] = []

        async def child_ends_first(session_id: str, *args: Any, **kw: Any) -> bool:
            if session_id == kid and not probed:
                probed.append(session_id)
                tree.release.set()  # the child's worker ends its turn and gives its lease back
                await until(lambda: is_(b, kid, "completed"))
                await until(lambda: _free(b, kid))
            return await busy(session_id, *args, **kw)

        p._busy = child_ends_first  # type: ignore[method-assign]
        await b.respond(kid, [direct], principal=ALICE)
        with caplog.at_level(logging.INFO, logger="signoff.worker"):
            async with working(b):
                await asyncio.wait_for(tree.entered.wait(), 10)
                async with working(p):
                    await until(lambda: is_(p, r.session_id, "completed"), _SPLIT_TTL / 3)
    assert probed
    assert _worker_lines(caplog, logging.WARNING) == []


async def _free(rt: so.Runtime, session_id: str) -> bool:
    """Whether no drive holds the session's lease (`rt` gave it back)."""
    store: Any = rt.store
    return session_id not in rt._holders and not await store.lease_held(session_id, rt.now())
