"""Hubs sharing a channel state: every one answers Slack's interactions, one delivers. The hub
that takes over delivery acts on the interactions no live process is acting on (those a dead one
left), not on one another hub's channel is acting on now."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import signoff as so
from signoff.channels import ChannelHub, ChannelState
from signoff.channels.slack import SlackChannel

from ._slack import FakeSlack, channel, click, fake, sign
from .test_slack_clicks import refund_asked

__all__ = ["fake"]  # the fixture, used by name


async def test_a_hub_taking_over_does_not_act_again_on_a_click_a_standby_is_acting_on(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Three hubs on one state file: the standby that took a press of Deny is opening its form
    (Slack slow to answer) when the delivering hub stops; the other standby takes over and does
    not open the form a second time (Slack would refuse the used trigger, and the person be told
    to press again over an open form)."""
    records = str(tmp_path / "runs.jsonl")
    async with refund_asked(tmp_path, records) as (rt, req):
        state = tmp_path / "hub.db"
        slacks = [channel(fake) for _ in range(3)]
        one, two, three = (ChannelHub(rt, [s], state=state) for s in slacks)
        for hub in (one, two, three):
            await hub.start(follow=False)
        try:
            await one.poll()
            assert one.active and not two.active and not three.active
            fake.slow["views.open"] = 2.0  # Slack answers once the hub took over
            press = click({"action_id": "signoff.deny", "value": req.id, "type": "button"})
            assert await slacks[2].handle(press, sign(press, int(time.time()))) is None
            async with asyncio.timeout(10):
                while not fake.of("views.open"):  # the standby is opening the form
                    await asyncio.sleep(0.01)
            await one.stop()
            await two.poll()
            assert two.active
            await slacks[1].idle()
            await slacks[2].idle()
            assert len(fake.of("views.open")) == 1
            assert fake.of("chat.postEphemeral") == []
            ((_, memo),) = slacks[1].memos("click:")
            assert memo["state"] == "done"
        finally:
            for hub in (one, two, three):
                await hub.stop()


async def test_clicks_saved_at_once_in_worker_threads_share_one_presence(tmp_path: Path) -> None:
    """Saves run in worker threads, two clicks' at once: both take the channel's one token (a
    second lock taken on its file would fail as held elsewhere, and the click get a 503)."""
    slack = SlackChannel("C42", token="xoxb-test", signing_secret="secret")
    state = ChannelState(tmp_path / "hub.db")
    try:
        async with so.Runtime([], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
            slack.bind(rt, state, hub="hub")
            start = threading.Barrier(4, timeout=10)  # the default executor runs 5 at least

            def take() -> str:
                start.wait()
                return slack.owner()

            tokens = await asyncio.gather(*(asyncio.to_thread(take) for _ in range(4)))
            assert len(set(tokens)) == 1
            assert not slack.elsewhere(tokens[0])  # its own
            other = SlackChannel("C42", token="xoxb-test", signing_secret="secret")
            other.bind(rt, ChannelState(tmp_path / "hub.db"), hub="hub")
            assert other.elsewhere(tokens[0])  # held: another object's work is left to it
            await slack.close()
            assert not other.elsewhere(tokens[0])  # let go: taken up
            other.state.close()
    finally:
        state.close()
