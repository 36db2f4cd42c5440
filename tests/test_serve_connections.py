"""`signoff serve --max-connections` and `--keep-alive-timeout` (uvicorn's `limit_concurrency`
and `timeout_keep_alive`), over a real socket: past the bound a request is answered 503 at once,
and an idle connection is closed after the timeout; from options or the environment."""

from __future__ import annotations

import platform
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn

import signoff as so
from signoff.server import _serve
from signoff.server._serve import KEEP_ALIVE_TIMEOUT

from ._cli import TARGET, agent, invoke, url

__all__ = ["url"]  # the fixture, used by name

REQUEST = b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n"


def built(*args: str) -> Any:
    """The uvicorn server `signoff serve ARGS` builds, not started."""
    servers: list[Any] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(uvicorn.Server, "run", lambda self, **kw: servers.append(self))
        result = invoke("serve", TARGET, "--port", "0", *args)
    assert result.exit_code == 0, result.output
    (server,) = servers
    return server


@contextmanager
def started(server: Any) -> Iterator[int]:
    """Run `server` (port 0) in a thread; yields the port it bound."""
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1]
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def connect(port: int) -> socket.socket:
    conn = socket.create_connection(("127.0.0.1", port), timeout=5)
    return conn


def status_of(conn: socket.socket) -> int:
    """Send one request on `conn` and read its response's status code."""
    conn.sendall(REQUEST)
    head = b""
    while b"\r\n" not in head:
        chunk = conn.recv(4096)
        assert chunk, "closed without a response"
        head += chunk
    return int(head.split(b" ", 2)[1])


def test_the_bound_and_the_timeout_from_the_options_and_the_environment(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = built("--store", url).config
    assert (config.limit_concurrency, config.timeout_keep_alive) == (None, KEEP_ALIVE_TIMEOUT)
    monkeypatch.setenv("SIGNOFF_MAX_CONNECTIONS", "40")
    monkeypatch.setenv("SIGNOFF_KEEP_ALIVE_TIMEOUT", "2.5")
    config = built("--store", url).config
    assert (config.limit_concurrency, config.timeout_keep_alive) == (40, 2.5)
    options = ["--max-connections", "7", "--keep-alive-timeout", "1"]
    config = built("--store", url, *options).config
    assert (config.limit_concurrency, config.timeout_keep_alive) == (7, 1.0)


def test_past_max_connections_a_request_is_503_at_once(url: str) -> None:
    """Connections that send nothing (a slow client's) count: with 3, two held open leave no
    room, so the next request is refused at once (it is not held, nor run), and one of them
    closed makes room again."""
    server = built("--store", url, "--max-connections", "3", "--log-level", "error")
    with started(server) as port:
        first = connect(port)
        assert status_of(first) == 200  # one connection alone is served
        idle = connect(port)  # sends nothing
        deadline = time.monotonic() + 5
        while len(server.server_state.connections) < 2:  # until the server holds it
            assert time.monotonic() < deadline, "the idle connection was never taken"
            time.sleep(0.01)
        with connect(port) as third:
            assert status_of(third) == 503
        idle.close()
        deadline = time.monotonic() + 5
        while True:  # until the server has seen it close
            with connect(port) as again:
                if status_of(again) == 200:
                    break
            assert time.monotonic() < deadline, "the room was never made"
            time.sleep(0.02)
        first.close()


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(url: str) -> None:
    """Closed by the server once idle that long after its response: the timer runs only after
    a response, so a connection that has sent no request is not closed (docs/server.md)."""
    server = built("--store", url, "--keep-alive-timeout", "0.3")
    with started(server) as port, connect(port) as silent, connect(port) as conn:
        # Timed from before the request, so a slow machine only makes `waited` longer: the
        # server's timer starts after its response, so it cannot close the connection sooner.
        conn.settimeout(60)
        began = time.monotonic()
        assert status_of(conn) == 200
        while conn.recv(4096):  # the response's body, then the server's close
            pass
        waited = time.monotonic() - began
        # What the docs say is not protected: one that never sent a request, idle longer, is
        # still held (uvicorn has no timeout for reading a request).
        silent.setblocking(False)
        with pytest.raises(BlockingIOError):
            silent.recv(1)
    # Not at once (the timer ran; asyncio may fire it a clock tick early), and by the 0.3 s
    # given, not by the default's 5 s: room for a loaded machine up to 15 times the timer.
    assert 0.29 <= waited < KEEP_ALIVE_TIMEOUT, waited


@pytest.mark.skipif(not hasattr(socket, "TCP_USER_TIMEOUT"), reason="Linux's TCP option")
def test_a_connection_whose_data_goes_unacknowledged_is_dropped_and_its_slot_given_back(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A follower's network path cut without a close (a NAT or firewall forgetting it): the
    server's keep-alives go unacknowledged, and the kernel retried them for 15 minutes, the
    stream holding its caller's stream slot meanwhile, so the follower's reconnects were 429
    `too_many_streams`. `signoff serve` has the kernel drop a connection whose data goes three
    heartbeats unacknowledged (`TCP_USER_TIMEOUT`, on the listening sockets, which accepted
    ones inherit): here 1 s. A client that stops reading with its buffers full is such a
    connection too (Linux 5.11 on), which is how the cut is made here on loopback."""
    monkeypatch.setattr(_serve, "UNACKED_HEARTBEATS", 1 / 15, raising=False)  # 1 s of 15 s ones
    rt = so.Runtime([agent], store=url)
    try:
        sid = rt.generate_sync("support", "x" * 1_000_000).session_id  # a 1 MB event to send
    finally:
        rt.close_sync()
    server = built("--store", url, "--max-streams", "1", "--log-level", "error")
    option = (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", 18))
    with started(server) as port:
        (listening,) = server.servers[0].sockets
        assert listening.getsockopt(*option) == 1000
        listening.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 8192)  # fills soon
        path = f"/v1/sessions/{sid}/events"
        events = f"http://127.0.0.1:{port}{path}"
        with socket.socket() as stalled:
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.connect(("127.0.0.1", port))
            # A followed stream whose client never reads.
            stalled.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode())
            deadline = time.monotonic() + 10
            while httpx.get(events, params={"follow": "false"}).status_code != 429:
                assert time.monotonic() < deadline, "the stalled stream never took its slot"
                time.sleep(0.05)
            # The stalled one's, and maybe the last request's, closing.
            taken = [c.transport.get_extra_info("socket") for c in server.server_state.connections]
            assert {s.getsockopt(*option) for s in taken if s and s.fileno() >= 0} == {1000}
            if _kernel() < (5, 11):
                pytest.skip("a zero window counts toward TCP_USER_TIMEOUT from Linux 5.11")
            deadline = time.monotonic() + 15  # about 1 s; it was 15 minutes
            while (status := httpx.get(events, params={"follow": "false"}).status_code) == 429:
                assert time.monotonic() < deadline, "the stalled stream kept its slot"
                time.sleep(0.1)
            assert status == 200


def _kernel() -> tuple[int, ...]:
    """This Linux kernel's version, as (major, minor)."""
    numbers = re.findall(r"\d+", platform.release())[:2]
    return tuple(int(n) for n in numbers)
