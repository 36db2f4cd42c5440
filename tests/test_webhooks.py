"""Webhooks: signed deliveries to a receiver on loopback, retried with backoff; the receiver and
agents the other webhook tests share."""

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
    InvalidSignature,
    WebhookChannel,
    verify_webhook,
)
from signoff.channels.webhooks import sign_webhook
from signoff.testing import ManualClock, call, call_tools, reply, scripted_agent

SECRET = "whsec_test_4f1a"


class Receiver:
    """An HTTP endpoint on loopback that answers with the statuses it is given, then 204."""

    def __init__(
        self, statuses: list[int | tuple[int, dict[str, str]]], max_size: int = 1024**2
    ) -> None:
        self.statuses = list(statuses)
        self.max_size = max_size  # a larger body is answered 413, as aiohttp's default 1 MiB
        self.attempts: list[tuple[dict[str, str], bytes]] = []
        self.accepted: list[tuple[dict[str, str], bytes]] = []
        self.targets: list[str] = []  # each attempt's path and query
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def __aenter__(self) -> Receiver:
        app = web.Application(client_max_size=self.max_size)
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
        self.targets.append(request.path_qs)
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
            # Delivered before the request closes: a warning still queued when its request
            # closes is dropped unsent (`still_due`), by design.
            await hooks.drain()
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


async def test_a_password_in_a_webhook_url_is_not_in_any_log_of_a_delivery(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An application logging at INFO or below (`logging.basicConfig(level=logging.INFO)`)
    also shows httpx's own line for each request, with its URL: the password must not be in
    it, while the receiver still gets it as Basic auth, and a user name alone likewise."""

    async def sleep(seconds: float) -> None:
        return None

    async with Receiver([503]) as receiver:
        urls = [
            receiver.url.replace("http://", "http://hook:s3cr3t%40pw@"),
            receiver.url.replace("http://", "http://tok3n-only@") + "?to=ops",
        ]
        hooks = WebhookChannel(urls, SECRET, max_attempts=2, sleep=sleep)
        raw = json.dumps({"hello": "world"}).encode()
        with caplog.at_level(logging.DEBUG):
            for url in urls:
                assert await hooks.deliver(url, "whd_1", "request.opened", raw) is True
        await hooks.close()
    sent = [headers["Authorization"] for headers, _ in receiver.attempts]
    assert sent == [
        "Basic aG9vazpzM2NyM3RAcHc=",
        "Basic aG9vazpzM2NyM3RAcHc=",
        "Basic dG9rM24tb25seTo=",
    ]
    shown = [r.getMessage() for r in caplog.records]
    assert any("HTTP Request: POST" in line for line in shown), shown  # httpx's line is there
    assert not any("s3cr3t" in line or "tok3n" in line for line in shown), shown


async def test_a_token_in_a_webhook_urls_query_is_sent_but_never_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A receiver that checks a token in the URL's query (`?token=...`): the token reaches it,
    and neither signoff's lines (retries, refusals with where a redirect points, give-ups,
    errors) nor httpx's own INFO line of each request show it; the names stay."""

    async def sleep(seconds: float) -> None:
        return None

    moved = (308, {"Location": "https://new.example/hook?token=m0ved-s3cr3t"})
    async with Receiver([500, moved, 503, 503]) as receiver:
        url = f"{receiver.url}?token=s3cr3t-tok&to=ops#s3cr3t-frag"
        hooks = WebhookChannel(url, SECRET, max_attempts=2, sleep=sleep)
        raw = json.dumps({"hello": "world"}).encode()
        with caplog.at_level(logging.DEBUG):
            assert await hooks.deliver(url, "whd_1", "request.opened", raw) is False  # 308
            assert await hooks.deliver(url, "whd_2", "request.opened", raw) is False  # gave up
            assert await hooks.deliver(url, "whd_3", "request.opened", raw) is True
        await hooks.close()
    assert receiver.targets == ["/hooks/signoff?token=s3cr3t-tok&to=ops"] * 5
    # the sender's lines (httpcore's DEBUG trace quotes the receiver's answer, a Location too;
    # the receiver's own access log, aiohttp's, shows what it got)
    shown = [
        r.getMessage()
        for r in caplog.records
        if r.name.startswith("signoff") or r.name == "httpx" or r.levelno >= logging.INFO
        if not r.name.startswith("aiohttp")
    ]
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("signoff")]
    assert len(ours) == 4 and all("?token=***&to=***#***" in line for line in ours), ours
    assert any("'https://new.example/hook?token=***'" in line for line in ours), ours
    theirs = [line for line in shown if "HTTP Request: POST" in line]  # httpx's INFO line
    assert len(theirs) == 5 and all("?token=***&to=***" in line for line in theirs), theirs
    assert not any("s3cr3t" in line or "m0ved" in line for line in shown), shown
    with pytest.raises(so.UsageError, match=r"\?token=\*\*\*&to=\*\*\*") as given_twice:
        WebhookChannel([url, url], SECRET)
    assert "s3cr3t" not in str(given_twice.value)


def _unused_port() -> int:
    """A local port nothing listens on: a receiver that cannot be reached."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there
    return int(port)


async def test_an_unreachable_receiver_is_retried() -> None:
    slept: list[float] = []
    port = _unused_port()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    hooks = WebhookChannel(
        f"http://127.0.0.1:{port}/x", SECRET, max_attempts=4, backoff=1, max_backoff=3, sleep=sleep
    )
    assert await hooks.deliver(hooks.urls[0], "whd_1", "request.opened", b"{}") is False
    assert slept == [1, 2, 3]
    await hooks.close()


async def test_many_attempts_back_off_at_max_backoff_to_the_last() -> None:
    """Retrying for hours, a minute apart (`max_attempts` over 1025): past the 1024th attempt
    the doubled backoff is larger than a float, and the delay must stay `max_backoff` rather
    than the delivery ending early in an OverflowError, neither counted nor logged as given up."""
    slept: list[float] = []
    port = _unused_port()

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    hooks = WebhookChannel(
        f"http://127.0.0.1:{port}/x", SECRET, max_attempts=1030, max_backoff=60, sleep=sleep
    )
    assert await hooks.deliver(hooks.urls[0], "whd_1", "request.opened", b"{}") is False
    assert len(slept) == 1029 and slept[:3] == [0.5, 1, 2] and set(slept[8:]) == {60}
    assert (hooks.delivered, hooks.failed) == (0, 1)
    await hooks.close()


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


@pytest.mark.parametrize(
    "when",
    [
        "Mon, 01 Jan 2024 00:00:00 +99999999999999999999",  # an offset past a C int
        "Mon, 01 Jan 99999999999999999999 00:00:00 GMT",  # a year past a C long
    ],
)
async def test_a_retry_after_date_out_of_range_is_no_failed_delivery(when: str) -> None:
    """Reading such a date raised an OverflowError, out of the attempt: a 2xx carrying one
    counted as a failure (the delivery sent again at the next start), a 503 carrying one ended
    the retries. Neither is read as a wait: a 2xx is delivered, a 503 retried after backoff."""
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)

    answers: list[int | tuple[int, dict[str, str]]] = [
        (503, {"Retry-After": when}),
        (200, {"Retry-After": when}),
    ]
    async with Receiver(answers) as receiver:
        hooks = WebhookChannel(receiver.url, SECRET, backoff=1, sleep=sleep)
        assert await hooks.deliver(receiver.url, "whd_1", "request.opened", b"{}") is True
        await hooks.close()
    assert slept == [1] and len(receiver.attempts) == 2
    assert (hooks.delivered, hooks.failed) == (1, 0)


async def test_a_redirect_refused_names_where_it_pointed_with_any_password_masked(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A receiver that moved (308) is refused, as any redirect: the error says where it points,
    so the operator can configure that URL, with a password in it masked."""

    async def moved(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 308 Permanent Redirect\r\n"
            b"Location: https://hook:s3cr3t@new.example/hook\r\nContent-Length: 0\r\n\r\n"
        )
        await writer.drain()

    async with raw_receiver(moved) as url:
        hooks = WebhookChannel(url, SECRET, max_attempts=3)
        assert await hooks.deliver(url, "whd_1", "request.opened", b"{}") is False
        await hooks.close()
    assert "HTTP 308 to 'https://hook:***@new.example/hook'" in caplog.text
    assert "s3cr3t" not in caplog.text


async def test_a_request_with_megabytes_of_arguments_reaches_a_receiver_capped_at_1_mib(
    tmp_path: Path,
) -> None:
    """A call with 700 KB of arguments and a 700 KB payload was announced in a 1.4 MB body: a
    receiver taking up to 1 MiB (aiohttp's default, as many) answered 413, a refusal, never
    sent again, so it never heard of the request. Over `max_body_bytes` (256 KiB) a body sends
    the input and the payload as null and names them in `clipped`; the request's id and
    `input_hash` are there to read it whole (`GET /v1/requests/{id}`)."""
    blob = "b" * 700_000

    @so.tool
    def upload(ctx: so.ToolContext, blob: str) -> str:
        """Upload a file."""
        ctx.request_approval({"head": blob})
        return "stored"

    agent = scripted_agent(
        "files", [call_tools(call("upload", blob=blob)), reply("Done.")], tools=[upload]
    )
    async with (
        Receiver([]) as receiver,
        so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1)
        async with manual(ChannelHub(rt, [hooks])) as hub:
            r = await rt.generate("files", prompt="store it")
            (request,) = r.pending
            await hub.poll()
            await hooks.drain()
            await rt.respond(
                r.session_id, [so.InputResponse(request_id=request.id, option_id="approve")]
            )
            await hub.poll()
            await hooks.drain()
        assert await hooks.refusals() == []
    bodies = [json.loads(body) for _, body in receiver.accepted]
    assert [b["type"] for b in bodies] == ["request.opened", "request.resolved"]
    for (_, raw), body in zip(receiver.accepted, bodies, strict=True):
        assert len(raw) <= 256 * 1024
        assert body["clipped"] == ["request.action.input", "request.payload"]
        assert body["request"]["id"] == request.id
        assert body["request"]["action"]["input"] is None and body["request"]["payload"] is None
        assert request.action is not None
        assert body["request"]["action"]["input_hash"] == request.action.input_hash
    assert request.action is not None
    small = hooks.payload("request.opened", request.model_copy(update={"payload": None}))
    assert "clipped" not in hooks.payload(
        "request.opened",
        request.model_copy(
            update={"payload": None, "action": request.action.model_copy(update={"input": {}})}
        ),
    )
    assert small["clipped"] == ["request.action.input"]


async def test_a_receiver_capping_bodies_below_max_body_bytes_gets_them_clipped_at_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A receiver taking less than `max_body_bytes` (Express takes 100 KB) answered 413 to a
    request with 150 KB of arguments, a final refusal: it never heard of the request. A 413 is
    now answered at once with the input, payload and answer sent as null (named in `clipped`),
    not counted as an attempt; a receiver that refuses even that is refused as too large."""

    @so.tool(approval=so.always())
    def upload(blob: str) -> str:
        """Upload a file."""
        return "stored"

    blob = "b" * 150_000
    agent = scripted_agent(
        "files", [call_tools(call("upload", blob=blob)), reply("Done.")], tools=[upload]
    )
    async with (
        Receiver([], max_size=100_000) as receiver,
        so.Runtime([agent], store=f"sqlite:///{tmp_path / 's.db'}") as rt,
    ):
        hooks = WebhookChannel(receiver.url, SECRET, max_attempts=1)
        async with manual(ChannelHub(rt, [hooks])) as hub:
            r = await rt.generate("files", prompt="store it")
            (request,) = r.pending
            await hub.poll()
            await hooks.drain()
        assert await hooks.refusals() == []
    assert len(receiver.attempts) == 1  # the first, 413, was answered by aiohttp itself
    ((_, raw),) = receiver.accepted
    body = json.loads(raw)
    assert body["type"] == "request.opened" and body["clipped"] == ["request.action.input"]
    assert body["request"]["id"] == request.id and body["request"]["action"]["input"] is None
    assert "HTTP 413 (body too large)" in caplog.text and "max_body_bytes" in caplog.text

    async with Receiver([], max_size=1024) as tiny:  # smaller than any body
        hooks = WebhookChannel(tiny.url, SECRET, max_attempts=1)
        assert not await hooks.deliver(tiny.url, "whd_x", "request.opened", raw)
        assert tiny.accepted == []
    assert "the body is too large for it" in caplog.text
