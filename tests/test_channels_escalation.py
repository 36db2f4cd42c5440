"""Escalations through the hub: each channel sees an escalated request once, as it now stands,
and a request moves between channels routed by group."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.channels import (
    Channel,
    ChannelHub,
    Escalation,
    Resolution,
)
from signoff.testing import ManualClock

from ._channels import BOB, Texts, escalating_refund, manual, three_refunds


class Watcher(Channel):
    """Notes what the hub tells it; `on_escalated` is the base class's unless `escalations`."""

    def __init__(self, *, escalations: bool = False, live_only: bool = True, **kw: Any) -> None:
        super().__init__(**kw)
        self.live_only = live_only
        self.escalations = escalations
        self.seen: list[tuple[Any, ...]] = []

    async def on_updated(self, request: so.InputRequest) -> None:
        self.seen.append(("updated", request.id, request.escalated_to, request.expires_at))

    async def on_escalated(self, request: so.InputRequest, escalation: Escalation) -> None:
        if not self.escalations:
            return await super().on_escalated(request, escalation)
        self.seen.append(("escalated", request.id, request.status, escalation))

    async def on_resolved(self, request: so.InputRequest, resolution: Resolution) -> None:
        self.seen.append((resolution.outcome, request.id))


async def test_an_escalation_reaches_each_channel_once_as_the_request_now_stands(
    store_url: str,
) -> None:
    """By default a channel shows the escalated request anew (`on_updated`: no deadline, the
    group named); one that overrides `on_escalated` is told the group, when and why. A request
    answered before the hub read its escalation is not shown again by a `live_only` channel."""
    clock = ManualClock()
    async with so.Runtime([escalating_refund()], store=store_url, clock=clock) as rt:
        shows = Watcher(name="shows")
        hears = Watcher(name="hears", escalations=True, live_only=False)
        async with manual(ChannelHub(rt, [shows, hears], clock=clock)) as hub:
            first = await rt.generate("support", prompt="Refund A-1")
            second = await rt.generate("support", prompt="Refund A-1 again")
            (a,), (b,) = first.pending, second.pending
            await hub.poll()
            clock.advance(61)
            assert await rt.expire_due() == 2
            answer = so.InputResponse(request_id=b.id, option_id="approve")
            await rt.respond(second.session_id, [answer], principal=BOB)
            await hub.poll()
            await hub.poll()
        at = {
            e.data["request_id"]: e.at
            for e in await rt.audit()
            if e.type == "approval.candidate" and e.data["outcome"] == "escalated"
        }
        assert shows.seen == [("updated", a.id, "finance", None), ("approved", b.id)]

        def told(request: so.InputRequest, session: str) -> Escalation:
            return Escalation(
                request_id=request.id,
                session_id=session,
                to="finance",
                at=at[request.id],
                reason="no one decided before the deadline",
            )

        *escalations, last = hears.seen  # the sweep escalates the two in either order
        assert sorted(escalations, key=lambda e: e[1] != a.id) == [
            ("escalated", a.id, "pending", told(a, first.session_id)),
            ("escalated", b.id, "settled", told(b, second.session_id)),
        ]
        assert last == ("approved", b.id)


class Opener(Watcher):
    """A `Watcher` that notes the requests it is told opened, too."""

    async def on_requested(self, request: so.InputRequest) -> None:
        self.seen.append(("requested", request.id, request.escalated_to))


async def test_an_escalation_moves_a_request_between_channels_routed_by_group(
    store_url: str,
) -> None:
    """A channel that takes only escalated requests for its group is handed the request as it
    opens for it there; the first-line channel that showed it is told of the escalation and of
    its close, though it no longer takes the request as it stands."""
    clock = ManualClock()
    async with so.Runtime([escalating_refund()], store=store_url, clock=clock) as rt:
        first = Opener(name="first", escalations=True, accepts=lambda r: r.escalated_to is None)
        finance = Opener(name="finance", accepts=lambda r: r.escalated_to == "finance")
        hooks = Opener(
            name="hooks",
            escalations=True,
            live_only=False,
            accepts=lambda r: r.escalated_to == "finance",
        )
        async with manual(ChannelHub(rt, [first, finance, hooks], clock=clock)) as hub:
            result = await rt.generate("support", prompt="Refund A-1")
            (a,) = result.pending
            await hub.poll()
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()
            answer = so.InputResponse(request_id=a.id, option_id="approve")
            await rt.respond(result.session_id, [answer], principal=BOB)
            await hub.poll()
        (escalation,) = [
            Escalation.from_event(e.data, a.model_copy(update={"escalated_to": "finance"}), e.at)
            for e in await rt.audit()
            if e.type == "approval.candidate" and e.data["outcome"] == "escalated"
        ]
        assert first.seen == [
            ("requested", a.id, None),
            ("escalated", a.id, "pending", escalation),
            ("approved", a.id),
        ]
        assert finance.seen == [("requested", a.id, "finance"), ("approved", a.id)]
        # not live_only: told of the escalation itself, as a receiver routing by group needs
        assert hooks.seen == [("escalated", a.id, "pending", escalation), ("approved", a.id)]


async def test_a_text_channel_says_where_the_request_it_shows_was_escalated(
    store_url: str,
) -> None:
    """The person reading texts learns the request they see went to the group; a channel that
    still takes it keeps it (a member of the group answers it there), one routed away from the
    group drops it and shows the next."""
    clock = ManualClock()
    runs: list[str] = []
    agents = [escalating_refund("billing"), three_refunds(runs)]
    async with so.Runtime(agents, store=store_url, clock=clock) as rt:
        everyone = Texts(name="everyone")
        first_line = Texts(name="first", accepts=lambda r: r.escalated_to is None)
        async with manual(ChannelHub(rt, [everyone, first_line], clock=clock)) as hub:
            result = await rt.generate("billing", prompt="Refund A-1")
            (a,) = result.pending
            await hub.poll()
            clock.advance(1)
            others = await rt.generate("support", prompt="Refund A, B and C")
            await hub.poll()
            assert everyone.sent == first_line.sent == [everyone.render(a)]
            clock.advance(60)
            assert await rt.expire_due() == 1
            await hub.poll()
            said = "issue_refund was escalated to finance (no one decided before the deadline)"
            assert everyone.sent[-1] == f"{said}."
            assert everyone.current is not None and everyone.current.id == a.id
            assert everyone.current.escalated_to == "finance"
            assert first_line.sent[-2:] == [
                f"{said}; it is no longer shown here.",
                first_line.render(others.pending[0]),
            ]
            assert "Escalated to finance" in everyone.render(everyone.current)
            outcome = await everyone.reply("yes", BOB)  # Bob answers for finance
            assert outcome is not None and outcome.outcome == "approved"
            assert everyone.sent[-1] == everyone.render(others.pending[0])
            await hub.poll()
            assert first_line.sent[-1] == first_line.render(others.pending[0])


async def test_an_escalation_read_after_the_sessions_ttl_passed_opens_nowhere(
    store_url: str,
) -> None:
    """An escalation the hub reads only after the session's TTL passed (the hub behind): the
    group's `live_only` channel was handed it as a request that opens there (Slack posted it
    with Approve and Deny), though an answer could only be refused (`SessionExpired`). As a
    request opening read late after that TTL is, it is not handed to that channel."""
    clock = ManualClock()
    agent = escalating_refund(limits=so.Limits(ttl=100))
    async with so.Runtime([agent], store=store_url, clock=clock) as rt:
        first = Opener(name="first", escalations=True, accepts=lambda r: r.escalated_to is None)
        finance = Opener(name="finance", accepts=lambda r: r.escalated_to == "finance")
        async with manual(ChannelHub(rt, [first, finance], clock=clock)) as hub:
            result = await rt.generate("support", prompt="Refund A-1")
            (a,) = result.pending
            await hub.poll()
            clock.advance(61)
            assert await rt.expire_due() == 1  # escalated to finance, the session lives on
            clock.advance(50)  # its TTL (100 s from its last activity) passes unrecorded
            await hub.poll()
            await hub.poll()
            answer = so.InputResponse(request_id=a.id, option_id="approve")
            with pytest.raises(so.SessionExpired):
                await rt.respond(result.session_id, [answer], principal=BOB)
            await hub.poll()
        assert ("requested", a.id, "finance") not in finance.seen
        assert first.seen[0] == ("requested", a.id, None)  # shown while the session lived
