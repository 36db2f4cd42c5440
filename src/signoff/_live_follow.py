"""What `LiveSession.follow()` reads: the session's stream and those of the subagent sessions
its open mirrors stand for (theirs too, `MAX_HOPS` deep). Each stream's events are queued as
read and folded into their view only as `follow()` yields them, so no view reads ahead of what
its caller was given and the next `follow()` reads on from there, losing none. One folded but
stopped before its yield (a caller's timeout while its fold stops a subagent's stream) is kept
(`LiveSession._unsent`) for the next `follow()` to yield first.

A mirror's close (the session's `input.resolved`) is yielded after its subagent's request's,
which the server records first: if the subagent's stream has not brought that yet, its session
is read up to it (a read not followed, which ends at the store's last event) before the mirror
closes and its stream stops. One that read does not find (the subagent's session deleted, or a
close that did not come from it: the parent's TTL) is not waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ._events import Event
from ._exceptions import SessionExpired, UnknownSession
from ._mirrors import MAX_HOPS

if TYPE_CHECKING:
    from ._live_session import LiveSession

__all__ = ["MIRRORED", "Following"]

MIRRORED = ("approval.candidate", "input.resolved")
"""The subagents' events `follow()` yields: those that change what a mirror shows."""

_OPEN = ("pending", "responded")


@dataclass(eq=False, slots=True)
class _Stream:
    """One session followed: its view, the stream of the session whose mirror stands for it
    (None: the session followed), how many hops below it are followed, and its reading task."""

    live: LiveSession
    above: _Stream | None
    hops: int
    task: asyncio.Task[None] | None = None


class Following:
    """One `follow()`: its streams, read into one queue, and the last seq yielded of each
    session (a session read again, up to a subagent's close, is not yielded twice)."""

    def __init__(self, live: LiveSession) -> None:
        self.queue: asyncio.Queue[tuple[_Stream, Event | Exception | None]]
        self.queue = asyncio.Queue(maxsize=64)
        self.streams: dict[str, _Stream] = {}
        self.sent: dict[str, int] = {}
        self.top = _Stream(live, None, MAX_HOPS)

    async def events(self) -> AsyncGenerator[Event, None]:
        """Fold and yield the events as `LiveSession.follow()` says, until the caller stops:
        first those an earlier one folded but did not yield."""
        unsent = self.top.live._unsent
        while unsent:
            yield unsent.pop(0)
        self._start(self.top)
        try:
            await self._watch(self.top)
            while True:
                stream, item = await self.queue.get()
                if self.streams.get(stream.live.session_id) is not stream:
                    continue  # read before its mirror closed: followed no more
                if item is None or isinstance(item, Exception):
                    if stream is self.top:
                        if item is None:
                            return
                        raise item
                    if item is not None and not isinstance(item, (UnknownSession, SessionExpired)):
                        raise item
                    # Its stream ended (its session gone): the mirror closes by this session's
                    # events; the streams below it are read no more, as it is not.
                    await self._stop([s for s in self.streams.values() if s.above is stream])
                    continue
                async for event in self._deliver(stream, item):
                    yield event
        finally:
            await self._stop(list(self.streams.values()))

    def _start(self, stream: _Stream) -> None:
        live = stream.live
        source = live.client.events(live.session_id, live.seq, shown=live._last_folded())
        self.streams[live.session_id] = stream
        stream.task = asyncio.ensure_future(self._pump(stream, source))

    async def _pump(self, stream: _Stream, source: AsyncGenerator[Event, None]) -> None:
        # Closed in this task: left to the garbage collector, the stream's close would race
        # the event loop's shutdown (an `aclose(): ... already running` error at exit).
        try:
            async with contextlib.aclosing(source) as events:
                async for event in events:
                    await self.queue.put((stream, event))
        except Exception as exc:
            await self.queue.put((stream, exc))
        else:
            await self.queue.put((stream, None))

    async def _stop(self, streams: list[_Stream]) -> None:
        """Stop reading these streams and those below them."""
        for stream in streams:  # grows as it goes: the streams below each
            streams.extend(s for s in self.streams.values() if s.above is stream)
        tasks = []
        for stream in dict.fromkeys(streams):
            self.streams.pop(stream.live.session_id, None)
            if stream.task is not None:
                stream.task.cancel()
                tasks.append(stream.task)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _watch(self, stream: _Stream) -> None:
        """Follow the subagent sessions of the stream's session's open mirrors; stop those of
        closed ones."""
        live = stream.live
        wanted = live._mirrored() if stream.hops > 0 else []
        for child in wanted:
            if child not in self.streams:
                below = _Stream(live._child(child), stream, stream.hops - 1)
                self._start(below)
                # Its own open mirrors at once: a view read before (`sync()`) may hold them,
                # and its stream brings nothing new to start them while it waits on them.
                await self._watch(below)
        await self._stop(
            [
                s
                for s in self.streams.values()
                if s.above is stream and s.live.session_id not in wanted
            ]
        )

    async def _deliver(self, stream: _Stream, event: Event) -> AsyncGenerator[Event, None]:
        """Fold an event read from a stream and yield it if `follow()` does: the session's
        own, its subagents' that change a mirror. A mirror's close comes after its subagent's
        request's, read first if its stream has not brought it yet."""
        below = self._closing(stream, event)
        if below is not None:
            async for earlier in self._read_to_close(*below):
                yield earlier
        live = stream.live
        touched = live._folded(event)
        if touched is not None:
            live._refresh(touched)
            shown = stream
            while shown.above is not None:  # the mirrors of it, up to the session followed
                above = shown.above.live
                above._refresh(above._mirrors.get(shown.live.session_id, ()))
                shown = shown.above
        session_id = live.session_id
        sending = event.seq > self.sent.get(session_id, 0) and (
            stream is self.top or event.type in MIRRORED  # the subagent's turn is not ours
        )
        if sending:
            self.sent[session_id] = event.seq
        if touched is None or any(live._recorded[i].request.child is not None for i in touched):
            try:  # the open mirrors may have changed: one asked or closed
                await self._watch(stream)
            except BaseException:  # a caller's cancel while a stream stops: folded, not yielded
                if sending:
                    self.top.live._unsent.append(event)
                raise
        if sending:
            yield event

    def _closing(self, stream: _Stream, event: Event) -> tuple[_Stream, str] | None:
        """The stream of the subagent whose request the mirror `event` closes stands for, and
        that request's id, if the subagent's stream has not brought its close yet."""
        live = stream.live
        request_id = event.data.get("request_id")
        if event.type != "input.resolved" or event.seq <= live.seq:
            return None
        was = live._recorded.get(request_id) if isinstance(request_id, str) else None
        ref = None if was is None or was.status not in _OPEN else was.request.child
        below = None if ref is None else self.streams.get(ref.session_id)
        if ref is None or below is None or below.above is not stream:
            return None
        return None if _closed(below.live, ref.request_id) else (below, ref.request_id)

    async def _read_to_close(self, below: _Stream, request_id: str) -> AsyncGenerator[Event, None]:
        """Read the subagent's session on, to its request's close at most, and deliver what it
        brings: a read not followed, which ends where its store does, so none is waited for."""
        live = below.live
        source = live.client.events(
            live.session_id, live.seq, follow=False, shown=live._last_folded()
        )
        try:
            async with contextlib.aclosing(source) as events:
                async for event in events:
                    async for delivered in self._deliver(below, event):
                        yield delivered
                    if _closed(live, request_id):
                        return
        except (UnknownSession, SessionExpired):
            return  # gone: the mirror closes by its session's event alone


def _closed(live: LiveSession, request_id: str) -> bool:
    """Whether the view read the request's close."""
    recorded = live._recorded.get(request_id)
    return recorded is not None and recorded.status not in _OPEN
