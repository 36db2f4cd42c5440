"""The client tests' raw server: `Canned`, a tiny HTTP server on loopback that sends exactly the
bytes a test gives it, as a proxy or a broken server would, and helpers that write those bytes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

__all__ = [
    "CANCEL",
    "Canned",
    "canned",
    "dropped",
    "error",
    "event",
    "EVENTS",
    "http",
    "stream",
]


Reply = bytes | Callable[[asyncio.StreamWriter], Awaitable[None]]


def http(status: str, body: str | bytes, kind: str = "application/json", extra: str = "") -> bytes:
    """A whole HTTP/1.1 response, closing the connection."""
    raw = body.encode() if isinstance(body, str) else body
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(raw)}\r\n"
        f"Connection: close\r\n{extra}\r\n"
    )
    return head.encode() + raw


def error(status: str, code: str, extra: str = "", **detail: Any) -> bytes:
    return http(
        status, json.dumps({"error": {"code": code, "message": "m", **detail}}), extra=extra
    )


def event(seq: int, sid: str = "ses_x") -> str:
    data = {"session_id": sid, "seq": seq, "type": "turn.started", "at": 1.0, "data": {}}
    return f"id: {seq}\nevent: turn.started\ndata: {json.dumps(data)}\n\n"


def stream(body: str) -> bytes:
    """An event stream the server ends by closing the connection (no Content-Length)."""
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    return (head + body).encode()


class Canned:
    """A loopback HTTP server that answers each request to a path with the next canned reply
    queued for it (the last one repeats), and records the requests' heads."""

    def __init__(self) -> None:
        self.replies: dict[str, list[Reply]] = {}
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.base = ""
        self.done = asyncio.Event()  # set when the test is over: replies that hang may end
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    def on(self, path: str, *replies: Reply) -> None:
        self.replies[path] = list(replies)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            target = head[0].split()[1]
            path = target.split("?")[0]
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (h.partition(":") for h in head[1:] if h)
            }
            size = int(headers.get("content-length", "0"))
            if size:
                await reader.readexactly(size)
            self.seen.append((target, headers))
            queue = self.replies.get(path) or [http("404 Not Found", "")]
            reply = queue.pop(0) if len(queue) > 1 else queue[0]
            if isinstance(reply, bytes):
                writer.write(reply)
            else:
                await reply(writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._handlers.discard(task)

    async def __aenter__(self) -> Canned:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self.done.set()
        self._server.close()
        await asyncio.wait_for(asyncio.gather(*self._handlers, return_exceptions=True), 10)


@pytest.fixture
async def canned() -> AsyncIterator[Canned]:
    async with Canned() as server:
        yield server


CANCEL = "/v1/sessions/ses_x/cancel"
EVENTS = "/v1/sessions/ses_x/events"


async def dropped(writer: asyncio.StreamWriter) -> None:
    writer.transport.abort()
