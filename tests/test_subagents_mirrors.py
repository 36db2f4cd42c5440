"""A child's request mirrored on its parent, closed from the child's side: answered, edited,
cancelled, expired or past its deadline there, the mirror follows and the parent goes on.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff import _child_sessions
from signoff.testing import (
    ManualClock,
    call,
    call_tools,
    reply,
    scripted_agent,
    sqlite_runtime,
    tool_results,
)

from ._subagents import (
    ALICE,
    Counted,
    refund_agents,
)


async def test_answering_the_child_directly_lets_the_parent_go_on(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("Handled in the billing session.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    mirror = r.pending[0]
    assert mirror.child is not None
    child_done = await rt.respond(
        mirror.child.session_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
    )
    assert child_done.status == "completed"
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1
    state = await rt.state(r.session_id)
    assert state.status == "idle" and state.turn is not None
    assert state.turn.text == "Handled in the billing session."
    assert state.requests[mirror.id].status == "settled"
    assert state.requests[mirror.id].outcome == "approved"
    assert await rt.pending() == []
    # The mirror is closed now: answering it again changes nothing.
    again = await rt.respond(
        r.session_id, [so.InputResponse(request_id=mirror.id, option_id="approve")], principal=ALICE
    )
    assert again.outcomes[0].applied is False and ran == [ran[0]] and after.calls == 1
    await rt.close()


async def test_an_edited_approval_given_on_the_child_repeats_on_the_mirror(tmp_path: Path) -> None:
    """The child's approval is given directly, with edited input: the mirror closes the same
    way, so the same answer given on the mirror later is a no-op (not a conflicting answer),
    and the mirror's stored resolution names the decision and the edit as the child's does."""
    ran: list[dict[str, Any]] = []
    parent, child = refund_agents(ran, Counted("Refunded less."))
    async with sqlite_runtime(tmp_path, parent, child) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        edited = {"order_id": "1042", "amount": 90.0}
        await rt.respond(
            mirror.child.session_id,
            [
                so.InputResponse(
                    request_id=mirror.child.request_id, option_id="approve", edited_input=edited
                )
            ],
            principal=ALICE,
        )
        assert ran == [edited]
        again = await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="approve", edited_input=edited)],
            principal=ALICE,
        )
        assert again.outcomes == [
            so.Outcome(request_id=mirror.id, outcome="approved", applied=False)
        ]
        assert ran == [edited]
        original = await rt.store.get_request(mirror.child.request_id)
        copy = await rt.store.get_request(mirror.id)
        assert original is not None and copy is not None
        assert original.resolution is not None and copy.resolution is not None
        for field in ("decision", "edited_input", "outcome"):
            assert copy.resolution.get(field) == original.resolution.get(field), field


async def test_cancelling_the_child_directly_closes_the_mirror_and_resumes_the_parent(
    tmp_path: Path,
) -> None:
    # Documented: "a child cancelled on its own gives {"cancelled": true, ...}". The parent must
    # not be left waiting for ever on a mirror of a request the cancel withdrew.
    ran: list[dict[str, Any]] = []
    after = Counted("Billing was stopped.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    cancelled = await rt.cancel(mirror.child.session_id, "not needed")
    assert cancelled.status == "cancelled"
    state = await rt.state(r.session_id)
    assert state.status == "idle" and state.turn is not None
    assert state.turn.text == "Billing was stopped."
    assert state.requests[mirror.id].status == "withdrawn"
    assert await rt.pending() == []
    assert ran == [] and after.calls == 1
    [result] = tool_results(after.capture.last)
    assert result.content == {
        "cancelled": True,
        "agent": "billing",
        "session_id": mirror.child.session_id,
    }
    await rt.close()


def _three_deep(ran: list[dict[str, Any]], top_after: Counted, desk_says: str) -> list[so.Agent]:
    """`front` delegates to `desk`, which delegates to `billing`'s refund (`ran` records it);
    `front` answers with `top_after` once `desk` has, `desk` with `desk_says`."""
    _, refunds = refund_agents(ran, Counted("unused"))
    middle = scripted_agent(
        "desk",
        [call_tools(call("billing", message="refund 1042")), reply(desk_says)],
        tools=[so.delegate("billing")],
    )
    top = scripted_agent(
        "front",
        [call_tools(call("desk", message="sort out 1042")), top_after],
        tools=[so.delegate("desk")],
    )
    return [top, middle, refunds]


async def test_cancelling_the_middle_of_three_resumes_the_top(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    top_after = Counted("The desk was stopped.")
    rt = sqlite_runtime(tmp_path, *_three_deep(ran, top_after, "unused"))
    r = await rt.generate("front", prompt="sort out 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    await rt.cancel(mirror.child.session_id)
    assert await rt.pending() == []  # the grandchild's request and both mirrors are closed
    state = await rt.state(r.session_id)
    assert state.status == "idle" and top_after.calls == 1 and ran == []
    assert tool_results(top_after.capture.last)[0].content["cancelled"] is True
    await rt.close()


async def test_a_runtime_without_the_parents_agent_answers_the_child_and_leaves_the_parent(
    tmp_path: Path,
) -> None:
    # Workers and apps can be split by agent: a process that has only the child's agent
    # answers the child directly; the parent is left runnable for a process that has its agent.
    ran: list[dict[str, Any]] = []
    after = Counted("Refunded, says billing.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    billing_only = sqlite_runtime(tmp_path, child)
    done = await billing_only.respond(
        mirror.child.session_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
    )
    assert done.status == "completed" and ran == [{"order_id": "1042", "amount": 180.0}]
    assert after.calls == 0 and await billing_only.pending() == []
    [summary] = await billing_only.sessions(agent="support")
    assert summary.status == "running"
    await billing_only.close()
    finished = await rt.generate(session_id=r.session_id)
    assert (finished.status, finished.text) == ("completed", "Refunded, says billing.")
    assert after.calls == 1 and len(ran) == 1
    await rt.close()


def expiring_agents(ran: list[dict[str, Any]], after: Counted) -> tuple[so.Agent, so.Agent]:
    """`refund_agents`, with a child whose sessions expire after a minute."""
    parent, child = refund_agents(ran, after)
    child.limits = so.Limits(ttl=60)
    return parent, child


async def test_an_answer_to_an_expired_childs_mirror_fails_and_the_parent_goes_on(
    tmp_path: Path,
) -> None:
    # The child's session expired while the parent waited: the answer is refused, and the
    # parent is not left waiting for ever on a mirror nobody can answer any more. The refusal
    # names the mirror, closed (`RequestClosed`), not the parent as expired (`SessionExpired`
    # of the child's session, a 410 over HTTP, until this was changed deliberately).
    ran: list[dict[str, Any]] = []
    after = Counted("Billing timed out.")
    clock = ManualClock()
    rt = sqlite_runtime(tmp_path, *expiring_agents(ran, after), clock=clock)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    clock.advance(120)
    with pytest.raises(so.RequestClosed) as info:
        await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=mirror.id, option_id="approve")],
            principal=ALICE,
        )
    assert info.value.request_ids == [mirror.id]
    assert f"billing's session {mirror.child.session_id} passed its TTL" in str(info.value)
    state = await rt.state(r.session_id)
    assert state.status == "idle" and state.requests[mirror.id].status == "expired"
    assert ran == [] and after.calls == 1
    [result] = tool_results(after.capture.last)
    assert result.is_error and "expired" in str(result.content)
    assert await rt.pending() == []
    await rt.close()


async def test_resuming_a_parent_whose_child_expired_goes_on(tmp_path: Path) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("Billing timed out.")
    clock = ManualClock()
    rt = sqlite_runtime(tmp_path, *expiring_agents(ran, after), clock=clock)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    clock.advance(120)
    again = sqlite_runtime(tmp_path, *expiring_agents(ran, after), clock=clock)
    done = await again.generate(session_id=r.session_id)
    assert (done.status, done.text, done.pending) == ("completed", "Billing timed out.", [])
    assert ran == [] and after.calls == 1
    await again.close()
    await rt.close()


async def test_resuming_the_parent_picks_up_a_child_answered_without_resuming(
    tmp_path: Path,
) -> None:
    # The child's request was answered with resume=False (or its process died before closing
    # the mirror): resuming the parent closes the mirror and runs the child's turn on.
    ran: list[dict[str, Any]] = []
    after = Counted("The refund went through.")
    parent, child = refund_agents(ran, after)
    rt = sqlite_runtime(tmp_path, parent, child)
    r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
    [mirror] = r.pending
    assert mirror.child is not None
    await rt.respond(
        mirror.child.session_id,
        [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
        principal=ALICE,
        resume=False,
    )
    done = await rt.generate(session_id=r.session_id)
    assert (done.status, done.text) == ("completed", "The refund went through.")
    assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1
    assert (await rt.state(r.session_id)).requests[mirror.id].outcome == "approved"
    await rt.close()


async def test_resuming_the_top_picks_up_a_grandchild_answered_without_resuming(
    tmp_path: Path,
) -> None:
    """As one level down, two: resuming the top of three after the grandchild's request was
    answered with resume=False (or its process died right after recording it) left the top
    waiting on both mirrors, the person asked again and the refund not run. Each level's
    mirrors are now closed from the bottom up."""
    ran: list[dict[str, Any]] = []
    top_after = Counted("All sorted.")
    rt = sqlite_runtime(tmp_path, *_three_deep(ran, top_after, "The desk refunded it."))
    r = await rt.generate("front", prompt="sort out 1042", auth=ALICE)
    (leaf,) = [p for p in await rt.pending() if p.child is None]
    assert leaf.session_id != r.session_id and len(await rt.pending()) == 3
    await rt.respond(
        leaf.session_id,
        [so.InputResponse(request_id=leaf.id, option_id="approve")],
        principal=ALICE,
        resume=False,
    )
    done = await rt.generate(session_id=r.session_id)
    assert (done.status, done.text) == ("completed", "All sorted.")
    assert ran == [{"order_id": "1042", "amount": 180.0}] and top_after.calls == 1
    assert await rt.pending() == []
    await rt.close()


async def test_a_cancelled_or_expired_child_lets_its_parent_go_on_on_both_stores(
    store_url: str,
) -> None:
    ran: list[dict[str, Any]] = []
    after = Counted("Billing stopped.")
    clock = ManualClock()
    async with so.Runtime(list(expiring_agents(ran, after)), store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        await rt.cancel(mirror.child.session_id)
        assert (await rt.state(r.session_id)).status == "idle" and after.calls == 1

        r = await rt.generate("support", prompt="Refund order 1043", auth=ALICE)
        assert r.status == "waiting"
        clock.advance(120)
        done = await rt.generate(session_id=r.session_id)
        assert (done.status, done.pending) == ("completed", []) and after.calls == 2
        assert await rt.pending() == [] and ran == []


async def test_a_deadline_in_the_child_ends_the_mirror_and_resumes_the_parent(
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    @so.tool(approval=so.always(expires_in=60))
    async def payout(amount: float) -> str:
        """Pay out."""
        ran.append(str(amount))
        return "paid"

    child = scripted_agent(
        "billing",
        [
            call_tools(call("payout", amount=5)),
            lambda conv: reply(f"payout: {tool_results(conv)[-1].content}"),
        ],
        tools=[payout],
    )
    after = Counted("It timed out.")
    parent = scripted_agent(
        "support",
        [call_tools(call("billing", message="pay 5")), after],
        tools=[so.delegate("billing")],
    )
    clock = ManualClock()
    rt = sqlite_runtime(tmp_path, parent, child, clock=clock)
    r = await rt.generate("support", prompt="pay 5", auth=ALICE)
    [mirror] = r.pending
    # The mirror shows the child's deadline, which decides; the parent applies none of its own.
    assert mirror.child is not None
    asked = await rt.store.get_request(mirror.child.request_id)
    assert asked is not None and asked.request.expires_at is not None
    assert mirror.expires_at == asked.request.expires_at
    clock.advance(61)
    assert await rt.expire_due() == 1  # only the child's request has a deadline
    state = await rt.state(r.session_id)
    assert state.status == "idle" and state.requests[mirror.id].outcome == "expired"
    assert ran == [] and after.calls == 1
    [result] = tool_results(after.capture.last)
    assert "timed_out" in result.content
    await rt.close()


async def test_an_answer_to_a_mirror_its_childs_cancel_left_open_closes_it_and_the_parent_goes_on(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child is cancelled by a process that died before closing the parent's mirror: an
    answer given to the mirror is refused (`RequestClosed`), closes it as the child's request
    closed and lets the parent's turn go on, rather than leaving it open for ever, refusing
    every answer, with the parent waiting on it."""
    ran: list[dict[str, Any]] = []
    after = Counted("Billing was stopped.")

    async def died(rt: so.Runtime, state: Any) -> None:
        return None

    async with so.Runtime(list(refund_agents(ran, after)), store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        with monkeypatch.context() as m:
            m.setattr(_child_sessions, "after_close", died)
            await rt.cancel(mirror.child.session_id)
        assert [p.id for p in await rt.pending()] == [mirror.id]
        with pytest.raises(so.RequestClosed):
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=mirror.id, option_id="approve")],
                principal=ALICE,
            )
        state = await rt.state(r.session_id)
        assert state.requests[mirror.id].status == "withdrawn"
        assert state.turn is not None and state.turn.status == "completed"
        assert await rt.pending() == [] and ran == [] and after.calls == 1


async def test_an_answer_to_the_top_mirror_of_a_grandchild_its_cancel_left_open_closes_both(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, one level deeper: the grandchild's cancel left open its mirror on the middle
    session and that mirror's on the top one. An answer to the top one closes both, and the
    middle and top turns go on to the end."""
    ran: list[dict[str, Any]] = []
    top_after = Counted("The desk was stopped.")
    _, refunds = refund_agents(ran, Counted("unused"))
    middle = scripted_agent(
        "desk",
        [call_tools(call("billing", message="refund 1042")), reply("Billing stopped.")],
        tools=[so.delegate("billing")],
    )
    top = scripted_agent(
        "front",
        [call_tools(call("desk", message="sort out 1042")), top_after],
        tools=[so.delegate("desk")],
    )

    async def died(rt: so.Runtime, state: Any) -> None:
        return None

    async with sqlite_runtime(tmp_path, top, middle, refunds) as rt:
        r = await rt.generate("front", prompt="sort out 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        [inner] = await rt.pending(session_id=mirror.child.session_id)
        assert inner.child is not None
        with monkeypatch.context() as m:
            m.setattr(_child_sessions, "after_close", died)
            await rt.cancel(inner.child.session_id)
        assert len(await rt.pending()) == 2
        with pytest.raises(so.RequestClosed):
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=mirror.id, option_id="approve")],
                principal=ALICE,
            )
        assert await rt.pending() == []
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        assert tool_results(top_after.capture.last)[0].content == "Billing stopped."
        assert ran == [] and top_after.calls == 1


async def test_a_child_answered_directly_by_a_process_that_died_after_its_turn_ended(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child's request is answered on the child and its turn ends, and the process dies
    before it told the parent (`after_drive`): the queue does not ask again for the approval
    given, and a worker carries the parent's turn on, rather than leaving it waiting on a
    mirror no sweep or claim would ever look at."""
    ran: list[dict[str, Any]] = []
    after = Counted("Handled in the billing session.")
    agents = list(refund_agents(ran, after))

    async def died(rt: so.Runtime, session_id: str) -> None:
        return None

    async with so.Runtime(agents, store=store_url) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        [mirror] = r.pending
        assert mirror.child is not None
        with monkeypatch.context() as m:
            m.setattr(_child_sessions, "after_drive", died)
            done = await rt.respond(
                mirror.child.session_id,
                [so.InputResponse(request_id=mirror.child.request_id, option_id="approve")],
                principal=ALICE,
            )
        assert done.status == "completed" and after.calls == 0
    async with so.Runtime(agents, store=store_url, inline=False, lease_ttl=2.0) as worker:
        assert await worker.pending() == []
        stop = asyncio.Event()
        working = asyncio.create_task(worker.work(stop=stop, idle_wait=0.05))
        try:
            for _ in range(250):
                turn = (await worker.state(r.session_id)).turn
                if turn is not None and turn.status == "completed":
                    break
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(working, 10)
        state = await worker.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed", state.status
        assert state.turn.text == "Handled in the billing session."
        assert state.requests[mirror.id].outcome == "approved"
        assert ran == [{"order_id": "1042", "amount": 180.0}] and after.calls == 1
