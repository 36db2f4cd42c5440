"""Approve pressed again and again in Slack by someone the response policy refuses: each press is
told so, and the session's log records the refusal once."""

from __future__ import annotations

import time
from pathlib import Path

from signoff.channels.slack import SlackChannel

from ._slack import TEAM, FakeSlack, fake, form, sign
from ._slack_replies import FIRST_TS
from .test_slack_connect import CAROL_ONLY, IDENTIFY, PARTNER, U_MALLORY, guest
from .test_slack_identity import CORP, asked, notes

__all__ = ["fake"]

PRESSES = 6


async def press(slack: SlackChannel, rid: str, n: int) -> None:
    """Approve pressed by mallory, of the partner's workspace: press `n`, a delivery of its own."""
    payload = {
        "type": "block_actions",
        "user": {"id": U_MALLORY, "username": "mallory", "team_id": PARTNER},
        "team": {"id": TEAM, "domain": "acme"},
        "container": {"type": "message", "message_ts": FIRST_TS, "channel_id": "C42"},
        "channel": {"id": "C42", "name": "approvals"},
        "trigger_id": f"13345224609.738474920.{n:08d}",
        "actions": [{"action_id": "signoff.approve", "value": rid, "type": "button"}],
    }
    body = form(payload)
    assert await slack.handle(body, sign(body, int(time.time()))) is None
    await slack.idle()


async def test_presses_the_policy_refuses_record_one_refusal(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    fake.users[U_MALLORY] = guest(U_MALLORY, f"carol@{CORP}")
    runs: list[str] = []
    async with asked(store_url, tmp_path, fake, runs, CAROL_ONLY, identify=IDENTIFY) as (
        rt,
        req,
        slack,
        hub,
    ):
        head = await rt.store.head(req.session_id)
        assert head is not None
        for n in range(PRESSES):
            await press(slack, req.id, n)
            await hub.poll()
        added = [e.type async for e in rt.events(req.session_id, head, follow=False)]
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.status == "pending"
        assert await rt.verify_audit() == []
    assert added == ["approval.candidate", "approval.candidate", "turn.waiting"]
    assert runs == []
    told = notes(fake)
    assert len(told) == PRESSES
    assert all(n.startswith("Your answer was not accepted (rejected") for n in told)
