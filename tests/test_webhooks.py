"""Webhooks: signed deliveries to a receiver on loopback, retried with backoff, verifiable."""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import hashlib
import hmac
import json
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

import signoff as so
from signoff.channels import (
    ChannelHub,
    ChannelState,
    InvalidSignature,
    WebhookChannel,
    verify_webhook,
)
from signoff.channels.webhooks import sign_webhook
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

SECRET = "whsec_test_4f1a"


class Receiver:
    """An HTTP endpoint on loopback that answers with the statuses it is given, then 204."""

    def __init__(self, statuses: list[int | tuple[int, dict[str, str]]]) -> None:
        self.statuses = list(statuses)
        self.attempts: list[tuple[dict[str, str], bytes]] = []
        self.accepted: list[tuple[dict[str, str], bytes]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Receiver:
        app = web.Application()
        app.router.add_post("/hooks/signoff", self.handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}/hooks/signoff"
        await web.SockSite(self._runner, sock).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = dict(request.headers)
        self.attempts.append((headers, body))
        if self.statuses:
            answer = self.statuses.pop(0)
            status, extra = answer if isinstance(answer, tuple) else (answer, {})
            return web.Response(status=status, headers=extra)
        self.accepted.append((headers, body))
        return web.Response(status=204)


@asynccontextmanager
async def manual(hub: ChannelHub) -> AsyncIterator[ChannelHub]:
    await hub.start(follow=False)
    try:
        yield hub
    finally:
        await hub.stop()


def refund_agent(**rules: Any) -> so.Agent:
    @so.tool(approval=so.always(**rules))
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": amount}

    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042", amount=180)), reply("Done.")],
        tools=[issue_refund],
    )


async def test_a_receiver_that_fails_twice_gets_the_event_once_with_a_valid_signature(
    tmp_path: Path,
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    async with (
        Receiver([500, 503]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, backoff=0.25, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks])) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            (req,) = r.pending
            await hub.poll()
            await hooks.drain()
        assert len(receiver.attempts) == 3
        assert slept == [0.25, 0.5]  # exponential backoff, not slept for real
        ((headers, body),) = receiver.accepted
        assert (hooks.delivered, hooks.failed) == (1, 0)
        payload = verify_webhook(SECRET, headers, body)
        assert payload["type"] == "request.opened"
        assert headers["Signoff-Event"] == "request.opened"
        assert payload["request"]["id"] == req.id
        assert payload["request"]["action"]["input"] == {"order_id": "1042", "amount": 180.0}
        assert payload["resolution"] is None
        # every attempt carries the same delivery id (receivers dedupe on it)
        assert {h["Signoff-Delivery"] for h, _ in receiver.attempts} == {payload["id"]}
        with pytest.raises(InvalidSignature, match="does not match"):
            verify_webhook("another secret", headers, body)


async def test_a_delivery_is_signed_as_documented(tmp_path: Path) -> None:
    """A receiver written without signoff checks `v1=` + hex HMAC-SHA256 of `{timestamp}.{body}`
    with the shared secret: what is sent is exactly that, so `verify_webhook` agreeing with
    `sign_webhook` is not all that holds."""
    known = "v1=24ba2bb9ea0a9575f3f35509273afdc182462e1a23a57134207cf963590ceb07"
    assert sign_webhook(SECRET, 1_700_000_000, b'{"id":"dlv_1"}') == known
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [hooks])) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
    ((headers, body),) = receiver.accepted
    signed = f"{headers['Signoff-Timestamp']}.".encode() + body
    mac = hmac.new(SECRET.encode(), signed, hashlib.sha256).hexdigest()
    assert headers["Signoff-Signature"] == f"v1={mac}"


async def test_resolution_and_expiry_warnings_are_delivered(tmp_path: Path) -> None:
    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        async with manual(ChannelHub(rt, [hooks], clock=clock)) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            (req,) = r.pending
            assert req.expires_at == clock.now + 3600
            await hub.poll()
            clock.advance(2000)
            await hub.poll()  # 1600 s left: no warning yet
            clock.advance(1100)
            await hub.poll()  # 500 s left: warned once
            await hub.poll()
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="cancel", text="not now")],
                principal=so.Principal(authenticator="web", principal_id="bob"),
            )
            await hub.poll()
            await hooks.drain()
            assert hooks.recall(f"warned:{req.id}") is None  # the memo goes with the request
        # each is signed when sent, which can be before the clock moved on
        payloads = [
            verify_webhook(SECRET, h, b, now=clock.now, tolerance=4000)
            for h, b in receiver.accepted
        ]
        assert [p["type"] for p in payloads] == [
            "request.opened",
            "request.expiring",
            "request.resolved",
        ]
        resolution = payloads[-1]["resolution"]
        assert resolution["outcome"] == "cancelled"
        assert resolution["reason"] == "not now"
        assert resolution["by"]["principal_id"] == "bob"
        assert payloads[1]["request"]["expires_at"] == req.expires_at


async def test_refusals_are_not_retried_and_retries_end(tmp_path: Path) -> None:
    async def sleep(seconds: float) -> None:
        return None

    async with Receiver([400, 500, 500, 500]) as receiver:
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=3, sleep=sleep)
        raw = json.dumps({"hello": "world"}).encode()
        assert await hooks.deliver(receiver.url, "whd_1", "request.opened", raw) is False
        assert len(receiver.attempts) == 1  # a 4xx refusal is final
        assert await hooks.deliver(receiver.url, "whd_2", "request.opened", raw) is False
        assert len(receiver.attempts) == 4  # three attempts, then it gives up
        assert (hooks.delivered, hooks.failed) == (0, 2)
        await hooks.close()


async def test_a_password_in_a_webhook_url_is_sent_but_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A receiver that takes Basic auth from the URL (`https://user:password@host/`): the
    password reaches it, and the log lines of retries, refusals and give-ups show it masked."""

    async def sleep(seconds: float) -> None:
        return None

    async with Receiver([500, 500, 503, 400]) as receiver:
        url = receiver.url.replace("http://", "http://hook:s3cr3t-pw@")
        hooks = WebhookChannel(url, SECRET, max_attempts=3, sleep=sleep)
        raw = json.dumps({"hello": "world"}).encode()
        with caplog.at_level(logging.DEBUG, logger="signoff.channels"):
            assert await hooks.deliver(url, "whd_1", "request.opened", raw) is False
            assert await hooks.deliver(url, "whd_2", "request.opened", raw) is False
        await hooks.close()
    assert receiver.attempts[0][0]["Authorization"] == "Basic aG9vazpzM2NyM3QtcHc="
    shown = [r.getMessage() for r in caplog.records]
    assert len(shown) == 4 and all("hook:***@127.0.0.1" in line for line in shown), shown
    assert not any("s3cr3t" in line for line in shown)
    with pytest.raises(so.UsageError, match=r"hook:\*\*\*@") as given_twice:
        WebhookChannel([url, url], SECRET)
    assert "s3cr3t" not in str(given_twice.value)


async def test_an_unreachable_receiver_is_retried() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    hooks = WebhookChannel(
        f"http://127.0.0.1:{port}/x", SECRET, max_attempts=4, backoff=1, max_backoff=3, sleep=sleep
    )
    assert await hooks.deliver(hooks.urls[0], "whd_1", "request.opened", b"{}") is False
    assert slept == [1, 2, 3]
    await hooks.close()


def test_verify_webhook_rejects_what_it_should() -> None:
    body = b'{"type":"request.opened"}'
    stamp = 1_700_000_000
    good = {"Signoff-Timestamp": str(stamp), "Signoff-Signature": sign_webhook(SECRET, stamp, body)}
    assert verify_webhook(SECRET, good, body, now=stamp + 10) == {"type": "request.opened"}
    # header names are case-insensitive; several signatures (secret rotation) are accepted
    rotated = {
        "signoff-timestamp": str(stamp),
        "signoff-signature": "v1=00ff, " + sign_webhook(SECRET, stamp, body),
    }
    assert verify_webhook(SECRET, rotated, body.decode(), now=stamp) == {"type": "request.opened"}
    with pytest.raises(InvalidSignature, match="more than 300s"):
        verify_webhook(SECRET, good, body, now=stamp + 301)
    with pytest.raises(InvalidSignature, match="more than 60s"):
        verify_webhook(SECRET, good, body, now=stamp - 61, tolerance=60)
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_webhook(SECRET, good, body + b" ", now=stamp)
    with pytest.raises(InvalidSignature, match="missing"):
        verify_webhook(SECRET, {"Signoff-Timestamp": str(stamp)}, body, now=stamp)
    with pytest.raises(InvalidSignature, match="missing"):
        signed_only = {"Signoff-Signature": good["Signoff-Signature"]}
        verify_webhook(SECRET, signed_only, body, now=stamp)
    with pytest.raises(InvalidSignature, match="not a Unix timestamp"):
        verify_webhook(SECRET, {**good, "Signoff-Timestamp": "yesterday"}, body, now=stamp)
    with pytest.raises(InvalidSignature, match="more than 300s off"):  # too large for a float
        verify_webhook(SECRET, {**good, "Signoff-Timestamp": "9" * 400}, body, now=stamp + 0.5)
    unsigned_json = b"[1]"
    listed = {
        "Signoff-Timestamp": str(stamp),
        "Signoff-Signature": sign_webhook(SECRET, stamp, unsigned_json),
    }
    with pytest.raises(InvalidSignature, match="not a JSON object"):
        verify_webhook(SECRET, listed, unsigned_json, now=stamp)
    with pytest.raises(so.UsageError):
        verify_webhook("", good, body)


def test_configuration_errors_are_named() -> None:
    with pytest.raises(so.UsageError, match="at least one URL"):
        WebhookChannel([], SECRET)
    with pytest.raises(so.UsageError, match="http"):
        WebhookChannel("ftp://example.com", SECRET)
    with pytest.raises(so.UsageError, match="secret"):
        WebhookChannel("https://example.com/hook", "")
    with pytest.raises(so.UsageError, match="max_attempts"):
        WebhookChannel("https://example.com/hook", SECRET, max_attempts=0)
    for timeout in (0, -1, float("nan")):
        with pytest.raises(so.UsageError, match="timeout"):
            WebhookChannel("https://example.com/hook", SECRET, timeout=timeout)
    # each URL once (twice would deliver every event twice), and one httpx can send to
    with pytest.raises(so.UsageError, match="twice"):
        WebhookChannel(["https://example.com/a", "https://example.com/a"], SECRET)
    for bad in ("https://[::1", "http://", "https:///path"):
        with pytest.raises(so.UsageError, match="URL"):
            WebhookChannel(bad, SECRET)


async def test_deliveries_unsent_at_close_are_counted_and_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with Receiver([503] * 50) as receiver:
        hooks = WebhookChannel(receiver.url, SECRET, timeout=0.3, backoff=10, max_attempts=5)
        request = so.InputRequest(
            kind="question", id="req_9", session_id="s", turn_id="t", agent="a", created_at=0.0
        )
        for event in ("request.opened", "request.expiring", "request.resolved"):
            await hooks.enqueue(event, request)
        await hooks.close()
    assert (hooks.delivered, hooks.failed) == (0, 3)  # one waiting for a retry, two queued
    assert "3 deliveries were not sent within 0.3s of closing and are lost" in caplog.text


async def test_deliveries_to_one_url_keep_their_order() -> None:
    async with Receiver([]) as receiver:
        hooks = WebhookChannel(receiver.url, SECRET)
        request = so.InputRequest(
            kind="question", id="req_9", session_id="s", turn_id="t", agent="a", created_at=0.0
        )
        for event in ("request.opened", "request.expiring", "request.resolved"):
            await hooks.enqueue(event, request)
        await asyncio.wait_for(hooks.drain(), 10)
        await hooks.close()
    assert [json.loads(b)["type"] for _, b in receiver.accepted] == [
        "request.opened",
        "request.expiring",
        "request.resolved",
    ]


def test_verify_webhook_refuses_non_ascii_headers_by_name() -> None:
    """A forged signature or timestamp with non-ASCII characters is an `InvalidSignature`, not a
    TypeError from `hmac.compare_digest` (a 500 in the receiver)."""
    body = b'{"type":"request.opened"}'
    stamp = 1_700_000_000
    good = {"Signoff-Timestamp": str(stamp), "Signoff-Signature": sign_webhook(SECRET, stamp, body)}
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_webhook(SECRET, {**good, "Signoff-Signature": "v1=\u00e9"}, body, now=stamp)
    # int() reads other scripts' digits and underscores; the header is ASCII digits only
    arabic = "\u0661\u0667\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660"
    for odd in (arabic, "1_700_000_000", "9" * 5000):
        with pytest.raises(InvalidSignature, match="not a Unix timestamp"):
            verify_webhook(SECRET, {**good, "Signoff-Timestamp": odd}, body, now=stamp)


async def test_a_request_with_a_lone_surrogate_is_still_delivered() -> None:
    """A model can put an unpaired surrogate (`\\ud800`) in a tool's input and the store keeps
    it; the delivery escapes it instead of failing on UTF-8 every time it is tried."""
    async with Receiver([]) as receiver:
        hooks = WebhookChannel(receiver.url, SECRET)
        request = so.InputRequest(
            kind="question",
            id="req_9",
            session_id="s",
            turn_id="t",
            agent="a",
            created_at=0.0,
            question="caf\u00e9 \ud800",
        )
        await hooks.enqueue("request.opened", request)
        await asyncio.wait_for(hooks.drain(), 10)
        await hooks.close()
    ((headers, body),) = receiver.accepted
    assert verify_webhook(SECRET, headers, body)["request"]["question"] == "caf\u00e9 \ud800"


@asynccontextmanager
async def raw_receiver(answer: Any) -> AsyncIterator[str]:
    """A loopback TCP server that reads a request's head and lets `answer(writer)` reply."""

    handlers: set[asyncio.Task[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        handlers.add(task)
        try:
            with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
                await reader.readuntil(b"\r\n\r\n")
                await answer(writer)
        finally:
            writer.close()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await writer.wait_closed()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/hook"
    finally:
        server.close()
        for task in handlers:  # the endless answers
            task.cancel()
        await asyncio.gather(*handlers, return_exceptions=True)
        await server.wait_closed()


async def test_a_receivers_endless_answer_is_not_read() -> None:
    """Only the status matters: a 200 followed by an endless body neither hangs the URL's
    queue nor grows memory, it counts as delivered."""

    async def endless(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        while True:
            writer.write(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")
            await writer.drain()

    async with raw_receiver(endless) as url:
        hooks = WebhookChannel(url, SECRET, timeout=2, max_attempts=1)
        delivered = await asyncio.wait_for(hooks.deliver(url, "whd_1", "request.opened", b"{}"), 5)
        await hooks.close()
    assert delivered is True and (hooks.delivered, hooks.failed) == (1, 0)


async def test_a_receiver_that_trickles_its_answer_times_out() -> None:
    """`timeout` bounds a whole attempt: a receiver sending a byte now and then (each read
    within httpx's own per-read timeout) does not hold the URL's deliveries forever."""

    async def trickle(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        while True:
            writer.write(b"X")
            await writer.drain()
            await asyncio.sleep(0.05)

    async with raw_receiver(trickle) as url:
        hooks = WebhookChannel(url, SECRET, timeout=0.5, max_attempts=1)
        delivered = await asyncio.wait_for(hooks.deliver(url, "whd_1", "request.opened", b"{}"), 5)
        await hooks.close()
    assert delivered is False and (hooks.delivered, hooks.failed) == (0, 1)


async def test_a_redirect_is_a_refusal_and_is_not_followed() -> None:
    """The signed body goes only to the configured URL: a 301 elsewhere is final, not retried."""
    async with Receiver([]) as elsewhere:

        async def moved(writer: asyncio.StreamWriter) -> None:
            writer.write(
                f"HTTP/1.1 301 Moved\r\nLocation: {elsewhere.url}\r\n"
                "Content-Length: 0\r\n\r\n".encode()
            )
            await writer.drain()

        async with raw_receiver(moved) as url:
            hooks = WebhookChannel(url, SECRET, max_attempts=3)
            assert await hooks.deliver(url, "whd_1", "request.opened", b"{}") is False
            await hooks.close()
    assert elsewhere.attempts == [] and (hooks.delivered, hooks.failed) == (0, 1)


async def test_a_delivery_given_up_on_is_sent_again_when_the_hub_next_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Like Slack's posts: a delivery that ran out of attempts is logged as an error and kept in
    the hub's state, sent again (same delivery id) on the next start, and then forgotten."""

    async def sleep(seconds: float) -> None:
        return None

    state = tmp_path / "hub.db"
    async with (
        Receiver([503, 503]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=2, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        assert (hooks.delivered, hooks.failed, receiver.accepted) == (0, 1, [])
        assert "gave up on" in caplog.text
        for _ in range(2):  # sent on the first start after, not again on the second
            again = WebhookChannel(receiver.url, SECRET, sleep=sleep)
            async with manual(ChannelHub(rt, [again], state=state)):
                await asyncio.wait_for(again.drain(), 10)
        ((headers, body),) = receiver.accepted
        payload = verify_webhook(SECRET, headers, body)
        assert payload["request"]["id"] == r.pending[0].id
        assert {h["Signoff-Delivery"] for h, _ in receiver.attempts} == {payload["id"]}


async def test_a_refused_delivery_is_not_kept(tmp_path: Path) -> None:
    """A 4xx is the receiver's final word: it is not sent again on the next start."""
    async with (
        Receiver([400]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db")) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        again = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [again], state=tmp_path / "hub.db")):
            await asyncio.wait_for(again.drain(), 10)
        assert len(receiver.attempts) == 1 and receiver.accepted == []


async def test_a_client_that_follows_redirects_still_sends_only_to_the_configured_url() -> None:
    """The signed body never leaves for another URL, also with a client the caller configured
    to follow redirects: a 307 (which would carry the body on) is a refusal."""
    import httpx

    async with Receiver([]) as elsewhere:

        async def moved(writer: asyncio.StreamWriter) -> None:
            writer.write(
                f"HTTP/1.1 307 Temporary Redirect\r\nLocation: {elsewhere.url}\r\n"
                "Content-Length: 0\r\n\r\n".encode()
            )
            await writer.drain()

        async with (
            raw_receiver(moved) as url,
            httpx.AsyncClient(follow_redirects=True) as client,
        ):
            hooks = WebhookChannel(url, SECRET, max_attempts=3, client=client)
            assert await hooks.deliver(url, "whd_1", "request.opened", b"{}") is False
            await hooks.close()
    assert elsewhere.attempts == [] and (hooks.delivered, hooks.failed) == (0, 1)


async def test_an_unsent_delivery_to_a_url_with_a_space_is_sent_on_the_next_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A URL may hold a space (in its query, say): the kept delivery still names that URL, so
    the next start sends it rather than dropping it as no longer configured."""

    async def sleep(seconds: float) -> None:
        return None

    state = tmp_path / "hub.db"
    async with (
        Receiver([503]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        url = receiver.url + "?team=ops desk"
        hooks = WebhookChannel(url, SECRET, max_attempts=1, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        assert receiver.accepted == []
        again = WebhookChannel(url, SECRET, sleep=sleep)
        async with manual(ChannelHub(rt, [again], state=state)):
            await asyncio.wait_for(again.drain(), 10)
    assert "no longer configured" not in caplog.text
    ((headers, body),) = receiver.accepted
    assert verify_webhook(SECRET, headers, body)["type"] == "request.opened"


def test_verify_webhook_refuses_a_tolerance_or_clock_that_checks_nothing() -> None:
    """A NaN tolerance or `now` compares false with every age: replays of any age would pass."""
    body = b'{"type":"request.opened"}'
    stamp = 1_700_000_000
    good = {"Signoff-Timestamp": str(stamp), "Signoff-Signature": sign_webhook(SECRET, stamp, body)}
    for tolerance in (float("nan"), -1.0):
        with pytest.raises(so.UsageError, match="tolerance"):
            verify_webhook(SECRET, good, body, now=stamp, tolerance=tolerance)
    for now in (float("nan"), float("inf")):
        with pytest.raises(so.UsageError, match="now"):
            verify_webhook(SECRET, good, body, now=now)


def test_verify_webhook_refuses_delivery_headers_that_contradict_the_signed_body() -> None:
    """`Signoff-Delivery` and `Signoff-Event` are not signed: a replay that changes them (so a
    receiver deduping on the header takes it as new) is refused rather than believed."""
    body = b'{"id":"whd_1","type":"request.opened"}'
    stamp = 1_700_000_000
    good = {
        "Signoff-Timestamp": str(stamp),
        "Signoff-Signature": sign_webhook(SECRET, stamp, body),
        "Signoff-Delivery": "whd_1",
        "Signoff-Event": "request.opened",
    }
    assert verify_webhook(SECRET, good, body, now=stamp)["id"] == "whd_1"
    with pytest.raises(InvalidSignature, match="Signoff-Delivery"):
        verify_webhook(SECRET, {**good, "Signoff-Delivery": "whd_2"}, body, now=stamp)
    with pytest.raises(InvalidSignature, match="Signoff-Event"):
        verify_webhook(SECRET, {**good, "Signoff-Event": "request.resolved"}, body, now=stamp)


def test_verify_webhook_refuses_a_signed_body_nested_too_deeply_by_name() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    stamp = 1_700_000_000
    signed = {
        "Signoff-Timestamp": str(stamp),
        "Signoff-Signature": sign_webhook(SECRET, stamp, body),
    }
    with pytest.raises(InvalidSignature, match="not JSON"):
        verify_webhook(SECRET, signed, body, now=stamp)


def test_a_nan_backoff_or_warning_window_and_a_fractional_max_attempts_are_refused() -> None:
    """NaN passes a `< 0` check: a NaN `max_backoff` would have a retry sleep forever and a NaN
    `expiring_within` would warn at once; `max_attempts=2.5` would fail each delivery later."""
    nan = float("nan")
    with pytest.raises(so.UsageError, match="backoff"):
        WebhookChannel("https://example.com/hook", SECRET, backoff=nan)
    with pytest.raises(so.UsageError, match="max_backoff"):
        WebhookChannel("https://example.com/hook", SECRET, max_backoff=nan)
    with pytest.raises(so.UsageError, match="expiring_within"):
        WebhookChannel("https://example.com/hook", SECRET, expiring_within=nan)
    for attempts in (2.5, "3", True):
        with pytest.raises(so.UsageError, match="max_attempts"):
            WebhookChannel("https://example.com/hook", SECRET, max_attempts=attempts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ({"timeout": float("inf")}, "timeout must be a positive, finite number of seconds"),
        ({"timeout": "10"}, "timeout must be a positive, finite number of seconds"),
        ({"timeout": True}, "timeout must be a positive, finite number of seconds"),
        ({"backoff": float("inf")}, "backoff must be a finite number of seconds from 0"),
        ({"max_backoff": -1}, "max_backoff must be a finite number of seconds from 0"),
        ({"expiring_within": "300"}, "expiring_within must be a finite number of seconds"),
        ({"max_attempts": 0}, "max_attempts must be a whole number from 1, not 0"),
    ],
)
def test_webhook_settings_out_of_their_range_are_refused_naming_it(
    setting: dict[str, Any], message: str
) -> None:
    """An infinite timeout or backoff hung a delivery for ever, and a string where the seconds
    go was a bare TypeError; each is a `UsageError` naming the setting and its range."""
    with pytest.raises(so.UsageError, match=f"^{message}"):
        WebhookChannel("https://example.com/hook", SECRET, **setting)
    assert WebhookChannel("https://example.com/hook", SECRET, backoff=0, max_backoff=0).backoff == 0


def test_a_url_no_connection_can_use_is_refused_when_configured() -> None:
    """A port past 65535 made every send raise (an ExceptionGroup, not a failed attempt) and
    a malformed IDNA host raised a UnicodeError: both are configuration errors, by name."""
    for bad in ("http://127.0.0.1:99999/hook", "http://127.0.0.1:0/hook", "http://xn--/hook"):
        with pytest.raises(so.UsageError, match="URL"):
            WebhookChannel(bad, SECRET)


async def test_secret_rotation_signs_with_each_secret_and_verifies_with_any() -> None:
    """Rotating the secret: the channel signs with the new and the old one at once, so
    receivers that still check the old secret accept every delivery (a refusal is final,
    so a rotation without this drops deliveries), and a receiver may check both."""
    async with Receiver([]) as receiver:
        hooks = WebhookChannel(receiver.url, ["whsec_new", SECRET])
        sent = b'{"id":"whd_1","type":"request.opened"}'
        assert await hooks.deliver(receiver.url, "whd_1", "request.opened", sent) is True
        await hooks.close()
    ((headers, body),) = receiver.accepted
    assert verify_webhook(SECRET, headers, body)["id"] == "whd_1"
    assert verify_webhook("whsec_new", headers, body)["id"] == "whd_1"
    assert verify_webhook(["whsec_newer", "whsec_new"], headers, body)["id"] == "whd_1"
    with pytest.raises(InvalidSignature, match="does not match"):
        verify_webhook(["whsec_other", "whsec_newer"], headers, body)
    for bad in ([], [""], ["ok", 7]):
        with pytest.raises(so.UsageError, match="secret"):
            WebhookChannel(receiver.url, bad)  # type: ignore[arg-type]
        with pytest.raises(so.UsageError, match="secret"):
            verify_webhook(bad, headers, body)  # type: ignore[arg-type]


async def test_an_expiry_warning_the_state_could_not_keep_is_sent_on_the_next_tick(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A channel state that fails once (locked too long) while a warning is queued: the
    warning was marked sent and its deadline dropped first, so it was never sent."""
    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=600, clock=clock)
        async with manual(ChannelHub(rt, [hooks], state=tmp_path / "hub.db", clock=clock)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            clock.advance(3100)
            keep = hooks.state.remember
            failed: list[str] = []

            def remember(channel: str, key: str, value: Any, **hub: str) -> None:
                if key.startswith("outbox:") and not failed:
                    failed.append(key)
                    raise so.StoreError("channel state: database is locked")
                keep(channel, key, value, **hub)

            monkeypatch.setattr(hooks.state, "remember", remember)
            await hub.poll()  # the tick fails (logged by the hub)
            assert failed
            await hub.poll()
            await hooks.drain()
        payloads = [
            verify_webhook(SECRET, h, b, now=clock.now, tolerance=4000)
            for h, b in receiver.accepted
        ]
        assert [p["type"] for p in payloads] == ["request.opened", "request.expiring"]


async def test_an_opening_the_state_could_not_keep_is_sent_when_the_hub_retries_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The delivery was marked queued before it was kept: when keeping it failed, the hub's
    retry of the entry found it "already queued", and the receiver never heard of it."""
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET)
        hub = ChannelHub(rt, [hooks], state=tmp_path / "hub.db", retry_backoff=0)
        async with manual(hub):
            keep = hooks.state.remember
            failed: list[str] = []

            def remember(channel: str, key: str, value: Any, **hub: str) -> None:
                if key.startswith("outbox:") and not failed:
                    failed.append(key)
                    raise so.StoreError("channel state: database is locked")
                keep(channel, key, value, **hub)

            monkeypatch.setattr(hooks.state, "remember", remember)
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()  # on_requested fails: the hub retries the entry
            assert failed
            await hub.poll()
            await asyncio.wait_for(hooks.drain(), 10)
        ((headers, body),) = receiver.accepted
        assert verify_webhook(SECRET, headers, body)["type"] == "request.opened"


def test_a_secret_that_is_not_valid_unicode_is_refused_when_configured() -> None:
    """A secret read from an environment holding invalid UTF-8 has lone surrogates: signing
    raised UnicodeEncodeError on every send (never a failed attempt, kept forever)."""
    for bad in ("whsec_\udcff", ["whsec_new", "\ud800"]):
        with pytest.raises(so.UsageError, match="secret"):
            WebhookChannel("https://example.com/hook", bad)
        with pytest.raises(so.UsageError, match="secret"):
            verify_webhook(bad, {}, b"{}")


async def test_a_delivery_posted_but_not_recorded_is_posted_again_with_the_same_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash between the receiver's 2xx and forgetting the kept delivery (here: forgetting
    fails) posts it again on the next start: the same `Signoff-Delivery` and payload `id`, a
    body that verifies, so the receiver can drop the duplicate."""
    state = tmp_path / "hub.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [hooks], state=state)) as hub:
            keep = hooks.state.forget

            def forget(channel: str, key: str, **hub: str) -> None:
                if key.startswith("outbox:"):
                    raise so.StoreError("channel state: disk I/O error")
                keep(channel, key, **hub)

            monkeypatch.setattr(hooks.state, "forget", forget)
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        monkeypatch.undo()
        again = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [again], state=state)):
            await asyncio.wait_for(again.drain(), 10)
    kept = ChannelState(state)
    assert kept.memos("webhooks", "outbox:") == []  # sent the second time, and forgotten
    kept.close()
    first, second = receiver.accepted
    assert first[0]["Signoff-Delivery"] == second[0]["Signoff-Delivery"]
    ids = {verify_webhook(SECRET, h, b)["id"] for h, b in receiver.accepted}
    assert ids == {first[0]["Signoff-Delivery"]}


def test_verify_webhook_refuses_a_text_body_utf8_cannot_hold_by_name() -> None:
    """A body passed as text with a lone surrogate (a framework that decoded invalid UTF-8
    with surrogateescape) is an `InvalidSignature`, not a UnicodeEncodeError (a 500)."""
    stamp = 1_700_000_000
    headers = {"Signoff-Timestamp": str(stamp), "Signoff-Signature": "v1=00"}
    with pytest.raises(InvalidSignature, match="raw bytes"):
        verify_webhook(SECRET, headers, '{"a":"caf\udce9"}', now=stamp)


async def test_a_receiver_asking_to_retry_later_is_waited_for_up_to_max_backoff() -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    now = 1_800_000_000.0
    later = email.utils.formatdate(now + 20, usegmt=True)
    answers: list[int | tuple[int, dict[str, str]]] = [
        (429, {"Retry-After": "5"}),  # longer than the backoff's 1 s: waited for
        (503, {"Retry-After": later}),  # an HTTP date, 20 s on
        (429, {"Retry-After": "3600"}),  # an hour: no longer than max_backoff
        (503, {"Retry-After": "soon"}),  # unreadable: the backoff's own 8 s
        (429, {"Retry-After": "0"}),  # shorter than the backoff: the backoff's 16 s
    ]
    async with Receiver(answers) as receiver:
        hooks = WebhookChannel(
            receiver.url,
            SECRET,
            max_attempts=6,
            backoff=1,
            max_backoff=30,
            sleep=sleep,
            clock=lambda: now,
        )
        assert await hooks.deliver(receiver.url, "whd_1", "request.opened", b"{}") is True
        assert slept == [5, 20, 30, 8, 16]
        assert len(receiver.accepted) == 1
        await hooks.close()


# -- escalations ---------------------------------------------------------------------------------

FIONA = so.Principal(authenticator="sso", principal_id="fiona", attributes={"groups": ["finance"]})
TIMED_OUT = "no one decided before the deadline"


def finance_when_escalated(ctx: so.ResponseContext) -> so.Allowed | so.Rejected:
    """Once escalated, members of the group it went to may answer."""
    who = ctx.response.principal
    group = ctx.request.escalated_to
    if group is not None and who is not None and group in who.attributes.get("groups", []):
        return so.Allowed()
    return so.Rejected("not in the group this was escalated to")


def escalating_agent() -> so.Agent:
    spec = so.ApprovalSpec(
        request=so.always(),
        response=finance_when_escalated,
        expires_in=60,
        on_timeout="escalate",
        escalate_to="finance",
    )

    @so.tool(approval=spec)
    async def issue_refund(order_id: str, amount: float) -> dict[str, Any]:
        """Refund an order."""
        return {"refunded": amount}

    return scripted_agent(
        "support",
        [call_tools(call("issue_refund", order_id="1042", amount=180)), reply("Done.")],
        tools=[issue_refund],
    )


async def escalated_at(rt: so.Runtime, request_id: str) -> float:
    (entry,) = [
        e
        for e in await rt.audit()
        if e.type == "approval.candidate"
        and e.data["outcome"] == "escalated"
        and e.data["request_id"] == request_id
    ]
    return entry.at


@pytest.mark.parametrize("applied_by", ["sweep", "listing", "answer"])
async def test_an_escalation_is_delivered_once_signed_whichever_process_applies_it(
    store_url: str, applied_by: str
) -> None:
    """The hub's runtime never looks at the request: another process applies the passed deadline
    (a worker's sweep, a listing of the queue, or the answer of the group it went to), and the
    receiver is told once, with the group, when, and the request as stored by then."""
    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime([escalating_agent()], store=store_url, clock=clock) as rt,
        so.Runtime([escalating_agent()], store=store_url, clock=clock) as other,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, expiring_within=0, clock=clock)
        async with manual(ChannelHub(rt, [hooks], clock=clock)) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            (req,) = r.pending
            await hub.poll()
            clock.advance(61)
            await hub.poll()  # the deadline passed, but no one has applied it yet
            await hooks.drain()
            assert [json.loads(b)["type"] for _, b in receiver.accepted] == ["request.opened"]
            if applied_by == "sweep":
                assert await other.expire_due() == 1
            elif applied_by == "listing":
                assert [q.id for q in await other.pending()] == [req.id]
            else:
                answer = so.InputResponse(request_id=req.id, option_id="approve")
                done = await other.respond(r.session_id, [answer], principal=FIONA)
                assert done.status == "completed"
            await hub.poll()
            await hub.poll()  # read again: nothing new, nothing sent twice
            assert await other.expire_due() == 0
            await hooks.drain()
        at = await escalated_at(rt, req.id)
        stored = await rt.store.get_request(req.id)
        assert stored is not None
    payloads = [verify_webhook(SECRET, h, b, now=clock.now) for h, b in receiver.accepted]
    expected = ["request.opened", "request.escalated"]
    if applied_by == "answer":
        expected.append("request.resolved")
    assert [p["type"] for p in payloads] == expected
    headers, _ = receiver.accepted[1]
    escalated = payloads[1]
    assert headers["Signoff-Event"] == "request.escalated"
    assert headers["Signoff-Delivery"] == escalated["id"]
    assert escalated["escalation"] == {
        "request_id": req.id,
        "session_id": r.session_id,
        "to": "finance",
        "at": at,
        "reason": TIMED_OUT,
    }
    assert escalated["resolution"] is None
    # the request as stored when the hub read the escalation: the group named, no deadline
    assert escalated["request"] == stored.request.model_dump(mode="json")
    assert escalated["request"]["escalated_to"] == "finance"
    assert escalated["request"]["expires_at"] is None
    assert escalated["request"]["status"] == ("settled" if applied_by == "answer" else "pending")
    assert payloads[0]["escalation"] is None  # every event has the same keys
    assert len({p["id"] for p in payloads}) == len(payloads)


async def test_an_escalation_the_receiver_fails_is_retried_with_the_same_delivery_id(
    tmp_path: Path,
) -> None:
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    clock = ManualClock()
    async with (
        Receiver([]) as receiver,
        so.Runtime([escalating_agent()], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt,
    ):
        hooks = WebhookChannel(
            receiver.url, SECRET, expiring_within=0, backoff=0.25, sleep=sleep, clock=clock
        )
        async with manual(ChannelHub(rt, [hooks], clock=clock)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            receiver.statuses = [503, (429, {"Retry-After": "2"})]
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()
            await hooks.drain()
    assert slept == [0.25, 2.0]  # backoff, then the receiver's Retry-After
    tried = [h for h, _ in receiver.attempts if h["Signoff-Event"] == "request.escalated"]
    assert len(tried) == 3
    opened, escalated = (verify_webhook(SECRET, h, b, now=clock.now) for h, b in receiver.accepted)
    assert (opened["type"], escalated["type"]) == ("request.opened", "request.escalated")
    assert escalated["escalation"]["to"] == "finance"
    assert {h["Signoff-Delivery"] for h in tried} == {escalated["id"]}
    assert (hooks.delivered, hooks.failed) == (2, 0)


async def test_an_escalation_given_up_on_is_sent_again_when_the_hub_next_starts(
    tmp_path: Path,
) -> None:
    async def sleep(seconds: float) -> None:
        return None

    clock = ManualClock()
    state = tmp_path / "hub.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime([escalating_agent()], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock) as rt,
    ):
        hooks = WebhookChannel(
            receiver.url, SECRET, expiring_within=0, max_attempts=2, sleep=sleep, clock=clock
        )
        async with manual(ChannelHub(rt, [hooks], state=state, clock=clock)) as hub:
            await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
            receiver.statuses = [503, 503]
            clock.advance(61)
            assert await rt.expire_due() == 1
            await hub.poll()
            await hooks.drain()
        assert (hooks.delivered, hooks.failed) == (1, 1)
        for _ in range(2):  # sent on the first start after, not again on the second
            again = WebhookChannel(receiver.url, SECRET, sleep=sleep, clock=clock)
            async with manual(ChannelHub(rt, [again], state=state, clock=clock)) as hub:
                await hub.poll()  # the trail holds nothing new for it
                await asyncio.wait_for(again.drain(), 10)
    payloads = [verify_webhook(SECRET, h, b, now=clock.now) for h, b in receiver.accepted]
    assert [p["type"] for p in payloads] == ["request.opened", "request.escalated"]
    tried = [h for h, _ in receiver.attempts if h["Signoff-Event"] == "request.escalated"]
    assert len(tried) == 3  # two given up on, then the one the next start sent
    assert {h["Signoff-Delivery"] for h in tried} == {payloads[1]["id"]}


class DownOnOpening(WebhookChannel):
    """A webhook channel whose first `on_requested` fails (its state was locked, say)."""

    def __init__(self, *args: Any, down: bool, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.down = down

    async def on_requested(self, request: so.InputRequest) -> None:
        if self.down:
            self.down = False
            raise RuntimeError("down")
        await super().on_requested(request)


async def test_an_opening_delivered_again_after_the_close_is_not_warned_about(
    tmp_path: Path, store_url: str
) -> None:
    """The hub gives up on a request's opening, and delivers it again at its next start, after
    its close: no `request.expiring` for the closed request, and no `warned:` memo that nothing
    would ever drop (the close was delivered before)."""
    clock = ManualClock()
    state = tmp_path / "channels.db"
    async with (
        Receiver([]) as receiver,
        so.Runtime([refund_agent(expires_in=3600)], store=store_url, clock=clock) as rt,
    ):
        hooks = DownOnOpening(receiver.url, SECRET, expiring_within=600, clock=clock, down=True)
        hub = ChannelHub(rt, [hooks], state=state, clock=clock, max_attempts=1)
        async with manual(hub):
            r = await rt.generate("support", prompt="Refund 1042")
            (req,) = r.pending
            await hub.poll()  # the opening is given up on
            await rt.respond(
                r.session_id,
                [so.InputResponse(request_id=req.id, option_id="cancel")],
                principal=so.Principal(authenticator="web", principal_id="bob"),
            )
            await hub.poll()
        clock.advance(3100)  # within `expiring_within` of the deadline the request had
        again = DownOnOpening(receiver.url, SECRET, expiring_within=600, clock=clock, down=False)
        async with manual(ChannelHub(rt, [again], state=state, clock=clock)) as hub:
            await hub.poll()  # the opening again, then a tick
            await hub.poll()
            await again.drain()
            assert again.recall(f"warned:{req.id}") is None
    types = [json.loads(b)["type"] for _, b in receiver.accepted]
    assert sorted(types) == ["request.opened", "request.resolved"]


# -- hubs of different names on one state file -------------------------------------------------


async def test_a_hub_never_drops_the_unsent_deliveries_of_another_hub_sharing_its_state(
    store_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two hubs (different names) on one file, each with a webhook channel named `webhooks`
    posting to its own URL: the other's start dropped the first's kept delivery as "no longer
    configured", and the first's next start had nothing left to send."""

    async def sleep(seconds: float) -> None:
        return None

    state = tmp_path / "hub.db"
    async with (
        Receiver([503]) as ours,
        Receiver([]) as theirs,
        so.Runtime([refund_agent()], store=store_url) as rt,
    ):
        hooks = WebhookChannel(ours.url, SECRET, max_attempts=1, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state, name="ops")) as hub:
            r = await rt.generate("support", prompt="Refund 1042")
            await hub.poll()
            await hooks.drain()
        assert ours.accepted == []  # given up on: kept for the next start of `ops`
        others = WebhookChannel(theirs.url, SECRET, sleep=sleep)
        async with manual(ChannelHub(rt, [others], state=state, name="audit")) as hub:
            assert others.memos("outbox:") == []  # `ops`'s delivery is not this hub's
            await hub.poll()
            await asyncio.wait_for(others.drain(), 10)
        assert "no longer configured" not in caplog.text and theirs.attempts == []
        again = WebhookChannel(ours.url, SECRET, sleep=sleep)
        async with manual(ChannelHub(rt, [again], state=state, name="ops")):
            await asyncio.wait_for(again.drain(), 10)
            assert again.memos("outbox:") == []
    ((headers, body),) = ours.accepted
    payload = verify_webhook(SECRET, headers, body)
    assert (payload["type"], payload["request"]["id"]) == ("request.opened", r.pending[0].id)


async def test_same_named_webhook_channels_of_two_hubs_each_warn_their_receiver(
    tmp_path: Path,
) -> None:
    """The `warned:` memo of one hub's channel kept the other's receiver from ever hearing that
    the request was about to expire."""
    clock = ManualClock()
    state = tmp_path / "hub.db"
    async with (
        Receiver([]) as ours,
        Receiver([]) as theirs,
        so.Runtime(
            [refund_agent(expires_in=3600)], store=f"sqlite:///{tmp_path / 's.db'}", clock=clock
        ) as rt,
    ):
        mine = WebhookChannel(ours.url, SECRET, expiring_within=600, clock=clock)
        others = WebhookChannel(theirs.url, SECRET, expiring_within=600, clock=clock)
        async with (
            manual(ChannelHub(rt, [mine], state=state, name="ops", clock=clock)) as one,
            manual(ChannelHub(rt, [others], state=state, name="audit", clock=clock)) as two,
        ):
            assert one.active and two.active  # each delivers to its own channel
            (req,) = (await rt.generate("support", prompt="Refund 1042")).pending
            await one.poll()
            await two.poll()
            clock.advance(3100)
            await one.poll()
            assert mine.recall(f"warned:{req.id}") is True
            assert others.recall(f"warned:{req.id}") is None
            await two.poll()
            await mine.drain()
            await others.drain()
    for receiver in (ours, theirs):
        types = [
            verify_webhook(SECRET, h, b, now=clock.now, tolerance=4000)["type"]
            for h, b in receiver.accepted
        ]
        assert types == ["request.opened", "request.expiring"]


async def test_an_old_state_files_unsent_delivery_is_sent_after_the_upgrade(
    tmp_path: Path,
) -> None:
    """A file the previous signoff wrote (memos under the channel's name alone) on which two
    hubs ran a `webhooks` channel: the delivery it kept goes to both hubs, the one without its
    URL drops only its own copy, and the one with it sends it."""
    from .test_channel_state import old_state_file

    async def sleep(seconds: float) -> None:
        return None

    state = tmp_path / "hub.db"
    async with (
        Receiver([]) as ours,
        Receiver([]) as theirs,
        so.Runtime([refund_agent()], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        raw = json.dumps({"id": "whd_kept", "type": "request.opened"})
        kept = {"event": "request.opened", "body": raw}
        memos = [("webhooks", f"outbox:{ours.url} whd_kept", kept)]
        old_state_file(state, {"ops:webhooks": 0, "audit:webhooks": 0}, memos)
        others = WebhookChannel(theirs.url, SECRET, sleep=sleep)
        async with manual(ChannelHub(rt, [others], state=state, name="audit")):
            await asyncio.wait_for(others.drain(), 10)
        hooks = WebhookChannel(ours.url, SECRET, sleep=sleep)
        async with manual(ChannelHub(rt, [hooks], state=state, name="ops")):
            await asyncio.wait_for(hooks.drain(), 10)
            assert hooks.memos("outbox:") == []
    assert theirs.attempts == []
    ((headers, body),) = ours.accepted
    assert body == raw.encode() and verify_webhook(SECRET, headers, body)["id"] == "whd_kept"


@pytest.mark.parametrize("bad", [5, None, 1.5, b"whsec_bytes", {"whsec_a": 1}, object()])
def test_a_secret_of_the_wrong_type_is_a_usage_error_naming_it(bad: object) -> None:
    """`WebhookChannel(url, secret=5)` failed with a bare TypeError (`list(5)`); bytes were
    refused as "not a string" without saying which argument. Neither error echoes the value."""
    for make in (
        lambda: WebhookChannel("https://example.com/hook", bad),  # type: ignore[arg-type]
        lambda: verify_webhook(bad, {}, b"{}"),  # type: ignore[arg-type]
    ):
        with pytest.raises(so.UsageError, match=r"secret") as caught:
            make()
        assert type(bad).__name__ in str(caught.value), caught.value
        assert "whsec_" not in str(caught.value)


# -- requests open before a channel first started ------------------------------------------------


async def test_a_new_channel_starts_from_now_unless_it_backfills_the_open_requests_once(
    store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Requests opened before a webhook channel first started are not announced by default: it
    starts from now, as the hub does. With `backfill=True` its first start on a state sends
    `request.opened` for each still open (oldest first, not the closed one), once: a restart on
    that state sends none again, and a request opened as the hub began (on the trail past its
    start and open at start) is announced once."""
    async with Receiver([]) as receiver, so.Runtime([refund_agent()], store=store_url) as rt:
        older = [(await rt.generate("support", prompt=f"Refund {n}")).pending[0] for n in "AB"]
        closed = await rt.generate("support", prompt="Refund C")
        await rt.respond(
            closed.session_id,
            [so.InputResponse(request_id=closed.pending[0].id, option_id="cancel")],
        )

        def opened() -> list[str]:
            bodies = [json.loads(b) for _, b in receiver.accepted]
            return [b["request"]["id"] for b in bodies if b["type"] == "request.opened"]

        plain = WebhookChannel(receiver.url, SECRET)
        async with manual(ChannelHub(rt, [plain], state=tmp_path / "plain.db")) as hub:
            await hub.poll()
            await plain.drain()
            assert opened() == []
            fresh = (await rt.generate("support", prompt="Refund D")).pending[0]
            await hub.poll()
            await plain.drain()
        assert opened() == [fresh.id]
        receiver.accepted.clear()

        state = tmp_path / "backfill.db"
        hooks = WebhookChannel(receiver.url, SECRET, backfill=True)
        hub = ChannelHub(rt, [hooks], state=state)
        reading = hub._open_requests
        during: list[so.InputRequest] = []

        async def opening_meanwhile() -> list[so.InputRequest]:
            # past the position the hub just took, and open when the channel starts
            during.append((await rt.generate("support", prompt="Refund E")).pending[0])
            return await reading()

        monkeypatch.setattr(hub, "_open_requests", opening_meanwhile)
        async with manual(hub):
            await hub.poll()
            await hooks.drain()
        assert opened() == [older[0].id, older[1].id, fresh.id, during[0].id]
        again = WebhookChannel(receiver.url, SECRET, backfill=True)
        async with manual(ChannelHub(rt, [again], state=state)) as hub:
            await hub.poll()
            later = (await rt.generate("support", prompt="Refund F")).pending[0]
            await hub.poll()
            await again.drain()
        assert opened() == [older[0].id, older[1].id, fresh.id, during[0].id, later.id]
    with pytest.raises(so.UsageError, match="backfill must be True or False"):
        WebhookChannel("https://example.com/hook", SECRET, backfill="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("url", [123, None, b"http://example.com/hook"])
def test_a_url_that_is_not_text_is_a_usage_error(url: object) -> None:
    """Masking a password in the URL an error names must not fail on what is no text at all:
    it raised AttributeError ('int' object has no attribute 'partition') instead."""
    with pytest.raises(so.UsageError, match=r"must be http\(s\)://\.\.\., not"):
        WebhookChannel([url], SECRET)  # type: ignore[list-item]


@pytest.mark.parametrize(
    "url",
    [
        "http://hook:s3cr3t#pw@example.com/x",
        "http://hook:s3cr3t/pw@example.com/x",
        "http://hook:s3cr3t?pw@example.com/x",
    ],
)
def test_a_password_that_breaks_the_url_is_not_shown_in_the_error(url: str) -> None:
    """A password with `#`, `/` or `?` not percent-encoded ends the host part where the mask
    looked for it: the error showed the URL whole, and httpx's message ('Invalid port: ...')
    quoted the password's start."""
    with pytest.raises(so.UsageError, match="not a usable webhook URL") as refused:
        WebhookChannel(url, SECRET)
    assert "s3cr3t" not in str(refused.value) and "pw" not in str(refused.value)
    assert "hook:***@example.com/x" in str(refused.value)


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        # httpx reads `hook:123` as a host and port: no Basic auth, the rest a path, query or
        # fragment; a person meant the password `123/s3cr3t` (it was shown whole)
        ("http://hook:123/s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        ("http://hook:12?s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        ("http://hook:12#s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        # httpx sends the password `p` to host `ss`; a person meant `p@ss/s3cr3t`
        ("http://hook:p@ss/s3cr3t@example.com/x", "http://hook:***@example.com/x"),
        # httpx reads the last `@` before the path: the password is `s3cr3t@example.com\`
        ("http://hook:s3cr3t@example.com\\@evil.example/x", "http://hook:***@evil.example/x"),
        ("HTTP://hook:s3cr3t@example.com/x", "HTTP://hook:***@example.com/x"),
        ("http://hook:s3%2Fcr3t@example.com/x", "http://hook:***@example.com/x"),
        ("http://:s3cr3t@example.com/x", "http://:***@example.com/x"),
        ("http://hook:s3cr3t@[::1]:8080/x", "http://hook:***@[::1]:8080/x"),
        # a password the user name holds: the user name is masked too
        ("http://hook:ook@example.com/x", "http://***@example.com/x"),
        # a token as the user name is sent as Basic auth too
        ("http://s3cr3t-token@example.com/x", "http://***@example.com/x"),
        # nothing secret: shown as given
        ("http://[::1]:8080/x@y", "http://[::1]:8080/x@y"),
        (
            "https://example.com/hook?to=ops@example.com",
            "https://example.com/hook?to=ops@example.com",
        ),
        ("http://example.com:8080/x", "http://example.com:8080/x"),
    ],
)
def test_a_password_is_masked_however_the_url_reads(url: str, shown: str) -> None:
    """A URL httpx takes but reads differently from its writer (`http://u:123/pw@host` is host
    `u`, port 123) was logged whole: all that httpx sends as Basic auth, and all before the
    last `@` a password may reach, is masked."""
    import httpx

    from signoff.channels.webhooks import _masked

    masked = _masked(url)
    assert masked == shown
    assert "s3cr3t" not in str(masked) and "s3%2F" not in str(masked) and ":ook" not in str(masked)
    parsed = httpx.URL(url)
    if parsed.password:  # what httpx sends is not in the userinfo shown
        assert parsed.password not in str(masked).partition("://")[2].rpartition("@")[0]
    if (
        url != shown
        and url.startswith("http://")
        and parsed.host
        and (parsed.port is None or 0 < parsed.port < 65536)
    ):
        with pytest.raises(so.UsageError, match="is given twice") as given_twice:
            WebhookChannel([url, url], SECRET)
        assert f"{shown!r} is given twice" in str(given_twice.value)


def test_an_unusable_url_with_a_password_still_says_what_is_wrong() -> None:
    """A password httpx reads as one is masked, and the parser's message about the rest (a bad
    port) is kept: it quotes nothing of the password."""
    with pytest.raises(so.UsageError, match="not a usable webhook URL") as refused:
        WebhookChannel("http://hook:s3cr3t@example.com:abc/x", SECRET)
    assert "'http://hook:***@example.com:abc/x' (Invalid port: 'abc')" in str(refused.value)
    assert "s3cr3t" not in str(refused.value)
