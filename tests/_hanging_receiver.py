"""A webhook receiver on loopback that hangs: it takes each request and never answers, until
told to answer, for the tests of how a stop cuts short a delivery under way."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["Receiver", "receiving"]


class Receiver:
    """A webhook receiver on loopback that takes each request and never answers while `hangs`
    (`reached` is set once one came), and answers 204 once not, keeping what it got."""

    def __init__(self) -> None:
        self.hangs = True
        self.reached = asyncio.Event()
        self.hung: list[dict[str, str]] = []  # the headers of each request left unanswered
        self.accepted: list[tuple[dict[str, str], bytes]] = []
        self.url = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            lines = head.split("\r\n")[1:]
            headers = {
                k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in lines if h)
            }
            if self.hangs:
                self.hung.append(headers)
                self.reached.set()
                await reader.read()  # until the sender gives up
                return
            body = await reader.readexactly(int(headers["content-length"]))
            self.accepted.append((headers, body))
            writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()


@contextlib.asynccontextmanager
async def receiving() -> AsyncIterator[Receiver]:
    """A `Receiver` listening, its `url` set; closed at the end."""
    receiver = Receiver()
    server = await asyncio.start_server(receiver.handle, "127.0.0.1", 0)
    receiver.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/hook"
    async with server:
        yield receiver
