"""Retrying a subagent's failed delegated turn, on both stores: run while its parent's delegate
call still waits on it (the call then takes its result and counts what it spent), refused
(`SubagentOrphaned`) once the call read the failure as its result, whose spend nobody would
count."""

from __future__ import annotations

from typing import Literal

import pytest

import signoff as so
from signoff.models import Scripted
from signoff.testing import Flaky, call, call_tools, reply, scripted_agent

from ._subagents import ALICE, events


def tokens(n: int) -> so.Usage:
    return so.Usage(output_tokens=n)


def parent(limits: so.Limits | None = None) -> so.Agent:
    """Delegates to `orders` (10 tokens), then replies (10 tokens)."""
    return scripted_agent(
        "support",
        [
            call_tools(call("orders", message="refund 3"), usage=tokens(10)),
            reply("done", usage=tokens(10)),
        ],
        tools=[so.delegate("orders")],
        limits=limits,
    )


def child(*, approval: bool) -> so.Agent:
    """Calls a tool (100 tokens), whose next model call fails once, then replies (300 tokens)."""

    @so.tool(approval=so.always() if approval else so.never())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    fails_once = Flaky(
        reply("refunded 3", usage=tokens(300)), failures=1, error=so.ModelError("HTTP 500")
    )
    return so.Agent(
        name="orders",
        model=Scripted(
            [call_tools(call("issue_refund", order_id="3"), usage=tokens(100)), fails_once]
        ),
        tools=[issue_refund],
    )


async def test_a_failed_delegated_turn_its_call_read_is_not_retried(store_url: str) -> None:
    """The call ended with `SubagentFailed`, counting 100: a retry of the child's turn would
    spend 300 more against the parent's headroom, counted nowhere. It is refused, recording
    nothing; a message sent to the child starts a turn of its own, its own budget's."""
    async with so.Runtime(
        [parent(so.Limits(max_tokens=500)), child(approval=False)], store=store_url
    ) as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        assert r.status == "completed"
        [kid] = [s.id for s in await rt.sessions(agent="orders")]
        state = await rt.state(kid)
        assert state.turn is not None and state.turn.status == "failed" and state.turn.retryable
        assert (await rt.state(r.session_id)).delegated.total_tokens == 100
        before = await events(rt, kid)
        with pytest.raises(so.SubagentOrphaned) as refused:
            await rt.generate(session_id=kid)
        assert refused.value.session_id == kid and refused.value.parent_id == r.session_id
        assert await events(rt, kid) == before
        assert (await rt.state(r.session_id)).delegated.total_tokens == 100

        own = await rt.generate(session_id=kid, prompt="and order 4", auth=ALICE)
        assert own.status == "completed" and own.text == "refunded 3"
        assert (await rt.state(kid)).usage.total_tokens == 400
        assert (await rt.state(r.session_id)).delegated.total_tokens == 100


async def test_a_failed_delegated_turn_its_call_waits_on_is_retried(store_url: str) -> None:
    """Answered directly in a process lacking the parent's agent, the child's turn fails; the
    parent's call still waits on it. Its retry runs, and the parent then takes its result and
    counts all it spent."""
    async with so.Runtime([parent(), child(approval=True)], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
    assert r.status == "waiting"
    [mirror] = r.pending
    assert mirror.child is not None
    kid = mirror.child.session_id
    async with so.Runtime([child(approval=True)], store=store_url) as rt:
        answer = so.InputResponse(request_id=mirror.child.request_id, option_id="approve")
        failed = await rt.respond(kid, [answer], principal=ALICE)
        assert failed.status == "failed"
        retried = await rt.generate(session_id=kid)
        assert retried.status == "completed" and retried.text == "refunded 3"
    async with so.Runtime([parent(), child(approval=True)], store=store_url) as rt:
        done = await rt.generate(session_id=r.session_id)
        assert done.status == "completed" and done.text == "done"
        assert (await rt.state(r.session_id)).delegated.total_tokens == 400


@pytest.mark.parametrize("policy", ["steer", "queue"])
async def test_a_message_to_a_child_no_retry_will_resume_starts_its_own_turn(
    store_url: str, policy: Literal["steer", "queue"]
) -> None:
    """The child's failed delegated turn its parent no longer waits on is never retried (a
    retry is `SubagentOrphaned`): someone else's message, or a `queue` one, waited for that
    retry, queued for good, and someone else's prompt was `SessionBusy`; each starts the
    child's own turn, as docs/subagents.md says a message to the child does."""
    bob = so.Principal(authenticator="test", principal_id="bob")
    async with so.Runtime([parent(), child(approval=False)], store=store_url) as rt:
        r = await rt.generate("support", prompt="refund 3", auth=ALICE)
        assert r.status == "completed"
        [kid] = [s.id for s in await rt.sessions(agent="orders")]
        sender = ALICE if policy == "queue" else bob
        own = await rt.send(kid, "and order 4", principal=sender, turn_policy=policy)
        assert (own.status, own.text, own.queued) == ("completed", "refunded 3", False)
        state = await rt.state(kid)
        assert state.queued == [] and state.turn is not None
        assert state.turn.principal == sender
