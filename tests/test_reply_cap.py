"""`max_reply_bytes`: the OpenAI and Anthropic adapters stop reading a reply once it passes the
cap (as inflated), through the real SDKs against a raw HTTP server on loopback."""

from __future__ import annotations

import asyncio
import functools
import gzip
import json
import socket
import zlib
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import signoff as so
from signoff.models import ModelRequest
from signoff.models._reply_cap import DEFAULT_MAX_REPLY_BYTES

from ._loopback import LoopbackServer, read_head
from .fakes.llm import API_KEY, anthropic_message, openai_completion

CAP = 64 * 1024
Body = Callable[[socket.socket], None]


class RawServer(LoopbackServer):
    """Answers each connection's request with `body(conn)`, counting the bytes it got out."""

    def __init__(self, body: Body) -> None:
        super().__init__()
        self.body = body
        self.sent = 0
        self.requests = 0

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def handle(self, conn: socket.socket) -> None:
        read = read_head(conn)
        if read is None:
            return
        head, rest = read
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        while len(rest) < length:
            rest += conn.recv(65536)
        self.requests += 1
        try:
            self.body(conn)
        except OSError:
            pass  # the client hung up: what the cap is for

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.sent += len(data)


def head(length: int | None, encoding: str | None = None) -> bytes:
    lines = ["HTTP/1.1 200 OK", "Content-Type: application/json"]
    lines.append("Transfer-Encoding: chunked" if length is None else f"Content-Length: {length}")
    if encoding:
        lines.append(f"Content-Encoding: {encoding}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


@pytest.fixture(params=["openai", "anthropic"])
def flavor(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def make_model(
    flavor: str, base_url: str, **kwargs: Any
) -> so.models.OpenAIChat | so.models.Anthropic:
    if flavor == "openai":
        return so.models.OpenAIChat(
            "m", base_url=base_url, api_key=API_KEY, max_retries=2, **kwargs
        )
    return so.models.Anthropic(
        "m", base_url=base_url.removesuffix("/v1"), api_key=API_KEY, max_retries=2, **kwargs
    )


def reply_json(flavor: str, text: str) -> bytes:
    body = openai_completion(text) if flavor == "openai" else anthropic_message(text)
    return json.dumps(body).encode()


def request() -> ModelRequest:
    return ModelRequest(
        session_id="ses_1",
        agent="a",
        instructions="",
        messages=[so.UserMessage(text="hi")],
        tools=[],
        response_index=0,
    )


async def complete(model: Any) -> so.ModelResponse:
    async with model:
        result: so.ModelResponse = await asyncio.wait_for(model.complete(request()), 60)
        return result


@pytest.fixture
def server_for() -> Iterator[Callable[[Body], RawServer]]:
    made: list[RawServer] = []

    def start(body: Body) -> RawServer:
        server = RawServer(body)
        made.append(server.__enter__())
        return server

    yield start
    for server in made:
        server.__exit__()


async def test_an_endless_reply_is_cut_off_after_the_cap(flavor, server_for) -> None:
    def endless(conn: socket.socket) -> None:
        server.send(conn, head(None))
        piece = b"x" * 65536
        chunk = b"%x\r\n" % len(piece) + piece + b"\r\n"
        for _ in range(16_384):  # 1 GiB, unless the client hangs up
            server.send(conn, chunk)

    server = server_for(endless)
    with pytest.raises(so.ModelError, match=r"passed 65,536 bytes \(max_reply_bytes\)"):
        await complete(make_model(flavor, server.base_url, max_reply_bytes=CAP))
    assert server.requests == 1  # a reply too large is not asked for again
    # What the client read is about the cap; the rest is what loopback's buffers took in.
    assert server.sent < 64 * 1024 * 1024


async def test_a_reply_announcing_too_many_bytes_is_refused_before_reading(
    flavor, server_for
) -> None:
    def huge(conn: socket.socket) -> None:
        server.send(conn, head(10 * CAP) + b"{" * 1024)

    server = server_for(huge)
    with pytest.raises(so.ModelError, match=r"announced 655,360 bytes, over max_reply_bytes"):
        await complete(make_model(flavor, server.base_url, max_reply_bytes=CAP))
    assert server.requests == 1


@functools.cache
def bomb_of(flavor: str, coding: str) -> bytes:
    """100 MB of spaces in a reply, compressed to about 100 KB: the cap counts what the SDK would
    parse. Made once per flavor and coding (0.6 s of CPU each; the gzip spellings share one)."""
    raw = reply_json(flavor, "ok")[:-1] + b" " * 100_000_000 + b"}"
    return zlib.compress(raw, 9) if coding == "deflate" else gzip.compress(raw, 9)


# Spellings HTTP allows for one gzip coding: a list with identity, any case, the x- alias.
GZIP_SPELLINGS = ["gzip, identity", "identity, gzip", "GZip", "x-gzip"]


@pytest.mark.parametrize("encoding", ["gzip", "deflate", *GZIP_SPELLINGS])
async def test_a_compressed_reply_is_capped_as_it_inflates(flavor, server_for, encoding) -> None:
    packed = bomb_of(flavor, "deflate" if encoding == "deflate" else "gzip")
    assert len(packed) < 2 * CAP * 16

    def bomb(conn: socket.socket) -> None:
        server.send(conn, head(len(packed), encoding) + packed)

    server = server_for(bomb)
    with pytest.raises(so.ModelError, match=r"passed 655,360 bytes \(max_reply_bytes\)"):
        await complete(make_model(flavor, server.base_url, max_reply_bytes=10 * CAP))


@pytest.mark.parametrize(
    "encoding", ["gzip", "deflate", "raw deflate", "identity", None, *GZIP_SPELLINGS]
)
async def test_replies_under_the_cap_are_read_whole(flavor, server_for, encoding) -> None:
    raw = reply_json(flavor, "fine " * 2000)
    if encoding in ("gzip", *GZIP_SPELLINGS):
        packed = gzip.compress(raw)
    elif encoding == "deflate":
        packed = zlib.compress(raw)
    elif encoding == "raw deflate":  # some servers send deflate without zlib's header
        z = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        packed = z.compress(raw) + z.flush()
    else:
        packed = raw
    sent_encoding = "deflate" if encoding == "raw deflate" else encoding

    def fine(conn: socket.socket) -> None:
        server.send(conn, head(len(packed), sent_encoding) + packed)

    server = server_for(fine)
    response = await complete(make_model(flavor, server.base_url, max_reply_bytes=CAP))
    assert response.text == "fine " * 2000


@pytest.mark.parametrize("encoding", ["gzip, gzip", "br", "zstd", "compress"])
async def test_a_reply_in_an_encoding_not_asked_for_is_refused(
    flavor, server_for, encoding
) -> None:
    """Only one gzip or deflate coding is asked for and inflated under the cap: any other (which
    the HTTP package might inflate past it, or could not read) fails the call, once."""
    packed = gzip.compress(gzip.compress(reply_json(flavor, "ok")))

    def other(conn: socket.socket) -> None:
        server.send(conn, head(len(packed), encoding) + packed)

    server = server_for(other)
    with pytest.raises(so.ModelError, match=f"is encoded as '{encoding}', not asked for"):
        await complete(make_model(flavor, server.base_url, max_reply_bytes=CAP))
    assert server.requests == 1


async def test_corrupt_compressed_data_is_a_model_error(flavor, server_for) -> None:
    def corrupt(conn: socket.socket) -> None:
        server.send(conn, head(64, "gzip") + b"\x1f\x8b" + b"\x00" * 62)

    server = server_for(corrupt)
    with pytest.raises(
        so.ModelError, match="labelled compressed, but the body could not be decoded"
    ):
        await complete(make_model(flavor, server.base_url, max_reply_bytes=CAP))


@pytest.mark.parametrize(
    ("reply", "says"),
    [
        (head(10 * CAP) + b"{" * 1024, "announced"),
        (head(None) + b"%x\r\n" % (2 * CAP) + b" " * (2 * CAP) + b"\r\n", "passed"),
        (head(64, "gzip") + b"\x1f\x8b" + b"\x00" * 62, "could not be decoded"),
        (head(2, "br") + b"{}", "is encoded as 'br'"),
    ],
    ids=["announced", "endless", "corrupt", "brotli"],
)
async def test_a_password_in_the_base_url_is_left_out_of_the_caps_errors(
    flavor, server_for, reply, says
) -> None:
    """The cap's error names the URL it read, and is recorded in the session's log: a gateway's
    basic-auth password in the base URL is shown as `***` there, as in the model's own errors."""

    def answer(conn: socket.socket) -> None:
        server.send(conn, reply)

    server = server_for(answer)
    base = server.base_url.replace("http://", "http://bob:hunter2@")
    with pytest.raises(so.ModelError, match=says) as info:
        await complete(make_model(flavor, base, max_reply_bytes=CAP))
    assert "hunter2" not in str(info.value)
    assert "the reply from http://bob:***@127.0.0.1:" in str(info.value)


@pytest.mark.parametrize("bad", [0, 1023, 1.5e6, True, "16MB", None])
def test_max_reply_bytes_must_be_a_whole_number_of_bytes(flavor, bad) -> None:
    with pytest.raises(so.UsageError, match="max_reply_bytes must be an integer >= 1024"):
        make_model(flavor, "http://127.0.0.1:9/v1", max_reply_bytes=bad)


def test_the_default_cap_is_sixteen_mebibytes(flavor) -> None:
    model = make_model(flavor, "http://127.0.0.1:9/v1")
    assert model.max_reply_bytes == DEFAULT_MAX_REPLY_BYTES == 16 * 1024 * 1024
