"""A keyed call whose answer is lost after the server applied it, against a real server on
each store: the client sends it once more under its key, and the server applies it once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

import signoff as so
from signoff.server import AsyncClient

from .test_server_common import served


async def _message(reader: asyncio.StreamReader) -> bytes:
    """One HTTP/1.1 message, its head and its Content-Length body, as it came."""
    head = await reader.readuntil(b"\r\n\r\n")
    size = 0
    for line in head.decode("latin-1").split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            size = int(value)
    return head + (await reader.readexactly(size) if size else b"")


@asynccontextmanager
async def dropping_proxy(upstream: str, path: str, drops: int) -> AsyncIterator[list[str]]:
    """A loopback proxy to `upstream` that, for the first `drops` requests to `path`, waits for
    the server's whole answer (the call applied) and then resets the client's connection. It
    yields a list: its base URL first, then each request line it forwards."""
    host, port = httpx.URL(upstream).host, httpx.URL(upstream).port
    forwarded: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal drops
        try:
            request = await _message(reader)
            line = request.split(b"\r\n", 1)[0].decode()
            forwarded.append(line)
            up_reader, up_writer = await asyncio.open_connection(host, port)
            up_writer.write(request)
            await up_writer.drain()
            answer = await _message(up_reader)
            up_writer.close()
            if line.split()[1] == path and drops > 0:
                drops -= 1
                writer.transport.abort()  # the answer lost: a reset, after the commit
                return
            head, _, body = answer.partition(b"\r\n\r\n")
            writer.write(head + b"\r\nConnection: close\r\n\r\n" + body)
            await writer.drain()
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        forwarded.append(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
        yield forwarded
    finally:
        server.close()


async def test_a_message_whose_answer_was_lost_is_applied_once(store_url: str) -> None:
    with served(store_url) as upstream:
        async with AsyncClient(upstream, token="alice-token") as direct:
            opened = await direct.generate("support")
            path = f"/v1/sessions/{opened.session_id}/messages"
            async with dropping_proxy(upstream, path, drops=1) as forwarded:
                base = forwarded.pop(0)
                async with AsyncClient(base, token="alice-token") as c:
                    result = await c.send(opened.session_id, "Refund order 1042")
            assert result.replayed and result.status == "waiting"
            sent = [line for line in forwarded if line.startswith(f"POST {path} ")]
            assert len(sent) == 2  # sent, its answer lost; sent again, answered from the key
            events = [e async for e in direct.events(opened.session_id, follow=False)]
    messages = [e.data["message"] for e in events if e.type in ("turn.started", "turn.message")]
    assert messages == ["Refund order 1042"]  # delivered once
    asked = [e for e in events if e.type == "input.requested"]
    assert len(asked) == 1 and [r.id for r in result.pending] == [
        r["id"] for r in asked[0].data["requests"]
    ]


async def test_an_answer_whose_reply_was_lost_is_not_sent_again(store_url: str) -> None:
    """`respond` carries no key: its reply lost, it is not sent again by the client (a second
    answer could act on a later request), and the error says it may have been applied."""
    with served(store_url) as upstream:
        async with AsyncClient(upstream, token="alice-token") as direct:
            r = await direct.generate("support", "Refund order 1042")
            path = f"/v1/sessions/{r.session_id}/responses"
            async with dropping_proxy(upstream, path, drops=1) as forwarded:
                base = forwarded.pop(0)
                async with AsyncClient(base, token="alice-token") as c:
                    answer = [{"request_id": r.pending[0].id, "option_id": "approve"}]
                    try:
                        await c.respond(r.session_id, answer)
                    except so.RemoteError as exc:
                        assert exc.code == "connection_lost" and exc.status == 0
                        assert "may or may not have been applied" in str(exc)
                    else:
                        raise AssertionError("a lost reply was not reported")
            assert [line.split()[1] for line in forwarded] == [path]
            events = [e async for e in direct.events(r.session_id, follow=False)]
    resolved = [e.data["request_id"] for e in events if e.type == "input.resolved"]
    assert resolved == [r.pending[0].id]  # applied, once
