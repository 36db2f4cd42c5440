"""The HTTP event stream read by `AsyncClient.events`: reconnects with `Last-Event-ID`, backs
off while the server is refused or silent, and refuses to skip events a store wrote anew."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import TYPE_CHECKING

import httpx

from . import _exceptions as errors
from . import _wire as wire
from ._events import Event
from .models._reply_cap import ReplyTooLarge

if TYPE_CHECKING:
    from ._async_client import AsyncClient

__all__ = ["remote_events", "too_large"]


def too_large(exc: ReplyTooLarge) -> errors.RemoteError:
    """A reply cut off at `max_reply_bytes`, as the `RemoteError` the caller gets: the server
    answered, but more than the client reads (it may have applied the call)."""
    return errors.RemoteError(str(exc), "reply_too_large", exc.reply_status)


async def remote_events(
    client: AsyncClient,
    path: str,
    session_id: str,
    after: int,
    follow: bool,
    retries: int,
    shown: Event | None,
) -> AsyncGenerator[Event, None]:
    """`AsyncClient.events` once its arguments are checked: the stream at `path`, read on after
    each cut-off, up to `retries` failures in a row."""
    last = after  # and `shown`, the last event yielded, is asked for again on a reconnect
    failures = 0
    reopened = False  # a connection before this one was heard: this one is a reconnect
    heard = _Heard()
    quiet = 0  # followed streams in a row that ended without an event
    while True:
        client._check_open()  # closed since the last connection: httpx's bare RuntimeError
        since = last if shown is None else shown.seq - 1
        params = {"after": since, "follow": "true" if follow else "false"}
        if shown is not None:  # refused if gone, where the stream would be merely empty
            params["shown"] = shown.seq
        headers = {"Last-Event-ID": str(since), "Accept": "text/event-stream"}
        pause = 0.0
        streaming = False
        reopened = reopened or heard.any
        heard = _Heard()
        last_seen = last
        try:
            # Its opening (headers, a refusal's body) gets what a whole call gets; then
            # `timeout` bounds each read, so a stream gone silent (its server vanished
            # without closing it) is asked for again, not waited on for ever.
            async with (
                asyncio.timeout(2 * client._timeout) as opening,
                client.http.stream(
                    "GET", path, params=params, headers=headers, timeout=client.http.timeout
                ) as response,
            ):
                if not response.is_success:
                    await response.aread()
                    if shown is not None and wire.past_head(response):
                        raise errors.EventsRewritten(session_id, shown.seq)
                    # A reconnect's 429 `too_many_streams`: the server still counts the
                    # connection it replaces (one cut without a close it has seen yet).
                    passing = wire.transient(response) or (reopened and wire.slots_full(response))
                    if failures >= retries or not passing:
                        wire.raise_for(response)
                    failures += 1
                    pause = wire.backoff(failures, response)
                elif not response.headers.get("content-type", "").startswith("text/event-stream"):
                    await response.aread()
                    raise wire.not_signoff(response, "an event-stream")
                else:
                    opening.reschedule(None)
                    streaming = True
                    lines = heard.lines(response.aiter_lines())
                    async for kind, data in wire.sse_data(lines, client._max_reply):
                        if kind == ":":  # a keep-alive: the server is alive
                            failures = 0
                            continue
                        event = wire.streamed(kind, data)
                        if event.session_id != session_id:
                            raise errors.RemoteError(
                                f"{client._url(path)}: the event stream of session "
                                f"{session_id!r} sent an event of session "
                                f"{event.session_id[:100]!r}",
                                "http_error",
                                response.status_code,
                            )
                        if event.seq <= last:
                            if shown is not None and event.seq == shown.seq and event != shown:
                                raise errors.EventsRewritten(session_id, shown.seq)
                            continue  # asked for again, or sent by a server that ignored it
                        last, shown = event.seq, event
                        failures = 0
                        yield event
                    if not heard.any:  # closed at once: not a signoff server's stream
                        failures += 1
                        if failures > retries:
                            raise errors.RemoteError(
                                f"{client._url(path)}: the event stream ended {failures} "
                                "times in a row having sent nothing",
                                "http_error",
                                response.status_code,
                            )
                        pause = wire.backoff(failures)
            if pause:
                await client._pause(pause)
                continue
            if not follow:
                return
            # The server closed a followed stream: reconnect, soon if it sent events,
            # else less and less often (up to every 2 s), not ten times a second for ever.
            quiet = 0 if last_seen < last else quiet + 1
            await client._pause(wire.backoff(quiet) if quiet else 0.1)
        except ReplyTooLarge as exc:  # the next try would be as large
            raise too_large(exc) from None
        except TimeoutError:  # the opening trickled past twice the timeout
            failures += 1
            if failures > retries:
                raise client._too_slow(path) from None
            await client._pause(wire.backoff(failures))
        except httpx.TransportError as exc:
            if streaming and follow and heard.any and isinstance(exc, httpx.ReadTimeout):
                continue  # quiet, or dead: a reconnect tells; a dead server fails it
            failures += 1
            if failures > retries:
                raise wire.transport_error(exc, client._url(path)) from exc
            await client._pause(wire.backoff(failures))


class _Heard:
    """Whether a stream sent any line at all, which a signoff server's does as it opens."""

    def __init__(self) -> None:
        self.any = False

    async def lines(self, lines: AsyncIterator[str]) -> AsyncIterator[str]:
        async for line in lines:
            self.any = True
            yield line
