"""A message sent once an approval's deadline passed (`send`): the deadline closed the approval
first, so the turn is held on it no more. The send records the deadline and drives the turn it
resumed on (an inline runtime), a `queue` message, or someone else's, waiting behind it and a
`steer` one read in it; it had left a `queue` message queued and the turn `running` with
nothing to drive it. With `inline=False` the turn is left to the workers. A subagent's deadline
behind a mirror is recorded first too, whoever looked at it before. Both stores."""

from __future__ import annotations

from typing import Any, Literal

import pytest

import signoff as so
from signoff.testing import Capture, ManualClock, call, call_tools, reply, scripted_agent, timeline

from ._steer import ALICE, BOB, events, texts
from ._workers import is_, until, working

NO_ONE_DECIDED = {
    "timed_out": True,
    "ran": False,
    "reason": "no one decided before the approval deadline",
}


def refund_agent(
    ran: list[str], *steps: Any, on_timeout: Literal["deny", "approve"] = "deny"
) -> so.Agent:
    """A refund whose approval expires 60 s after it is asked; then `steps`."""

    @so.tool(approval=so.ApprovalSpec(so.always(), expires_in=60, on_timeout=on_timeout))
    def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    return scripted_agent(
        "support", [call_tools(call("refund", order_id="1")), *steps], tools=[refund]
    )


async def started(rt: so.Runtime, session_id: str) -> list[tuple[str, str | None]]:
    """(message, principal id) of each turn the session started, in order."""
    out = []
    for e in await events(rt, session_id):
        if e.type == "turn.started":
            out.append((e.data["message"], (e.data.get("principal") or {}).get("principal_id")))
    return out


@pytest.mark.parametrize(
    ("sender", "policy"),
    [(ALICE, "queue"), (BOB, "steer")],
    ids=["queue", "someone else's"],
)
async def test_a_message_after_the_deadline_waits_behind_the_turn_the_send_drives_on(
    store_url: str, sender: so.Principal, policy: Literal["steer", "queue"]
) -> None:
    ran: list[str] = []
    resumed = Capture(reply("The refund expired."))
    answer = Capture(reply("Your parcel is on its way."))
    clock = ManualClock()
    async with so.Runtime([refund_agent(ran, resumed, answer)], store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund order 1", auth=ALICE)
        assert waiting.status == "waiting"
        sid, rid = waiting.session_id, waiting.pending[0].id
        clock.advance(61)
        r = await rt.send(sid, "where is my parcel?", principal=sender, turn_policy=policy)
        # Driven in the call: the deadline's turn, then the message's own, which it is told.
        assert (r.status, r.text, r.queued) == ("completed", "Your parcel is on its way.", False)
        state = await rt.state(sid)
        assert state.status == "idle" and state.queued == []
        assert await started(rt, sid) == [
            ("refund order 1", "alice"),
            ("where is my parcel?", sender.principal_id),
        ]
        # The model read the deadline's result in the turn it resumed, not the message.
        assert texts(resumed.last)[-1] == ("tool", NO_ONE_DECIDED)
        assert texts(answer.last)[-1] == ("user", "where is my parcel?")
        stored = await rt.store.get_request(rid)
        assert stored is not None and stored.status == "expired"
        assert ran == []


async def test_a_steer_after_the_deadline_is_read_in_the_turn_it_resumed(store_url: str) -> None:
    """The person the turn serves steers the turn the deadline resumed: the model reads the
    deadline's result, then the message, in that one turn."""
    ran: list[str] = []
    resumed = Capture(reply("It expired; your parcel is on its way."))
    clock = ManualClock()
    async with so.Runtime([refund_agent(ran, resumed)], store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund order 1", auth=ALICE)
        clock.advance(61)
        r = await rt.send(waiting.session_id, "where is my parcel?", principal=ALICE)
        assert (r.status, r.queued, r.turn_id) == ("completed", False, waiting.turn_id)
        assert texts(resumed.last)[-2:] == [
            ("tool", NO_ONE_DECIDED),
            ("user", "where is my parcel?"),
        ]
        assert await started(rt, waiting.session_id) == [("refund order 1", "alice")]


async def test_a_message_after_an_approving_deadline_waits_for_the_call_it_ran(
    store_url: str,
) -> None:
    """`on_timeout="approve"`: the call the deadline approved runs in the send's drive, before
    the message's turn."""
    ran: list[str] = []
    clock = ManualClock()
    agent = refund_agent(ran, reply("Refunded."), reply("On its way."), on_timeout="approve")
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund order 1", auth=ALICE)
        clock.advance(61)
        r = await rt.send(waiting.session_id, "parcel?", principal=ALICE, turn_policy="queue")
        assert (r.status, r.text, r.queued) == ("completed", "On its way.", False)
        assert ran == ["1"]
        assert [m for m, _ in await started(rt, waiting.session_id)] == [
            "refund order 1",
            "parcel?",
        ]


async def test_without_inline_the_turn_the_deadline_resumed_is_left_to_the_workers(
    store_url: str,
) -> None:
    ran: list[str] = []
    clock = ManualClock()
    agent = refund_agent(ran, reply("The refund expired."), reply("On its way."))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund order 1", auth=ALICE)
    sid = waiting.session_id
    async with so.Runtime([agent], store=store_url, clock=clock, inline=False) as client:
        clock.advance(61)
        r = await client.send(sid, "parcel?", principal=ALICE, turn_policy="queue")
        assert (r.status, r.queued, r.turn_id) == ("running", True, waiting.turn_id)
        assert [m for m, _ in await started(client, sid)] == ["refund order 1"]
        async with working(client):
            await until(lambda: is_(client, sid, "completed"))
            await until(lambda: _idle(client, sid))
        assert [m for m, _ in await started(client, sid)] == ["refund order 1", "parcel?"]
        assert (await client.state(sid)).turn.text == "On its way."  # type: ignore[union-attr]


async def _idle(rt: so.Runtime, session_id: str) -> bool:
    return (await rt.state(session_id)).status == "idle"


def refund_desk(
    ran: list[str], on_timeout: Literal["deny", "approve"], *steps: Any
) -> list[so.Agent]:
    """`support` delegates refunding order 9 to `billing`, whose approval expires 60 s after it
    is asked; `support` then takes `steps`."""

    @so.tool(approval=so.always(expires_in=60, on_timeout=on_timeout))
    def refund(order_id: str) -> str:
        """Refund an order."""
        ran.append(order_id)
        return "refunded"

    billing = scripted_agent(
        "billing", [call_tools(call("refund", order_id="9")), reply("Refunded.")], tools=[refund]
    )
    support = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 9")), *steps],
        tools=[so.delegate("billing")],
    )
    return [support, billing]


@pytest.mark.parametrize("listing", [False, True], ids=["unlisted", "listed first"])
@pytest.mark.parametrize("on_timeout", ["approve", "deny"])
async def test_a_message_after_a_subagents_deadline_waits_behind_the_turn_it_resumed(
    store_url: str, on_timeout: Literal["deny", "approve"], listing: bool
) -> None:
    """The deadline behind the mirror closed the approval before the message came, whoever
    records it: the send did not, found the mirror open and steered, withdrawing it, and the
    subagent's turn was cancelled (an approved refund never ran), unless a listing had
    recorded the deadline first."""
    ran: list[str] = []
    clock = ManualClock()
    agents = refund_desk(ran, on_timeout, reply("Done."), reply("On its way."))
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund 9", auth=ALICE)
        sid, (mirror,) = waiting.session_id, waiting.pending
        assert mirror.child is not None
        clock.advance(61)
        if listing:
            assert await rt.pending() == []
        r = await rt.send(sid, "parcel?", principal=ALICE, turn_policy="queue")
        assert (r.status, r.text, r.queued) == ("completed", "On its way.", False)
        assert ran == (["9"] if on_timeout == "approve" else [])
        assert [m for m, _ in await started(rt, sid)] == ["refund 9", "parcel?"]
        for rid in (mirror.id, mirror.child.request_id):
            stored = await rt.store.get_request(rid)
            assert stored is not None and stored.status == "expired"
        child = timeline(await events(rt, mirror.child.session_id))
        assert "turn.cancelled" not in child and child[-2:] == ["turn.completed", "session.waiting"]


async def test_a_steer_after_a_subagents_deadline_is_read_after_the_call_it_approved(
    store_url: str,
) -> None:
    """The person the turn serves steers the turn the deadline resumed: the approved refund
    runs, and the model reads its result, then the message. The steer had withdrawn the
    mirror and cancelled the subagent's turn."""
    ran: list[str] = []
    clock = ManualClock()
    resumed = Capture(reply("Refunded; your parcel is on its way."))
    async with so.Runtime(refund_desk(ran, "approve", resumed), store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund 9", auth=ALICE)
        (mirror,) = waiting.pending
        clock.advance(61)
        r = await rt.send(waiting.session_id, "where is my parcel?", principal=ALICE)
        assert (r.status, r.turn_id) == ("completed", waiting.turn_id)
        assert ran == ["9"]
        seen = texts(resumed.last)
        assert seen[-2][0] == "tool" and seen[-1] == ("user", "where is my parcel?")
        stored = await rt.store.get_request(mirror.id)
        assert stored is not None and stored.status == "expired"


@pytest.mark.parametrize("on_timeout", ["deny", "approve"])
async def test_a_runtime_without_the_agent_refuses_the_message_recording_no_deadline(
    store_url: str, on_timeout: Literal["deny", "approve"]
) -> None:
    """`UnknownAgent`, the store unchanged: it had recorded the deadline first, then raised,
    leaving an approved call's turn runnable with no one to drive it."""
    clock = ManualClock()
    agent = refund_agent([], reply("Done."), on_timeout=on_timeout)
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund order 1", auth=ALICE)
    sid = waiting.session_id
    clock.advance(61)
    async with so.Runtime([], store=store_url, clock=clock) as bare:
        seq = await bare.store.head(sid)
        with pytest.raises(so.UnknownAgent):
            await bare.send(sid, "parcel?", principal=ALICE, turn_policy="queue")
        assert await bare.store.head(sid) == seq


def ttl_desk(*steps: Any) -> list[so.Agent]:
    """`support` delegates refunding order 9 to `billing`, whose session's TTL is 60 s and whose
    refund waits on an approval with no deadline; `support` then takes `steps`."""

    @so.tool(approval=so.always())
    def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    billing = scripted_agent(
        "billing",
        [call_tools(call("refund", order_id="9")), reply("Refunded.")],
        tools=[refund],
        limits=so.Limits(ttl=60),
    )
    support = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 9")), *steps],
        tools=[so.delegate("billing")],
    )
    return [support, billing]


@pytest.mark.parametrize(
    ("sender", "policy"),
    [(ALICE, "queue"), (BOB, "steer")],
    ids=["queue", "someone else's"],
)
async def test_a_message_after_a_read_recorded_a_subagents_ttl_drives_the_turn_it_left(
    store_url: str, sender: so.Principal, policy: Literal["steer", "queue"]
) -> None:
    """A read (`rt.state`, as `GET /v1/sessions/{id}` and the dashboard make) recorded the
    subagent's passed TTL, closing the mirror, and left the parent's turn runnable with no one
    driving it: the message then only queued, the session `running` for good. The send drives
    that turn on, then the message's own, which it returns."""
    clock = ManualClock()
    agents = ttl_desk(reply("Billing gave up."), reply("On its way."))
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund 9", auth=ALICE)
        sid = waiting.session_id
        clock.advance(61)
        assert (await rt.state(sid)).status == "running"  # recorded, not driven
        r = await rt.send(sid, "parcel?", principal=sender, turn_policy=policy)
        assert (r.status, r.text, r.queued) == ("completed", "On its way.", False)
        state = await rt.state(sid)
        assert state.status == "idle" and state.queued == []
        assert await started(rt, sid) == [("refund 9", "alice"), ("parcel?", sender.principal_id)]


async def test_without_inline_the_turn_a_read_left_runnable_is_left_to_the_workers(
    store_url: str,
) -> None:
    clock = ManualClock()
    agents = ttl_desk(reply("Billing gave up."), reply("On its way."))
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund 9", auth=ALICE)
    sid = waiting.session_id
    async with so.Runtime(agents, store=store_url, clock=clock, inline=False) as client:
        clock.advance(61)
        await client.state(sid)
        r = await client.send(sid, "parcel?", principal=ALICE, turn_policy="queue")
        assert (r.status, r.queued, r.turn_id) == ("running", True, waiting.turn_id)
        assert [m for m, _ in await started(client, sid)] == ["refund 9"]
        async with working(client):
            await until(lambda: _idle(client, sid))
        assert [m for m, _ in await started(client, sid)] == ["refund 9", "parcel?"]


@pytest.mark.parametrize("kind", ["deadline", "ttl"])
async def test_a_prompt_after_a_subagents_deadline_starts_behind_the_turn_it_resumed(
    store_url: str, kind: str
) -> None:
    """`generate(session_id=..., prompt=...)` records the subagent's passed deadline (or TTL)
    behind the mirror first, as `send` does: it raised `PartialAnswer` on the mirror unless a
    listing had looked first."""
    ran: list[str] = []
    clock = ManualClock()
    steps = (reply("Done."), reply("On its way."))
    agents = refund_desk(ran, "approve", *steps) if kind == "deadline" else ttl_desk(*steps)
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund 9", auth=ALICE)
        sid, (mirror,) = waiting.session_id, waiting.pending
        clock.advance(61)
        r = await rt.generate(session_id=sid, prompt="parcel?", auth=ALICE)
        assert (r.status, r.text) == ("completed", "On its way.")
        assert ran == (["9"] if kind == "deadline" else [])
        assert [m for m, _ in await started(rt, sid)] == ["refund 9", "parcel?"]
        stored = await rt.store.get_request(mirror.id)
        assert stored is not None and stored.status == "expired"


@pytest.mark.parametrize("how", ["queue", "steer", "prompt"])
@pytest.mark.parametrize("kind", ["deadline", "ttl"])
async def test_a_runtime_without_the_subagents_agent_refuses_a_message_past_its_deadline(
    store_url: str, kind: str, how: str
) -> None:
    """A process of `support` only (`billing` runs elsewhere): the message is `UnknownAgent`
    naming `billing`, nothing recorded, as for a deadline of the session's own. It had taken
    the mirror as open: a `queue` message steered past it, withdrawing the approval the
    deadline approved (the refund never ran). The process with `billing` then goes on."""
    ran: list[str] = []
    clock = ManualClock()
    steps = (reply("Done."), reply("On its way."))
    agents = refund_desk(ran, "approve", *steps) if kind == "deadline" else ttl_desk(*steps)
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund 9", auth=ALICE)
    sid, (mirror,) = waiting.session_id, waiting.pending
    assert mirror.child is not None
    sids = (sid, mirror.child.session_id)
    clock.advance(61)
    async with so.Runtime(agents[:1], store=store_url, clock=clock) as support:
        heads = [await support.store.head(s) for s in sids]
        with pytest.raises(so.UnknownAgent, match="unknown agent 'billing'"):
            if how == "prompt":
                await support.generate(session_id=sid, prompt="parcel?", auth=ALICE)
            else:
                policy: Literal["steer", "queue"] = "queue" if how == "queue" else "steer"
                await support.send(sid, "parcel?", principal=ALICE, turn_policy=policy)
        assert [await support.store.head(s) for s in sids] == heads
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        r = await rt.send(sid, "parcel?", principal=ALICE, turn_policy="queue")
        assert (r.status, r.text) == ("completed", "On its way.")
        assert ran == (["9"] if kind == "deadline" else [])


async def test_a_subagents_deadline_that_only_escalates_refuses_no_message_elsewhere(
    store_url: str,
) -> None:
    """A subagent's deadline that escalates its request leaves it open (and the mirror), as
    before the deadline: a process without the subagent's agent takes a steering message as it
    did before it passed, where it was refused with `UnknownAgent` until the subagent's process
    recorded the escalation."""

    @so.tool(approval=so.always(expires_in=60, on_timeout="escalate", escalate_to="managers"))
    def refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    billing = scripted_agent(
        "billing", [call_tools(call("refund", order_id="9")), reply("Refunded.")], tools=[refund]
    )
    support = scripted_agent(
        "support",
        [call_tools(call("billing", message="refund 9")), reply("Done.")],
        tools=[so.delegate("billing")],
    )
    clock = ManualClock()
    async with so.Runtime([support, billing], store=store_url, clock=clock) as rt:
        waiting = await rt.generate("support", "refund 9", auth=ALICE)
    clock.advance(61)
    async with so.Runtime([support], store=store_url, clock=clock) as alone:
        r = await alone.send(waiting.session_id, "parcel?", principal=ALICE, turn_policy="steer")
        assert (r.status, r.text, r.queued) == ("completed", "Done.", False)
