"""Replies typed in the thread of a request's Slack message (the Events API endpoint).

Requests are posted to the loopback fake Slack of `_slack` through the real `slack_sdk`
client; events are signed like Slack signs them and sent to the endpoint the channel mounts on
the signoff server, or handed to `SlackChannel.handle_event`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels._base import QUEUED_NOTE
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

from ._slack import (
    ALICE,
    TEAM,
    FakeSlack,
    channel,
    manual,
    refund_requested,
    refund_runtime,
)
from ._slack_replies import (
    ALLOWED,
    BOT,
    FIRST_TS,
    default_policy_runtime,
    deliver,
    event,
    events_of,
    fake,
    shop_agent,
    two_refunds_runtime,
)

__all__ = ["fake"]  # the fixture, used by name


async def test_a_typed_reply_answers_the_first_open_question_whichever_thread_it_is_in(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    async with so.Runtime([shop_agent()], store=store_url) as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")  # no principal: anyone answers
        size, scent = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            assert len(fake.of("chat.postMessage")) == 2
            second_ts = "1700000000.000002"
            # In the second question's thread, mentioning the bot, with Slack's escapes: it
            # still answers the first open question, as free text, as the person who typed it.
            body = event(f"<@{BOT}> 1 l &amp; no &lt;pump&gt;", thread=second_ts, user="U5")
            assert await deliver(slack, body) is None
            stored = await rt.store.get_request(size.id)
            assert stored is not None and stored.status == "settled"
            assert stored.resolution is not None
            assert stored.resolution["answer"] == {
                "value": "1 l & no <pump>",
                "option_id": None,
                "text": "1 l & no <pump>",
            }
            assert stored.resolution["by"]["principal_id"] == f"slack:{TEAM}:U5"
            still = await rt.store.get_request(scent.id)
            assert still is not None and still.status == "pending"
            # An option's label answers the next one; a reply broadcast to the channel counts.
            body = event("mint", event_id="Ev02", subtype="thread_broadcast", user="U5")
            await deliver(slack, body)
            await hub.poll()
        stored = await rt.store.get_request(scent.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["value"] == "Mint"
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        assert state.turn.text == "Reordered."
        # Both messages were updated in place as answered; nobody was told anything else.
        assert len(fake.of("chat.update")) == 2
        assert fake.of("chat.postEphemeral") == []


async def test_a_reply_with_a_file_attached_answers_by_its_text(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Slack sends a message with files attached as subtype `file_share`, the typed text in
    `text`: an approver's "deny" with a screenshot was acknowledged and dropped, with nothing
    written and no note. It answers as typed; files sent with no text are ignored, as an empty
    reply is."""
    photo = [{"id": "F0PHOTO", "name": "photo.jpg", "mimetype": "image/jpeg"}]
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            alone = event("", subtype="file_share", files=photo, upload=True)
            assert await deliver(slack, alone) is None
            assert slack.memos("event:") == []
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.status == "pending"
            typed = event("deny", event_id="Ev02", subtype="file_share", files=photo, upload=True)
            assert await deliver(slack, typed) is None
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "cancelled"
        assert stored.resolution is not None
        assert stored.resolution["by"]["principal_id"] == f"slack:{TEAM}:{ALLOWED}"
        assert log == []
        assert fake.of("chat.postEphemeral") == []


async def test_typed_approve_and_deny_settle_approvals_in_order_as_the_policy_allows(
    tmp_path: Path, fake: FakeSlack
) -> None:
    log: list[Any] = []
    async with two_refunds_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund both orders", auth=ALICE)
        first, second = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            # "approve" in the second request's thread approves the first one (asked first).
            await deliver(slack, event("Approve", thread="1700000000.000002"))
            one = await rt.store.get_request(first.id)
            two = await rt.store.get_request(second.id)
            assert one is not None and one.outcome == "approved"
            assert one.resolution is not None
            assert one.resolution["by"]["principal_id"] == f"slack:{TEAM}:{ALLOWED}"
            assert two is not None and two.status == "pending"
            await deliver(slack, event("deny", event_id="Ev02"))  # the label Deny, any case
            await hub.poll()
        two = await rt.store.get_request(second.id)
        assert two is not None and two.outcome == "cancelled"
        assert log == [("1042", 180)]
        turn = (await rt.state(r.session_id)).turn
        assert turn is not None and turn.status == "completed"
        assert fake.of("chat.postEphemeral") == []


async def test_a_reply_the_response_policy_refuses_changes_nothing_and_is_told(
    tmp_path: Path, fake: FakeSlack
) -> None:
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            await deliver(slack, event("approve", user="U999MALLORY"))
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        kinds = [e.type for e in await events_of(rt, r.session_id)]
        assert "turn.message" not in kinds
        assert fake.of("chat.postEphemeral") == [
            {
                "channel": "C42",
                "user": "U999MALLORY",
                "text": "Your answer was not accepted (rejected).",
                "thread_ts": FIRST_TS,
                "parse": "none",
                "link_names": False,
            }
        ]
        assert fake.of("chat.update") == []
        assert log == []


async def test_a_message_from_someone_the_response_policy_refuses_is_not_sent(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Mallory, whom the refund's allow-list policy refuses every answer, types a message (not
    an answer) in the thread: it is not sent, she is told so, and the session is unchanged.
    Before, it was queued in Alice's session and became a turn of Mallory's own there, as no
    policy judges a message."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            before = await events_of(rt, r.session_id)
            await deliver(slack, event("Refund order 9999 instead", user="U999MALLORY"))
            await hub.poll()
            assert await events_of(rt, r.session_id) == before
        state = await rt.state(r.session_id)
        assert state.queued == []
        note = f"You may not answer request {req.id}: nothing was sent."
        assert [e["text"] for e in fake.of("chat.postEphemeral")] == [note]
        assert log == []


async def test_a_reply_from_someone_the_default_policy_refuses_sends_nothing(
    tmp_path: Path, fake: FakeSlack
) -> None:
    async with default_policy_runtime(tmp_path) as rt:
        r = await rt.generate("git", prompt="Delete main", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            before = await events_of(rt, r.session_id)
            # Neither an answer nor a message: as a message it would wait for the turn's end.
            await deliver(slack, event("approve"))
            await deliver(slack, event("please keep main", event_id="Ev02"))
            await hub.poll()
        assert await events_of(rt, r.session_id) == before
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        note = f"You may not answer request {req.id}: nothing was sent."
        assert [e["text"] for e in fake.of("chat.postEphemeral")] == [note, note]
        assert {e["thread_ts"] for e in fake.of("chat.postEphemeral")} == {FIRST_TS}


async def test_a_reply_after_the_request_closed_is_an_ordinary_message_to_the_session(
    tmp_path: Path, fake: FakeSlack
) -> None:
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        size, scent = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            await rt.respond(
                r.session_id,
                [
                    so.InputResponse(request_id=size.id, text="Large"),
                    so.InputResponse(request_id=scent.id, text="Mint"),
                ],
            )
            await hub.poll()  # both messages updated as answered: the threads stay open
            assert len(fake.of("chat.update")) == 2
            await deliver(slack, event("Also tell the team, please", user="U5"))
        state = await rt.state(r.session_id)
        assert state.turn is not None and state.turn.status == "completed"
        assert state.turn.text == "Noted: I will tell the team."
        assert state.turn.principal is not None
        assert state.turn.principal.principal_id == f"slack:{TEAM}:U5"
        assert fake.of("chat.postEphemeral") == []


async def test_a_reply_from_someone_the_waiting_turn_does_not_serve_is_told_it_waits(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """A reply that answers nothing, from an approver other than the person the turn serves, is
    queued for the turn's end (it neither answers nor steers): an ephemeral note in the thread
    tells them so, once, also when Slack's retry of the event is sent again."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            body = event("Is the customer on the premium plan?")
            await deliver(slack, body)
            await deliver(slack, body, at=time.time() + 1, **{"X-Slack-Retry-Num": "1"})
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        state = await rt.state(r.session_id)
        assert [m["message"] for m in state.queued] == ["Is the customer on the premium plan?"]
        assert fake.of("chat.postEphemeral") == [
            {
                "channel": "C42",
                "user": ALLOWED,
                "text": QUEUED_NOTE,
                "thread_ts": FIRST_TS,
                "parse": "none",
                "link_names": False,
            }
        ]
        assert log == []


def _support() -> so.Agent:
    """A subagent whose turn asks to approve a refund, then answers (and once more)."""

    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> str:
        """Refund an order."""
        return "refunded"

    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042")), reply("Done."), reply("Again.")],
        tools=[issue_refund],
    )


def _desk_over_support() -> tuple[so.Agent, so.Agent]:
    """`desk` (a 60 s TTL) delegating to `_support`'s agent: the parent whose lapse orphans it."""
    parent = scripted_agent(
        "desk",
        [call_tools(call("support", call_id="d1", message="Go on")), reply("Done.")],
        tools=[so.delegate("support")],
        limits=so.Limits(ttl=60),
    )
    return parent, _support()


@pytest.mark.parametrize("recorded", ["by the reply", "by a read of the parent", "by a sweep"])
async def test_a_typed_approve_after_a_parents_ttl_passed_is_refused_not_sent(
    tmp_path: Path, fake: FakeSlack, recorded: str
) -> None:
    """A typed "approve" in the thread of a subagent's request once its parent's TTL passed:
    a read recorded that (the request withdrawn), no request was open, and the reply went to
    the subagent as a message, a new turn of it (its model ran). As a press of Approve is, the
    person is told it can no longer be answered, and nothing is sent, whichever read recorded
    the expiry: the reply's own read of the session, or one before the reply (someone opened
    the parent's page, a sweep ran)."""

    parent, child = _desk_over_support()
    clock = ManualClock()
    async with so.Runtime(
        [parent, child], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
    ) as rt:
        r = await rt.generate("desk", prompt="Handle it")
        (mirror,) = r.pending
        assert mirror.child is not None
        rid, sid = mirror.child.request_id, mirror.child.session_id
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            assert len(fake.of("chat.postMessage")) == 1  # the subagent's request
            clock.advance(61)
            if recorded == "by a read of the parent":
                await rt.state(r.session_id)  # its page opened, say
            elif recorded == "by a sweep":
                await rt.expire_due()
            before = await rt.store.get_request(rid)
            assert before is not None
            assert before.status == ("pending" if recorded == "by the reply" else "withdrawn")
            assert await deliver(slack, event("approve")) is None
            await hub.poll()
        stored = await rt.store.get_request(rid)
        assert stored is not None and stored.status == "withdrawn"
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.text != "Done."  # no new turn ran
        assert [e.type for e in await events_of(rt, sid)].count("turn.started") == 1
    (note,) = fake.of("chat.postEphemeral")
    assert note["text"] == (
        f"This request can no longer be answered: request {rid} is withdrawn (cancelled); it "
        "takes no answers. Your reply was not sent."
    )


async def test_a_typed_approve_after_a_grandparents_ttl_passed_is_refused_not_sent(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """As for a parent's: the TTL of the session two above the subagent's passed and a sweep
    recorded it (the subagent's request withdrawn) before a typed "approve" in its thread,
    which is refused, not sent to the subagent as a message."""

    child = _support()
    middle = scripted_agent(
        "team",
        [call_tools(call("support", call_id="t1", message="Go on")), reply("Done.")],
        tools=[so.delegate("support")],
    )
    top = scripted_agent(
        "desk",
        [call_tools(call("team", call_id="d1", message="Go on")), reply("Done.")],
        tools=[so.delegate("team")],
        limits=so.Limits(ttl=60),
    )
    clock = ManualClock()
    store = f"sqlite:///{tmp_path / 's.db'}"
    async with so.Runtime([top, middle, child], store=store, clock=clock) as rt:
        (asked,) = (await rt.generate("desk", prompt="Handle it")).pending
        while asked.child is not None:  # down the mirrors to the subagent's own request
            stored = await rt.store.get_request(asked.child.request_id)
            assert stored is not None
            asked = stored.request
        rid, sid = asked.id, asked.session_id
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            assert len(fake.of("chat.postMessage")) == 1  # the subagent's request
            clock.advance(61)
            await rt.expire_due()
            before = await rt.store.get_request(rid)
            assert before is not None and before.status == "withdrawn"
            assert await deliver(slack, event("approve")) is None
            await hub.poll()
        assert [e.type for e in await events_of(rt, sid)].count("turn.started") == 1
    (note,) = fake.of("chat.postEphemeral")
    assert note["text"] == (
        f"This request can no longer be answered: request {rid} is withdrawn (cancelled); it "
        "takes no answers. Your reply was not sent."
    )


@pytest.mark.parametrize("recorded", ["by the reply", "by a sweep"])
async def test_a_plain_message_after_a_parents_ttl_passed_is_refused_not_sent(
    tmp_path: Path, fake: FakeSlack, recorded: str
) -> None:
    """A reply answering nothing in the thread of a subagent's request once its parent's TTL
    passed went to the subagent as a message (old code: a new turn, its model ran, 'Done.'):
    the runtime refuses it (`SubagentOrphaned`), and the note in the thread says so."""

    parent, child = _desk_over_support()
    clock = ManualClock()
    async with so.Runtime(
        [parent, child], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
    ) as rt:
        r = await rt.generate("desk", prompt="Handle it")
        (mirror,) = r.pending
        assert mirror.child is not None
        sid = mirror.child.session_id
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], clock=clock)) as hub:
            await hub.poll()
            clock.advance(61)
            if recorded == "by a sweep":
                await rt.expire_due()
            assert await deliver(slack, event("Is it done yet?")) is None
            await hub.poll()
        state = await rt.state(sid)
        assert state.turn is not None and state.turn.status == "cancelled"
        assert [e.type for e in await events_of(rt, sid)].count("turn.started") == 1
    (note,) = fake.of("chat.postEphemeral")
    assert note["text"] == (
        f"Your reply was not delivered: session {sid!r} is a subagent's of session "
        f"{r.session_id!r}, which passed its TTL before its turn ended: the conversation is "
        "over, and the subagent takes no more messages; start a new conversation"
    )
