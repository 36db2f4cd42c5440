"""Approve pressed again and again in Slack by someone the response policy refuses: each press is
told so, and the session's log records the refusal once. A press of (or reply to) a request
whose stored row is damaged is told so, once, and not tried again."""

from __future__ import annotations

import logging
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from signoff.channels import ChannelHub
from signoff.channels.slack import SlackChannel
from signoff.channels.slack._inbox import damaged_note

from ._slack import TEAM, FakeSlack, channel, click, fake, form, manual, refund_requested, sign
from ._slack_replies import FIRST_TS, deliver, event
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


async def test_a_press_or_reply_on_a_damaged_request_is_told_once_and_not_retried(
    tmp_path: Path, fake: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """A request whose stored row no longer decodes (a hand edit): Approve, Deny and a typed
    reply each read it (`StoreDamaged`), which the inbox took for a store down for a while: the
    work was left pending, tried again up to five times, each logged with its traceback, and
    the person told nothing. Each is now told it cannot be read, logged once, and done."""
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (_rt, req):
        slack = channel(fake)
        async with manual(ChannelHub(_rt, [slack])) as hub:
            await hub.poll()
            db = sqlite3.connect(tmp_path / "state.db")
            with db:
                db.execute("UPDATE requests SET data = ? WHERE id = ?", (b"{broken", req.id))
            db.close()
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                for n, action in enumerate(("signoff.approve", "signoff.deny")):
                    body = click(
                        {"action_id": action, "value": req.id, "type": "button"}, trigger=f"1.2.{n}"
                    )
                    assert await slack.handle(body, sign(body, int(time.time()))) is None
                    await slack.idle()
                assert await deliver(slack, event("approve")) is None
            assert [v.get("state") for _, v in slack.memos("click:")] == ["done", "done"]
            assert [v.get("state") for _, v in slack.memos("event:")] == ["done"]
    notes = [n["text"] for n in fake.of("chat.postEphemeral")]
    assert notes == [damaged_note(req.id)] * 3
    assert fake.of("views.open") == [] and log == []
    lines = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(lines) == 3, [r.getMessage() for r in lines]
    assert all("cannot be done" in r.getMessage() and r.exc_info is None for r in lines)
