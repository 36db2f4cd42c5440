"""`_child_sessions`: counting a cancelled subagent's spend in the parent that owes it finds the
tree deleted meanwhile (another process's prune, once the child's turn ended): nothing is owed,
and the call on the child stands rather than failing on a session its caller never named. A
session is a call's child only if a delegate call created it: a workflow's own step named as the
child's creation makes no other session one, to cancel, expire or bill with it."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff._state_parts import CallState
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._subagents import ALICE, events
from .test_child_drives import _deleted_once_settled
from .test_subagents_spend import orders, support, tokens, waiting_child


@pytest.mark.parametrize("how", ["cancel", "respond"])
async def test_a_call_on_an_orphan_whose_tree_is_deleted_as_its_spend_is_counted_stands(
    store_url: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """The parent was cancelled by a runtime without the child's agent, so it owes the child's
    spend; a cancel of the child, or an answer to it (which cancels the orphan), by a runtime
    with the agent counts it, and the tree is deleted between the child's cancel and the count:
    the write to the parent raised UnknownSession naming the parent. Now the cancel stands, and
    the answer is told that the child it named is gone."""
    async with (
        so.Runtime([support(), orders(tokens(40))], store=store_url) as rt,
        so.Runtime([support()], store=store_url) as agentless,
        so.Runtime([support(), orders(tokens(40))], store=store_url) as other,
    ):
        parent, child = await waiting_child(rt)
        await agentless.cancel(parent, principal=ALICE)
        [request] = await rt.pending(session_id=child)
        deleted = _deleted_once_settled(monkeypatch, other, parent, child)
        if how == "cancel":
            cancelled = await rt.cancel(child, principal=ALICE)
            assert cancelled.cancelled
        else:
            approve = so.InputResponse(request_id=request.id, option_id="approve")
            with pytest.raises(so.UnknownSession) as caught:  # gone once its orphan was cancelled
                await rt.respond(child, [approve], principal=ALICE)
            assert caught.value.session_id == child  # the session asked about, not its parent
        assert deleted == [[parent, child]]
        assert await rt.sessions() == []


def _apart(store_url: str, other: dict[str, str]) -> tuple[so.Runtime, ManualClock]:
    """A runtime of a workflow whose own step, named as a delegate call's (`subagent.session`),
    returns the id of a session it has nothing to do with (`other["sid"]`) and then asks a
    person (its sessions with a TTL of 60 s), and of that session's agent, which spends 1000
    tokens and waits on a refund's approval."""

    @so.tool
    async def open_ticket(ctx: so.ToolContext) -> dict[str, str]:
        """Open a ticket."""
        sid = await ctx.step("subagent.session", lambda: other["sid"])
        await ctx.ask("Close the ticket?", options=["yes", "no"])
        return {"ticket": sid}

    @so.tool(approval=True)
    async def refund(amount: float) -> dict[str, bool]:
        """Refund."""
        return {"ok": True}

    workflow = scripted_agent(
        "wf",
        [call_tools(call("open_ticket", call_id="c1")), reply("done")],
        tools=[open_ticket],
        limits=so.Limits(ttl=60),
    )
    refunds = call_tools(call("refund", call_id="r1", amount=5), usage=tokens(1000))
    unrelated = scripted_agent("other", [refunds, reply("ok")], tools=[refund])
    clock = ManualClock()
    return so.Runtime([workflow, unrelated], store=store_url, clock=clock), clock


async def _ended_beside(
    store_url: str, how: str, other: dict[str, str]
) -> tuple[so.Runtime, str, str]:
    """The unrelated session waits on its approval and the workflow's call asks; the workflow's
    session is then cancelled, expired (a sweep), deleted past its TTL, or answered: the other
    session is left as it was. Returns the runtime and the two sessions' ids."""
    rt, clock = _apart(store_url, other)
    async with rt:
        waiting = await rt.generate("other", prompt="refund please")
        other["sid"] = waiting.session_id
        r = await rt.generate("wf", prompt="open a ticket")
        assert r.status == "waiting"
        if how == "cancel":
            assert (await rt.cancel(r.session_id, "not needed")).status == "cancelled"
        elif how == "expire":
            clock.advance(61)
            assert await rt.expire_due() == 1
        elif how == "delete":
            clock.advance(61)
            assert await rt.delete_session(r.session_id) == [r.session_id]
        else:
            yes = so.InputResponse(request_id=r.pending[0].id, option_id="yes")
            assert (await rt.respond(r.session_id, [yes])).status == "completed"
            [done] = [e for e in await events(rt, r.session_id) if e.type == "tool.completed"]
            assert "delegated" not in done.data and "short" not in done.data
            assert (await rt.state(r.session_id)).delegated == so.Usage()
        assert (await rt.state(waiting.session_id)).status == "waiting"
        [pending] = await rt.pending(session_id=waiting.session_id)
        approve = so.InputResponse(request_id=pending.id, option_id="approve")
        assert (await rt.respond(waiting.session_id, [approve])).status == "completed"
        assert (await rt.state(waiting.session_id)).turn.status == "completed"  # type: ignore[union-attr]
    return rt, r.session_id, waiting.session_id


@pytest.mark.parametrize("how", ["cancel", "expire", "delete", "answer"])
async def test_a_workflow_step_named_as_a_childs_creation_makes_no_other_session_its_child(
    store_url: str, how: str
) -> None:
    """A workflow's own step named `subagent.session`, returning another session's id, made
    that session the call's child: cancelling the workflow's session (or its TTL passing)
    cancelled the other's turn and withdrew its pending approval, and the call's end billed
    what the other had spent (`delegated`) against the workflow's budgets."""
    rt, workflow, _ = await _ended_beside(store_url, how, {})
    if how != "delete":
        async with rt:
            assert (await rt.state(workflow)).owed == {}


@pytest.mark.parametrize("how", ["cancel", "expire", "delete", "answer"])
async def test_a_session_created_for_no_parent_is_cancelled_and_billed_for_none(
    store_url: str, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Whatever a call's journal names as its children (here every workflow call names the other
    session, as a store edited by hand might), a parent's cancel, expiry or deletion ends, and
    its call's end bills, only sessions whose creation named it as their parent."""
    names = CallState.subagents

    def naming(call: CallState) -> list[str]:
        if call.tool_name != "open_ticket":
            return names(call)
        return [other["sid"]]

    other: dict[str, str] = {}
    monkeypatch.setattr(CallState, "subagents", naming)
    await _ended_beside(store_url, how, other)


@pytest.mark.parametrize("journaled", ["marked", "older"])
async def test_a_delegate_calls_own_child_is_still_cancelled_and_billed(
    store_url: str, monkeypatch: pytest.MonkeyPatch, journaled: str
) -> None:
    """A delegate call's child is its child whether its step is marked as the child's creation
    (`child`, as journaled now) or not (as an older signoff journaled it, by name alone, which
    is read as the child only where it names the session the call's key derives): cancelling
    the parent cancels the child and counts what it spent."""
    if journaled == "older":
        original = so.ToolContext._step

        async def unmarked(ctx: so.ToolContext, *args: Any, child: bool = False) -> Any:
            return await original(ctx, *args)

        monkeypatch.setattr(so.ToolContext, "_step", unmarked)
    async with so.Runtime([support(), orders(tokens(40))], store=store_url) as rt:
        parent, child = await waiting_child(rt)
        [step] = [e for e in await events(rt, parent) if e.type == "tool.step"]
        marked = True if journaled == "marked" else None
        assert (step.data["name"], step.data.get("child")) == ("subagent.session", marked)
        await rt.cancel(parent, principal=ALICE)
        kid = (await rt.state(child)).turn
        assert kid is not None and kid.status == "cancelled"
        assert (await rt.state(parent)).delegated == tokens(40)
