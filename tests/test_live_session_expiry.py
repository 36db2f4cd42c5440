"""`LiveSession` and a session's TTL: once it passed, the session's requests take no answer,
and the live session shows them closed, as the queue leaves them out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import signoff as so
from signoff._live_session import LiveSession
from signoff._payloads import RemoteResult
from signoff.testing import ManualClock

from ._delegation import refund_desk
from .test_live_session_mirrors import Over
from .test_server_common import ALICE


class Counted(Over):
    """`Over`, counting the answers it sends."""

    sent = 0

    async def respond(
        self, session_id: str, responses: Sequence[so.InputResponse | Mapping[str, Any]]
    ) -> RemoteResult:
        self.sent += 1
        return await super().respond(session_id, responses)


def _expiring(ran: list[str], who: str) -> list[so.Agent]:
    """`refund_desk`, `who`'s sessions expiring after 60 idle seconds."""
    agents = refund_desk(so.always(), ran)
    for agent in agents:
        if agent.name == who:
            agent.limits = so.Limits(ttl=60)
    return agents


async def test_a_session_past_its_ttl_shows_its_requests_closed(store_url: str) -> None:
    """The session's TTL passed: its request was still offered; the answer sent got
    `SessionExpired`, which recorded the expiry, yet the request stayed open in the live view
    and the next answer went to the server again."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(_expiring(ran, "billing"), store=store_url, clock=clock) as rt:
        r = await rt.generate("billing", prompt="refund 9", auth=ALICE)
        (asked,) = r.pending
        remote = Counted(rt, ALICE)
        live = LiveSession(remote, r.session_id, clock=clock)
        await live.sync()
        clock.advance(59)
        assert [q.id for q in live.open_requests()] == [asked.id]
        clock.advance(1)
        assert await rt.pending(session_id=r.session_id) == []
        assert live.open_requests() == []
        assert (live.requests[asked.id].status, live.requests[asked.id].outcome) == (
            "expired",
            "expired",
        )
        with pytest.raises(so.SessionExpired) as expired:
            await live.respond([{"request_id": asked.id, "option_id": "approve"}])
        assert expired.value.pending == [asked.id]
        assert remote.sent == 0  # refused locally, as the server refuses it
        assert ran == []


async def test_an_answer_the_server_refuses_as_expired_catches_up(store_url: str) -> None:
    """The live session's clock lags the server's: the server refuses the answer with
    `SessionExpired` and records the expiry, which the live session then reads."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(_expiring(ran, "billing"), store=store_url, clock=clock) as rt:
        r = await rt.generate("billing", prompt="refund 9", auth=ALICE)
        (asked,) = r.pending
        live = LiveSession(Over(rt, ALICE), r.session_id, clock=lambda: 0.0)
        await live.sync()
        clock.advance(61)
        with pytest.raises(so.SessionExpired):
            await live.respond([{"request_id": asked.id, "option_id": "approve"}])
        assert live.open_requests() == []
        assert live.requests[asked.id].status == "expired"


async def test_a_mirror_whose_subagents_session_passed_its_ttl_shows_closed(
    store_url: str,
) -> None:
    """The subagent's session passed its TTL: the mirror can take no answer (the server refuses
    it with `RequestClosed`), yet the parent's live session showed it open."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(_expiring(ran, "billing"), store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        remote = Counted(rt, ALICE)
        live = LiveSession(remote, r.session_id, clock=clock)
        await live.sync()
        clock.advance(61)
        assert live.open_requests() == []
        with pytest.raises(so.RequestClosed):
            await live.respond([{"request_id": mirror.id, "option_id": "approve"}])
        assert remote.sent == 0
        assert ran == []


async def test_a_session_that_went_on_since_it_was_read_is_not_shown_expired() -> None:
    """The TTL counts from the session's last event: one the live session had not read yet
    (a vote counted elsewhere) kept the session alive, yet its request stayed `expired` for
    good once shown so, and an answer was refused locally with `SessionExpired`."""
    from .test_live_session import Remote, _asked

    def at(seq: int, kind: Any, when: float, data: dict[str, Any]) -> so.Event:
        return so.Event(session_id="s1", seq=seq, type=kind, at=when, turn_id="t1", data=data)

    created = at(1, "session.created", 1.0, {"agent": "support", "ttl": 60})
    remote = Remote([created, _asked(2, "r1")])
    now = [70.0]
    live = LiveSession(remote, "s1", clock=lambda: now[0])
    await live.sync()
    assert live.open_requests() == [] and live.requests["r1"].status == "expired"
    counted = {"request_id": "r1", "outcome": "counted", "by": {"principal_id": "bob"}}
    remote.log.append(at(3, "approval.candidate", 65.0, counted))
    await live.respond([{"request_id": "r1", "text": "order 7"}])  # it catches up first
    assert [[a.request_id for a in sent] for sent in remote.sent] == [["r1"]]
    assert live.requests["r1"].status == "responded"
    now[0] = 126.0
    with pytest.raises(so.SessionExpired):
        await live.respond([{"request_id": "r1", "text": "order 8"}])


async def test_a_subagents_late_spend_keeps_no_session_alive() -> None:
    """A parent's `subagent.spent` (the late count of a child's usage) is bookkeeping, which the
    server's TTL does not count from: the live session counted from it, and showed a request
    open up to a TTL after the server had expired it."""
    from .test_live_session import Remote, _asked

    def at(seq: int, kind: Any, when: float, data: dict[str, Any]) -> so.Event:
        return so.Event(session_id="s1", seq=seq, type=kind, at=when, turn_id="t1", data=data)

    spent = {"session_id": "ses_child", "delegated": so.Usage().model_dump()}
    log = [
        at(1, "session.created", 1.0, {"agent": "support", "ttl": 60}),
        _asked(2, "r1"),
        at(3, "subagent.spent", 50.0, spent),
    ]
    now = [62.0]
    live = LiveSession(Remote(log), "s1", clock=lambda: now[0])
    await live.sync()  # last active at 1.0 (`_state.SessionState` skips the spend too)
    assert live.open_requests() == [] and live.requests["r1"].status == "expired"


async def test_an_escalation_keeps_no_session_alive() -> None:
    """A deadline's escalation is no activity, which the server's TTL does not count from: the
    live session counted from it, and showed the request open up to a TTL after the server
    had expired the session."""
    from .test_live_session import Remote, _asked

    def at(seq: int, kind: Any, when: float, data: dict[str, Any]) -> so.Event:
        return so.Event(session_id="s1", seq=seq, type=kind, at=when, turn_id="t1", data=data)

    escalated = {"request_id": "r1", "outcome": "escalated", "to": "finance", "reason": "late"}
    log = [
        at(1, "session.created", 1.0, {"agent": "support", "ttl": 60}),
        _asked(2, "r1"),
        at(3, "approval.candidate", 50.0, escalated),
    ]
    now = [60.0]
    live = LiveSession(Remote(log), "s1", clock=lambda: now[0])
    await live.sync()
    assert live.requests["r1"].request.escalated_to == "finance"
    assert [q.id for q in live.open_requests()] == ["r1"]
    now[0] = 62.0  # last active at 1.0 (`_state.SessionState` skips the escalation too)
    assert live.open_requests() == [] and live.requests["r1"].status == "expired"
