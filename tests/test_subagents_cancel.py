"""Cancelling a parent cancels its child: withdrawn while it waits or stopped while it runs,
and a child the parent's cancel missed (started meanwhile, or created just after) is cancelled
by a worker, the sweep or the next cancel, while a later turn of the child is left alone.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff import _child_sessions, _subagents
from signoff.testing import (
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    timeline,
)

from ._subagents import (
    ALICE,
    Counted,
    approve_refund_through_parent,
    events,
    refund_agents,
    two_step_children,
)


async def test_cancelling_the_parent_withdraws_the_child_too(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("unused")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    mirror = r.pending[0]
    assert mirror.child is not None
    child_id = mirror.child.session_id
    cancelled = await rt.cancel(r.session_id, "changed my mind")
    assert cancelled.status == "cancelled" and cancelled.pending == []
    assert await rt.pending() == []
    assert timeline(await events(rt, r.session_id))[-4:] == [
        "input.resolved cancelled",
        "turn.cancelled",
        "session.waiting",
        "subagent.spent",  # what the child spent (nothing: its model has no usage), counted
    ]
    assert timeline(await events(rt, child_id))[-3:] == [
        "input.resolved cancelled",
        "turn.cancelled",
        "session.waiting",
    ]
    assert (await rt.state(child_id)).status == "cancelled"
    with pytest.raises(so.RequestClosed):
        await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="approve")],
            principal=ALICE,
        )
    with pytest.raises(so.RequestClosed):
        await rt.respond(
            child_id,
            [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
            principal=ALICE,
        )
    assert ran == [] and after.calls == 0
    await rt.close()


async def test_cancelling_the_parent_while_its_child_runs_cancels_the_child(
    tmp_path: Path,
) -> None:
    """The parent is cancelled while the child's turn is still running (no request mirrored
    yet): the child's turn is cancelled too, and the approval it would have asked next never
    reaches the queue, where approving it would run a refund for a cancelled task."""
    entered = asyncio.Event()
    release = asyncio.Event()
    ran: list[str] = []

    @so.tool
    async def lookup(order_id: str) -> str:
        """Look an order up, slowly."""
        entered.set()
        await release.wait()
        return "found"

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("lookup", order_id="1042")),
            call_tools(call("issue_refund", order_id="1042")),
            reply("Refund done."),
        ],
        tools=[lookup, issue_refund],
    )
    after = Counted("unused")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund order 1042")), after],
        tools=[so.delegate("billing")],
    )
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        running = asyncio.create_task(rt.generate(session_id=sid, prompt="Refund", auth=ALICE))
        await entered.wait()
        cancelled = await rt.cancel(sid, "changed my mind")
        assert cancelled.status == "cancelled"
        release.set()
        assert (await running).status == "cancelled"
        assert await rt.pending() == []
        [child_id] = [s.id for s in await rt.sessions(agent="billing")]
        child_state = await rt.state(child_id)
        assert child_state.turn is not None and child_state.turn.status == "cancelled"
        assert ran == [] and after.calls == 0


def _cancel_once_created(
    monkeypatch: pytest.MonkeyPatch, rt: so.Runtime, parent_id: list[str], *, check: bool
) -> None:
    """Cancel the parent right after its delegate call created the child (its turn started with
    it), before the call journaled the child: the cancel's sweep of the turn's children does not
    find it. With `check`, the call goes on and finds its parent's turn ended. Without, the
    cancelling process dies before its sweep and the call's process right after the cancel (a
    `StoreError` ends its drive, recording nothing), leaving the child's turn running."""
    original = _subagents.RuntimeHost.create_child

    async def create_child(host: _subagents.RuntimeHost, *args: Any, **kwargs: Any) -> str:
        child = await original(host, *args, **kwargs)
        with monkeypatch.context() as m:
            if not check:
                m.setattr(_child_sessions, "cancel_delegated", _swept_none)
            cancelled = await rt.cancel(parent_id[0], "changed my mind")
        assert cancelled.status == "cancelled"
        if not check:
            raise so.StoreError("the process died here")
        return child

    monkeypatch.setattr(_subagents.RuntimeHost, "create_child", create_child)


async def _swept_none(*args: Any) -> None:
    """A cancel's sweep of the turn's children that never ran (its process died first)."""


def _lookup_agents(
    looked: list[str], *, usage: so.Usage | None = None
) -> tuple[so.Agent, so.Agent]:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    def first(conversation: list[so.Message]) -> so.ModelResponse:
        looked.append("child model")
        return call_tools(call("issue_refund", order_id="1042"), usage=usage)

    child = scripted_agent("billing", [first, reply("Refund done.")], tools=[issue_refund])
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund order 1042")), reply("unused")],
        tools=[so.delegate("billing")],
    )
    return parent, child


async def test_a_parent_cancelled_as_its_child_starts_leaves_no_live_child(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent is cancelled after its delegate call created the child but before the call
    journaled it: the cancel finds no child to cancel, so the call, going on, must see its
    parent's turn ended and cancel the child's turn rather than leave it `running` for a
    worker."""
    looked: list[str] = []
    parent, child = _lookup_agents(looked)
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        _cancel_once_created(monkeypatch, rt, [sid], check=True)
        r = await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        assert r.status == "cancelled"
        [child_id] = [s.id for s in await rt.sessions(agent="billing")]
        child_state = await rt.state(child_id)
        assert child_state.turn is not None and child_state.turn.status == "cancelled"
        assert [s.status for s in await rt.sessions(agent="billing")] == ["cancelled"]
        assert await rt.pending() == [] and looked == []


async def test_a_worker_cancels_a_child_whose_parent_turn_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A child's turn left running for a cancelled parent (its creator died before checking
    the parent) is cancelled by the worker that claims it: its model never runs and no
    approval for the cancelled task reaches the queue."""
    looked: list[str] = []
    parent, child = _lookup_agents(looked)
    url = f"sqlite:///{tmp_path / 'state.db'}"
    async with so.Runtime([parent, child], store=url) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        _cancel_once_created(monkeypatch, rt, [sid], check=False)
        with pytest.raises(so.StoreError, match="died here"):
            await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        assert (await rt.state(sid)).turn_status == "cancelled"
        [orphan] = await rt.sessions(agent="billing")
        assert orphan.status == "running"
    monkeypatch.undo()
    async with so.Runtime([parent, child], store=url, inline=False) as worker:
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        try:
            for _ in range(250):
                turn = (await worker.state(orphan.id)).turn
                if turn is not None and turn.status != "running":
                    break
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(working, 10)
        turn = (await worker.state(orphan.id)).turn
        assert turn is not None and turn.status == "cancelled"
        assert await worker.pending() == [] and looked == []


async def test_an_answer_to_a_child_its_parents_cancel_missed_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The process cancelling the parent died after recording the parent's cancel and before
    cancelling the child, which still waits on its approval: an answer given to that request
    must not be applied to a task no one waits for; the orphan is cancelled and the answer
    refused as for any withdrawn request."""
    ran: list[dict[str, Any]] = []
    parent, child = refund_agents(ran, Counted("unused"))
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        with monkeypatch.context() as m:  # the cancel reaches no child: as if it died there
            m.setattr(_child_sessions, "children", lambda requests: [])
            m.setattr(_child_sessions, "delegated", lambda state: [])
            assert (await rt.cancel(r.session_id, principal=ALICE)).status == "cancelled"
        [orphan] = await rt.pending()
        assert orphan.id == mirror.child.request_id
        with pytest.raises(so.RequestClosed):
            await rt.respond(
                mirror.child.session_id,
                [so.InputResponse(request_id=orphan.id, option_id="approve")],
                principal=ALICE,
            )
        child_state = await rt.state(mirror.child.session_id)
        assert child_state.turn is not None and child_state.turn.status == "cancelled"
        row = await rt.store.get_request(orphan.id)
        assert row is not None and row.status == "withdrawn"
        assert await rt.pending() == [] and ran == []


async def test_the_sweep_cancels_a_child_its_parents_cancel_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but no one answers: the periodic sweep (`expire_due`, run by workers) finds
    the child still waiting for a cancelled parent and cancels it, so its approval leaves the
    queue instead of waiting there for ever."""
    ran: list[dict[str, Any]] = []
    parent, child = refund_agents(ran, Counted("unused"))
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        with monkeypatch.context() as m:
            m.setattr(_child_sessions, "children", lambda requests: [])
            m.setattr(_child_sessions, "delegated", lambda state: [])
            await rt.cancel(r.session_id, principal=ALICE)
        assert len(await rt.pending()) == 1
        assert await rt.expire_due() == 1
        child_state = await rt.state(mirror.child.session_id)
        assert child_state.turn is not None and child_state.turn.status == "cancelled"
        assert await rt.pending() == [] and ran == []
        assert await rt.expire_due() == 0


async def test_cancelling_a_cancelled_parent_again_cancels_the_child_it_missed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first cancel of the parent died before reaching its child: cancelling the parent
    again (the caller never heard back, so it retries) must finish the job, not return at once
    because the parent's turn is cancelled already."""
    ran: list[dict[str, Any]] = []
    parent, child = refund_agents(ran, Counted("unused"))
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        with monkeypatch.context() as m:
            m.setattr(_child_sessions, "children", lambda requests: [])
            m.setattr(_child_sessions, "delegated", lambda state: [])
            await rt.cancel(r.session_id, principal=ALICE)
        assert len(await rt.pending()) == 1
        again = await rt.cancel(r.session_id, principal=ALICE)
        assert again.status == "cancelled"
        child_state = await rt.state(mirror.child.session_id)
        assert child_state.turn is not None and child_state.turn.status == "cancelled"
        assert await rt.pending() == [] and ran == []


async def test_cancelling_the_parent_leaves_a_later_turn_of_the_child_alone(
    tmp_path: Path,
) -> None:
    """The child's delegated turn completed (answered on the child) and a message to the child
    started a turn of its own, waiting on an approval, before the parent went on: cancelling
    the parent cancels nothing of the child's, whose later turn is not the parent's task."""
    ran: list[str] = []

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("issue_refund", order_id="1042")),
            reply("Refund done."),
            call_tools(call("issue_refund", call_id="again", order_id="1043")),
            reply("Second refund done."),
        ],
        tools=[issue_refund],
    )
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", call_id="d1", message="Refund order 1042")), reply("unused")],
        tools=[so.delegate("billing")],
    )
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    child_id = mirror.child.session_id
    billing_only = sqlite_runtime(tmp_path, child)
    await billing_only.respond(
        child_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
    )
    later = await billing_only.send(child_id, "refund 1043 too", principal=ALICE)
    assert later.status == "waiting"
    await billing_only.close()
    assert (await rt.cancel(r.session_id, principal=ALICE)).status == "cancelled"
    child_state = await rt.state(child_id)
    assert child_state.turn is not None and child_state.turn.status == "waiting"
    [own] = await rt.pending(session_id=child_id)
    done = await rt.respond(
        child_id, [so.InputResponse(request_id=own.id, option_id="approve")], principal=ALICE
    )
    assert (done.status, done.text) == ("completed", "Second refund done.")
    assert ran == ["1042", "1043"]
    await rt.close()


async def test_a_parent_cancelled_just_after_its_child_was_created_leaves_it_cancelled(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent is cancelled right after its delegate call created the child session, before
    the call's `subagent.session` step was recorded: the parent's drive stops there, before it
    starts the child's turn. The child must not be left an empty `idle` session that looks like
    one a person opened: it reads as cancelled, with nothing to run or answer."""
    looked: list[str] = []
    parent, child = _lookup_agents(looked)
    async with so.Runtime([parent, child], store=store_url) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        original = _subagents.RuntimeHost.create_child

        async def create_child(
            host: _subagents.RuntimeHost, agent: str, parent_id: str, key: str, **kw: Any
        ) -> str:
            child_id = await original(host, agent, parent_id, key, **kw)
            assert (await rt.cancel(sid, "changed my mind")).status == "cancelled"
            return child_id

        monkeypatch.setattr(_subagents.RuntimeHost, "create_child", create_child)
        r = await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        assert r.status == "cancelled"
        monkeypatch.undo()
        [row] = await rt.sessions(agent="billing")
        assert row.status == "cancelled", row
        child_state = await rt.state(row.id)
        assert child_state.parent == sid and child_state.turn is not None
        assert child_state.turn.status == "cancelled"
        assert timeline(await events(rt, row.id)) == [
            "session.created",
            "turn.started",
            "turn.cancelled",
            "session.waiting",
        ]
        assert (await rt.cancel(sid)).status == "cancelled"
        assert await rt.pending() == [] and looked == []
        assert await rt.expire_due() == 0


async def test_a_parent_cancelled_after_its_call_died_between_its_two_steps_cancels_the_child(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older signoff's delegate call journaled the child's session (`subagent.session`),
    then its process died before the next step started the child's turn; the parent's turn is
    cancelled before any process takes the call up again. The child was left an empty session to
    which every message was refused as busy ("its delegated task has not started yet") for
    ever. The cancel starts the child's delegated turn with its task, and cancels it."""
    looked: list[str] = []
    parent, child = _lookup_agents(looked)
    two_step_children(monkeypatch)
    async with so.Runtime([parent, child], store=store_url) as rt:
        sid = await rt.create_session("support", auth=ALICE)

        async def died(*args: Any, **kwargs: Any) -> bool:
            raise so.StoreError("the process died here")  # the drive records nothing more

        monkeypatch.setattr(_subagents.RuntimeHost, "start_child", died)
        with pytest.raises(so.StoreError, match="died here"):
            await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        monkeypatch.undo()
        [row] = await rt.sessions(agent="billing")
        assert (await rt.state(row.id)).turn is None  # journaled, never started
        assert (await rt.cancel(sid, "wrong order")).status == "cancelled"
        child_state = await rt.state(row.id)
        assert child_state.turn is not None and child_state.turn.status == "cancelled"
        assert timeline(await events(rt, row.id)) == [
            "session.created",
            "turn.started",
            "turn.cancelled",
            "session.waiting",
        ]
        started = (await events(rt, row.id))[1]
        assert started.data["message"] == "Refund order 1042", started.data
        cancelled = (await events(rt, row.id))[2]
        assert cancelled.data["reason"] == "wrong order", cancelled.data
        assert await rt.pending() == [] and looked == []
        # The call taken up again at the same moment starts no second delegated turn after it.
        assert await rt._start_turn(row.id, "Refund order 1042", None, delegated=True) is False
        assert len(await events(rt, row.id)) == 4
        # The child is a session like any other now: a message to it runs a turn of its own.
        own = await rt.send(row.id, "and order 1043?", principal=ALICE)
        assert own.status == "waiting" and looked == ["child model"]


async def test_a_message_queued_on_the_child_starts_its_own_turn_after_the_parents_cancel(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A message sent to the child with `queue` while its delegated turn runs waits for that
    turn's end; the parent's cancel ends it, and the message starts the child's next turn at
    once (inline, as the turn's end would), which is the child's own: it asks its approval, and
    cancelling the parent again leaves it alone."""
    looked: list[str] = []
    parent, child = _lookup_agents(looked)
    async with so.Runtime([parent, child], store=store_url) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        original = _subagents.RuntimeHost.start_child

        async def start_child(host: _subagents.RuntimeHost, child_id: str, *args: Any) -> bool:
            started = await original(host, child_id, *args)
            queued = await rt.send(child_id, "Refund 1042", principal=ALICE, turn_policy="queue")
            assert queued.queued and queued.status == "running" and looked == []
            assert (await rt.cancel(sid, "changed my mind")).status == "cancelled"
            return started

        monkeypatch.setattr(_subagents.RuntimeHost, "start_child", start_child)
        r = await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        assert r.status == "cancelled"
        monkeypatch.undo()
        [child_id] = [s.id for s in await rt.sessions(agent="billing")]
        assert timeline(await events(rt, child_id)) == [
            "session.created",
            "turn.started",
            "turn.message queued:Refund 1042",
            "turn.cancelled",
            "session.waiting",
            "turn.started",  # started by the cancel (inline), as the turn's end would have
            "model.completed",
            "input.requested tool-approval:issue_refund",
            "turn.waiting",
        ]
        assert (await rt.state(child_id)).status == "waiting"
        delegated = next(e.turn_id for e in await events(rt, child_id) if e.type == "turn.started")
        [own] = await rt.pending()
        assert own.session_id == child_id and own.turn_id != delegated and looked == ["child model"]
        assert (await rt.cancel(sid)).status == "cancelled"
        assert await rt.pending() == [own]
        done = await rt.respond(
            child_id, [so.InputResponse(request_id=own.id, option_id="approve")], principal=ALICE
        )
        assert (done.status, done.text) == ("completed", "Refund done.")


async def test_a_worker_drives_a_child_its_parent_has_yet_to_journal(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child is created with its turn started, so a worker may claim it before the delegate
    call that created it journals it (or after that call's process died, before a retry does).
    Its parent's turn still takes the call's result: the worker drives the child, not cancels
    it as an orphan, and the call takes the child's result."""
    ran: list[dict[str, Any]] = []
    after = Counted("The refund went through.")
    parent, child = refund_agents(ran, after)
    original = _subagents.RuntimeHost.create_child
    claimed: list[str] = []

    async def create_child(host: _subagents.RuntimeHost, *args: Any, **kwargs: Any) -> str:
        child_id = await original(host, *args, **kwargs)
        async with so.Runtime([parent, child], store=store_url, inline=False) as worker:
            stop = asyncio.Event()
            working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.02))
            try:
                for _ in range(250):
                    if (await worker.state(child_id)).status != "running":
                        break
                    await asyncio.sleep(0.02)
            finally:
                stop.set()
                await asyncio.wait_for(working, 10)
            claimed.append((await worker.state(child_id)).status)
        return child_id

    monkeypatch.setattr(_subagents.RuntimeHost, "create_child", create_child)
    async with so.Runtime([parent, child], store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        assert claimed == ["waiting"]  # the worker ran the child's model: it asks its approval
        monkeypatch.undo()
        [mirror] = r.pending
        assert r.status == "waiting" and mirror.source == "child"
        await approve_refund_through_parent(rt, r.session_id, mirror, ran, after)


async def test_cancelling_the_parent_reaches_a_child_its_call_died_before_journaling(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delegate call created the child (its turn started with it) and its process died
    before journaling it; another drive ran the child, which asks its approval. Cancelling the
    parent's turn cancels that child too, found from the call's idempotency key: it was left
    waiting on a person for a task no one would take the result of, until an orphan sweep. And
    the parent's budgets count what it spent."""
    looked: list[str] = []
    parent, child = _lookup_agents(looked, usage=so.Usage(input_tokens=120, output_tokens=30))

    async def died(host: _subagents.RuntimeHost, *args: Any, **kwargs: Any) -> str:
        await original(host, *args, **kwargs)
        raise so.StoreError("the process died here")

    original = _subagents.RuntimeHost.create_child
    monkeypatch.setattr(_subagents.RuntimeHost, "create_child", died)
    async with so.Runtime([parent, child], store=store_url) as rt:
        sid = await rt.create_session("support", auth=ALICE)
        with pytest.raises(so.StoreError, match="died here"):
            await rt.generate(session_id=sid, prompt="Refund", auth=ALICE)
        monkeypatch.undo()
        [row] = await rt.sessions(agent="billing")
        steps = [e for e in await events(rt, sid) if e.type == "tool.step"]
        assert steps == []  # not journaled
        asked = await rt.generate(session_id=row.id)
        assert asked.status == "waiting" and looked == ["child model"]
        [request] = await rt.pending()
        assert request.session_id == row.id
        assert (await rt.cancel(sid, "wrong order")).status == "cancelled"
        kid = await rt.state(row.id)
        assert kid.turn is not None and kid.turn.status == "cancelled"
        assert await rt.pending() == []
        stored = await rt.store.get_request(request.id)
        assert stored is not None and stored.status == "withdrawn"
        # What it spent counts in its parent's budgets, as a journaled child's does.
        spent = (await rt.state(row.id)).usage
        assert spent.input_tokens == 120
        after = await rt.state(sid)
        assert after.delegated == spent and after.owed == {}
