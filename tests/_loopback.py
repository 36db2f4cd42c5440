"""`LoopbackServer`: a raw TCP server on 127.0.0.1 for tests that must control every byte an
HTTP client sees (a reply cut or inflated on purpose, a forwarding proxy), one thread per
connection."""

from __future__ import annotations

import socket
import threading
from typing import Self

__all__ = ["LoopbackServer", "read_head"]


def read_head(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """The request head read from `conn` (without its blank line) and the bytes after it read
    so far; None if the client hung up first."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


class LoopbackServer:
    """Accepts connections on a free loopback port while used as a context manager, and hands
    each to `handle` on a thread of its own (the connection is closed after)."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1])

    def handle(self, conn: socket.socket) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handled, args=(conn,), daemon=True).start()

    def _handled(self, conn: socket.socket) -> None:
        with conn:
            self.handle(conn)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._sock.close()
