"""A quiet stream's keep-alives and its sign-in re-checks come every `heartbeat`, as documented,
even with a `poll_interval` longer than it: on SQLite (polled) the session's event stream and
the dashboard's queue stream slept a whole `poll_interval` between reads, so with
`create_app(poll_interval=4, heartbeat=1)` a keep-alive came every 4 s (a proxy's idle timeout
could cut the stream) and a signed-out cookie's stream went on that long."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

import signoff as so
from signoff.server._context import ServerContext
from signoff.server._queue_stream import queue_changes
from signoff.server._sign_ins import Grant, SignOuts
from signoff.server._sse import KEEP_ALIVE, SIGNED_OUT_END, event_stream

from .test_server_common import ALICE, make_agents
from .test_sse_stream import _context, _request

POLL_INTERVAL = 30.0
"""Far longer than the test waits: a stream that sleeps it between reads sends nothing."""
HEARTBEAT = 0.05

Open = Callable[[Any, ServerContext, str], AsyncIterator[str]]


def _events(request: Any, ctx: ServerContext, sid: str) -> AsyncIterator[str]:
    return event_stream(request, ctx, sid, 0, follow=True)


def _queue(request: Any, ctx: ServerContext, sid: str) -> AsyncIterator[str]:
    return queue_changes(request, ctx, ALICE)


STREAMS = pytest.mark.parametrize("open_stream", [_events, _queue], ids=["events", "queue"])


async def _until(stream: AsyncIterator[str], sent: list[str], done: Callable[[], bool]) -> None:
    """Read `stream` into `sent` until `done()` or its end: within 5 s (a hundred heartbeats,
    room for a loaded machine), where a stream that waited a `poll_interval` sent nothing for 30."""

    async def read() -> None:
        async for message in stream:
            sent.append(message)
            if done():
                return

    try:
        await asyncio.wait_for(read(), 5)  # returned, or the stream ended
    except TimeoutError:
        raise AssertionError(f"not within 5 s; the stream sent {sent[-3:]}") from None


@STREAMS
async def test_a_quiet_stream_sends_a_keep_alive_every_heartbeat(
    store_url: str, open_stream: Open
) -> None:
    async with so.Runtime(make_agents(), store=store_url) as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        ctx = _context(rt, poll_interval=POLL_INTERVAL, heartbeat=HEARTBEAT)
        stream = open_stream(_request(), ctx, sid)
        sent: list[str] = []
        began = time.monotonic()
        await _until(stream, sent, lambda: sent.count(KEEP_ALIVE) >= 5)
        took = time.monotonic() - began
        ctx.closing = True  # a stopping server ends it within a heartbeat, not a poll_interval
        await _until(stream, sent, lambda: False)
    assert took >= 4 * HEARTBEAT  # not sent back to back either: one per quiet heartbeat


@STREAMS
async def test_a_signed_out_cookies_stream_ends_within_a_heartbeat(
    store_url: str, monkeypatch: pytest.MonkeyPatch, open_stream: Open
) -> None:
    async with so.Runtime(make_agents(), store=store_url) as rt:
        sid = (await rt.generate("support", prompt="Refund order 1042", auth=ALICE)).session_id
        ctx = _context(rt, poll_interval=POLL_INTERVAL, heartbeat=HEARTBEAT)
        request = _request()
        request.state.signoff_sign_in = Grant("sgn_1", int(rt.now()), ALICE)
        signed_out = [False]

        async def revoked(*args: Any) -> bool:
            return signed_out[0]

        monkeypatch.setattr(SignOuts, "revoked", revoked)
        stream = open_stream(request, ctx, sid)
        sent: list[str] = []
        await _until(stream, sent, lambda: sent.count(KEEP_ALIVE) >= 2)  # quiet, polled
        signed_out[0] = True  # signed out in another tab, or another process
        await _until(stream, sent, lambda: sent[-1] == SIGNED_OUT_END)
        with pytest.raises(StopAsyncIteration):  # and it has ended
            await anext(stream)
