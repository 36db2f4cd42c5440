"""Reply deliveries through the inbox: a delivery Slack retries acts once, a locked state file gets
a 503 in time, a reply acknowledged before a crash is sent by the next start, and old events and
threads are forgotten while lost replies resume on ticks.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.channels import ChannelHub, ChannelState
from signoff.channels.slack._inbox import ACK_WITHIN
from signoff.channels.slack._replies import KEEP_THREADS, RETRY_WINDOW

from ._slack import (
    TEAM,
    FakeSlack,
    asgi_client,
    channel,
    manual,
    refused_while_locked,
    serving,
    state_locked,
)
from ._slack_replies import (
    EVENTS,
    deliver,
    event,
    events_of,
    fake,
    shop_agent,
    signed,
)

__all__ = ["fake"]  # the fixture, used by name


async def test_a_delivery_slack_retries_acts_once(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        sent: list[str] = []
        send = rt.send

        async def counted(session_id: str, message: str, **kwargs: Any) -> so.GenerateResult:
            sent.append(message)
            return await send(session_id, message, **kwargs)

        monkeypatch.setattr(rt, "send", counted)
        size, scent = r.pending
        state_file = tmp_path / "hub.db"
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=state_file)) as hub:
            await hub.poll()
            body = event("Large")
            await deliver(slack, body)
            # Signed anew, with Slack's retry headers; and one reaching another process that
            # shares the channel state (a fresh channel here): none acts again.
            for retry in (1, 2):
                at = time.time() + retry
                await deliver(slack, body, at=at, **{"X-Slack-Retry-Num": str(retry)})
            other = channel(fake)
            other.bind(rt, hub.state, hub=hub.name)
            await deliver(other, body, at=time.time() + 3, **{"X-Slack-Retry-Num": "3"})
        one = await rt.store.get_request(size.id)
        two = await rt.store.get_request(scent.id)
        assert one is not None and one.resolution is not None
        assert one.resolution["answer"]["value"] == "Large"
        assert two is not None and two.status == "pending"  # "Large" is no scent, but text
        assert sent == ["Large"]  # the retries were not even sent with the same key


async def test_a_reply_meeting_a_locked_state_file_gets_a_503_in_time_and_stalls_nothing(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process holding the channel state's write lock: the event waits for it off the
    event loop (another request is answered meanwhile) and gets a 503 before Slack's 3 s, with
    nothing saved or sent; once the lock is gone, Slack's retry is sent, once."""
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        sent: list[str] = []
        send = rt.send

        async def counted(session_id: str, message: str, **kwargs: Any) -> so.GenerateResult:
            sent.append(message)
            return await send(session_id, message, **kwargs)

        monkeypatch.setattr(rt, "send", counted)
        size, _ = r.pending
        # The state waits 30 s for a lock (not 5 s): an event held for it fails the bound by far.
        with contextlib.closing(ChannelState(tmp_path / "hub.db", busy_timeout=30)) as state:
            async with serving(rt, fake, state) as (slack, hub, app):
                assert slack.replies.inbox.ack_within == ACK_WITHIN < 3
                async with asgi_client(app) as http:
                    body = event("Large")

                    async def post() -> httpx.Response:
                        return await http.post(EVENTS, content=body, headers=signed(body))

                    async with state_locked(tmp_path / "hub.db"):
                        await refused_while_locked(http, post, size.id)
                        await slack.idle()
                        assert slack.memos("event:") == []
                        assert sent == []
                    for retry in (1, 2):  # Slack's retries, signed anew
                        headers = signed(
                            body, time.time() + retry, **{"X-Slack-Retry-Num": str(retry)}
                        )
                        response = await http.post(EVENTS, content=body, headers=headers)
                        assert (response.status_code, response.content) == (200, b"")
                        await slack.idle()
        stored = await rt.store.get_request(size.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["value"] == "Large"
        assert sent == ["Large"]


async def test_a_retry_signed_as_the_reply_that_got_a_503_is_taken_not_refused_as_a_replay(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Slack may retry a delivery it had a 503 for with the same signature: a request that
    failed after it verified (nothing was taken) leaves no trace in the replay check, so that
    retry is taken, once; a request that got its 200 stays refused as a replay."""
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        size, _ = r.pending
        async with serving(rt, fake, tmp_path / "hub.db") as (slack, hub, app):
            remember = hub.state.remember

            def refusing(channel_name: str, key: str, value: Any, **hub: str) -> None:
                if key.startswith("event:"):
                    raise so.StoreError("channel state: cannot save a memo: disk I/O error")
                remember(channel_name, key, value, **hub)

            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                body = event("Large")
                headers = signed(body)
                monkeypatch.setattr(hub.state, "remember", refusing)
                assert (await http.post(EVENTS, content=body, headers=headers)).status_code == 503
                monkeypatch.setattr(hub.state, "remember", remember)
                response = await http.post(EVENTS, content=body, headers=headers)
                assert (response.status_code, response.content) == (200, b"")
                await slack.idle()
                again = await http.post(EVENTS, content=body, headers=headers)
                assert again.status_code == 401
                assert again.json()["error"]["code"] == "invalid_signature"
            assert len(slack.memos("event:")) == 1
            await hub.poll()
        stored = await rt.store.get_request(size.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["value"] == "Large"


async def test_a_reply_acknowledged_before_a_crash_is_sent_by_the_next_start_once(
    store_url: str, tmp_path: Path, fake: FakeSlack
) -> None:
    async with so.Runtime([shop_agent()], store=store_url) as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        size, scent = r.pending
        state_file = tmp_path / "hub.db"
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=state_file)) as hub:
            await hub.poll()
            await slack.handle_event(event("Large"), signed(event("Large")))
            # The process dies once Slack has its 200: the work it spawned never runs.
            for task in list(slack._tasks):
                task.cancel()
            await asyncio.gather(*slack._tasks, return_exceptions=True)
            (saved,) = slack.memos("event:")
            assert saved[1]["state"] == "pending"
        stored = await rt.store.get_request(size.id)
        assert stored is not None and stored.status == "pending"
        again = channel(fake)
        async with manual(ChannelHub(rt, [again], state=state_file)):
            await again.idle()  # the start resumed it
            ((_, memo),) = again.memos("event:")
            assert memo["state"] == "done"
            # Killed after sending and before marking it done: the next start sends it again,
            # and its idempotency key (the event id) keeps it from answering twice.
            again.remember("event:Ev01", saved[1])
        stored = await rt.store.get_request(size.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["value"] == "Large"
        third = channel(fake)
        async with manual(ChannelHub(rt, [third], state=state_file)):
            await third.idle()
        still = await rt.store.get_request(scent.id)
        assert still is not None and still.status == "pending"
        messages = [e for e in await events_of(rt, r.session_id) if e.type == "input.resolved"]
        assert len(messages) == 1


async def test_old_events_and_threads_are_forgotten_and_lost_replies_resumed_on_ticks(
    tmp_path: Path, fake: FakeSlack
) -> None:
    clock = [1_800_000_000.0]
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        size, scent = r.pending
        slack = channel(fake, clock=lambda: clock[0])
        async with manual(ChannelHub(rt, [slack])) as hub:
            await hub.poll()
            threads = dict(slack.memos("thread:"))
            assert threads == {
                "thread:C42:1700000000.000001": {"request_id": size.id},
                "thread:C42:1700000000.000002": {"request_id": scent.id},
            }
            await deliver(slack, event("Large"), at=clock[0])
            await hub.poll()  # the first request closed: its thread is kept, marked closed
            threads = dict(slack.memos("thread:"))
            assert threads["thread:C42:1700000000.000001"]["closed_at"] > 0
            # Another process took a reply and died (its memo is pending, its task gone).
            lost = {
                "state": "pending",
                "at": clock[0],
                "tries": 1,
                "event_id": "EvLost",
                "request_id": scent.id,
                "team": TEAM,
                "user": "U5",
                "channel": "C42",
                "thread": "1700000000.000002",
                "text": "Mint",
            }
            slack.remember("event:EvLost", lost)
            clock[0] += RETRY_WINDOW + 1
            await hub.poll()
            await slack.idle()
            # the handled event is forgotten; the lost one was sent
            (memo,) = slack.memos("event:")
            assert memo[0] == "event:EvLost" and memo[1]["state"] == "done"
            stored = await rt.store.get_request(scent.id)
            assert stored is not None and stored.resolution is not None
            assert stored.resolution["answer"]["value"] == "Mint"
            await hub.poll()
            clock[0] += KEEP_THREADS
            await hub.poll()
            assert slack.memos("thread:") == []
            # a reply in a thread forgotten is ignored
            await deliver(slack, event("More", event_id="Ev09"), at=clock[0])
            assert slack.memos("event:") == []
