"""The clients' event streams against servers that answer 200 and then say nothing: a stream
that hangs with nothing sent, or closes at once each time, is given up after `retries`, with a
named error, instead of being asked for again for ever."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

import signoff as so
from signoff.server import AsyncClient, Client

from ._client import EVENTS, Canned, canned, event, stream

__all__ = ["canned"]  # the fixture, used by name


def hanging(canned: Canned, sent: str = "") -> Callable[[asyncio.StreamWriter], Awaitable[None]]:
    """A reply that sends the stream's headers (and `sent`), then nothing until the test ends."""

    async def reply(writer: asyncio.StreamWriter) -> None:
        writer.write(stream(sent))
        await writer.drain()
        await canned.done.wait()

    return reply


@pytest.mark.parametrize("sent", ["", "retry: 500\n\n", event(1)])
async def test_a_read_that_never_ends_is_given_up_after_the_retries(
    canned: Canned, sent: str
) -> None:
    """Without following, the stream must end once it has caught up: one left hanging (after
    its headers, the server's `retry:` line or an event) is a failure each time, and the read
    raises `timeout` after `retries`, as a call that got no answer does."""
    canned.on(EVENTS, hanging(canned, sent))
    async with AsyncClient(canned.base, timeout=0.2) as c:

        async def read() -> list[int]:
            return [e.seq async for e in c.events("ses_x", follow=False, retries=2)]

        with pytest.raises(so.RemoteError) as caught:
            await asyncio.wait_for(read(), 10)
    assert (caught.value.code, caught.value.status) == ("timeout", 0)
    assert len(canned.seen) == 3


async def test_the_blocking_events_give_up_on_a_read_that_never_ends(canned: Canned) -> None:
    canned.on(EVENTS, hanging(canned))
    with Client(canned.base, timeout=0.2) as c:
        with pytest.raises(so.RemoteError) as caught:
            await asyncio.wait_for(asyncio.to_thread(c.events, "ses_x", retries=1), 10)
    assert caught.value.code == "timeout"
    assert len(canned.seen) == 2


async def test_a_followed_stream_that_hangs_with_nothing_sent_is_given_up(canned: Canned) -> None:
    """A signoff server sends its `retry:` line as soon as a stream opens: one that sends its
    headers and then nothing (a proxy holding the body back, a wedged server) counts as a
    failure each time it goes silent for `timeout`, not as a quiet stream."""
    canned.on(EVENTS, hanging(canned))
    async with AsyncClient(canned.base, timeout=0.2) as c:
        with pytest.raises(so.RemoteError) as caught:
            await asyncio.wait_for(anext(aiter(c.events("ses_x", retries=2))), 10)
    assert caught.value.code == "timeout"
    assert len(canned.seen) == 3


async def test_a_followed_stream_closed_at_once_each_time_is_given_up(canned: Canned) -> None:
    """A 200 event stream that ends before sending anything, each time it is asked for, is a
    failure each time: after `retries` the follower raises (`http_error`, status 200) instead
    of asking ten times a second for ever."""
    canned.on(EVENTS, stream(""))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.RemoteError) as caught:
            await asyncio.wait_for(anext(aiter(c.events("ses_x", retries=2))), 10)
    assert (caught.value.code, caught.value.status) == ("http_error", 200)
    assert "sent nothing" in str(caught.value)
    assert len(canned.seen) == 3


async def test_a_stream_closed_at_once_between_events_does_not_add_up(canned: Canned) -> None:
    """Only failures in a row count: empty streams around ones that send events do not."""
    empty = stream("")
    canned.on(EVENTS, empty, empty, stream(event(1)), empty, empty, stream(event(2)))
    async with AsyncClient(canned.base) as c:
        seqs = []
        async for e in c.events("ses_x", retries=2):
            seqs.append(e.seq)
            if e.seq == 2:
                break
    assert seqs == [1, 2] and len(canned.seen) == 6


async def test_a_stream_whose_opening_trickles_is_given_up_after_the_retries(
    canned: Canned,
) -> None:
    """A server (or proxy) sending a stream's headers a byte at a time, each well within
    `timeout`, held the follower for as long as it went on: the opening of a stream (its
    headers, a refusal's body) gets twice `timeout`, as a call does, and each one too slow is
    a failure."""

    async def trickled(writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nX-Slow: ")
        while not canned.done.is_set():
            writer.write(b"a")
            await writer.drain()
            await asyncio.sleep(0.05)

    canned.on(EVENTS, trickled)
    async with AsyncClient(canned.base, timeout=0.5) as c:
        with pytest.raises(so.RemoteError) as caught:
            await asyncio.wait_for(anext(aiter(c.events("ses_x", retries=1))), 10)
    assert (caught.value.code, caught.value.status) == ("timeout", 0)
    assert len(canned.seen) == 2


async def test_streams_closed_after_a_keep_alive_are_asked_for_less_and_less_often(
    canned: Canned, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A followed stream that answers (a keep-alive: not a failure) and ends at once, each time,
    was asked for again every 0.1 s for as long as it went on: the pause before each reconnect
    now grows (doubling up to 2 s) while no event comes, and starts again after one."""
    from signoff import _wire

    asked: list[int] = []

    def backoff(failures: int, response: object = None) -> float:
        asked.append(failures)
        return 0.0

    monkeypatch.setattr(_wire, "backoff", backoff)
    alive = stream(": keep-alive\n\n")
    canned.on(EVENTS, alive, alive, alive, alive, stream(event(1)), alive, alive, stream(event(2)))
    async with AsyncClient(canned.base) as c:
        seqs = []
        async for e in c.events("ses_x", retries=0):
            seqs.append(e.seq)
            if e.seq == 2:
                break
    assert seqs == [1, 2]
    assert asked == [1, 2, 3, 4, 1, 2]


async def test_a_stream_followed_past_its_clients_close_says_the_client_is_closed(
    canned: Canned,
) -> None:
    """A stream left open when its client closes ends at its next reconnect with the client's
    `UsageError`, not httpx's bare `RuntimeError` (a closed client cannot send)."""
    canned.on(EVENTS, stream(event(1)), stream(event(2)))
    async with AsyncClient(canned.base) as c:
        events = c.events("ses_x")
        assert (await anext(events)).seq == 1
    with pytest.raises(so.UsageError, match="closed"):
        await asyncio.wait_for(anext(events), 10)
    await events.aclose()
