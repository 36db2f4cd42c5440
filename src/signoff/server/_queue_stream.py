"""The dashboard's queue stream (`/_signoff/stream`): a `queue` event whenever the open requests
a viewer sees change, read by polling the store so any server process can serve it."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing

from starlette.requests import Request

from .._exceptions import StoreError
from .._types import Principal
from ._context import ServerContext
from ._sse import KEEP_ALIVE, LASTING, Beat, end_event, sse

__all__ = ["queue_changes"]

log = logging.getLogger("signoff.server")


async def queue_changes(
    request: Request, ctx: ServerContext, viewer: Principal
) -> AsyncIterator[str]:
    """The queue stream's messages: a `queue` event whenever the set of open requests the
    `viewer` sees changes, keep-alives each quiet `heartbeat` (a store call that hangs, a
    frozen database host, included), until the viewer's sign-in ends or the server stops."""
    last = None
    everything: tuple[int, str] | None = None
    beat = Beat(request, ctx, follow=True)
    failing = False
    yield "retry: 1000\n\n"
    while True:
        found: tuple[int, str] | None = None
        read = asyncio.ensure_future(_queue_read(ctx, viewer, everything))
        async with aclosing(beat.awaiting(read)) as waits:
            async for message in waits:
                yield message
        if beat.over:
            return
        try:
            found, everything = read.result()
        except LASTING as exc:  # the store's file replaced, a request row damaged: it stays so
            yield end_event(ctx, exc)
            return
        except StoreError as exc:
            # The database restarting, say: keep the stream (keep-alives go on); the page's
            # EventSource, reconnecting meanwhile, would get a 503 and give up for good.
            if not failing:
                log.warning("the queue's stream waits for the store: %s", exc)
            failing = True
        else:
            failing = False
        if found is not None and found[1] != last:
            total, last = found
            beat.sent()
            yield sse({"total": total, "version": last}, event="queue")
        elif time.monotonic() - beat.last_sent >= ctx.heartbeat:
            beat.sent()
            yield KEEP_ALIVE
        async with aclosing(beat.sign_in_check()) as checks:
            async for message in checks:
                yield message
        if beat.over:
            return
        if ctx.closing or await request.is_disconnected():
            return
        async with aclosing(beat.pause(ctx.poll_interval)) as waits:
            async for message in waits:
                yield message
        if beat.over:
            return


async def _queue_read(
    ctx: ServerContext, viewer: Principal, everything: tuple[int, str] | None
) -> tuple[tuple[int, str] | None, tuple[int, str] | None]:
    """One poll of the queue stream: the `viewer`'s queue version (None when it cannot have
    changed), and the whole queue's, which was `everything` at the last poll."""
    if ctx.sees_every_request(viewer):
        return await ctx.open_requests_version(), everything
    # The viewer's queue is a scan; it can only change when the whole queue did.
    now = await ctx.open_requests_version()
    if now == everything:
        return None, everything
    return await ctx.queue_version(viewer), now
