"""A loopback proxy in front of PostgreSQL, as pgbouncer stands: it passes connections through
to the server, or, once `refuse` names a message, answers each new one the way pgbouncer does
when it cannot reach the server behind it: the login is accepted, and the first statement gets
an ErrorResponse (SQLSTATE 08P01) carrying that message, then the connection is closed. And a
real pgbouncer (`pgbouncer`), in front of a port, in the pooling mode a test asks for."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pwd
import shutil
import socket
import struct
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

__all__ = ["PgProxy", "free_port", "pg_proxy", "pgbouncer"]

_NEGOTIATIONS = (80877103, 80877104)  # SSLRequest, GSSENCRequest: answered "N" (not here)


class PgProxy:
    """The proxy's port, and what it does with a new connection: `refuse` (a message) or pass it
    through to `target` (a port on 127.0.0.1)."""

    def __init__(self, target: int | None) -> None:
        self.target = target
        self.refuse: str | None = None
        self.port = 0
        self._open: set[asyncio.StreamWriter] = set()

    def cut(self) -> None:
        """Drop every connection passed through (the server behind went away)."""
        for writer in self._open:
            writer.transport.abort()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._open.add(writer)
        try:
            if self.refuse is not None or self.target is None:
                await self._refused(reader, writer, self.refuse or "no server")
                return
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
            self._open.add(up_writer)
            await asyncio.gather(
                _pipe(reader, up_writer), _pipe(up_reader, writer), return_exceptions=True
            )
        except OSError:
            pass
        finally:
            for w in (writer,):
                w.transport.abort()

    async def _refused(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, message: str
    ) -> None:
        while True:  # the startup message, after any negotiation
            length = struct.unpack("!i", await reader.readexactly(4))[0]
            body = await reader.readexactly(length - 4)
            if struct.unpack("!i", body[:4])[0] not in _NEGOTIATIONS:
                break
            writer.write(b"N")
        out = _message(b"R", struct.pack("!i", 0))  # AuthenticationOk
        for name, value in (
            ("server_version", "15.0"),
            ("client_encoding", "UTF8"),
            ("standard_conforming_strings", "on"),
            ("DateStyle", "ISO, MDY"),
            ("integer_datetimes", "on"),
            ("TimeZone", "UTC"),
        ):
            out += _message(b"S", f"{name}\0{value}\0".encode())
        out += _message(b"K", struct.pack("!ii", 1, 1)) + _message(b"Z", b"I")
        writer.write(out)
        await writer.drain()
        await reader.readexactly(1)  # the first statement's first message
        fields = b"".join(
            code + text.encode() + b"\0"
            for code, text in ((b"S", "FATAL"), (b"V", "FATAL"), (b"C", "08P01"), (b"M", message))
        )
        writer.write(_message(b"E", fields + b"\0"))
        await writer.drain()


def _message(kind: bytes, body: bytes) -> bytes:
    return kind + struct.pack("!i", len(body) + 4) + body


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    finally:
        writer.transport.abort()


@contextlib.asynccontextmanager
async def pg_proxy(target: int | None = None) -> AsyncIterator[PgProxy]:
    """A proxy on a free loopback port, for this event loop, passing through to `target`."""
    proxy = PgProxy(target)
    server = await asyncio.start_server(proxy.serve, "127.0.0.1", 0)
    proxy.port = server.sockets[0].getsockname()[1]
    try:
        yield proxy
    finally:
        server.close()
        proxy.cut()
        await server.wait_closed()


@contextlib.contextmanager
def pgbouncer(target: int, mode: str = "session", pool_size: int = 20) -> Iterator[int]:
    """A real pgbouncer on a free loopback port, in front of `target` (a port on 127.0.0.1), its
    `pool_mode` `mode` and `default_pool_size` `pool_size` (scripts/setup installs Debian's)."""
    binary = shutil.which("pgbouncer") or (
        "/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None
    )
    if binary is None:
        pytest.fail("pgbouncer is not installed: run scripts/setup (apt-get install pgbouncer)")
    directory = Path(tempfile.mkdtemp(prefix="signoff-pgbouncer-"))
    # pgbouncer refuses to run as root. Started as postgres itself, not through runuser, which
    # waits 2 s after passing a SIGTERM on.
    as_pg = pwd.getpwnam("postgres") if os.geteuid() == 0 else None
    port = free_port()
    (directory / "users.txt").write_text('"postgres" ""\n')
    (directory / "pgbouncer.ini").write_text(
        f"[databases]\n* = host=127.0.0.1 port={target}\n[pgbouncer]\n"
        f"listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n"
        f"auth_type = trust\nauth_file = {directory / 'users.txt'}\npool_mode = {mode}\n"
        f"default_pool_size = {pool_size}\n"
        "ignore_startup_parameters = extra_float_digits,options\n"
    )
    directory.chmod(0o755)
    for path in (directory, directory / "users.txt", directory / "pgbouncer.ini"):
        if as_pg is not None:
            shutil.chown(path, "postgres")
    proc = subprocess.Popen(
        [binary, str(directory / "pgbouncer.ini")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        user=None if as_pg is None else as_pg.pw_uid,
        group=None if as_pg is None else as_pg.pw_gid,
        extra_groups=None if as_pg is None else [],
    )
    try:
        until = time.monotonic() + 10
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > until:
                pytest.fail("pgbouncer did not start")
            time.sleep(0.05)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(directory, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
