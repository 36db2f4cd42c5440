"""The clients against an https server whose certificate no public authority signed (a proxy
with a private CA, say): refused by default with an error that says why and what to pass, and
trusted with `verify=` an `ssl.SSLContext` that knows its authority."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

import signoff as so
from signoff.server import AsyncClient, Client
from tests._tls import self_signed

STATE = {"id": "ses_x", "status": "idle"}


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A self-signed certificate for 127.0.0.1 and its key, made by Debian's `openssl`."""
    where = tmp_path_factory.mktemp("tls")
    yield self_signed(where, "127.0.0.1", "IP:127.0.0.1")


class TlsServer:
    """A loopback https server answering every request with the session state above; `served`
    counts the requests that got through the handshake."""

    def __init__(self, cert: Path, key: Path) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        self.served = 0
        self.base = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            body = json.dumps(STATE).encode()
            head = (
                f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
            )
            writer.write(f"{head}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
            self.served += 1
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def server(certificate: tuple[Path, Path]) -> AsyncIterator[TlsServer]:
    tls = TlsServer(*certificate)
    listening = await asyncio.start_server(tls.handle, "127.0.0.1", 0, ssl=tls.context)
    tls.base = f"https://127.0.0.1:{listening.sockets[0].getsockname()[1]}"
    loop = asyncio.get_running_loop()
    # The refused handshakes are the test's point, not errors for asyncio's log.
    loop.set_exception_handler(lambda _loop, _context: None)
    try:
        yield tls
    finally:
        listening.close()
        await listening.wait_closed()


def trusting(cert: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(cert))


async def test_an_untrusted_certificate_is_refused_saying_why(server: TlsServer) -> None:
    async with AsyncClient(server.base) as c:
        with pytest.raises(so.RemoteError) as caught:
            await c.state("ses_x")
    assert (caught.value.code, caught.value.status) == ("unreachable", 0)
    assert "TLS certificate could not be verified" in str(caught.value)
    assert "verify=" in str(caught.value)
    assert server.served == 0


async def test_verify_with_a_context_that_trusts_the_authority_reads_the_server(
    server: TlsServer, certificate: tuple[Path, Path]
) -> None:
    async with AsyncClient(server.base, verify=trusting(certificate[0])) as c:
        assert await c.state("ses_x") == STATE
    assert server.served == 1


async def test_verify_false_reads_any_server(server: TlsServer) -> None:
    async with AsyncClient(server.base, verify=False) as c:
        assert await c.state("ses_x") == STATE


async def test_the_blocking_client_takes_verify(
    server: TlsServer, certificate: tuple[Path, Path]
) -> None:
    with Client(server.base, verify=trusting(certificate[0])) as c:
        assert await asyncio.to_thread(c.state, "ses_x") == STATE
    with Client(server.base) as c:
        with pytest.raises(so.RemoteError, match="TLS certificate could not be verified"):
            await asyncio.to_thread(c.state, "ses_x")


@pytest.mark.parametrize("value", ["/etc/ssl/certs/ca-certificates.crt", None, 1])
def test_verify_that_is_not_a_flag_or_a_context_is_refused(value: object) -> None:
    with pytest.raises(so.UsageError, match="verify must be True, False or an ssl.SSLContext"):
        AsyncClient("https://127.0.0.1:1", verify=value)  # type: ignore[arg-type]
    with pytest.raises(so.UsageError, match="verify must be"):
        Client("https://127.0.0.1:1", verify=value)  # type: ignore[arg-type]
