"""`event_stream` read directly: a read that is not followed never ends quietly short of the log
when the store fails, nor when the server stops, and a server that is stopping ends a followed
stream after the batch in flight rather than sending it the whole backlog first; and, over
HTTP, that a read that is not followed stops at the head its request read."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import signoff as so
from signoff import stores
from signoff.server import TokenAuth
from signoff.server._context import ServerContext
from signoff.server._sign_ins import Grant, SignOuts
from signoff.server._sse import event_stream

from .test_server_common import ALICE, auth, in_process, make_agents


class _Request:
    """What `event_stream` asks of its request: whether the client went, and its state."""

    def __init__(self) -> None:
        self.state = SimpleNamespace()

    async def is_disconnected(self) -> bool:
        return False


def _request() -> Any:
    """A stand-in for the streamed request (typed loosely: it is no Starlette `Request`)."""
    return _Request()


async def _ids(stream: Any) -> list[int]:
    """The event ids a stream sent, in order (its retry line and comments skipped)."""
    ids = []
    async for message in stream:
        for line in message.splitlines():
            if line.startswith("id: "):
                ids.append(int(line.removeprefix("id: ")))
    return ids


def _context(runtime: so.Runtime, **kwargs: Any) -> ServerContext:
    return ServerContext(
        runtime=runtime, auth=TokenAuth({}), access=lambda c, i: True, secret=b"k" * 32, **kwargs
    )


async def test_a_read_that_is_not_followed_fails_when_the_store_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`follow=false` reads the log once: a store failing under it must fail the response (the
    client then reads again), not end it as if the log had no more events."""
    async with so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db") as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        ctx = _context(rt, poll_interval=0.01, heartbeat=0.05)
        assert len(await _ids(event_stream(_request(), ctx, sid, 0, follow=False))) > 2
        real = rt.store.read_events
        reads = [0]

        async def failing(*args: Any, **kwargs: Any) -> list[so.Event]:
            reads[0] += 1
            if reads[0] > 1:
                raise so.StoreUnavailable("the database is down")
            return await real(*args, **kwargs)

        monkeypatch.setattr(stores, "READ_BYTES", 1)  # one event a read
        monkeypatch.setattr(rt.store, "read_events", failing)
        stream = event_stream(_request(), ctx, sid, 0, follow=False)
        sent = []
        with pytest.raises(so.StoreUnavailable):
            async for message in stream:
                sent.append(message)
        assert sum(m.startswith("id: ") for m in sent) == 1


async def test_a_stopping_server_ends_a_stream_after_the_batch_in_flight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the server begins to stop (`closing`), a stream with a backlog ends after the read
    it is sending, so the shutdown does not wait for the whole log to go out; the client
    resumes from the last id it got."""
    async with so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db") as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        head = (await rt._state(sid)).seq
        assert head > 2
        monkeypatch.setattr(stores, "READ_BYTES", 1)  # one event a read
        ctx = _context(rt, poll_interval=0.01, heartbeat=0.05)
        assert await _ids(event_stream(_request(), ctx, sid, 0, follow=False)) == list(
            range(1, head + 1)
        )
        ctx.closing = True
        assert await _ids(event_stream(_request(), ctx, sid, 0, follow=True)) == [1]
        assert await _ids(event_stream(_request(), ctx, sid, 1, follow=True)) == [2]


async def test_a_stopping_server_still_sends_a_read_that_is_not_followed_to_its_end(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read with `follow=false` ends where the log does, and its client takes that end for the
    whole log (`Client.events`, `LiveSession.sync`): cut short because the server is stopping,
    it would look complete. It is bounded, so it is sent whole."""
    async with so.Runtime(make_agents(), store=store_url) as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        head = (await rt._state(sid)).seq
        assert head > 2
        monkeypatch.setattr(stores, "READ_BYTES", 1)  # one event a read
        ctx = _context(rt, poll_interval=0.01, heartbeat=0.05)
        ctx.closing = True
        assert await _ids(event_stream(_request(), ctx, sid, 0, follow=False)) == list(
            range(1, head + 1)
        )
        assert await _ids(event_stream(_request(), ctx, sid, 2, follow=False)) == list(
            range(3, head + 1)
        )


async def test_a_read_that_is_not_followed_stops_at_the_head_the_request_read(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`GET .../events?follow=false` ends at the session's head as the request read it (its
    state is read to check the caller's access and the start): it read once more to find the
    log's end, a round trip for nothing on each such request. A read bounded by bytes still
    reads on to that head."""
    async with in_process(store_url) as (rt, c):
        c.headers.update(auth("alice-token"))
        made = await c.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"})
        sid = made.json()["session_id"]
        head = (await rt._state(sid)).seq
        assert head > 2
        real = rt.store.read_events
        reads = [0]

        async def counted(*args: Any, **kwargs: Any) -> list[so.Event]:
            reads[0] += kwargs.get("max_bytes") is not None  # the stream's own reads
            return await real(*args, **kwargs)

        monkeypatch.setattr(rt.store, "read_events", counted)
        url = f"/v1/sessions/{sid}/events"

        async def ids(after: int) -> list[int]:
            reads[0] = 0
            r = await c.get(url, params={"follow": "false", "after": str(after)})
            assert r.status_code == 200, r.text
            return [int(x.removeprefix("id: ")) for x in r.text.splitlines() if x[:4] == "id: "]

        assert await ids(0) == list(range(1, head + 1)) and reads == [1]
        assert await ids(head) == [] and reads == [0]
        monkeypatch.setattr(stores, "READ_BYTES", 1)  # one event a read
        assert await ids(1) == list(range(2, head + 1)) and reads == [head - 1]


async def _keep_alives_while_hung(
    ctx: ServerContext, stream: AsyncIterator[str], hung: asyncio.Event, released: asyncio.Event
) -> None:
    """Read `stream` until `hung` is set, then check it sends keep-alives while the call it
    waits on hangs (five: a quarter of a second at a heartbeat of 0.05 s, at most 5 s on a busy
    machine; never, from a stream that waits for the call), and that a stopping server ends it
    and drops that call."""
    messages: list[str] = []

    async def read() -> None:
        async for message in stream:
            messages.append(message)

    reader = asyncio.create_task(read())
    await asyncio.wait_for(hung.wait(), 10)
    since = len(messages)
    deadline = time.monotonic() + 5
    while sum(m.startswith(": keep-alive") for m in messages[since:]) < 5:
        assert time.monotonic() < deadline, messages[-3:]
        await asyncio.sleep(0.01)
    assert not released.is_set()  # all sent while the call hangs
    ctx.closing = True
    await asyncio.wait_for(reader, 5)  # the stream ended without the call's answer
    await asyncio.wait_for(released.wait(), 5)  # and the call it waited on was dropped


async def test_a_followed_stream_sends_keep_alives_while_a_store_read_hangs(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A database that stops answering (a frozen host, a network partition) held each read for
    the store's `operation_timeout` (30 s): the stream sent nothing that long, past its
    `heartbeat`, and a proxy's idle timeout could cut it. Keep-alives go on while a read waits,
    and a server that begins to stop ends the stream without waiting for it."""
    async with so.Runtime(make_agents(), store=store_url) as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        head = (await rt._state(sid)).seq
        real = rt.store.read_events
        hung = asyncio.Event()
        released = asyncio.Event()

        async def hanging(*args: Any, **kwargs: Any) -> list[so.Event]:
            if kwargs.get("after", 0) < head:
                return await real(*args, **kwargs)
            hung.set()
            try:
                await asyncio.sleep(3600)
            finally:
                released.set()
            raise AssertionError("unreachable")

        monkeypatch.setattr(rt.store, "read_events", hanging)
        ctx = _context(rt, poll_interval=0.01, heartbeat=0.05)
        stream = event_stream(_request(), ctx, sid, 0, follow=True)
        await _keep_alives_while_hung(ctx, stream, hung, released)


async def test_keep_alives_go_on_while_a_sign_in_check_hangs(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream opened with the sign-in cookie reads the store's sign-outs every `heartbeat`:
    a database not answering held that read too, the stream silent meanwhile."""
    async with so.Runtime(make_agents(), store=store_url) as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        head = (await rt._state(sid)).seq
        ctx = _context(rt, poll_interval=0.01, heartbeat=0.05)
        hung = asyncio.Event()
        released = asyncio.Event()

        async def hanging(*args: Any) -> bool:
            hung.set()
            try:
                await asyncio.sleep(3600)
            finally:
                released.set()
            raise AssertionError("unreachable")

        monkeypatch.setattr(SignOuts, "revoked", hanging)
        request = _request()
        request.state.signoff_sign_in = Grant("sgn_1", int(rt.now()), ALICE)
        stream = event_stream(request, ctx, sid, head, follow=True)
        await _keep_alives_while_hung(ctx, stream, hung, released)
