"""Cancelling one turn by its id (`Runtime.cancel(turn_id=)`): a cancel sent again, or from a page
shown before, stops that turn and never a later one; a turn id that is not the session's cancels
nothing and reports the session as it is; a malformed one is a `UsageError`. A cancel records
an approval's passed deadline first (a subagent's behind a mirror too), only where the
session's agent is. Both stores."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest

import signoff as so
import signoff._cancel_batch as _cancel_batch
from signoff.models import ModelRequest
from signoff.testing import Capture, ManualClock, call, call_tools, reply, scripted_agent, timeline

from ._delegation import refund_desk
from ._steer import ALICE, events, plan_agent


def _agent() -> so.Agent:
    """Asks which plan at every turn: each turn waits on a person until answered or cancelled."""
    again = call_tools(call("pick_plan", call_id="p2"))
    return plan_agent(Capture(again), call_tools(call("pick_plan", call_id="p3")))


async def test_a_cancel_naming_a_turn_stops_that_turn_and_no_later_one(store_url: str) -> None:
    async with so.Runtime([_agent()], store=store_url) as rt:
        first = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        sid = first.session_id
        assert first.status == "waiting" and first.turn_id is not None
        seq = (await rt.state(sid)).seq
        other = await rt.cancel(sid, turn_id="trn_not_this_one", principal=ALICE)
        assert other.status == "waiting" and other.turn_id == first.turn_id
        assert other.cancelled is False
        assert (await rt.state(sid)).seq == seq  # nothing recorded
        done = await rt.cancel(sid, "changed my mind", turn_id=first.turn_id, principal=ALICE)
        assert done.status == "cancelled" and done.turn_id == first.turn_id and done.cancelled
        again = await rt.cancel(sid, turn_id=first.turn_id)  # sent twice: the same report
        assert again.status == "cancelled" and again.turn_id == first.turn_id
        assert again.cancelled is False  # ... but this one cancelled nothing
        second = await rt.send(sid, "basic, please", principal=ALICE)
        assert second.status == "waiting" and second.turn_id != first.turn_id
        seq = (await rt.state(sid)).seq
        stale = await rt.cancel(sid, turn_id=first.turn_id, principal=ALICE)
        assert stale.status == "waiting" and stale.turn_id == second.turn_id
        assert stale.cancelled is False
        state = await rt.state(sid)
        assert state.seq == seq and [r.id for r in state.pending_requests()] == [
            r.id for r in second.pending
        ]
        cancelled = [e for e in await events(rt, sid) if e.type == "turn.cancelled"]
        assert [e.turn_id for e in cancelled] == [first.turn_id]


async def test_of_two_cancels_sent_at_once_one_says_it_cancelled(store_url: str) -> None:
    """A form sent twice (a double click): both calls reported the turn cancelled, and nothing
    told which one had cancelled it and whose reason was recorded; `cancelled` says it."""
    async with so.Runtime([_agent()], store=store_url) as rt:
        first = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        sid, turn = first.session_id, first.turn_id
        both = await asyncio.gather(
            rt.cancel(sid, "one", turn_id=turn, principal=ALICE),
            rt.cancel(sid, "two", turn_id=turn, principal=ALICE),
        )
        assert [(r.status, r.turn_id) for r in both] == [("cancelled", turn)] * 2
        assert sorted(r.cancelled for r in both) == [False, True]
        [mine] = [i for i, r in enumerate(both) if r.cancelled]
        [cancelled] = [e for e in await events(rt, sid) if e.type == "turn.cancelled"]
        assert cancelled.data["reason"] == ["one", "two"][mine]
        assert (await rt.cancel(sid)).cancelled is False  # a turn over: nothing to cancel


@pytest.mark.parametrize("bad", ["", 5, b"trn_x"])
async def test_a_malformed_turn_id_is_a_usage_error_and_cancels_nothing(
    store_url: str, bad: Any
) -> None:
    async with so.Runtime([_agent()], store=store_url) as rt:
        r = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        seq = (await rt.state(r.session_id)).seq
        with pytest.raises(so.UsageError, match="turn_id must be a turn's id"):
            await rt.cancel(r.session_id, turn_id=bad)
        state = await rt.state(r.session_id)
        assert state.status == "waiting" and state.seq == seq


async def test_the_requests_a_cancel_withdraws_carry_its_reason(store_url: str) -> None:
    """A withdrawn request said only "turn cancelled" (the audit's Withdrawn tab, Slack's
    message, the request's record): the reason the person gave was on the turn's event alone."""
    async with so.Runtime([_agent()], store=store_url) as rt:
        first = await rt.generate("sales", prompt="upgrade me", auth=ALICE)
        rid = first.pending[0].id
        await rt.cancel(first.session_id, "wrong customer", principal=ALICE)
        stored = await rt.store.get_request(rid)
        assert stored is not None and stored.status == "withdrawn"
        assert stored.resolution is not None
        assert stored.resolution["reason"] == "turn cancelled: wrong customer"
        resolved = [e for e in await events(rt, first.session_id) if e.type == "input.resolved"]
        assert [e.data["reason"] for e in resolved] == ["turn cancelled: wrong customer"]
        second = await rt.send(first.session_id, "basic, please", principal=ALICE)
        await rt.cancel(first.session_id, principal=ALICE)  # no reason given: none added
        stored = await rt.store.get_request(second.pending[0].id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["reason"] == "turn cancelled"


def _expiring(ran: list[str], on_timeout: Literal["deny", "approve", "escalate"]) -> so.Agent:
    """A refund whose approval's deadline passes 60 s after it is asked."""
    group = "finance" if on_timeout == "escalate" else None
    spec = so.always(expires_in=60, on_timeout=on_timeout, escalate_to=group)

    @so.tool(approval=spec)
    def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    steps = [call_tools(call("refund", order_id="1")), reply("Done.")]
    return scripted_agent("support", steps, tools=[refund])


@pytest.mark.parametrize(
    ("on_timeout", "closed", "status"),
    [
        ("deny", ["input.resolved expired"], "expired"),
        ("approve", ["approval.settled approve", "input.resolved expired"], "expired"),
        # Escalated, the request stays open: the cancel withdraws it.
        ("escalate", ["approval.candidate", "input.resolved cancelled"], "withdrawn"),
    ],
)
async def test_a_cancel_records_an_approvals_passed_deadline_first(
    store_url: str,
    on_timeout: Literal["deny", "approve", "escalate"],
    closed: list[str],
    status: str,
) -> None:
    """The request read `withdrawn` (cancelled), though `rt.state()` showed it expired just
    before: the cancel withdrew it without recording its deadline. Now the deadline's close
    comes first, then the cancel of the turn it resumed (or still waits on, escalated), in
    which the call it approved never ran."""
    ran: list[str] = []
    clock = ManualClock()
    async with so.Runtime([_expiring(ran, on_timeout)], store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund order 1", auth=ALICE)
        sid, rid = waiting.session_id, waiting.pending[0].id
        clock.advance(61)
        done = await rt.cancel(sid, "never mind", turn_id=waiting.turn_id, principal=ALICE)
        assert (done.status, done.turn_id, done.cancelled) == ("cancelled", waiting.turn_id, True)
        assert timeline(await events(rt, sid))[5:] == [
            *closed,
            "turn.cancelled",
            "session.waiting",
        ]
        stored = await rt.store.get_request(rid)
        assert stored is not None and stored.status == status
        # Escalated and withdrawn in the cancel's one commit: the row keeps both.
        assert stored.request.escalated_to == ("finance" if on_timeout == "escalate" else None)
        assert ran == []
        assert (await rt.state(sid)).status == "cancelled"


async def test_a_cancel_naming_another_turn_records_no_passed_deadline(store_url: str) -> None:
    """It reports the session as it is and writes nothing: a deadline it recorded would leave
    the turn runnable, with no one to drive it."""
    clock = ManualClock()
    async with so.Runtime([_expiring([], "deny")], store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund order 1", auth=ALICE)
        sid = waiting.session_id
        clock.advance(61)
        seq = await rt.store.head(sid)
        other = await rt.cancel(sid, turn_id="trn_not_this_one", principal=ALICE)
        assert (other.turn_id, other.cancelled) == (waiting.turn_id, False)
        assert await rt.store.head(sid) == seq


@pytest.mark.parametrize("on_timeout", ["deny", "approve", "escalate"])
async def test_a_runtime_without_the_agent_refuses_the_cancel_recording_no_deadline(
    store_url: str, on_timeout: Literal["deny", "approve", "escalate"]
) -> None:
    """`UnknownAgent`, the store unchanged, as before a cancel recorded deadlines first: it had
    recorded the deadline, then raised, leaving an approved call's turn runnable with no one
    to drive it. (`signoff cancel --store` stands agents in: it records it, then cancels.)"""
    clock = ManualClock()
    async with so.Runtime([_expiring([], on_timeout)], store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund order 1", auth=ALICE)
    sid = waiting.session_id
    clock.advance(61)
    async with so.Runtime([], store=store_url, clock=clock) as bare:
        seq = await bare.store.head(sid)
        with pytest.raises(so.UnknownAgent):
            await bare.cancel(sid, "never mind", principal=ALICE)
        assert await bare.store.head(sid) == seq
        stored = await bare.store.get_request(waiting.pending[0].id)
        assert stored is not None and stored.status == "pending"


@pytest.mark.parametrize("on_timeout", ["deny", "approve"])
async def test_a_cancel_records_a_subagents_passed_deadline_behind_a_mirror_first(
    store_url: str, on_timeout: Literal["deny", "approve"]
) -> None:
    """The mirror read `withdrawn`, as if the cancel had closed it, though the subagent's
    deadline had: it now reads `expired`, as the subagent's request does, and the subagent's
    turn that deadline resumed is cancelled with its parent's (the approved call never runs)."""
    ran: list[str] = []
    clock = ManualClock()
    spec = so.always(expires_in=60, on_timeout=on_timeout)
    async with so.Runtime(refund_desk(spec, ran), store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund 9", auth=ALICE)
        (mirror,) = waiting.pending
        assert mirror.child is not None
        clock.advance(61)
        done = await rt.cancel(waiting.session_id, "never mind", principal=ALICE)
        assert (done.status, done.cancelled) == ("cancelled", True)
        for rid in (mirror.id, mirror.child.request_id):
            stored = await rt.store.get_request(rid)
            assert stored is not None and stored.status == "expired"
        assert (await rt.state(mirror.child.session_id)).status == "cancelled"
        assert ran == []


@pytest.mark.parametrize("on_timeout", ["deny", "approve"])
async def test_a_cancel_closes_a_chain_of_mirrors_its_grandchilds_deadline_closed(
    store_url: str, on_timeout: Literal["deny", "approve"]
) -> None:
    """`front` delegates to `support`, which delegates to `billing`: each mirror reads `expired`
    (as the deadline closed billing's request), each turn is cancelled, the refund never ran.
    Each session records it in its own cancel's one commit, the top one first."""
    ran: list[str] = []
    clock = ManualClock()
    front = scripted_agent(
        "front",
        [call_tools(call("support", message="refund 9")), reply("all done")],
        tools=[so.delegate("support")],
    )
    spec = so.always(expires_in=60, on_timeout=on_timeout)
    async with so.Runtime([front, *refund_desk(spec, ran)], store=store_url, clock=clock) as rt:
        waiting = await rt.generate("front", "refund 9", auth=ALICE)
        clock.advance(61)
        done = await rt.cancel(waiting.session_id, "never mind", principal=ALICE)
        assert (done.status, done.cancelled) == ("cancelled", True)
        (request,) = waiting.pending
        sessions = [waiting.session_id]
        while request.child is not None:
            sessions.append(request.child.session_id)
            stored = await rt.store.get_request(request.child.request_id)
            assert stored is not None
            request = stored.request
        assert len(sessions) == 3
        for sid in sessions:
            assert (await rt.state(sid)).status == "cancelled"
            [closed] = (await rt.state(sid)).requests.values()
            assert closed.status == "expired", sid
        assert ran == []
        assert await rt.verify_audit() == []


class _Failing:
    """Fails (a connection error: retryable) on a message with `fail` in it, else answers."""

    async def complete(self, request: ModelRequest) -> so.ModelResponse:
        last = [m for m in request.messages if m.kind == "user"][-1].text
        if "fail" in last:
            raise ConnectionError("model down")
        return so.ModelResponse(text=f"re: {last}", usage=so.Usage())


async def test_a_cancel_whose_failed_turn_was_passed_meanwhile_reports_it_not_retryable(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Alice cancels her failed turn (a retry could resume it) while her next message starts the
    turn past it. The cancel, which found it ended, reported it `retryable`, though a retry
    runs only the session's turn: it reports it failed, not retryable, cancelling nothing."""
    async with so.Runtime([so.Agent(name="desk", model=_Failing())], store=store_url) as rt:
        failed = await rt.generate("desk", prompt="fail", auth=ALICE)
        sid = failed.session_id
        assert (failed.status, failed.retryable) == ("failed", True)
        of = _cancel_batch.CancelBatch.of

        async def passed_first(cls: Any, *a: Any, **kw: Any) -> Any:
            monkeypatch.undo()
            assert (await rt.send(sid, "next", principal=ALICE)).status == "completed"
            return await of(*a, **kw)

        monkeypatch.setattr(_cancel_batch.CancelBatch, "of", classmethod(passed_first))
        told = await rt.cancel(sid, principal=ALICE)
        assert (told.turn_id, told.status) == (failed.turn_id, "failed")
        assert (told.retryable, told.cancelled) == (False, False)
        state = await rt.state(sid)
        assert state.turn is not None and (state.turn.status, state.turn.text) == (
            "completed",
            "re: next",
        )
