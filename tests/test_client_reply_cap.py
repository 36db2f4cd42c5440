"""The clients read a server's reply up to `max_reply_bytes`: a broken or hostile server (or a
proxy) sending an endless body, a gzip bomb, or an event stream with an endless line fails the
call with `reply_too_large` instead of filling the process's memory."""

from __future__ import annotations

import asyncio
import json
import zlib
from collections.abc import Awaitable, Callable

import pytest

import signoff as so
from signoff.server import AsyncClient, Client

from ._client import EVENTS, Canned, canned, event, http, stream

__all__ = ["canned"]  # the fixture, used by name

CAP = 64 * 1024
STATE = "/v1/sessions/ses_x"


def endless(
    canned: Canned, head: str, line: bytes
) -> Callable[[asyncio.StreamWriter], Awaitable[None]]:
    """A reply that sends `head` and then `line` again and again until the client hangs up
    (or 64 MiB, which no test here may need to read)."""

    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(head.encode())
        for _ in range(64 * 1024 * 1024 // len(line)):
            if canned.done.is_set():
                return
            writer.write(line)
            await writer.drain()

    return reply


def gzipped(body: bytes) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, zlib.MAX_WBITS | 16)
    return packer.compress(body) + packer.flush()


async def refused(call: Awaitable[object]) -> so.RemoteError:
    with pytest.raises(so.RemoteError) as caught:
        await asyncio.wait_for(call, 20)
    return caught.value


async def test_a_reply_announcing_a_length_over_the_cap_is_not_read(canned: Canned) -> None:
    canned.on(STATE, http("200 OK", "{" + " " * (CAP + 10) + "}"))
    async with AsyncClient(canned.base, max_reply_bytes=CAP) as c:
        exc = await refused(c.state("ses_x"))
    assert (exc.code, exc.status) == ("reply_too_large", 200)
    assert f"{CAP + 12:,} bytes" in str(exc) and "max_reply_bytes" in str(exc)


async def test_an_endless_body_fails_the_call_near_the_cap(canned: Canned) -> None:
    head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n["
    canned.on(STATE, endless(canned, head, b"1," * 8192))
    async with AsyncClient(canned.base, max_reply_bytes=CAP) as c:
        exc = await refused(c.state("ses_x"))
    assert (exc.code, exc.status) == ("reply_too_large", 200)
    assert len(canned.seen) == 1  # not asked again: the next reply would be as large


async def test_a_gzip_bomb_is_counted_as_it_inflates(canned: Canned) -> None:
    bomb = gzipped(b"[" + b"0," * (50 * 1024 * 1024) + b"0]")  # 100 MB in about 100 KB
    assert len(bomb) < CAP * 4
    canned.on(STATE, http("200 OK", bomb, extra="Content-Encoding: gzip\r\n"))
    async with AsyncClient(canned.base, max_reply_bytes=CAP) as c:
        exc = await refused(c.state("ses_x"))
    assert exc.code == "reply_too_large"
    assert canned.seen[0][1]["accept-encoding"] == "gzip, deflate"  # only what it inflates


async def test_a_small_gzipped_reply_is_read(canned: Canned) -> None:
    body = json.dumps({"id": "ses_x", "status": "idle"}).encode()
    canned.on(STATE, http("200 OK", gzipped(body), extra="Content-Encoding: gzip\r\n"))
    async with AsyncClient(canned.base, max_reply_bytes=CAP) as c:
        assert await c.state("ses_x") == {"id": "ses_x", "status": "idle"}


async def test_a_reply_in_a_coding_not_asked_for_is_refused(canned: Canned) -> None:
    canned.on(STATE, http("200 OK", b"\x0b\x02\x80{}\x03", extra="Content-Encoding: br\r\n"))
    async with AsyncClient(canned.base, max_reply_bytes=CAP) as c:
        exc = await refused(c.state("ses_x"))
    assert exc.code == "reply_too_large" and "'br'" in str(exc)


async def test_an_event_stream_longer_than_the_cap_is_read_whole(canned: Canned) -> None:
    """The cap bounds a stream's lines, not the stream: it may run for days."""
    many = "".join(event(seq) for seq in range(1, 2001))
    assert len(many) > 2 * CAP
    canned.on(EVENTS, stream(many))
    async with AsyncClient(canned.base, max_reply_bytes=CAP) as c:
        seqs = [e.seq async for e in c.events("ses_x", follow=False)]
    assert seqs == list(range(1, 2001))


async def test_an_endless_line_of_an_event_stream_fails_the_read(canned: Canned) -> None:
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    canned.on(EVENTS, endless(canned, head + event(1) + "data: ", b"x" * 8192))
    async with AsyncClient(canned.base, max_reply_bytes=CAP) as c:
        seen: list[int] = []

        async def read() -> None:
            async for e in c.events("ses_x", follow=True, retries=3):
                seen.append(e.seq)

        exc = await refused(read())
    assert (exc.code, exc.status) == ("reply_too_large", 200)
    assert seen == [1]
    assert len(canned.seen) == 1  # not reconnected: the event would be as long again


async def test_an_event_of_many_short_data_lines_fails_the_read(canned: Canned) -> None:
    lines = "data: " + "\ndata: ".join(["x" * 100] * (CAP // 50)) + "\n\n"
    canned.on(EVENTS, stream(event(1) + lines))
    async with AsyncClient(canned.base, max_reply_bytes=CAP) as c:
        exc = await refused(_collect(c))
    assert (exc.code, exc.status) == ("reply_too_large", 200)


async def _collect(c: AsyncClient) -> list[int]:
    return [e.seq async for e in c.events("ses_x", follow=False)]


async def test_the_blocking_client_reads_within_its_cap(canned: Canned) -> None:
    canned.on(STATE, http("200 OK", "{" + " " * (CAP + 10) + "}"))
    with Client(canned.base, max_reply_bytes=CAP) as c:
        with pytest.raises(so.RemoteError) as caught:
            await asyncio.to_thread(c.state, "ses_x")
    assert caught.value.code == "reply_too_large"


@pytest.mark.parametrize("value", [0, 1023, True, "65536", 65536.0, None])
def test_a_cap_that_is_not_a_whole_number_of_bytes_is_refused(value: object) -> None:
    with pytest.raises(so.UsageError, match="^AsyncClient: max_reply_bytes must be an integer"):
        AsyncClient("http://127.0.0.1:1", max_reply_bytes=value)  # type: ignore[arg-type]
    # The blocking client's error names it, not the AsyncClient it wraps.
    with pytest.raises(so.UsageError, match="^Client: max_reply_bytes must be an integer"):
        Client("http://127.0.0.1:1", max_reply_bytes=value)  # type: ignore[arg-type]
