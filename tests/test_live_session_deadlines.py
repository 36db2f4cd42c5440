"""`LiveSession` and deadlines: a request whose deadline passed shows as that leaves it (closed
as `expired`, or escalated) before anything records it, as the runtime's other readers show it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

import signoff as so
from signoff._live_session import LiveSession
from signoff._payloads import RemoteResult
from signoff.testing import ManualClock

from ._delegation import refund_desk
from ._server_api import in_process
from .test_live_session_mirrors import Over
from .test_server_common import ALICE

ESCALATING = so.always(expires_in=60, on_timeout="escalate", escalate_to="finance")


class Counted(Over):
    """`Over`, counting the answers it sends."""

    sent = 0

    async def respond(
        self, session_id: str, responses: Sequence[so.InputResponse | Mapping[str, Any]]
    ) -> RemoteResult:
        self.sent += 1
        return await super().respond(session_id, responses)


async def test_a_request_past_its_deadline_shows_closed_before_anything_records_it(
    store_url: str,
) -> None:
    """The deadline passed and no sweep ran yet: the live session still offered the request, and
    sent an answer the server could only refuse; `pending()` leaves it out."""
    clock = ManualClock()
    ran: list[str] = []
    desk = refund_desk(so.always(expires_in=60), ran)
    async with so.Runtime(desk, store=store_url, clock=clock) as rt:
        r = await rt.generate("billing", prompt="refund 9", auth=ALICE)
        (asked,) = r.pending
        remote = Counted(rt, ALICE)
        live = LiveSession(remote, r.session_id, clock=clock)
        await live.sync()
        assert [q.id for q in live.open_requests()] == [asked.id]
        clock.advance(61)
        assert live.open_requests() == []
        view = live.requests[asked.id]
        assert (view.status, view.outcome) == ("expired", "expired")
        with pytest.raises(so.RequestClosed, match="is expired"):
            await live.respond([{"request_id": asked.id, "option_id": "approve"}])
        assert remote.sent == 0  # refused locally
        assert await rt.pending(session_id=r.session_id) == []  # which records it
        await live.sync()  # the stream's record agrees
        view = live.requests[asked.id]
        assert (view.status, view.outcome) == ("expired", "expired")
        assert ran == []


async def test_a_request_whose_deadline_escalates_shows_escalated(store_url: str) -> None:
    """`on_timeout="escalate"`: the live session shows the group it goes to, and no deadline,
    as the queue does; it stays open for that group to answer."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(refund_desk(ESCALATING, ran), store=store_url, clock=clock) as rt:
        r = await rt.generate("billing", prompt="refund 9", auth=ALICE)
        (asked,) = r.pending
        live = LiveSession(Over(rt, ALICE), r.session_id, clock=clock)
        await live.sync()
        clock.advance(61)
        (shown,) = live.open_requests()
        (queued,) = await rt.pending(session_id=r.session_id)
        assert (shown.id, shown.escalated_to, shown.expires_at) == (asked.id, "finance", None)
        assert (queued.escalated_to, queued.expires_at) == ("finance", None)
        done = await live.respond([{"request_id": asked.id, "option_id": "approve"}])
        assert done.status == "completed" and ran == ["9"]


async def test_a_mirror_whose_subagents_deadline_passed_shows_closed(store_url: str) -> None:
    """The subagent's request passed its deadline (the mirror has none of its own): the
    parent's live session showed the mirror open, as though it had no deadline."""
    clock = ManualClock()
    ran: list[str] = []
    desk = refund_desk(so.always(expires_in=60), ran)
    async with so.Runtime(desk, store=store_url, clock=clock) as rt:
        r = await rt.generate("support", prompt="refund 9", auth=ALICE)
        (mirror,) = r.pending
        live = LiveSession(Over(rt, ALICE), r.session_id, clock=clock)
        await live.sync()
        assert [q.expires_at for q in live.open_requests()] == [clock.now + 60]
        clock.advance(61)
        assert live.open_requests() == []
        assert live.requests[mirror.id].status == "expired"
        with pytest.raises(so.RequestClosed):
            await live.respond([{"request_id": mirror.id, "option_id": "approve"}])
        assert ran == []


async def test_an_answer_to_an_expired_request_says_so_once(store_url: str) -> None:
    """An answer to a request past its deadline said `is expired (expired)`, the outcome
    repeating the status: the runtime and the live session say it once, with the same code."""
    clock = ManualClock()
    ran: list[str] = []
    async with so.Runtime(
        refund_desk(so.always(expires_in=60), ran), store=store_url, clock=clock
    ) as rt:
        r = await rt.generate("billing", prompt="refund 9", auth=ALICE)
        (asked,) = r.pending
        live = LiveSession(Counted(rt, ALICE), r.session_id, clock=clock)
        await live.sync()
        clock.advance(61)
        said = f"request {asked.id} is expired; it takes no answers"
        with pytest.raises(so.RequestClosed) as local:
            await live.respond([{"request_id": asked.id, "option_id": "approve"}])
        assert (str(local.value), local.value.code) == (said, "request_closed")
        assert await rt.pending(session_id=r.session_id) == []  # which records it
        answer = so.InputResponse(request_id=asked.id, option_id="approve")
        with pytest.raises(so.RequestClosed) as remote:
            await rt.respond(r.session_id, [answer], principal=ALICE)
        assert (str(remote.value), remote.value.code) == (said, "request_closed")
        assert ran == []


async def test_an_answer_to_a_call_its_deadline_approved_says_it_ran(store_url: str) -> None:
    """`on_timeout="approve"`: the deadline approved the call, which ran, yet a late answer was
    told `request … is expired; it takes no answers`, as for a call its deadline denied. The
    runtime, the live session (before and after the stream records it) and the HTTP API's 409
    `request_closed` say it was approved automatically."""
    clock = ManualClock()
    ran: list[str] = []
    approving = so.always(expires_in=60, on_timeout="approve")
    async with so.Runtime(refund_desk(approving, ran), store=store_url, clock=clock) as rt:
        r = await rt.generate("billing", prompt="refund 9", auth=ALICE)
        (asked,) = r.pending
        live = LiveSession(Counted(rt, ALICE), r.session_id, clock=clock)
        await live.sync()
        clock.advance(61)
        said = (
            f"request {asked.id} was approved automatically when its deadline passed "
            "(on_timeout='approve'); it takes no answers"
        )
        answer = {"request_id": asked.id, "option_id": "approve"}
        with pytest.raises(so.RequestClosed) as local:
            await live.respond([answer])
        assert (str(local.value), local.value.code) == (said, "request_closed")
        assert await rt.pending(session_id=r.session_id) == []  # which records it
        assert ran == ["9"]
        with pytest.raises(so.RequestClosed) as remote:
            await rt.respond(r.session_id, [answer], principal=ALICE)
        assert (str(remote.value), remote.value.code) == (said, "request_closed")
        await live.sync()  # as the stream recorded it
        assert live.requests[asked.id].on_timeout == "approve"
        with pytest.raises(so.RequestClosed) as recorded:
            await live.respond([answer])
        assert str(recorded.value) == said
        async with in_process(rt) as c:
            given = {"inputResponses": [{"requestId": asked.id, "optionId": "approve"}]}
            refused = await c.post(f"/v1/sessions/{r.session_id}/responses", json=given)
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "request_closed"
        assert refused.json()["error"]["message"] == said
        assert ran == ["9"]
