"""A webhook receiver whose host name does not resolve in time (its DNS servers unreachable:
`getaddrinfo` blocks until the resolver gives up) holds up no other URL and no channel state:
the host has one lookup in flight, which later attempts wait for up to their own timeout, in a
thread of its own, and the state's calls run in threads of theirs, never the event loop's
default executor, which the old lookups filled. A name with several addresses connects to the
first that answers, and TLS still verifies the receiver's name, not the address."""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from signoff.channels import ChannelState, WebhookChannel
from signoff.channels._state import off_loop
from signoff.channels._webhook_lookups import interleaved

from ._tls import self_signed
from .test_webhooks import SECRET, Receiver

HANGING = "hooks.dns-down.example"

_real_getaddrinfo = socket.getaddrinfo


class Resolver:
    """`socket.getaddrinfo` with names of its own: `HANGING` blocks until `release` (as glibc
    does while its nameservers do not answer), then fails; the others are looked up as given
    in `names` (a list of addresses), or for real. Counts the lookups of each name, and the
    most of `HANGING` running at once."""

    def __init__(self, names: dict[str, list[str]] | None = None) -> None:
        self.names = names or {}
        self.release = threading.Event()
        self.calls: dict[str, int] = {}
        self.hanging = 0
        self.most_hanging = 0
        self._lock = threading.Lock()

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else host
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
        if name == HANGING:
            with self._lock:
                self.hanging += 1
                self.most_hanging = max(self.most_hanging, self.hanging)
            try:
                self.release.wait(60)
                raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
            finally:
                with self._lock:
                    self.hanging -= 1
        if name in self.names:
            return [
                (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (a, port or 0))
                for a in self.names[name]
            ]
        return _real_getaddrinfo(host, port, *args, **kwargs)


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[Resolver]:
    fake = Resolver()
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    try:
        yield fake
    finally:
        fake.release.set()  # the lookups still blocked end (their threads are daemons)


async def test_a_host_that_does_not_resolve_holds_up_no_other_url_nor_the_channel_state(
    resolver: Resolver,
) -> None:
    # A default executor of two threads (one CPU's is five): the old lookups filled any size,
    # each retry taking another thread for as long as the resolver tried.
    loop = asyncio.get_running_loop()
    small = ThreadPoolExecutor(max_workers=2)
    loop.set_default_executor(small)
    state = ChannelState()
    async with Receiver([]) as receiver:
        healthy = receiver.url.replace("127.0.0.1", "hooks.up.example")
        resolver.names["hooks.up.example"] = ["127.0.0.1"]
        bad = [f"http://{HANGING}:1/a", f"http://{HANGING}:1/b"]
        hooks = WebhookChannel(
            [*bad, healthy], SECRET, timeout=0.2, backoff=0, max_backoff=0, max_attempts=6
        )
        failing = [
            asyncio.create_task(hooks.deliver(url, f"whd_{i}", "request.opened", b"{}"))
            for i, url in enumerate(bad)
        ]
        try:
            await asyncio.sleep(0.3)  # the first attempts time out, their lookup still hung
            # Generous bounds on a loaded machine; the old code waited here until the
            # resolver gave up (60 s), every thread held by a lookup of the hanging host.
            async with asyncio.timeout(20):
                for n in range(3):
                    await off_loop(state.remember, "ch", f"k{n}", n)
                    assert await off_loop(state.recall, "ch", f"k{n}") == n
                    assert await hooks.deliver(healthy, f"whd_ok{n}", "request.opened", b"{}")
            # Every attempt at the hanging host waits for the one lookup, up to its timeout.
            async with asyncio.timeout(20):
                assert await asyncio.gather(*failing) == [False, False]
        finally:
            for task in failing:
                task.cancel()
            await asyncio.gather(*failing, return_exceptions=True)
            await hooks.close()
        assert len(receiver.accepted) == 3
        assert resolver.calls[HANGING] == 1 and resolver.most_hanging == 1
        assert (hooks.delivered, hooks.failed) == (3, 2)
    resolver.release.set()
    small.shutdown(wait=False)


async def test_a_lookup_that_failed_is_made_again_by_the_next_attempt(
    resolver: Resolver,
) -> None:
    resolver.release.set()  # fails at once
    hooks = WebhookChannel(f"http://{HANGING}/a", SECRET, timeout=5, backoff=0, max_attempts=3)
    assert await hooks.deliver(hooks.urls[0], "whd_1", "request.opened", b"{}") is False
    await hooks.close()
    assert resolver.calls[HANGING] == 3  # nothing kept of a failed lookup


async def test_each_address_of_a_name_is_tried_in_order(resolver: Resolver) -> None:
    """The first address refuses (nothing listens on 127.0.0.2): the next one is reached."""
    async with Receiver([]) as receiver:
        resolver.names["hooks.two.example"] = ["127.0.0.2", "127.0.0.1"]
        url = receiver.url.replace("127.0.0.1", "hooks.two.example")
        hooks = WebhookChannel(url, SECRET, timeout=10, max_attempts=1)
        assert await hooks.deliver(hooks.urls[0], "whd_1", "request.opened", b"{}") is True
        await hooks.close()
    assert resolver.calls["hooks.two.example"] == 1 and len(receiver.accepted) == 1


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for the name hooks.tls.example alone, and its key."""
    where = tmp_path_factory.mktemp("tls")
    return self_signed(where, "hooks.tls.example", "DNS:hooks.tls.example")


@asynccontextmanager
async def tls_receiver(cert: Path, key: Path) -> AsyncIterator[tuple[int, list[bytes]]]:
    """An https receiver on 127.0.0.1 answering 204; its port and the bodies it got."""
    got: list[bytes] = []

    async def handle(request: web.Request) -> web.Response:
        got.append(await request.read())
        return web.Response(status=204)

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    app = web.Application()
    app.router.add_post("/hook", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    await web.SockSite(runner, sock, ssl_context=context).start()
    try:
        yield sock.getsockname()[1], got
    finally:
        await runner.cleanup()


async def test_tls_verifies_the_receivers_name_not_its_address(
    resolver: Resolver, certificate: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SSL_CERT_FILE", str(certificate[0]))  # httpx trusts it (trust_env)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    resolver.names["hooks.tls.example"] = ["127.0.0.1"]
    resolver.names["hooks.other.example"] = ["127.0.0.1"]
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, _context: None)  # the refused handshake's log
    async with tls_receiver(*certificate) as (port, got):
        hooks = WebhookChannel(
            [f"https://hooks.tls.example:{port}/hook", f"https://hooks.other.example:{port}/hook"],
            SECRET,
            max_attempts=1,
        )
        assert await hooks.deliver(hooks.urls[0], "whd_1", "request.opened", b"{}") is True
        # The same address under a name the certificate does not carry: refused.
        assert await hooks.deliver(hooks.urls[1], "whd_2", "request.opened", b"{}") is False
        await hooks.close()
    assert got == [b"{}"]
    assert "certificate" in hooks._answers[hooks.urls[1]][1].lower()


async def test_an_address_that_does_not_answer_is_not_waited_for_before_the_next(
    resolver: Resolver,
) -> None:
    """The first address never answers (an unreachable IPv6 route): after `STAGGER` seconds the
    next is tried alongside, its stream is the one used, and the first attempt is cancelled."""
    import httpcore

    from signoff.channels._webhook_lookups import _backend_class

    resolver.names["hooks.slow.example"] = ["10.0.0.1", "10.0.0.2"]
    tried: list[str] = []
    cancelled: list[str] = []
    stream = httpcore.AsyncNetworkStream()

    class Inner(httpcore.AsyncNetworkBackend):
        async def connect_tcp(self, host: str, port: int, *args: Any) -> Any:
            tried.append(host)
            if host == "10.0.0.1":
                try:
                    await asyncio.sleep(60)
                except asyncio.CancelledError:
                    cancelled.append(host)
                    raise
            return stream

    backend = _backend_class()(Inner())
    async with asyncio.timeout(20):
        assert await backend.connect_tcp("hooks.slow.example", 443, 30) is stream
    assert tried == ["10.0.0.1", "10.0.0.2"] and cancelled == ["10.0.0.1"]


def test_the_first_address_of_the_other_family_is_tried_second() -> None:
    """Tried in getaddrinfo's order, three silent IPv6 addresses each cost the stagger before
    the IPv4 one was tried: anyio (RFC 8305) tries the other family's first address second."""
    six = ["2001:db8::1", "2001:db8::2", "2001:db8::3"]
    assert interleaved([*six, "192.0.2.1"]) == ["2001:db8::1", "192.0.2.1", *six[1:]]
    assert interleaved(["192.0.2.1", "192.0.2.2", *six]) == [
        "192.0.2.1",
        "2001:db8::1",
        "192.0.2.2",
        *six[1:],
    ]
    assert interleaved(six) == six and interleaved([]) == []
