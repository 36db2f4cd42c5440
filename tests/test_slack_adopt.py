"""A post Slack took but the hub never saved (`_adopt`): after a SIGKILL, a timeout, a 5xx or
a dropped connection, the hub finds the message in the channel's history by its metadata and
adopts it instead of posting the request a second time.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
import time
import urllib.parse
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.abc import AbstractResolver, ResolveResult
from slack_sdk.web.async_client import AsyncWebClient

import signoff as so
from signoff.channels import ChannelHub
from signoff.channels.slack import SlackChannel
from signoff.channels.slack._adopt import retry_handlers

from ._procs import ROOT, make_agent, sqlite_url
from ._slack import (
    ALICE,
    HISTORY,
    SECRET,
    FakeSlack,
    channel,
    manual,
    refund_requested,
    refund_runtime,
    slack_api,
)

__all__ = ["slack_api"]  # the fixture, used by name


async def crash_while_slack_posts(tmp_path: Path, slack_api: FakeSlack) -> str:
    """Open a request, then SIGKILL a hub process once Slack has its post and before the hub
    saves where the message is; the request's id."""
    slack_api.real_ts = True
    records = str(tmp_path / "runs.jsonl")
    async with so.Runtime([make_agent(records)], store=sqlite_url(tmp_path)) as rt:
        r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
        (req,) = r.pending
    argv = [sqlite_url(tmp_path), records, str(tmp_path / "hub.db"), slack_api.url]
    with (tmp_path / "child.err").open("w") as err:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests._slack_child",
            *argv,
            cwd=ROOT,
            stdout=asyncio.subprocess.PIPE,
            stderr=err,
        )
        slack_api.on_post = lambda message: os.kill(child.pid, signal.SIGKILL)
        out, _ = await asyncio.wait_for(child.communicate(), 60)
    slack_api.on_post = None
    assert child.returncode == -signal.SIGKILL, (out, (tmp_path / "child.err").read_text())
    assert out == b""  # it died before saving anything
    (posted,) = slack_api.of("chat.postMessage")
    assert posted["metadata"]["event_payload"]["request_id"] == req.id
    return req.id


async def test_a_hub_killed_after_slack_took_the_post_adopts_it_when_it_restarts(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A SIGKILL between Slack accepting chat.postMessage and the hub saving the message: the
    restarted hub finds the message in the channel's history by its metadata and adopts it
    (updating it when the request closes) instead of posting the request a second time."""
    rid = await crash_while_slack_posts(tmp_path, slack_api)
    (message,) = slack_api.messages["C42"]
    async with so.Runtime([make_agent(str(tmp_path / "r"))], store=sqlite_url(tmp_path)) as rt:
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            assert slack.recall(f"msg:{rid}") == {"channel": "C42", "ts": message["ts"]}
            assert slack.recall(f"posting:{rid}") is None
            (session,) = {r.session_id for r in await rt.pending()}
            await rt.respond(
                session,
                [so.InputResponse(request_id=rid, option_id="approve")],
                principal=ALICE,
            )
            await hub.poll()
    assert len(slack_api.of("chat.postMessage")) == 1
    assert len(slack_api.messages["C42"]) == 1
    (lookup,) = slack_api.of(HISTORY)
    assert lookup["channel"] == "C42" and lookup["include_all_metadata"] == "1"
    assert float(lookup["oldest"]) < float(message["ts"]) < float(lookup["latest"])
    (update,) = slack_api.of("chat.update")
    assert update["ts"] == message["ts"]
    assert update["blocks"][-1]["block_id"] == "signoff.resolution"


async def test_a_restarted_hub_that_cannot_read_the_history_posts_again_and_says_why(
    tmp_path: Path, slack_api: FakeSlack, caplog: pytest.LogCaptureFixture
) -> None:
    """The same crash with a bot that lacks the history scope: the request is posted again, as
    before message metadata, and the warning names Slack's error and the scope it needs."""
    rid = await crash_while_slack_posts(tmp_path, slack_api)
    slack_api.failing[HISTORY] = "missing_scope"
    async with so.Runtime([make_agent(str(tmp_path / "r"))], store=sqlite_url(tmp_path)) as rt:
        slack = channel(slack_api)
        with caplog.at_level(logging.WARNING, logger="signoff.channels"):
            async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
                await hub.poll()
                second = slack_api.messages["C42"][-1]
                assert slack.recall(f"msg:{rid}") == {"channel": "C42", "ts": second["ts"]}
    assert len(slack_api.of("chat.postMessage")) == 2
    (warning,) = [r.getMessage() for r in caplog.records if "history" in r.getMessage()]
    assert "missing_scope" in warning and "channels:history" in warning
    assert rid in warning and "posting it again" in warning


async def test_an_unsaved_attempt_slack_never_got_or_another_delivery_is_not_adopted(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A saved attempt whose post never reached Slack, while the channel holds an older message
    of the same request from another delivery (one given up on): that message is not adopted,
    the request is posted once, and only messages near the attempt's time were read."""
    slack_api.real_ts = True
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        payload = {"request_id": req.id, "delivery": "0" * 32}
        old = {"event_type": "signoff_request", "event_payload": payload}
        slack_api.messages["C42"] = [
            {"type": "message", "ts": f"{time.time() - 3:.6f}", "text": "x", "metadata": old}
        ]
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db")
        at = time.time() - 1
        hub.state.remember(
            slack.name, f"posting:{req.id}", {"delivery": "f" * 32, "at": at}, hub=hub.name
        )
        async with manual(hub):
            await hub.poll()
            posted = slack_api.messages["C42"][-1]
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": posted["ts"]}
        assert len(slack_api.of("chat.postMessage")) == 1
        (lookup,) = slack_api.of(HISTORY)
        assert lookup["include_all_metadata"] == "1"  # the old message's metadata was read
        assert float(lookup["latest"]) < at + 3600  # the attempt's window only
        # a delivery of its own: the old message's is not reused
        delivery = posted["metadata"]["event_payload"]["delivery"]
        assert delivery not in ("0" * 32, "f" * 32)


@asynccontextmanager
async def _posting(
    tmp_path: Path, slack: SlackChannel
) -> AsyncIterator[tuple[ChannelHub, so.InputRequest]]:
    """A hub of `slack` alone that retries at once, polled by the test, and the refund request
    just opened (not yet delivered)."""
    log: list[Any] = []
    async with refund_runtime(tmp_path, log) as rt:
        async with manual(ChannelHub(rt, [slack], retry_backoff=0)) as hub:
            r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            (req,) = r.pending
            yield hub, req


async def test_a_post_that_timed_out_after_slack_took_it_is_adopted_on_retry(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """chat.postMessage timing out while Slack still posts the message: the hub's retry finds
    the message by its metadata and saves it instead of posting the request a second time."""
    slack_api.real_ts = True
    slack_api.slow["chat.postMessage"] = 1.3
    client = AsyncWebClient(token="xoxb-test", base_url=slack_api.url, timeout=1)
    slack = SlackChannel("C42", client=client, signing_secret=SECRET)
    async with _posting(tmp_path, slack) as (hub, req):
        await hub.poll()  # times out
        assert slack.recall(f"msg:{req.id}") is None
        for _ in range(1000):  # Slack answers in 1.3 s: 10 s, however busy the machine
            if "C42" in slack_api.messages:
                break
            await asyncio.sleep(0.01)
        (message,) = slack_api.messages["C42"]
        await hub.poll()
        assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
    assert len(slack_api.of("chat.postMessage")) == 1
    assert len(slack_api.of(HISTORY)) == 1


async def test_a_post_answered_with_a_5xx_after_slack_took_it_is_adopted_on_retry(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A 5xx (a gateway's 504) does not say Slack posted nothing, as an `ok: false` answer
    does: the hub's retry looks for the message by its metadata before posting again."""
    slack_api.real_ts = True
    slack_api.lost["chat.postMessage"] = 1
    slack = channel(slack_api)
    async with _posting(tmp_path, slack) as (hub, req):
        await hub.poll()  # the 504
        assert slack.recall(f"msg:{req.id}") is None
        (message,) = slack_api.messages["C42"]
        await hub.poll()
        assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
        await hub.poll()
    assert len(slack_api.of("chat.postMessage")) == 1
    assert len(slack_api.messages["C42"]) == 1


async def test_a_post_whose_connection_drops_after_slack_took_it_is_adopted_not_resent(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """The connection closing after Slack took chat.postMessage and before it answered: the
    post is not sent again at once (slack_sdk's default retry of a dropped connection would
    post it twice); the hub's retry adopts the message by its metadata."""
    slack_api.real_ts = True
    slack_api.dropped["chat.postMessage"] = 1
    slack = channel(slack_api)
    async with _posting(tmp_path, slack) as (hub, req):
        await hub.poll()  # the dropped connection
        await hub.poll()
        (message,) = slack_api.messages["C42"]
        assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
    assert len(slack_api.of("chat.postMessage")) == 1


class _FailingOnce(AbstractResolver):
    """Resolves every host to loopback, after failing the first lookup: a call that made no
    connection, so nothing reached Slack."""

    def __init__(self) -> None:
        self.lookups = 0

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        self.lookups += 1
        if self.lookups == 1:
            raise OSError("name resolution failed")
        found: ResolveResult = {
            "hostname": host,
            "host": "127.0.0.1",
            "port": port,
            "family": family,
            "proto": 0,
            "flags": socket.AI_NUMERICHOST,
        }
        return [found]

    async def close(self) -> None:
        pass


async def test_a_post_that_never_reached_slack_is_sent_again_at_once(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """No connection made (a failed lookup): the channel's client posts again at once, so the
    message is not held until the hub's next retry, which would also first read the history
    for it; Slack has it once."""
    resolver = _FailingOnce()
    port = urllib.parse.urlsplit(slack_api.url).port
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(resolver=resolver)) as session:
        client = AsyncWebClient(
            token="xoxb-test",
            base_url=f"http://slack.test:{port}/api/",
            session=session,
            retry_handlers=retry_handlers(),
        )
        slack = SlackChannel("C42", client=client, signing_secret=SECRET)
        async with _posting(tmp_path, slack) as (hub, req):
            await hub.poll()
            (message,) = slack_api.messages["C42"]
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": message["ts"]}
    assert resolver.lookups == 2
    assert len(slack_api.of("chat.postMessage")) == 1
    assert slack_api.of(HISTORY) == []


async def test_a_request_closed_while_the_killed_hub_was_down_updates_its_unsaved_post(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """The same crash, then the request is answered elsewhere before the hub restarts: the
    message Slack took is found and shows the decision, rather than keeping live buttons."""
    rid = await crash_while_slack_posts(tmp_path, slack_api)
    (message,) = slack_api.messages["C42"]
    async with so.Runtime([make_agent(str(tmp_path / "r"))], store=sqlite_url(tmp_path)) as rt:
        (session,) = {r.session_id for r in await rt.pending()}
        await rt.respond(
            session, [so.InputResponse(request_id=rid, option_id="approve")], principal=ALICE
        )
        slack = channel(slack_api)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            assert slack.recall(f"posting:{rid}") is None
            assert slack.recall(f"msg:{rid}") is None  # closed: nothing left to update
    assert len(slack_api.of("chat.postMessage")) == 1
    (update,) = slack_api.of("chat.update")
    assert update["ts"] == message["ts"]
    assert update["blocks"][-1]["block_id"] == "signoff.resolution"


async def test_an_unsaved_post_is_found_with_a_client_that_has_no_timeout(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """A client built without a timeout (`timeout=None`): the history is read up to now instead
    of failing on the window's end, so the message is adopted rather than never posted."""
    slack_api.real_ts = True
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        payload = {"request_id": req.id, "delivery": "a" * 32}
        meta = {"event_type": "signoff_request", "event_payload": payload}
        ts = f"{time.time():.6f}"
        slack_api.messages["C42"] = [{"type": "message", "ts": ts, "text": "x", "metadata": meta}]
        client = AsyncWebClient(token="xoxb-test", base_url=slack_api.url)
        client.timeout = None  # type: ignore[assignment]
        slack = SlackChannel("C42", client=client, signing_secret=SECRET)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db")
        at = time.time() - 1
        hub.state.remember(
            slack.name, f"posting:{req.id}", {"delivery": "a" * 32, "at": at}, hub=hub.name
        )
        async with manual(hub):
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": ts}
    assert slack_api.of("chat.postMessage") == []
    (lookup,) = slack_api.of(HISTORY)
    assert "latest" not in lookup


async def test_a_rate_limited_history_read_is_waited_out_not_answered_by_posting_again(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """Slack's 429 on conversations.history (new apps get one call a minute): the lookup is
    retried after Retry-After and the message adopted; the request is not posted meanwhile."""
    slack_api.real_ts = True
    slack_api.limited[HISTORY] = 1
    slack_api.retry_after = "0"
    log: list[Any] = []
    async with refund_requested(tmp_path, log) as (rt, req):
        payload = {"request_id": req.id, "delivery": "b" * 32}
        meta = {"event_type": "signoff_request", "event_payload": payload}
        ts = f"{time.time():.6f}"
        slack_api.messages["C42"] = [{"type": "message", "ts": ts, "text": "x", "metadata": meta}]
        slack = channel(slack_api)
        hub = ChannelHub(rt, [slack], state=tmp_path / "hub.db")
        at = time.time() - 1
        hub.state.remember(
            slack.name, f"posting:{req.id}", {"delivery": "b" * 32, "at": at}, hub=hub.name
        )
        async with manual(hub):
            assert slack.recall(f"msg:{req.id}") is None  # limited at start
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": ts}
    assert slack_api.of("chat.postMessage") == []
    assert len(slack_api.of(HISTORY)) == 2


async def test_a_history_read_whose_connection_fails_is_retried_not_answered_by_posting_again(
    tmp_path: Path, slack_api: FakeSlack
) -> None:
    """An unsaved post to look for, and the connection to Slack drops while the history is
    read: the request was posted again at once (a second message), and the new attempt's memo
    replaced the first one's, so that message could never be adopted. The lookup is retried
    instead, as after a 5xx, and the message adopted."""
    slack_api.real_ts = True
    async with refund_runtime(tmp_path, []) as rt:
        slack = channel(slack_api)
        reads = slack.client.conversations_history

        async def dropping(**kwargs: Any) -> Any:
            if not slack_api.of(HISTORY) and not dropped:
                dropped.append(kwargs)
                raise aiohttp.ServerDisconnectedError()
            return await reads(**kwargs)

        dropped: list[Any] = []
        slack.client.conversations_history = dropping  # type: ignore[method-assign]
        async with manual(ChannelHub(rt, [slack], retry_backoff=0)) as hub:
            r = await rt.generate("support", prompt="Refund order 1042", auth=ALICE)
            (req,) = r.pending
            payload = {"request_id": req.id, "delivery": "c" * 32}
            meta = {"event_type": "signoff_request", "event_payload": payload}
            ts = f"{time.time():.6f}"
            slack_api.messages["C42"] = [
                {"type": "message", "ts": ts, "text": "x", "metadata": meta}
            ]
            slack.remember(f"posting:{req.id}", {"delivery": "c" * 32, "at": time.time() - 1})
            await hub.poll()
            assert len(dropped) == 1 and slack.recall(f"msg:{req.id}") is None
            await hub.poll()
            assert slack.recall(f"msg:{req.id}") == {"channel": "C42", "ts": ts}
    assert slack_api.of("chat.postMessage") == []
