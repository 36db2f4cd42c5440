"""The requester four eyes excludes from approving their own call, typing in its Slack thread:
as through `Runtime.send` (tests/test_steer_excluded.py), their "cancel" and other messages
steer the turn they started, and only their approve is refused, with a note saying why.

Requests are posted to the loopback fake Slack through the real slack_sdk client; the replies
are signed Events API deliveries handed to the channel."""

from __future__ import annotations

from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import slack_principal
from signoff.testing import (
    Capture,
    ExecutionLog,
    call,
    call_tools,
    reply,
    scripted_agent,
    store_contents,
)

from ._slack import TEAM, FakeSlack, channel, manual
from ._slack_replies import deliver, event, fake

__all__ = ["fake"]  # the fixture, used by name

REQUESTER = "U0ALICE"
OTHER = "U0BOB"

FOUR_EYES = {
    "one-approver": so.always(exclude_requester=True),
    "quorum": so.always(approvers=2, exclude_requester=True),
}


def _deploy_agent(log: ExecutionLog, approval: Any, seen: Capture) -> so.Agent:
    @log.tool(approval=approval)
    async def deploy(service: str) -> str:
        """Deploy a service to production."""
        return f"{service} live"

    return scripted_agent("ops", [call_tools(call("deploy", service="api")), seen], tools=[deploy])


@pytest.mark.parametrize("approval", list(FOUR_EYES.values()), ids=list(FOUR_EYES))
async def test_the_excluded_requester_steers_from_the_thread_and_only_their_approve_is_refused(
    store_url: str, fake: FakeSlack, approval: Any
) -> None:
    """Alice started the turn from Slack; four eyes bars her from approving her own deploy. Any
    reply of hers in the request's thread was refused ("You may not answer ...: nothing was
    sent"), where `send` lets her cancel or steer: now "never mind" and "cancel" withdraw the
    approval and reach the model, and "approve" is refused with the reason, nothing stored."""
    log = ExecutionLog()
    seen = Capture(reply("Not deploying."))
    alice = slack_principal(TEAM, REQUESTER)
    async with so.Runtime([_deploy_agent(log, approval, seen)], store=store_url) as rt:
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            r = await rt.generate("ops", prompt="deploy api", auth=alice)
            (req,) = r.pending
            await hub.poll()
            ts = slack.recall(f"msg:{req.id}")["ts"]
            before = await store_contents(rt.store, r.session_id)
            await deliver(slack, event("approve", thread=ts, user=REQUESTER, event_id="Ev1"))
            assert await store_contents(rt.store, r.session_id) == before
            (note,) = fake.of("chat.postEphemeral")
            assert (note["user"], note["thread_ts"]) == (REQUESTER, ts)
            assert note["text"] == (
                f"Your reply was not delivered: request {req.id}: the requester may not "
                "approve their own call"
            )
            for n, text in enumerate(("never mind", "cancel")):
                if n:  # a new turn, a new approval and its message
                    r = await rt.generate("ops", prompt="deploy api", auth=alice)
                    (req,) = r.pending
                    await hub.poll()
                    ts = slack.recall(f"msg:{req.id}")["ts"]
                await deliver(slack, event(text, thread=ts, user=REQUESTER, event_id=f"Ev{n}x"))
                stored = await rt.store.get_request(req.id)
                assert stored is not None
                assert (stored.status, stored.outcome) == ("withdrawn", "ignored")
                state = await rt.state(r.session_id)
                assert state.turn is not None and state.turn.status == "completed"
                last = seen.last[-1] if seen.last else None
                assert isinstance(last, so.UserMessage) and last.text == text
                await hub.poll()
            assert len(fake.of("chat.postEphemeral")) == 1  # no note for what steered
            # Someone eligible who types "cancel" denies it, as before.
            r = await rt.generate("ops", prompt="deploy api", auth=alice)
            (req,) = r.pending
            await hub.poll()
            ts = slack.recall(f"msg:{req.id}")["ts"]
            await deliver(slack, event("cancel", thread=ts, user=OTHER, event_id="Ev9"))
            stored = await rt.store.get_request(req.id)
            assert stored is not None and stored.outcome == "cancelled"
            assert stored.resolution is not None
            assert stored.resolution["by"]["principal_id"] == f"slack:{TEAM}:{OTHER}"
        assert log.count() == 0


async def test_someone_else_than_the_person_the_turn_serves_still_needs_the_right_to_answer(
    store_url: str, fake: FakeSlack
) -> None:
    """The thread stays closed to a bystander: a requester's own turn is theirs to steer, but
    someone who may not answer the request (the default policy: only the requester) and whom
    the turn does not serve sends nothing."""
    log = ExecutionLog()
    seen = Capture(reply("Not deploying."))
    alice = slack_principal(TEAM, REQUESTER)
    async with so.Runtime([_deploy_agent(log, so.always(), seen)], store=store_url) as rt:
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack])) as hub:
            r = await rt.generate("ops", prompt="deploy api", auth=alice)
            (req,) = r.pending
            await hub.poll()
            before = await store_contents(rt.store, r.session_id)
            await deliver(slack, event("never mind", user=OTHER, event_id="Ev1"))
            assert await store_contents(rt.store, r.session_id) == before
            (note,) = fake.of("chat.postEphemeral")
            assert note["text"] == f"You may not answer request {req.id}: nothing was sent."
        assert log.count() == 0
