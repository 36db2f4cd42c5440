"""The entries a hub gave a channel up on (it failed on each `max_attempts` times) are delivered
again while the hub runs, every `REDO_EVERY` seconds, not only when it next starts: a service
down for a few minutes must not leave the approvals opened meanwhile unshown until a restart.
A round stops at the first entry that fails again (the service is still down) rather than
holding the hub's poll, and the other channels, through one failure per entry."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels import _given_up as given_up
from signoff.testing import call, call_tools, reply, scripted_agent

from ._channels import manual
from ._slack import ALICE, FakeSlack, channel, slack_api
from .test_channels_hub import Flaky

__all__ = ["slack_api"]  # the fixture, used by name


def _refund(runs: list[str]) -> so.Agent:
    @so.tool(approval=so.always())
    async def issue_refund(order_id: str) -> dict[str, Any]:
        """Refund an order."""
        runs.append(order_id)
        return {"refunded": order_id}

    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="A-1")), reply("Done.")],
        tools=[issue_refund],
    )


async def test_entries_given_up_on_are_delivered_again_while_the_hub_runs(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "hub.db"
    async with so.Runtime([_refund([])], store=store_url) as rt:
        down = Flaky(3)
        async with manual(ChannelHub(rt, [down], state=state, max_attempts=1)) as hub:
            first = (await rt.generate("support", prompt="Refund A")).pending[0]
            second = (await rt.generate("support", prompt="Refund B")).pending[0]
            await hub.poll()  # both given up on
            assert (down.attempts, down.seen) == (2, [])
            await hub.poll()
            assert down.attempts == 2  # not before `REDO_EVERY` has passed
            monkeypatch.setattr(given_up, "REDO_EVERY", 0.0)
            await hub.poll()  # still down: the round stops at the first entry
            assert (down.attempts, down.seen) == (3, [])
            await hub.poll()  # back
            assert down.seen == [("requested", first.id), ("requested", second.id)]
            await hub.poll()
            assert down.attempts == 5  # nothing twice
        again = Flaky(0)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
        assert again.seen == []  # not at the next start either


async def test_a_slack_post_given_up_on_is_posted_once_slack_is_back_without_a_restart(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before, the approval stayed unposted (nobody in Slack could see it) until the hub's next
    start, however long the server ran on."""
    monkeypatch.setattr(given_up, "REDO_EVERY", 0.2)
    async with so.Runtime([_refund([])], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db", max_attempts=1)
        async with manual(hub):
            slack_api.down["chat.postMessage"] = 1  # a 503: Slack took nothing
            req = (await rt.generate("support", prompt="Refund A", auth=ALICE)).pending[0]
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") is None
            await asyncio.sleep(0.3)
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") is not None
            (_, post) = slack_api.of("chat.postMessage")
            assert post["metadata"]["event_payload"]["request_id"] == req.id
            await hub.poll()
        assert len(slack_api.of("chat.postMessage")) == 2
