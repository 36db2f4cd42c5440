"""Slack's retries of a delivery against the replay check of `SlackChannel`.

Slack retries a delivery it got no timely 2xx for, with `X-Slack-Retry-Num` and
`X-Slack-Retry-Reason`. A retry signed anew passes the replay check and is deduplicated by the
delivery's durable memo (its body's digest, its event id). These tests cover a retry sent with
the very headers of the first delivery, should Slack ever send one: after a 5xx it is taken
(see test_slack_clicks and test_slack_replies), after a 2xx it gets the first answer again and
does nothing, and a copy without the retry header stays refused as a replay.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.channels import ChannelHub, InvalidSignature

from ._procs import read_executions
from ._slack import FakeSlack, channel, fake, manual, serving, sign, submission
from ._slack_replies import EVENTS, event, shop_agent, signed
from .test_slack_clicks import approve, refund_asked

RETRY = {"X-Slack-Retry-Num": "1", "X-Slack-Retry-Reason": "http_timeout"}

__all__ = ["fake"]  # the fixture, used by name


async def test_a_retry_with_the_first_headers_after_a_200_does_nothing_and_gets_a_200(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """Slack timed out before our 200 arrived and retries with the same signature: the retry is
    acknowledged with the first answer and acts on nothing; the same request without the retry
    header is a replay and refused; a body altered under that signature is refused as unsigned."""
    records = str(tmp_path / "runs.jsonl")
    async with refund_asked(tmp_path, records) as (rt, req):
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            body = approve(req.id)
            headers = sign(body, int(time.time()))
            assert await slack.handle(body, headers) is None
            await slack.idle()
            for n in ("1", "2"):
                retry = {**headers, "X-Slack-Retry-Num": n, "X-Slack-Retry-Reason": "http_timeout"}
                assert await slack.handle(body, retry) is None
            with pytest.raises(InvalidSignature, match="replay"):
                await slack.handle(body, headers)
            altered = approve(req.id, at="1700000200.000001")
            with pytest.raises(InvalidSignature, match="does not match"):
                await slack.handle(altered, {**headers, **RETRY})
            await slack.idle()
            await hub.poll()
        stored = await rt.store.get_request(req.id)
        assert stored is not None and stored.outcome == "approved"
        assert [e.type for e in await rt.audit()].count("approval.settled") == 1
        assert fake.of("chat.postEphemeral") == []
    assert len(read_executions(records)) == 1


async def test_a_retried_form_submission_gets_the_first_answer_again(
    tmp_path: Path, fake: FakeSlack
) -> None:
    """A modal submission's answer (here: the errors of an empty answer) is what its retry
    with the same headers gets too, so the person's form shows the same thing."""
    async with refund_asked(tmp_path, str(tmp_path / "runs.jsonl")) as (rt, req):
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")):
            meta = {"request_id": req.id, "channel": "C42", "user": "U045EF6GH"}
            body = submission("signoff.text", meta, {"signoff.answer": {"answer": {}}})
            headers = sign(body, int(time.time()))
            first = await slack.handle(body, headers)
            assert first == {
                "response_action": "errors",
                "errors": {"signoff.answer": "Write an answer"},
            }
            assert await slack.handle(body, {**headers, **RETRY}) == first


async def test_a_retry_of_a_delivery_still_being_taken_is_refused_and_taken_once(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A retry with the first headers while the first delivery is still being saved is refused
    (Slack retries it later); the first is taken, once, and a later retry gets its answer."""
    records = str(tmp_path / "runs.jsonl")
    async with refund_asked(tmp_path, records) as (rt, req):
        slack = channel(fake)
        async with manual(ChannelHub(rt, [slack], state=tmp_path / "hub.db")) as hub:
            await hub.poll()
            remember = hub.state.remember
            saving, release = threading.Event(), threading.Event()

            def slow(channel_name: str, key: str, value: Any, **hub: str) -> None:
                if key.startswith("click:") and value.get("state") == "pending":
                    saving.set()
                    release.wait(5)
                remember(channel_name, key, value, **hub)

            monkeypatch.setattr(hub.state, "remember", slow)
            body = approve(req.id)
            headers = sign(body, int(time.time()))
            first = asyncio.create_task(slack.handle(body, headers))
            assert await asyncio.to_thread(saving.wait, 5)
            with pytest.raises(InvalidSignature, match="replay"):
                await slack.handle(body, {**headers, **RETRY})
            release.set()
            assert await first is None
            assert await slack.handle(body, {**headers, **RETRY}) is None
            await slack.idle()
            await hub.poll()
        assert [e.type for e in await rt.audit()].count("approval.settled") == 1
    assert len(read_executions(records)) == 1


async def test_an_event_retried_with_its_first_headers_over_http_is_acknowledged_once(
    tmp_path: Path, fake: FakeSlack, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the Events API endpoint: the retry with the first headers gets an empty 200 and sends
    nothing more; the same request without the retry header gets a 401."""
    async with so.Runtime([shop_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt:
        r = await rt.generate("shop", prompt="Reorder the soap")
        size, _ = r.pending
        sent: list[str] = []
        send = rt.send

        async def counted(session_id: str, message: str, **kwargs: Any) -> so.GenerateResult:
            sent.append(message)
            return await send(session_id, message, **kwargs)

        monkeypatch.setattr(rt, "send", counted)
        async with serving(rt, fake, tmp_path / "hub.db") as (slack, hub, app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
                body = event("Large")
                headers = signed(body)
                for extra in ({}, RETRY, {**RETRY, "X-Slack-Retry-Num": "2"}):
                    response = await http.post(EVENTS, content=body, headers={**headers, **extra})
                    assert (response.status_code, response.content) == (200, b"")
                    await slack.idle()
                replay = await http.post(EVENTS, content=body, headers=headers)
                assert replay.status_code == 401
                assert replay.json()["error"]["code"] == "invalid_signature"
            assert len(slack.memos("event:")) == 1
            await hub.poll()
        stored = await rt.store.get_request(size.id)
        assert stored is not None and stored.resolution is not None
        assert stored.resolution["answer"]["value"] == "Large"
        assert sent == ["Large"]
