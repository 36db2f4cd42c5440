"""Several answers in one call, one of which another process settles between this call's check
and its settling of it: the answers settled before it stand, are counted, and the turn goes on
with them, as each would have alone; the refused one raises its named error, the ones after it
stay open. Through a parent's mirrors (settled one by one, each in its subagent's session) and
for a session's own requests, one of which a response policy judges after the others settle."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff import _mirrors
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent, sqlite_runtime


def desk(ran: list[str], orders: list[str]) -> list[so.Agent]:
    """`front` delegates one refund per order to `billing` in one response; each refund asks
    for approval, so `front` waits on one mirror per order."""

    @so.tool(approval=so.always())
    async def refund(order: str) -> str:
        """Refund an order."""
        ran.append(order)
        return f"refunded {order}"

    child = scripted_agent(
        "billing", [call_tools(call("refund", order="?")), reply("billing done")], tools=[refund]
    )
    calls = [call("billing", call_id=f"d{i}", message=f"refund {o}") for i, o in enumerate(orders)]
    parent = scripted_agent(
        "front", [call_tools(*calls), reply("front done")], tools=[so.delegate("billing")]
    )
    return [parent, child]


def _elsewhere(work: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
    """`work` run as another process's call would be: in a context of its own."""
    return asyncio.create_task(work(), context=contextvars.Context())  # type: ignore[arg-type]


def _denied_meanwhile(
    monkeypatch: pytest.MonkeyPatch, other: so.Runtime, child: so.ChildRef
) -> list[bool]:
    """Once the call settled its first mirrored answer, `other` denies `child`'s request on the
    subagent's session directly, recording only the answer (`resume=False`)."""
    closing = _mirrors.close_mirror
    fired: list[bool] = []

    async def meanwhile(rt: Any, parent: str, mirror: so.InputRequest, **kw: Any) -> None:
        if not fired:
            fired.append(True)
            deny = so.InputResponse(request_id=child.request_id, option_id="cancel", text="no")
            await _elsewhere(lambda: other.respond(child.session_id, [deny], resume=False))
        await closing(rt, parent, mirror, **kw)

    monkeypatch.setattr(_mirrors, "close_mirror", meanwhile)
    return fired


async def _statuses(rt: so.Runtime, *session_ids: str) -> list[str | None]:
    states = [await rt.state(sid) for sid in session_ids]
    return [None if s.turn is None else s.turn.status for s in states]


def _approve(*requests: so.InputRequest) -> list[so.InputResponse]:
    return [so.InputResponse(request_id=r.id, option_id="approve") for r in requests]


async def test_a_mirrored_answer_settled_before_another_process_denied_the_next_goes_on(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One `respond` approves both mirrors; between its two settlements another process denies
    the second subagent's request directly, with `resume=False`. The call raises
    `ConflictingAnswer` naming the second mirror; the first approval stands and counts, and the
    parent's turn goes on with both subagents to its end. It used to count no accepted answer
    and leave the parent's turn `running` with no request open and nothing to drive it (the
    first subagent waiting, its request approved), which no sweep picks up."""
    ran: list[str] = []
    async with (
        so.Runtime(desk(ran, ["A1", "B2"]), store=store_url) as rt,
        so.Runtime(desk(ran, ["A1", "B2"]), store=store_url) as other,
    ):
        r = await rt.generate("front", "refund A1 and B2")
        first, second = r.pending
        assert first.child is not None and second.child is not None
        fired = _denied_meanwhile(monkeypatch, other, second.child)
        with pytest.raises(so.ConflictingAnswer) as refused:
            await rt.respond(r.session_id, _approve(first, second))
        assert fired and refused.value.request_ids == [second.id]
        assert f"{second.id} (asked for billing's" in str(refused.value)
        sessions = (r.session_id, first.child.session_id, second.child.session_id)
        assert await _statuses(rt, *sessions) == ["completed"] * 3
        assert ran == ["?"] and await rt.pending() == []
        state = await rt.state(r.session_id)
        assert {i: state.requests[i].status for i in (first.id, second.id)} == {
            first.id: "settled",
            second.id: "settled",
        }
        assert (rt._counts.accepted, dict(rt._counts.refused)) == (1, {"conflicting_answer": 1})
        assert (other._counts.accepted, dict(other._counts.refused)) == (1, {})
        assert await rt.expire_due() == 0  # nothing left for a sweep


async def test_the_mirrored_answers_after_the_refused_one_stay_open(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three mirrors approved in one call, the second denied meanwhile elsewhere: the first
    stands and its subagent's turn runs to its end in the parent's drive; the third stays open
    (the parent's turn waits on it alone) until it is answered, then the turn completes. The
    first subagent used to stay waiting, its request approved, with no one to drive it."""
    ran: list[str] = []
    orders = ["A1", "B2", "C3"]
    async with (
        so.Runtime(desk(ran, orders), store=store_url) as rt,
        so.Runtime(desk(ran, orders), store=store_url) as other,
    ):
        r = await rt.generate("front", "refund A1, B2 and C3")
        first, second, third = r.pending
        assert first.child is not None and second.child is not None and third.child is not None
        _denied_meanwhile(monkeypatch, other, second.child)
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(r.session_id, _approve(first, second, third))
        kids = (first.child.session_id, second.child.session_id, third.child.session_id)
        assert await _statuses(rt, r.session_id, *kids) == [
            "waiting",
            "completed",
            "completed",
            "waiting",
        ]
        assert [p.id for p in await rt.pending(session_id=r.session_id)] == [third.id]
        assert ran == ["?"]
        assert rt._counts.accepted == 1
        done = await rt.respond(r.session_id, _approve(third))
        assert done.status == "completed" and done.text == "front done" and ran == ["?", "?"]
        assert (rt._counts.accepted, dict(rt._counts.refused)) == (2, {"conflicting_answer": 1})


async def test_a_mirrored_answer_settled_before_the_refused_one_waits_for_resume(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race under `respond(resume=False)`: the first approval stands and counts, and
    no turn runs, as the call asked: the parent's turn is `running`, for the next call."""
    ran: list[str] = []
    async with (
        so.Runtime(desk(ran, ["A1", "B2"]), store=store_url) as rt,
        so.Runtime(desk(ran, ["A1", "B2"]), store=store_url) as other,
    ):
        r = await rt.generate("front", "refund A1 and B2")
        first, second = r.pending
        assert first.child is not None and second.child is not None
        _denied_meanwhile(monkeypatch, other, second.child)
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(r.session_id, _approve(first, second), resume=False)
        assert ran == [] and rt._counts.accepted == 1
        assert (await rt.state(r.session_id)).turn_status == "running"
        done = await rt.generate(session_id=r.session_id)
        assert done.status == "completed" and ran == ["?"]


def gated_agent(ran: list[str], other: list[so.Runtime]) -> so.Agent:
    """`ops` asks, in one response, to `notify` (a plain approval) and to `wire` (one a
    response policy judges); while the policy judges this process's approval of `wire`,
    `other[0]` denies it with `resume=False`."""

    @so.tool(approval=so.always())
    async def notify(text: str) -> str:
        """Tell the customer."""
        ran.append("notify")
        return "told"

    judged: list[bool] = []

    async def judge(ctx: so.ResponseContext) -> so.Allowed:
        if other and not judged:
            judged.append(True)
            deny = so.InputResponse(request_id=ctx.request.request_id, option_id="cancel")
            await _elsewhere(lambda: other[0].respond(ctx.session.id, [deny], resume=False))
        return so.Allowed()

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=judge))
    async def wire(amount: int) -> str:
        """Wire money."""
        ran.append("wire")
        return "wired"

    return scripted_agent(
        "ops",
        [call_tools(call("notify", text="hi"), call("wire", amount=5)), reply("ops done")],
        tools=[notify, wire],
    )


async def test_an_answer_settled_before_a_judged_one_lost_its_race_counts_and_goes_on(
    store_url: str,
) -> None:
    """A session's own requests: `notify`'s approval settles first, then `wire`'s is judged by
    its response policy, meanwhile denied elsewhere (`resume=False`): `ConflictingAnswer`, the
    approval of `notify` counted, and the turn goes on with both calls decided. It used to
    count nothing accepted and leave the turn `running` with no one to drive it."""
    ran: list[str] = []
    others: list[so.Runtime] = []
    async with (
        so.Runtime([gated_agent(ran, others)], store=store_url) as rt,
        so.Runtime([gated_agent(ran, [])], store=store_url) as other,
    ):
        r = await rt.generate("ops", "notify and wire")
        others.append(other)
        with pytest.raises(so.ConflictingAnswer):
            await rt.respond(r.session_id, _approve(*r.pending))
        state = await rt.state(r.session_id)
        assert state.turn_status == "completed" and ran == ["notify"]
        assert (rt._counts.accepted, dict(rt._counts.refused)) == (1, {"conflicting_answer": 1})
        assert (other._counts.accepted, dict(other._counts.refused)) == (1, {})


async def test_a_mirrored_answer_its_deadline_overtook_under_resume_false_runs_no_turn(
    tmp_path: Path,
) -> None:
    """`respond(resume=False)` through the parent, while the subagent's response policy
    decides, the subagent's request passes its deadline: `RequestClosed`, the mirror closed as
    expired, and no turn runs, as the call asked (the next call goes on). The subagent's turn
    used to run there, and the parent's after it."""
    clock = ManualClock()
    ran: list[str] = []

    async def slow(ctx: so.ResponseContext) -> so.Allowed:
        clock.advance(61)
        return so.Allowed()

    @so.tool(approval=so.ApprovalSpec(request=so.always(expires_in=60), response=slow))
    async def refund(order: str) -> str:
        """Refund an order."""
        ran.append(order)
        return "refunded"

    child = scripted_agent(
        "billing", [call_tools(call("refund", order="A1")), reply("billing done")], tools=[refund]
    )
    parent = scripted_agent(
        "front",
        [call_tools(call("billing", message="refund A1")), reply("front done")],
        tools=[so.delegate("billing")],
    )
    async with sqlite_runtime(tmp_path, parent, child, clock=clock) as rt:
        r = await rt.generate("front", "refund A1")
        [mirror] = r.pending
        assert mirror.child is not None
        with pytest.raises(so.RequestClosed):
            await rt.respond(r.session_id, _approve(mirror), resume=False)
        kid = mirror.child.session_id
        assert await _statuses(rt, r.session_id, kid) == ["running", "waiting"]
        assert (await rt.state(r.session_id)).requests[mirror.id].status == "expired"
        done = await rt.generate(session_id=r.session_id)
        assert done.status == "completed" and ran == []
        assert await _statuses(rt, kid) == ["completed"]
