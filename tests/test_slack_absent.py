"""A bot that cannot reach its channel (someone removed it, or archived the channel): the
requests that open and close meanwhile wait, in order, and reach Slack once it is back,
instead of being given up on one by one until the hub next starts."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import _channel, slack_principal

from ._slack import ALICE, HISTORY, TEAM, FakeSlack, channel, manual, refund_runtime, slack_api

__all__ = ["slack_api"]  # the fixture, used by name


@pytest.mark.parametrize("error", ["not_in_channel", "channel_not_found", "is_archived"])
async def test_a_bot_removed_from_the_channel_posts_what_opened_meanwhile_once_back(
    tmp_path: Path,
    slack_api: FakeSlack,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: str,
) -> None:
    """Posts and updates Slack refuses because the bot is out of its channel are tried again
    every `ABSENT_WAIT` seconds without spending the hub's attempts (here one, with an hour's
    backoff): once the bot is invited back, what opened meanwhile is posted, in order, once,
    and what closed meanwhile is updated."""
    monkeypatch.setattr(_channel, "ABSENT_WAIT", 0.2)
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db", retry_backoff=3600, max_attempts=1)
        async with manual(hub):
            slack_api.failing["chat.postMessage"] = error  # removed from the channel
            first = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            second = await rt.generate("support", prompt="Refund order 1043", auth=ALICE)
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                await hub.poll()
                await hub.poll()
            assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
            assert any(error in r.getMessage() for r in caplog.records)
            del slack_api.failing["chat.postMessage"]  # invited back
            await asyncio.sleep(0.25)
            await hub.poll()
            posted = [json.dumps(p["blocks"]) for p in slack_api.of("chat.postMessage")]
            # The refused post, then both, in order.
            assert [first.pending[0].id in p for p in posted] == [True, True, False]
            assert second.pending[0].id in posted[2]
            # Removed again while the first closes: its message is updated once back.
            slack_api.failing["chat.update"] = error
            await rt.respond(
                first.session_id,
                [so.InputResponse(request_id=first.pending[0].id, option_id="cancel")],
                principal=slack_principal(TEAM, "U078JK9LM"),
            )
            await hub.poll()
            del slack_api.failing["chat.update"]
            await asyncio.sleep(0.25)
            await hub.poll()
            updates = slack_api.of("chat.update")
            assert len(updates) == 2 and updates[0] == updates[1]
            assert updates[1]["blocks"][-1]["block_id"] == "signoff.resolution"
            assert slack.recall(f"msg:{first.pending[0].id}") is None


async def test_a_lost_post_whose_history_read_finds_the_bot_removed_is_adopted_once_back(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A post Slack carried out but answered with a gateway's 504, then the history read that
    looks for it fails once (a 503) and next finds the bot removed (`not_in_channel`): the
    request was posted again at once, its new attempt's memo replaced the first one's and was
    dropped when that post was refused too, so once the bot was back the request was posted a
    second time. The lookup waits for the bot instead, and its message is adopted."""
    monkeypatch.setattr(_channel, "ABSENT_WAIT", 0.2)
    slack_api.real_ts = True  # the lookup reads the attempt's time window
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db", retry_backoff=0)
        async with manual(hub):
            slack_api.lost["chat.postMessage"] = 1
            r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            (req,) = r.pending
            await hub.poll()  # posted; the answer lost
            assert len(slack_api.messages["C42"]) == 1
            slack_api.down[HISTORY] = 1  # the lookup fails once...
            slack_api.failing[HISTORY] = "not_in_channel"  # ... then the bot is removed
            slack_api.failing["chat.postMessage"] = "not_in_channel"
            await hub.poll()
            await hub.poll()
            assert slack_api.down[HISTORY] == 0 and len(slack_api.of(HISTORY)) == 2
            del slack_api.failing[HISTORY], slack_api.failing["chat.postMessage"]  # back
            await asyncio.sleep(0.25)
            await hub.poll()
            (message,) = slack_api.messages["C42"]
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
            assert slack.recall(f"posting:{req.id}") is None


async def test_a_bot_out_of_its_channel_is_logged_as_such_not_as_a_rate_limit(
    tmp_path: Path,
    slack_api: FakeSlack,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The wait for a bot removed from its channel reused the rate limit's signal, so the hub
    (and the posting of what was open at start) logged "rate limited": a person reading the
    log was not told to invite the bot. Both now say the channel cannot be reached and what to
    do, and the requests wait as before, spending no attempt (here one, an hour's backoff)."""
    monkeypatch.setattr(_channel, "ABSENT_WAIT", 0.2)
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db", retry_backoff=3600, max_attempts=1)
        slack_api.failing["chat.postMessage"] = "not_in_channel"
        before = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            async with manual(hub):  # the backlog: open at start
                after = await rt.generate("support", prompt="Refund order 1043", auth=ALICE)
                await asyncio.sleep(0.25)
                await hub.poll()  # the feed
                lines = [r.getMessage() for r in caplog.records]
                assert not [line for line in lines if "rate limited" in line], lines
                told = [line for line in lines if "invite the bot" in line]
                assert any(before.pending[0].id in line for line in told), lines
                assert any("audit entry" in line for line in told), lines
                assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
                del slack_api.failing["chat.postMessage"]
                await asyncio.sleep(0.25)
                await hub.poll()
                posted = [json.dumps(p["blocks"]) for p in slack_api.of("chat.postMessage")]
                last = posted[-2:]  # once each, now the bot is back
                assert [before.pending[0].id in p for p in last].count(True) == 1
                assert [after.pending[0].id in p for p in last].count(True) == 1
