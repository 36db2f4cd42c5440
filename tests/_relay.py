"""`Relay`: a TCP relay on loopback to a server (PostgreSQL, in the store's tests), which a
test subclasses to make the network between them fail in one way or another."""

from __future__ import annotations

import asyncio
import contextlib
import socket

__all__ = ["Relay"]


class Relay:
    """Relays each connection made to the port `start` returns to `host`:`port`, both ways,
    until `silence` or `close`; `relaying` False leaves new connections open and unanswered."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.relays: list[asyncio.Task[None]] = []
        self.clients: list[asyncio.StreamWriter] = []  # the relayed connections' client ends
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    def relaying(self) -> bool:
        """Whether a new connection is relayed (else it is accepted and left silent)."""
        return True

    def listening(self) -> socket.socket:
        """The socket to listen on: a free loopback port, bound."""
        listening = socket.socket()
        listening.bind(("127.0.0.1", 0))
        return listening

    async def start(self) -> int:
        listening = self.listening()
        self.server = await asyncio.start_server(self._accept, sock=listening)
        return int(listening.getsockname()[1])

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        if not self.relaying():
            return
        up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        self.clients.append(writer)
        self.writers.append(up_writer)
        self.relays += [
            asyncio.create_task(self._relay(reader, up_writer)),
            asyncio.create_task(self._relay(up_reader, writer)),
        ]

    @staticmethod
    async def _relay(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        writer.close()

    def silence(self) -> None:
        """Stop relaying on every connection open now, as a dropped route or a NAT that forgot
        them does (no reset, no answer, the socket still open); later ones relay as before."""
        for relay in self.relays:
            relay.cancel()
        self.relays = []

    async def close(self) -> None:
        self.silence()
        for writer in self.writers:
            writer.close()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()
