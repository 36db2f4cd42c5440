"""Approve pressed again in Slack once a quorum closed the request: each voter's answer stands,
so none is told "already closed"; anyone else is told who decided."""

from __future__ import annotations

import time
from pathlib import Path

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import SlackChannel
from signoff.testing import call, call_tools, reply, scripted_agent

from ._slack import TEAM, FakeSlack, channel, click, fake, manual, sign

__all__ = ["fake"]  # the fixture, used by name


async def _approve(slack: SlackChannel, request_id: str, user: str, n: int) -> None:
    """Approve pressed by `user`: press `n`, a delivery of its own."""
    action = {"action_id": "signoff.approve", "value": request_id, "type": "button"}
    body = click({**action, "action_ts": f"1700000100.00000{n}"}, user=user)
    assert await slack.handle(body, sign(body, int(time.time()))) is None
    await slack.idle()


async def test_a_voter_of_the_quorum_pressing_again_is_not_told_it_is_already_closed(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Two approvals needed: U0A's counts, U0B's closes it. Before, U0A pressing again was told
    "Request … is already closed: approved by …U0B", as if someone else had decided, though
    their own approval is part of the decision (only U0B, the last voter, was taken for a
    decider)."""
    runs: list[str] = []

    @so.tool(approval=so.always(approvers=2))
    async def deploy(env: str) -> str:
        """Deploy."""
        runs.append(env)
        return "deployed"

    agent = scripted_agent(
        "ops", [call_tools(call("deploy", env="prod")), reply("Deployed.")], tools=[deploy]
    )
    async with so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        (req,) = (await rt.generate("ops", prompt="Deploy")).pending
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            for n, user in enumerate(("U0A", "U0B", "U0A", "U0B", "U0C")):
                await _approve(slack, req.id, user, n)
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
    assert runs == ["prod"]
    assert [(e["user"], e["text"]) for e in fake.of("chat.postEphemeral")] == [
        ("U0A", "Your approval was counted (1 of 2)."),
        ("U0C", f"Request {req.id} is already closed: approved by slack:{TEAM}:U0B."),
    ]
