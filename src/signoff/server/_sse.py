"""Server-Sent Events framing, and the stream of one session's events read from the store."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import StreamingResponse

from .._events import Event
from .._exceptions import StoreError
from ._context import ServerContext

__all__ = ["STREAM_HEADERS", "event_stream", "parse_last_event_id", "sse", "stream_response"]

STREAM_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
"""Sent with every stream: no cache may keep it, and no proxy (nginx) may buffer it."""

log = logging.getLogger("signoff.server")


def sse(data: Any, *, event: str | None = None, id: str | int | None = None) -> str:
    """One SSE message; the data is JSON on a single line."""
    lines = []
    if id is not None:
        lines.append(f"id: {id}")
    if event is not None:
        lines.append(f"event: {event}")
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    lines.extend(f"data: {line}" for line in payload.split("\n"))
    return "\n".join(lines) + "\n\n"


def frame(event: Event) -> str:
    return sse(event.to_dict(), event=event.type, id=event.seq)


def stream_response(stream: AsyncIterator[str]) -> StreamingResponse:
    """An event stream as a response, with the headers that keep proxies from holding it."""
    return StreamingResponse(stream, media_type="text/event-stream", headers=STREAM_HEADERS)


def parse_last_event_id(raw: str) -> int | None:
    """The seq a `Last-Event-ID` names: plain ASCII digits, or None when it is not one (`int()`
    would also read `1_0` as 10 and `+2` as 2, ids this server never sends)."""
    text = raw.strip()
    if not text or not text.isascii() or not text.isdigit() or len(text) > 20:
        return None
    return int(text)


async def event_stream(
    request: Request,
    ctx: ServerContext,
    session_id: str,
    after: int,
    *,
    follow: bool,
) -> AsyncIterator[str]:
    """Everything after `after`, then (when following) new events as the store gains them,
    until the client goes or the server stops (`ctx.closing`).

    It polls the store rather than an in-process signal, so any server process can serve any
    session, whoever writes to it. A following stream outlives a store failing for a while (the
    database restarting): a client reconnecting then would get a 503, which ends an EventSource.
    """
    poll_interval, heartbeat = ctx.poll_interval, ctx.heartbeat
    yield f"retry: {int(max(poll_interval, 0.5) * 1000)}\n\n"
    last_sent = time.monotonic()
    failing = False
    while True:
        try:
            batch = await ctx.runtime.store.read_events(session_id, after=after, limit=500)
        except StoreError as exc:
            if not follow:
                raise
            if not failing:
                log.warning("session %s's event stream waits for the store: %s", session_id, exc)
            failing = True
            batch = []
        else:
            failing = False
        for event in batch:
            yield frame(event)
            after = event.seq
        if len(batch) == 500:
            continue  # more is waiting: no pause while catching up
        if not follow:
            return
        now = time.monotonic()
        if batch:
            last_sent = now
        elif now - last_sent >= heartbeat:
            yield ": keep-alive\n\n"
            last_sent = now
        if ctx.closing or await request.is_disconnected():
            return
        await asyncio.sleep(poll_interval)
