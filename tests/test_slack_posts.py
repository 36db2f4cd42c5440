"""How the hub's posts and updates reach Slack (`_channel`): once each, through rate limits,
5xx answers and gateway pages, a message deleted in Slack, a memo that cannot be saved, a
stop while Slack answers, and a restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

import pytest

import signoff as so
from signoff.channels import Channel, ChannelHub, _retries
from signoff.channels.slack import SlackChannel, _backlog, slack_principal

from ._channels import frozen_monotonic
from ._slack import (
    ALICE,
    HISTORY,
    SECRET,
    TEAM,
    FakeSlack,
    channel,
    click,
    manual,
    refund_requested,
    refund_runtime,
    sign,
    slack_api,
)

__all__ = ["slack_api"]  # the fixture, used by name


async def test_a_restarted_hub_does_not_post_again_and_updates_from_its_memo(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        state = tmp_path / "hub.db"
        async with manual(ChannelHub(rt, [channel(slack_api)], state=state)) as hub:
            await hub.poll()
        assert len(slack_api.of("chat.postMessage")) == 1
        # answered elsewhere (the API, the CLI) while no hub ran
        await rt.respond(
            r.session_id,
            [so.InputResponse(request_id=req.id, option_id="approve")],
            principal=slack_principal(TEAM, "U045EF6GH"),
        )
        async with manual(ChannelHub(rt, [channel(slack_api)], state=state)) as hub:
            await hub.poll()
            await hub.poll()
        assert len(slack_api.of("chat.postMessage")) == 1
        (update,) = slack_api.of("chat.update")
        assert update["ts"] == "1700000000.000001"
        assert update["blocks"][-1]["block_id"] == "signoff.resolution"


async def test_a_message_deleted_in_slack_does_not_stall_the_channel(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    # Someone deletes a request's message in Slack: updating it can never succeed, and retrying
    # for minutes must not hold back the requests that open meanwhile.
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], retry_backoff=3600)) as hub:
            await hub.poll()
            (posted,) = slack_api.of("chat.postMessage")
            slack_api.deleted.add("1700000000.000001")
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="cancel")],
                principal=slack_principal(TEAM, "U078JK9LM"),
            )
            other = await rt.generate("support", prompt="Refund order 1042 again", auth=ALICE)
            await hub.poll()
            assert len(slack_api.of("chat.update")) == 1  # tried once, not retried
            assert slack.recall(f"msg:{req.id}") is None  # nothing left to update
            second = slack_api.of("chat.postMessage")[1]
            assert other.pending[0].id in json.dumps(second["blocks"])
        assert posted["channel"] == "C42"


class Recorder(Channel):
    """A channel that only notes the requests it is told about."""

    name = "recorder"

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[str] = []

    async def on_requested(self, request: so.InputRequest) -> None:
        self.opened.append(request.id)


async def test_slack_rate_limits_wait_retry_after_without_holding_other_channels(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 429 is retried after Slack's Retry-After (not the hub's backoff, here an hour) and a
    burst of them never makes the hub give up the post; the other channels go on meanwhile."""
    clock = frozen_monotonic(monkeypatch, _retries)
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        slack, recorder = channel(slack_api), Recorder()
        hub = ChannelHub(rt, [slack, recorder], retry_backoff=3600, max_attempts=1)
        async with manual(hub):
            slack_api.limited["chat.postMessage"] = 2
            r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            (req,) = r.pending
            await hub.poll()
            assert recorder.opened == [req.id]  # not held back by Slack's limit
            assert len(slack_api.of("chat.postMessage")) == 1
            await hub.poll()  # before Retry-After: Slack is not called again
            assert len(slack_api.of("chat.postMessage")) == 1
            clock.now += 0.95  # not yet
            await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 1
            for _ in range(2):
                clock.now += 1.05
                await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 3
            assert slack.recall(f"msg:{req.id}") is not None
            await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 3 and recorder.opened == [req.id]


async def test_slack_rate_limited_at_start_posts_the_open_requests_later(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests open when the hub starts are posted once Slack's Retry-After has passed, not
    left unposted until the next start because the first post was rate limited."""
    clock = frozen_monotonic(monkeypatch, _backlog)
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack_api.limited["chat.postMessage"] = 1
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            assert (
                len(slack_api.of("chat.postMessage")) == 1 and slack.recall(f"msg:{req.id}") is None
            )
            await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 1
            clock.now += 0.95  # not yet
            await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 1
            clock.now += 0.1
            await hub.poll()
            assert len(slack_api.of("chat.postMessage")) == 2
            assert slack.recall(f"msg:{req.id}") is not None


async def test_an_entry_the_hub_gave_up_on_is_logged_and_retried_on_the_next_start(
    tmp_path: Path, slack_api: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """Slack failing on an update past `max_attempts`: the hub logs it at error level and
    delivers it again when it next starts, so the message stops offering Approve / Deny."""
    log: list[Any] = []
    state = tmp_path / "hub.db"
    async with refund_runtime(tmp_path, log) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        async with manual(ChannelHub(rt, [channel(slack_api)], state=state, max_attempts=1)) as hub:
            await hub.poll()
            slack_api.failing["chat.update"] = "internal_error"
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=slack_principal(TEAM, "U045EF6GH"),
            )
            with caplog.at_level(logging.ERROR, logger="signoff.channels"):
                await hub.poll()
            assert any(
                rec.levelno == logging.ERROR and "gave up" in rec.getMessage()
                for rec in caplog.records
            )
            await hub.poll()
            assert len(slack_api.of("chat.update")) == 1  # given up for this run
        del slack_api.failing["chat.update"]
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], state=state)) as hub:
            (_, update) = slack_api.of("chat.update")
            assert update["blocks"][-1]["block_id"] == "signoff.resolution"
            assert slack.recall(f"msg:{req.id}") is None
            await hub.poll()
        async with manual(ChannelHub(rt, [channel(slack_api)], state=state)):
            assert len(slack_api.of("chat.update")) == 2  # delivered once, then forgotten


async def test_a_hub_stopped_while_slack_posts_does_not_post_again_when_it_restarts(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A server shutting down while Slack is answering a post (the message is in the channel,
    its ts not yet saved): the post is let finish and saved, so the next start does not post
    the request a second time."""
    log: list[Any] = []
    state = tmp_path / "hub.db"
    async with refund_runtime(tmp_path, log) as rt:
        hub = ChannelHub(rt, [channel(slack_api)], state=state, poll_interval=0.01)
        await hub.start()
        slack_api.slow["chat.postMessage"] = 0.3
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
        for _ in range(1000):  # 10 s, however busy the machine
            if slack_api.of("chat.postMessage"):
                break
            await asyncio.sleep(0.01)
        assert slack_api.of("chat.postMessage")
        await hub.stop()  # Slack has the post, its answer is on the way
        del slack_api.slow["chat.postMessage"]
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], state=state)) as again:
            await again.poll()
            assert slack.recall(f"msg:{req.id}") is not None
        assert len(slack_api.of("chat.postMessage")) == 1


async def test_slack_down_at_start_posts_the_open_requests_once_it_is_back(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 5xx from Slack while the hub posts the requests open at start: they are posted again
    after a backoff (not left unposted until the next start), once each."""
    clock = frozen_monotonic(monkeypatch, _backlog)
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack_api.down["chat.postMessage"] = 2
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack])) as hub:
            assert len(slack_api.calls) == 1 and slack.recall(f"msg:{req.id}") is None
            await hub.poll()  # before the backoff: Slack is not called again
            assert len(slack_api.calls) == 1
            for _ in range(2):
                clock.now += 2.05
                await hub.poll()
            assert slack.recall(f"msg:{req.id}") is not None
            await hub.poll()
        # two 503s, then the post (Slack's first "ts"), and nothing more
        assert [m for m, _ in slack_api.calls] == ["chat.postMessage"] * 3
        assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": "1700000000.000001"}


async def test_slack_down_for_minutes_at_start_posts_the_open_requests_once_it_is_back(
    tmp_path: Path,
    slack_api: FakeSlack,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Slack failing the posts of the requests open at start for longer than their backoff
    (about two minutes): that is logged as an error, and they are tried once a minute while
    the hub runs. Before, they were dropped, unposted until the hub's next start."""
    clock = frozen_monotonic(monkeypatch, _backlog)
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        slack_api.failing["chat.postMessage"] = "internal_error"
        slack = channel(slack_api)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            async with manual(ChannelHub(rt, [slack])) as hub:
                for _ in range(_backlog.ATTEMPTS - 1):  # 1, 2, 4 ... 64 s apart
                    clock.now += 65
                    await hub.poll()
                assert len(slack_api.of("chat.postMessage")) == _backlog.ATTEMPTS
                assert any(r.levelno == logging.ERROR for r in caplog.records)
                del slack_api.failing["chat.postMessage"]
                clock.now += 59
                await hub.poll()
                assert slack.recall(f"msg:{req.id}") is None
                clock.now += 2
                await hub.poll()
                assert slack.recall(f"msg:{req.id}") is not None
                await hub.poll()
        assert len(slack_api.of("chat.postMessage")) == _backlog.ATTEMPTS + 1


async def test_a_request_open_at_start_whose_post_keeps_failing_holds_back_no_other(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first of two requests open at start fails to post at every try: it goes behind the
    second, posted a second later. Before, the second waited for the first's eight tries
    (about two minutes)."""
    clock = frozen_monotonic(monkeypatch, _backlog)
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, first):
        second = (await rt.generate("support", prompt="Refund order 7", auth=ALICE)).pending[0]
        slack = channel(slack_api)
        show = slack.posts.show

        async def failing_first(request: so.InputRequest) -> None:
            if request.id == first.id:
                raise ConnectionError("this one never goes through")
            await show(request)

        monkeypatch.setattr(slack.posts, "show", failing_first)
        async with manual(ChannelHub(rt, [slack])) as hub:
            assert slack_api.of("chat.postMessage") == []
            clock.now += 1.05
            await hub.poll()
            assert slack.recall(f"msg:{second.id}") is not None
            assert slack.recall(f"msg:{first.id}") is None


async def test_a_gateway_page_instead_of_slacks_json_is_read_as_a_failure_of_slack(
    tmp_path: Path, slack_api: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """A 5xx whose body is a gateway's HTML page, not Slack's JSON: the person whose form did
    not open is told to press again, a history read that failed so is retried before posting
    again, and an update is retried as Slack's failure (the log names it, not an
    AttributeError)."""
    slack_api.real_ts = True
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        slack = channel(slack_api)
        slack_api.lost["chat.postMessage"] = 1
        slack_api.down[HISTORY] = 1
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            async with manual(ChannelHub(rt, [slack], retry_backoff=0)) as hub:
                r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
                (req,) = r.pending
                await hub.poll()  # the post's 504
                await hub.poll()  # the history's 503: no post yet
                assert slack.recall(f"msg:{req.id}") is None
                assert len(slack_api.of("chat.postMessage")) == 1
                await hub.poll()
                (message,) = slack_api.messages["C42"]
                assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
                slack_api.down["views.open"] = 1
                body = click({"action_id": "signoff.deny", "value": req.id, "type": "button"})
                assert await slack.handle(body, sign(body, int(time.time()))) is None
                await slack.idle()
                slack_api.down["chat.update"] = 1
                await rt.respond(
                    r.session_id,
                    [so.InputResponse(request_id=req.id, option_id="approve")],
                    principal=slack_principal(TEAM, "U045EF6GH"),
                )
                await hub.poll()  # the update's 503
                await hub.poll()
        assert slack_api.of("chat.postEphemeral") == [
            {
                "channel": "C42",
                "user": "U045EF6GH",
                "text": "Slack could not open the form: press the button again.",
                "parse": "none",
                "link_names": False,
            }
        ]
    assert len(slack_api.of("chat.postMessage")) == 1
    assert len(slack_api.of(HISTORY)) == 2
    assert len(slack_api.of("chat.update")) == 2
    assert slack_api.messages["C42"][0]["blocks"][-1]["block_id"] == "signoff.resolution"
    failures = [rec.exc_info[0] for rec in caplog.records if rec.exc_info]
    assert AttributeError not in failures and failures, failures


async def test_a_post_whose_memo_cannot_be_saved_is_not_posted_again_on_retry(
    tmp_path: Path, slack_api: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The channel state refusing the memo of a message just posted (its file locked, a full
    disk): the hub retries, which saves the memo instead of posting the request again."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], retry_backoff=0)) as hub:
            remember = hub.state.remember
            refusals = [so.StoreError("channel state: cannot save a memo: database is locked")]

            def flaky(channel_name: str, key: str, value: Any, **hub: str) -> None:
                if refusals and key.startswith("msg:"):  # the memo of the message posted
                    raise refusals.pop()
                remember(channel_name, key, value, **hub)

            monkeypatch.setattr(hub.state, "remember", flaky)
            r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            (req,) = r.pending
            await hub.poll()
            assert refusals == []  # the message was posted, its memo refused
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": "1700000000.000001"}
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="approve")],
                principal=slack_principal(TEAM, "U045EF6GH"),
            )
            await hub.poll()
        assert len(slack_api.of("chat.postMessage")) == 1
        (update,) = slack_api.of("chat.update")
        assert update["ts"] == "1700000000.000001"


async def test_same_named_slack_channels_of_two_hubs_on_one_state_file_each_post(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Two hubs (different names) on one state file, each posting to its own Slack channel
    through a channel named `slack`: the second took the first's `msg:` memo for its own post,
    so its people never saw the request."""
    state = tmp_path / "hub.db"
    async with refund_runtime(tmp_path, []) as rt:
        ours = SlackChannel("C1", token="xoxb-test", base_url=slack_api.url, signing_secret=SECRET)
        theirs = SlackChannel(
            "C2", token="xoxb-test", base_url=slack_api.url, signing_secret=SECRET
        )
        async with (
            manual(ChannelHub(rt, [ours], state=state, name="ops")) as one,
            manual(ChannelHub(rt, [theirs], state=state, name="finance")) as two,
        ):
            (req,) = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).pending
            await one.poll()
            await two.poll()
            assert [p["channel"] for p in slack_api.of("chat.postMessage")] == ["C1", "C2"]
            assert ours.recall(f"msg:{req.id}")["channel"] == "C1"
            assert theirs.recall(f"msg:{req.id}")["channel"] == "C2"
