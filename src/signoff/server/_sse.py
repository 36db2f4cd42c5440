"""Server-Sent Events framing, and the stream of one session's events read from the store."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator
from contextlib import aclosing
from dataclasses import replace
from typing import Any

from starlette.requests import Request

from .. import stores
from .._events import Event
from .._exceptions import (
    EventsRewritten,
    SchemaVersionError,
    SessionError,
    SessionExpired,
    SignoffError,
    StoreDamaged,
    StoreError,
    StoreGone,
    UnknownSession,
)
from ._context import ServerContext
from ._errors import public_message, status_for
from ._json_pieces import PIECE, json_pieces
from ._stream_slots import HeldStream
from ._waits import drop

__all__ = [
    "KEEP_ALIVE",
    "LASTING",
    "READ_BYTES",
    "SIGNED_OUT_END",
    "STREAM_HEADERS",
    "Beat",
    "end_event",
    "event_stream",
    "frame_pieces",
    "parse_last_event_id",
    "session_end",
    "sse",
    "stream_response",
]

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


KEEP_ALIVE = ": keep-alive\n\n"
"""A comment, which clients ignore: sent after `heartbeat` quiet seconds so that proxies (and
the client's own read timeout) do not take a quiet stream for a dead one."""


READ_BYTES = 64 << 10
"""How much event JSON one read of a stream holds (at least one event, however large): what
the stream keeps in hand while its client reads (or has stopped reading) what it sends."""


def frame_pieces(event: Event, most: int = PIECE) -> Iterator[str]:
    """The event's SSE message (`sse(event.to_dict(), event=..., id=...)`: its JSON on one
    `data:` line) in pieces of at most `most` characters, written one after the other: a
    large event is never held whole as text, only the event itself."""
    head = f"id: {event.seq}\nevent: {event.type}\ndata: "
    pieces = json_pieces(event.to_dict(), most)
    first = next(pieces)
    if len(head) + len(first) <= most:  # a small event: one piece, as `sse` writes it
        first = head + first
    else:
        yield head
    for piece in pieces:
        yield first
        first = piece
    if len(first) + 2 <= most:
        yield first + "\n\n"
    else:
        yield first
        yield "\n\n"


def _mark(event: Event) -> Event:
    """What a stream keeps of the last event it sent, for its reads to check (`shown`): its
    seq, type, time and turn, not its data (megabytes, maybe)."""
    return replace(event, data={})


def stream_response(stream: AsyncIterator[str], release: Callable[[], None]) -> HeldStream:
    """An event stream as a response, with the headers that keep proxies from holding it; it
    calls `release` (giving its caller's stream slot back) when it ends."""
    return HeldStream(stream, release, media_type="text/event-stream", headers=STREAM_HEADERS)


def parse_last_event_id(raw: str) -> int | None:
    """The seq a `Last-Event-ID` names: plain ASCII digits, or None when it is not one (`int()`
    would also read `1_0` as 10 and `+2` as 2, ids this server never sends)."""
    text = raw.strip()
    if not text or not text.isascii() or not text.isdigit() or len(text) > 20:
        return None
    return int(text)


LASTING = (StoreGone, SchemaVersionError, StoreDamaged)
"""Store failures that waiting does not mend (the file deleted or replaced, data of a newer
signoff, a row that does not decode): a stream ends on them with `end_event`, followed or not,
instead of waiting them out or being cut off."""


def end_event(ctx: ServerContext, exc: SignoffError) -> str:
    """The final `stream.end` event: why the stream ended, as the error body a reconnect would
    get (`status`, `error`). It carries no id, so a reconnect resumes after the last event.
    The failure is noted (`ServerContext.met`), as the API's error handler notes a request's."""
    ctx.met(exc)
    body: dict[str, Any] = {"code": exc.code, "message": public_message(exc)}
    if isinstance(exc, SessionError | EventsRewritten):
        body["session_id"] = exc.session_id
    if isinstance(exc, EventsRewritten):
        body["seq"] = exc.seq
    if isinstance(exc, SessionExpired):
        body["request_ids"] = exc.pending
    return sse({"status": status_for(exc), "error": body}, event="stream.end")


SIGNED_OUT_END = sse(
    {
        "status": 401,
        "error": {
            "code": "unauthenticated",
            "message": "the sign-in ended (signed out, or expired): sign in again",
        },
    },
    event="stream.end",
)
"""The end of a stream whose sign-in cookie has expired or been signed out since it opened."""


async def session_end(
    ctx: ServerContext, session_id: str, after: int = 0
) -> tuple[SignoffError | None, float]:
    """Why the session's stream must end (it expired, is gone from the store, or the store
    lost the event `after` the stream sent last), or None and the time of the runtime's clock at
    which it expires (inf if never)."""
    try:
        state = await ctx.runtime._state(session_id)
    except UnknownSession as exc:
        return exc, 0.0
    if state.seq < after:  # lost, and not written anew yet: the stream's read found no event
        return EventsRewritten(session_id, after), 0.0
    if state.seq > after:  # written since the stream's read (another process's expiry, say):
        return None, 0.0  # sent first; its end, if any, is told after them
    now = ctx.runtime.now()
    ended = await ctx.runtime._ended(state, now)
    if ended is not None:
        return ended, 0.0
    if state.expired(now):  # a drive runs on past it: read again later
        return None, math.inf
    expires = state.expires_at
    return None, math.inf if expires is None else expires


async def event_stream(
    request: Request,
    ctx: ServerContext,
    session_id: str,
    after: int,
    *,
    follow: bool,
    head: int | None = None,
) -> AsyncIterator[str]:
    """Everything after `after`, then (when following) new events as the store gains them,
    until the client goes, the server stops (`ctx.closing`; a read that is not followed is
    still sent to its end), the session can have no more (it expired, was deleted, or its
    store is gone for good), or the sign-in cookie that opened it ended (checked every
    `heartbeat`): then a final `stream.end`. A read that is not followed, given the session's
    `head` as the request read it, ends there (a snapshot: no read to find the log's end).
    Each read checks that the last event sent is still the store's (`EventsRewritten`: the
    store lost commits and may have run the session on from before it), or the stream ends.

    It waits on the store's change signal (PostgreSQL's LISTEN/NOTIFY; SQLite's is polled, so
    there it reads every `poll_interval`) rather than an in-process one, so any server process
    can serve any session, whoever writes to it. A following stream outlives a store failing
    for a while (the database restarting): a client reconnecting then would get a 503, which
    ends an EventSource.
    """
    poll_interval, heartbeat = ctx.poll_interval, ctx.heartbeat
    yield f"retry: {int(max(poll_interval, 0.5) * 1000)}\n\n"
    beat = Beat(request, ctx, follow=follow)
    failing = False
    expires_at = 0.0  # by the runtime's clock; 0 until the session's state is read
    check_at = 0.0  # monotonic: when to read the state again (was the session deleted?)
    quiet = False  # the store's wait found the head not past `after`: no events to read
    shown: Event | None = None  # the last event sent, which each read checks is still there
    while True:
        if not follow and head is not None and after >= head:
            return
        ended: SignoffError | None = None
        batch: list[Event] = []
        read = asyncio.ensure_future(
            _read(ctx, session_id, after, follow, expires_at, check_at, quiet=quiet, shown=shown)
        )
        quiet = False
        async with aclosing(beat.awaiting(read)) as waits:
            async for message in waits:
                yield message
        if beat.over:
            return
        try:
            batch, ended, expires_at, check_at = read.result()
        except (EventsRewritten, UnknownSession) as exc:  # rewritten, or deleted, under it
            ended = exc
        except LASTING as exc:  # told, not cut off: a client reads a cut stream again
            ended = exc
        except StoreError as exc:
            if not follow:
                raise
            if not failing:
                log.warning("session %s's event stream waits for the store: %s", session_id, exc)
            failing = True
        else:
            failing = False
        if ended is not None:
            yield end_event(ctx, ended)
            return
        if not follow and head is not None:  # a snapshot: none written after the read began
            batch = [e for e in batch if e.seq <= head]
        sent = bool(batch)
        batch.reverse()
        while batch:  # each event let go once written: only the one being written is held
            event = batch.pop()
            for piece in frame_pieces(event):
                yield piece
            after, shown = event.seq, _mark(event)
            del event
        if sent:
            expires_at = 0.0  # the session's expiry moved with its new events: read it again
            beat.sent()
            # A read that is not followed is bounded, and its client takes its end for the
            # log's: it is sent whole, where a followed one resumes after the server stops.
            if ctx.closing and follow:
                return
            continue  # more may wait (a read bounded by bytes stops short): no pause
        if not follow:
            return
        async with aclosing(beat.sign_in_check()) as checks:
            async for message in checks:
                yield message
        if beat.over:
            return
        now = time.monotonic()
        if now - beat.last_sent >= heartbeat:
            yield KEEP_ALIVE
            beat.last_sent = now
        if ctx.closing or await request.is_disconnected():
            return
        wait = _change_wait(ctx, session_id, after, expires_at, min(check_at, beat.signed_at))
        if wait is not None:
            async with aclosing(beat.awaiting(wait, client=True)) as waits:
                async for message in waits:
                    yield message
            if beat.over:
                return
            if wait.exception() is None:
                quiet = not wait.result()
                if not quiet:
                    # A wake whose read finds no event looks at the session (the head may be
                    # behind `after`: then the wait would return at once, over and over).
                    check_at = 0.0
                continue
            check_at = 0.0  # deleted, or the store failing: the read tells which
        async with aclosing(beat.pause(poll_interval)) as waits:
            async for message in waits:
                yield message
        if beat.over:
            return


def _change_wait(
    ctx: ServerContext, session_id: str, after: int, expires_at: float, recheck_at: float
) -> asyncio.Future[bool] | None:
    """A wait for the session's head to pass `after`, on a store that announces its changes
    (PostgreSQL's LISTEN/NOTIFY, whose shared re-check of the heads is its safety net): until
    the session's expiry, or `recheck_at` (by `time.monotonic`: its sign-in and whether it is
    still stored are read again), is due. None where the store only polls: there a read every
    `poll_interval` costs less than its wait's own polls."""
    store = ctx.runtime.store
    wait = getattr(store, "wait_for_change", None)
    if wait is None or not hasattr(store, "changes_seen"):
        return None
    due = recheck_at - time.monotonic()
    if ctx.runtime.clock is time.time:
        due = min(due, expires_at - ctx.runtime.now())
    else:  # a clock of its own may jump: look at it as often as before
        due = min(due, ctx.poll_interval)
    # A `poll_interval` past the due time (a `heartbeat` at most: the sign-in is read again
    # each one, however long `poll_interval` is): a wait that ends a moment short of it would
    # have the stream read, find nothing due, and wait again.
    slack = min(ctx.poll_interval, ctx.heartbeat)
    waiting: Awaitable[bool] = wait(session_id, max(due, 0.0) + slack, after=after)
    return asyncio.ensure_future(waiting)


async def _read(
    ctx: ServerContext,
    session_id: str,
    after: int,
    follow: bool,
    expires_at: float,
    check_at: float,
    *,
    quiet: bool = False,
    shown: Event | None = None,
) -> tuple[list[Event], SignoffError | None, float, float]:
    """One poll of a stream: the events after `after` (none read if `quiet`: the store's wait
    found its head not past it; `shown`, the last event sent, checked), and (when following and
    none came, and it is time) why the session can have no more; `expires_at` and `check_at` as
    they are now."""
    batch: list[Event] = []
    if not quiet:
        batch = await ctx.runtime.store.read_events(
            session_id,
            after=after,
            limit=500,
            max_bytes=min(READ_BYTES, stores.READ_BYTES),
            shown=shown,
        )
    ended: SignoffError | None = None
    if follow and not batch and (ctx.runtime.now() >= expires_at or time.monotonic() >= check_at):
        ended, expires_at = await session_end(ctx, session_id, after)
        check_at = time.monotonic() + ctx.heartbeat
    return batch, ended, expires_at, check_at


class Beat:
    """A stream's pulse across its store calls: when it last sent a message (a keep-alive is
    due after `heartbeat` quiet seconds), when the sign-in that opened it is read again, and
    whether it must end (`over`)."""

    def __init__(self, request: Request, ctx: ServerContext, *, follow: bool) -> None:
        self.request = request
        self.ctx = ctx
        self.follow = follow
        self.last_sent = time.monotonic()
        self.signed_at = self.last_sent + ctx.heartbeat  # when to check the sign-in again
        self.over = False

    def sent(self) -> None:
        """Note that the stream has just sent a message."""
        self.last_sent = time.monotonic()

    async def awaiting(
        self, task: asyncio.Future[Any], *, client: bool = False
    ) -> AsyncGenerator[str, None]:
        """A keep-alive each `heartbeat` quiet seconds until `task`, a store call, is done. A
        store that does not answer (a frozen database host) holds a call for its timeout, 30 s:
        the stream ends before then, dropping the call and setting `over`, if the server begins
        to stop and the stream is followed, or (with `client`) the client goes, which is looked
        at every `poll_interval`."""
        ctx = self.ctx
        try:
            await asyncio.sleep(0)  # a call that need not wait (SQLite's) is done at its first step
            while not task.done() and not await _settled(
                task, min(self.last_sent + ctx.heartbeat, _soon(ctx.poll_interval))
            ):
                if self.follow and ctx.closing:
                    break
                if client and await self.request.is_disconnected():
                    break
                if time.monotonic() - self.last_sent >= ctx.heartbeat:
                    yield KEEP_ALIVE
                    self.sent()
        finally:
            drop(task)  # done already, unless the stream ended first
        self.over = not task.done()

    async def pause(self, seconds: float) -> AsyncGenerator[str, None]:
        """`seconds` between a polling stream's reads, with the keep-alives and sign-in checks
        due meanwhile: a `poll_interval` longer than `heartbeat` slept at once held them back.
        `over` is set when the stream must end (as `awaiting` and `sign_in_check` set it)."""
        until = _soon(seconds)
        while not self.over and time.monotonic() < until:
            nap = asyncio.ensure_future(
                asyncio.sleep(min(until, self.signed_at) - time.monotonic())
            )
            async with aclosing(self.awaiting(nap, client=True)) as waits:
                async for message in waits:
                    yield message
            if not self.over:
                async with aclosing(self.sign_in_check()) as checks:
                    async for message in checks:
                        yield message

    async def sign_in_check(self) -> AsyncGenerator[str, None]:
        """Once a `heartbeat`, whether the sign-in cookie that opened the stream has ended
        (signed out, or expired): keep-alives while that is read, then `SIGNED_OUT_END` if it
        has, and `over` set when the stream must end."""
        if time.monotonic() < self.signed_at:
            return
        self.signed_at = time.monotonic() + self.ctx.heartbeat
        check = asyncio.ensure_future(self.ctx.sign_in_ended(self.request))  # reads the store too
        async with aclosing(self.awaiting(check)) as waits:
            async for message in waits:
                yield message
        if not self.over and check.result():
            self.over = True
            yield SIGNED_OUT_END


def _soon(seconds: float) -> float:
    return time.monotonic() + seconds


async def _settled(task: asyncio.Future[Any], until: float) -> bool:
    """Whether `task` is done, waiting for it until the monotonic time `until` at most."""
    await asyncio.wait((task,), timeout=max(0.0, until - time.monotonic()))
    return task.done()
