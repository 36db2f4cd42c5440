"""A Slack message that still shows a request open after it closed elsewhere: the hub gave up
updating it (Slack failed past `max_attempts`), and someone clicks it. The click is refused with
how the request closed and by whom, and the message is updated then, not only at the hub's next
start; a click that merely beats the hub's poll leaves the update to the hub (one update).

Requests are posted to the loopback fake Slack through the real slack_sdk client; clicks are
signed interactions handed to the channel."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import SlackChannel, slack_principal
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._slack import ALICE, APPROVERS, TEAM, FakeSlack, channel, click, fake, manual, sign, slack_api

__all__ = ["fake", "slack_api"]  # the fixtures, used by name

DECIDER = "U078JK9LM"  # on the allow list, approves from elsewhere
LATE = "U045EF6GH"  # on the allow list, clicks the stale message


def _runtime(store_url: str, log: list[Any]) -> so.Runtime:
    async def allow_listed(ctx: so.ResponseContext) -> Literal["allowed", "rejected"]:
        who = ctx.response.principal
        return "allowed" if who is not None and who.principal_id in APPROVERS else "rejected"

    @so.tool(approval=so.ApprovalSpec(request=so.always(), response=allow_listed))
    async def issue_refund(order_id: str) -> dict[str, Any]:
        """Refund an order."""
        log.append(order_id)
        return {"refunded": order_id}

    agent = scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042")), reply("Done.")],
        tools=[issue_refund],
    )
    return so.Runtime([agent], store=store_url)


async def _approved_elsewhere(rt: so.Runtime, session_id: str, rid: str) -> None:
    await rt.respond(
        session_id,
        [so.InputResponse(request_id=rid, option_id="approve")],
        principal=slack_principal(TEAM, DECIDER),
    )


async def _click(
    slack: SlackChannel, rid: str, trigger: str = "1.2.a", button: str = "approve"
) -> None:
    action = {"action_id": f"signoff.{button}", "value": rid, "type": "button"}
    body = click(action, user=LATE, trigger=trigger)  # another press: another trigger
    assert await slack.handle(body, sign(body, int(time.time()))) is None
    await slack.idle()


def _closed_note(rid: str) -> str:
    return f"Request {rid} is already closed: approved by slack:{TEAM}:{DECIDER}."


@pytest.mark.parametrize("button", ["approve", "deny"])
async def test_a_click_on_a_message_the_hub_gave_up_updating_updates_it(
    store_url: str, tmp_path: Path, slack_api: FakeSlack, button: str
) -> None:
    """Before, the message kept its Approve / Deny until the hub next started: each click got
    the note and nothing else. (Deny would open its reason's form: it says the request is no
    longer open instead.)"""
    log: list[Any] = []
    async with _runtime(store_url, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db", max_attempts=1)
        async with manual(hub):
            await hub.poll()
            slack_api.failing["chat.update"] = "internal_error"
            await _approved_elsewhere(rt, r.session_id, req.id)
            await hub.poll()  # given up: the message still offers Approve / Deny
            assert slack.recall(f"msg:{req.id}") is not None
            del slack_api.failing["chat.update"]
            await _click(slack, req.id, button=button)
            (note,) = slack_api.of("chat.postEphemeral")
            told = (
                _closed_note(req.id)
                if button == "approve"
                else f"Request {req.id} is no longer open."
            )
            assert (note["user"], note["text"]) == (LATE, told)
            assert slack_api.of("views.open") == []
            updates = slack_api.of("chat.update")
            assert len(updates) == 2  # the one given up on, then the click's
            assert updates[-1]["blocks"][-1]["block_id"] == "signoff.resolution"
            assert "actions" not in [b["type"] for b in updates[-1]["blocks"]]
            assert slack.recall(f"msg:{req.id}") is None
            await hub.poll()
            await _click(slack, req.id, "1.2.b", button)  # updated now: nothing more to do
            assert len(slack_api.of("chat.update")) == 2
        assert log == ["1042"]


async def test_a_click_that_beats_the_hubs_poll_leaves_the_update_to_the_hub(
    store_url: str, tmp_path: Path, slack_api: FakeSlack
) -> None:
    log: list[Any] = []
    async with _runtime(store_url, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db")
        async with manual(hub):
            await hub.poll()
            await _approved_elsewhere(rt, r.session_id, req.id)
            await _click(slack, req.id)
            assert [n["text"] for n in slack_api.of("chat.postEphemeral")] == [_closed_note(req.id)]
            assert slack_api.of("chat.update") == []
            await hub.poll()
            (update,) = slack_api.of("chat.update")
            assert update["blocks"][-1]["block_id"] == "signoff.resolution"
        assert log == ["1042"]


@pytest.mark.parametrize("lapsed", ["own", "parent"])
async def test_a_request_whose_ttl_passed_before_the_hub_read_it_is_not_posted(
    tmp_path: Path, fake: FakeSlack, lapsed: str
) -> None:
    """A request opened while the hub was down (its position saved), its session's TTL (or its
    parent's, for a subagent's request) passing before the hub is back: the hub read its
    opening entry and, its row still pending (nothing recorded the expiry), posted it with
    Approve and Deny, which could only be refused. As the start's listing leaves it out, it is
    not posted."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    ttl = so.Limits(ttl=60)
    child = scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042")), reply("Done.")],
        tools=[issue_refund],
        limits=ttl if lapsed == "own" else None,
    )
    parent = scripted_agent(
        "desk",
        [call_tools(call("support", call_id="d1", message="Go on")), reply("Done.")],
        tools=[so.delegate("support")],
        limits=ttl,
    )
    clock = ManualClock()
    store = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([parent, child], store=store, clock=clock) as rt:
        state = tmp_path / "hub.db"
        async with manual(ChannelHub(rt, [channel(fake)], state=state, clock=clock)) as hub:
            await hub.poll()  # its position saved
        if lapsed == "own":
            (req,) = (await rt.generate("support", prompt="Refund 1042")).pending
            rid = req.id
        else:
            (mirror,) = (await rt.generate("desk", prompt="Handle it")).pending
            assert mirror.child is not None
            rid = mirror.child.request_id
        clock.advance(61)
        async with manual(ChannelHub(rt, [channel(fake)], state=state, clock=clock)) as hub:
            await hub.poll()
            await hub.poll()
    assert fake.of("chat.postMessage") == [], rid
