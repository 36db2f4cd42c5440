"""A bot token Slack refuses (revoked, invalid, expired, deactivated, denied) or one lacking a
scope: it was retried as any failure, each request given up on in turn (an error line per try,
no word on what to do) until the hub's next round. Now the channel's requests wait, in order,
without spending the hub's attempts, one error line says what is wrong and what to do (never
the token), and they are delivered once Slack takes the token again or the hub restarts."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import _token, slack_principal

from ._slack import ALICE, HISTORY, TEAM, FakeSlack, channel, manual, refund_runtime, slack_api

__all__ = ["slack_api"]  # the fixture, used by name

TOKEN_ERRORS = [
    "token_revoked",
    "invalid_auth",
    "account_inactive",
    "not_authed",
    "token_expired",
    "ekm_access_denied",
    "org_login_required",
    "missing_scope",
]


def _posted(slack_api: FakeSlack) -> list[str]:
    return [json.dumps(p["blocks"]) for p in slack_api.of("chat.postMessage")]


@pytest.mark.parametrize("error", TOKEN_ERRORS)
async def test_a_token_slack_refuses_holds_the_requests_and_is_logged_once_with_what_to_do(
    tmp_path: Path,
    slack_api: FakeSlack,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    error: str,
) -> None:
    """Posts and updates Slack refuses for the token wait `TOKEN_WAIT` seconds at a time
    (the hub here allows one attempt, with an hour's backoff, so a failure counted as one is
    given up on): once the token works, what opened meanwhile is posted, in order, once, and
    what closed meanwhile is updated."""
    monkeypatch.setattr(_token, "TOKEN_WAIT", 0.2)
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db", retry_backoff=3600, max_attempts=1)
        async with manual(hub):
            slack_api.failing["chat.postMessage"] = error
            first = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            second = await rt.generate("support", prompt="Refund order 1043", auth=ALICE)
            with caplog.at_level(logging.DEBUG, logger="signoff.channels"):
                await hub.poll()
                await asyncio.sleep(0.25)
                await hub.poll()  # tried again: not logged again
            assert len(slack_api.of("chat.postMessage")) == 2  # the first request, twice
            told = [r for r in caplog.records if r.levelno >= logging.WARNING]
            assert [r.levelname for r in told] == ["ERROR"], [r.getMessage() for r in told]
            line = told[0].getMessage()
            assert error in line and "chat.postMessage" in line and "xoxb-test" not in line
            assert "gave up" not in caplog.text and "rate limited" not in caplog.text
            todo = {
                "missing_scope": "add chat:write to the app's Bot Token Scopes",
                "ekm_access_denied": "ask the workspace's admins",
                "org_login_required": "wait for the move to end",
            }.get(error, "give the channel a working bot token (xoxb-...) and restart")
            assert todo in line, line
            del slack_api.failing["chat.postMessage"]  # mended
            await asyncio.sleep(0.25)
            caplog.clear()
            with caplog.at_level(logging.INFO, logger="signoff.channels"):
                await hub.poll()
            assert "Slack takes the bot token again" in caplog.text
            posted = _posted(slack_api)
            assert [first.pending[0].id in p for p in posted] == [True, True, True, False]
            assert second.pending[0].id in posted[3]
            # Refused again while the first closes: its message is updated once mended.
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


async def test_a_refused_token_is_logged_again_when_slacks_error_changes_or_it_lasts(
    tmp_path: Path,
    slack_api: FakeSlack,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(_token, "TOKEN_WAIT", 0.0)
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        hub = ChannelHub(rt, [channel(slack_api)], state=tmp_path / "hub.db", max_attempts=1)
        async with manual(hub):
            slack_api.failing["chat.postMessage"] = "missing_scope"
            await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            with caplog.at_level(logging.WARNING, logger="signoff.channels"):
                for _ in range(3):
                    await hub.poll()
                slack_api.failing["chat.postMessage"] = "token_revoked"  # the app uninstalled
                await hub.poll()
                monkeypatch.setattr(_token, "RELOG_EVERY", 0.0)
                await hub.poll()  # still refused, and long enough since: a reminder
            assert len(slack_api.of("chat.postMessage")) == 5
    lines = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert [level for level, _ in lines] == ["ERROR"] * 3, lines
    assert "missing_scope chat:write" in lines[0][1]
    assert "token_revoked" in lines[1][1] and lines[1][1] == lines[2][1]


async def test_requests_held_by_a_refused_token_are_posted_by_the_next_start(
    tmp_path: Path,
    slack_api: FakeSlack,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The token is mended by restarting with a new one: what waited is posted then, in order,
    once; what was open at start and refused meanwhile is logged as the error, not as a
    failed post retried with a backoff."""
    state = tmp_path / "hub.db"
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        slack_api.failing["chat.postMessage"] = "token_revoked"
        open_at_start = await rt.generate("support", prompt="Refund order 1041", auth=ALICE)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            hub = ChannelHub(rt, [channel(slack_api)], state=state, max_attempts=1)
            async with manual(hub):
                first = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
                second = await rt.generate("support", prompt="Refund order 1043", auth=ALICE)
                await hub.poll()
                await hub.poll()
        lines = [(r.levelname, r.getMessage()) for r in caplog.records]
        assert [level for level, _ in lines] == ["ERROR"], lines
        assert "token_revoked" in lines[0][1]
        del slack_api.failing["chat.postMessage"]  # a new token, and a restart
        async with manual(ChannelHub(rt, [channel(slack_api)], state=state)) as hub:
            await hub.poll()
        posted = _posted(slack_api)[-3:]
        ids = [r.pending[0].id for r in (open_at_start, first, second)]
        assert [[rid in p for rid in ids] for p in posted] == [
            [True, False, False],
            [False, True, False],
            [False, False, True],
        ]


async def test_a_lost_posts_history_read_refused_for_the_token_waits_instead_of_posting_again(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A post whose answer was lost (a gateway's 504) is looked for in the history: a token
    refused there is waited out, as a post would be, and the message is adopted once it works,
    not posted a second time (a missing history scope alone still posts again)."""
    monkeypatch.setattr(_token, "TOKEN_WAIT", 0.2)
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
            slack_api.failing[HISTORY] = "invalid_auth"
            slack_api.failing["chat.postMessage"] = "invalid_auth"
            await hub.poll()
            await asyncio.sleep(0.25)
            await hub.poll()
            assert len(slack_api.of(HISTORY)) == 2
            del slack_api.failing[HISTORY], slack_api.failing["chat.postMessage"]
            await asyncio.sleep(0.25)
            await hub.poll()
            (message,) = slack_api.messages["C42"]
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
            assert len(slack_api.of("chat.postMessage")) == 1
