"""Escalations delivered by webhook: once, signed, retried with the same delivery id, and sent
again after a restart."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import (
    ChannelHub,
    WebhookChannel,
    verify_webhook,
)
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from .test_webhooks import SECRET, Receiver, manual

# -- escalations ---------------------------------------------------------------------------------

FIONA = so.Principal(authenticator="sso", principal_id="fiona", attributes={"groups": ["finance"]})
TIMED_OUT = "no one decided before the deadline"


def finance_when_escalated(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    """Once escalated, members of the group it went to may answer."""
    who = ctx.response.principal
    group = ctx.request.escalated_to
    if group is not None and who is not None and group in who.attributes.get("groups", []):
        return so.Allowed()
    return so.Rejected("not in the group this was escalated to")


def escalating_agent() -> so.Agent:
    spec = so.ApprovalSpec(
        request=so.always(),
        response=finance_when_escalated,
        expires_in=60,
        on_timeout="escalate",
        escalate_to="finance",
    )

    @so.tool(approval=spec)
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": amount}

    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042", amount=180)), reply("Done.")],
        tools=[issue_refund],
    )


async def escalated_at(rt: so.Runtime, request_id: str) -> float:
    (entry,) = [
        e
        for e in await rt.audit()
        if e.type == "approval.candidate"
        and e.data["outcome"] == "escalated"
        and e.data["request_id"] == request_id
    ]
    return entry.at


@pytest.mark.parametrize("applied_by", ["sweep", "listing", "answer"])
async def test_an_escalation_is_delivered_once_signed_whichever_process_applies_it(
    store_url: str, applied_by: str
) -> None:
    """The hub's runtime never looks at the request: another process applies the passed deadline
    (a worker's sweep, a listing of the queue, or the answer of the group it went to), and the
    receiver is told once, with the group, when, and the request as stored by then."""
    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime([escalating_agent()], store=store_url, clock=clock) as rt,
        so.Runtime([escalating_agent()], store=store_url, clock=clock) as other,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=0, clock=clock)
        async with manual(ChannelHub(rt, [hooks], clock=clock)) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            (req,) = r.pending
            await hub.poll()
            clock.advance(61)
            await hub.poll()  # the deadline passed, but no one has applied it yet
            await hooks.drain()
            assert [json.loads(b)["type"] for _, b in receiver.accepted] == ["request.opened"]
            if applied_by == "sweep":
                assert await other.expire_due() == 1
            elif applied_by == "listing":
                assert [q.id for q in await other.pending()] == [req.id]
            else:
                answer = so.InputResponse(request_id=req.id, option_id="approve")
                done = await other.respond(r.session_id, [answer], principal=FIONA)
                assert done.status == "completed"
            await hub.poll()
            await hub.poll()  # read again: nothing new, nothing sent twice
            assert await other.expire_due() == 0
            await hooks.drain()
        at = await escalated_at(rt, req.id)
        stored = await rt.store.get_request(req.id)
        assert stored is not None
    payloads = [verify_webhook(SECRET, h, b, now=clock.now) for h, b in receiver.accepted]
    expected = ["request.opened", "request.escalated"]
    if applied_by == "answer":
        expected.append("request.resolved")
    assert [p["type"] for p in payloads] == expected
    headers, _ = receiver.accepted[1]
    escalated = payloads[1]
    assert headers["Signoff-Event"] == "request.escalated"
    assert headers["Signoff-Delivery"] == escalated["id"]
    assert escalated["escalation"] == {
        "request_id": req.id,
        "session_id": r.session_id,
        "to": "finance",
        "at": at,
        "reason": TIMED_OUT,
    }
    assert escalated["resolution"] is None
    # the request as stored when the hub read the escalation: the group named, no deadline
    assert escalated["request"] == stored.request.model_dump(mode="json")
    assert escalated["request"]["escalated_to"] == "finance"
    assert escalated["request"]["expires_at"] is None
    assert escalated["request"]["status"] == ("settled" if applied_by == "answer" else "pending")
    assert payloads[0]["escalation"] is None  # every event has the same keys
    assert len({p["id"] for p in payloads}) == len(payloads)


async def test_an_escalation_the_receiver_fails_is_retried_with_the_same_delivery_id(
    tmp_path: Path,
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime([escalating_agent()], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt,
    ):
        hooks = WebhookChannel(
            receiver.url, SECRET, expiring_within=0, backoff=0.25, sleep=sleep, clock=clock
        )
        async with manual(ChannelHub(rt, [hooks], clock=clock)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            receiver.statuses = [503, (429, {"Retry-After": "2"})]
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()
            await hooks.drain()
    assert slept == [0.25, 2.0]  # backoff, then the receiver's Retry-After
    tried = [h for h, _ in receiver.attempts if h["Signoff-Event"] == "request.escalated"]
    assert len(tried) == 3
    opened, escalated = (verify_webhook(SECRET, h, b, now=clock.now) for h, b in receiver.accepted)
    assert (opened["type"], escalated["type"]) == ("request.opened", "request.escalated")
    assert escalated["escalation"]["to"] == "finance"
    assert {h["Signoff-Delivery"] for h in tried} == {escalated["id"]}
    assert (hooks.delivered, hooks.failed) == (2, 0)


async def test_an_escalation_given_up_on_is_sent_again_when_the_hub_next_starts(
    tmp_path: Path,
) -> None:
    async def sleep(seconds: float) -> None:
        return None

    clock = ManualClock()
    state = tmp_path / "hub.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime([escalating_agent()], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt,
    ):
        hooks = WebhookChannel(
            receiver.url, SECRET, expiring_within=0, max_attempts=2, sleep=sleep, clock=clock
        )
        async with manual(ChannelHub(rt, [hooks], state=state, clock=clock)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            receiver.statuses = [503, 503]
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()
            await hooks.drain()
        assert (hooks.delivered, hooks.failed) == (1, 1)
        for _ in range(2):  # sent on the first start after, not again on the second
            again = WebhookChannel(receiver.url, SECRET, sleep=sleep, clock=clock)
            async with manual(ChannelHub(rt, [again], state=state, clock=clock)) as hub:
                await hub.poll()  # the trail holds nothing new for it
                await asyncio.wait_for(again.drain(), 10)
    payloads = [verify_webhook(SECRET, h, b, now=clock.now) for h, b in receiver.accepted]
    assert [p["type"] for p in payloads] == ["request.opened", "request.escalated"]
    tried = [h for h, _ in receiver.attempts if h["Signoff-Event"] == "request.escalated"]
    assert len(tried) == 3  # two given up on, then the one the next start sent
    assert {h["Signoff-Delivery"] for h in tried} == {payloads[1]["id"]}
