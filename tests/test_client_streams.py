"""The clients' event streams: cut mid-event, refused by a restarting server's proxy, sent again,
gone silent or only quiet; nothing is lost or repeated."""

from __future__ import annotations

import asyncio
import inspect
import time
from pathlib import Path

import pytest

import signoff as so
from signoff.server import AsyncClient, Client

from ._client import EVENTS, Canned, canned, error, event, http, stream
from .test_server_common import served

__all__ = ["canned"]  # the fixture, used by name


async def test_a_stream_cut_mid_event_resumes_after_the_last_whole_one(canned: Canned) -> None:
    """A proxy closes the connection in the middle of event 2: the half of it is dropped, and
    the client asks again from event 1 (`Last-Event-ID: 1`), missing and repeating nothing."""
    whole = event(2)
    canned.on(EVENTS, stream(event(1) + whole[: len(whole) // 2]), stream(event(2) + event(3)))
    async with AsyncClient(canned.base) as c:
        seqs = []
        async for e in c.events("ses_x"):
            seqs.append(e.seq)
            if e.seq == 3:
                break
    assert seqs == [1, 2, 3]
    # It asks again for the last event it yielded (1), to check it is still the server's.
    assert [h.get("last-event-id") for _, h in canned.seen] == ["0", "0"]


async def test_a_reconnect_checks_the_last_event_it_yielded_is_still_the_servers(
    canned: Canned,
) -> None:
    """A stream cut while the server's store lost commits (a crash, a restored copy) and ran the
    session on: the reconnect asked for what came after the last event yielded, so the client
    went on with event 3, following an event 2 it never showed. It asks for event 2 again:
    the same one is not yielded twice; another one, or none (refused as past the session's
    last event), raises `EventsRewritten` before anything after it."""
    other = event(2).replace('"at": 1.0', '"at": 2.0')
    for again, yielded, raised in (
        (stream(other + event(3)), [1, 2], True),
        (error("422 Unprocessable Entity", "invalid_request"), [1, 2], True),
        (stream(event(2) + event(3)), [1, 2, 3], False),
    ):
        canned.seen.clear()
        canned.on(EVENTS, stream(event(1) + event(2)), again)
        seqs: list[int] = []
        rewritten: so.EventsRewritten | None = None
        async with AsyncClient(canned.base) as c:
            try:
                async for e in c.events("ses_x"):
                    seqs.append(e.seq)
                    if e.seq == 3:
                        break
            except so.EventsRewritten as exc:
                rewritten = exc
        assert seqs == yielded
        found = None if rewritten is None else (rewritten.session_id, rewritten.seq)
        assert found == (("ses_x", 2) if raised else None)
        assert [h.get("last-event-id") for _, h in canned.seen] == ["0", "1"]


async def test_a_stream_refused_by_a_restarting_servers_proxy_is_asked_again(
    canned: Canned,
) -> None:
    """While the server behind it restarts, a proxy answers 502/504 with its own page (or 429,
    its rate limit), or the server a 503 `store_unavailable`: the stream is asked for again,
    not given up."""
    canned.on(
        EVENTS,
        stream(event(1)),
        http("502 Bad Gateway", "<html>bad gateway</html>", "text/html"),
        http("504 Gateway Timeout", "<html>timeout</html>", "text/html"),
        error("503 Service Unavailable", "store_unavailable", extra="Retry-After: 0\r\n"),
        http("429 Too Many Requests", "slow down", "text/plain", extra="Retry-After: 0\r\n"),
        stream(event(2)),
    )
    async with AsyncClient(canned.base) as c:
        seqs = []
        async for e in c.events("ses_x"):
            seqs.append(e.seq)
            if e.seq == 2:
                break
    assert seqs == [1, 2]
    assert [h.get("last-event-id") for _, h in canned.seen] == ["0", "0", "0", "0", "0", "0"]


async def test_a_stream_refused_for_good_is_raised_after_the_retries(canned: Canned) -> None:
    canned.on(EVENTS, http("502 Bad Gateway", "<html>bad gateway</html>", "text/html"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.RemoteError) as caught:
            await asyncio.wait_for(anext(aiter(c.events("ses_x", retries=2))), 10)
    assert caught.value.status == 502
    assert len(canned.seen) == 3
    canned.on(EVENTS, error("409 Conflict", "session_busy", session_id="ses_x"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.SessionBusy):  # not a gateway's error: raised at once
            await anext(aiter(c.events("ses_x")))
    assert len(canned.seen) == 4


def test_the_blocking_events_take_what_the_async_ones_take_but_follow() -> None:
    asynchronous = inspect.signature(AsyncClient.events).parameters
    blocking = inspect.signature(Client.events).parameters
    assert list(blocking) == [p for p in asynchronous if p != "follow"]
    for name, param in blocking.items():
        assert (param.kind, param.default) == (asynchronous[name].kind, asynchronous[name].default)


async def test_the_blocking_events_give_up_after_their_retries(canned: Canned) -> None:
    canned.on(EVENTS, http("502 Bad Gateway", "<html>bad gateway</html>", "text/html"))
    with Client(canned.base) as c:
        with pytest.raises(so.RemoteError) as caught:
            await asyncio.to_thread(c.events, "ses_x", retries=1)
    assert caught.value.status == 502
    assert len(canned.seen) == 2


async def test_a_close_from_another_thread_ends_a_streams_pause_at_once(canned: Canned) -> None:
    """A stream pausing on a 429's `Retry-After: 20` before its next try slept on through
    `Client.close()` from another thread, which waits for cut-short calls to end (so a keyed
    call keeps its key) and so took its full 5 s; the pause now ends as the client closes."""
    slow_down = http("429 Too Many Requests", "{}", extra="Retry-After: 20\r\n")
    canned.on(EVENTS, slow_down)
    c = Client(canned.base)
    reading = asyncio.create_task(asyncio.to_thread(c.events, "ses_x", retries=5))
    while not canned.seen:
        await asyncio.sleep(0.01)
    began = time.monotonic()
    await asyncio.to_thread(c.close)
    closing = time.monotonic() - began
    with pytest.raises(so.UsageError, match="closed"):
        await asyncio.wait_for(reading, 10)
    assert closing < 4  # well under the 5 s it waited for the pause to end of itself
    assert len(canned.seen) == 1


async def test_events_sent_again_are_not_yielded_again(canned: Canned) -> None:
    """A server (or cache) that ignores `Last-Event-ID` and sends the log from the start again."""
    canned.on(EVENTS, stream(event(1) + event(2)), stream(event(1) + event(2) + event(3)))
    async with AsyncClient(canned.base) as c:
        seqs = []
        async for e in c.events("ses_x"):
            seqs.append(e.seq)
            if e.seq == 3:
                break
    assert seqs == [1, 2, 3]


async def test_a_stream_gone_silent_is_reconnected_after_the_timeout(canned: Canned) -> None:
    """A server that vanished without closing the connection (its host lost, a NAT's entry
    dropped) sends not even keep-alives: after `timeout` seconds the client reconnects instead
    of waiting for ever."""

    async def silent(writer: asyncio.StreamWriter) -> None:
        writer.write(stream(event(1)))
        await writer.drain()
        await canned.done.wait()

    canned.on(EVENTS, silent, stream(event(2)))
    async with AsyncClient(canned.base, timeout=0.5) as c:
        seqs = []

        async def follow() -> None:
            async for e in c.events("ses_x"):
                seqs.append(e.seq)
                if e.seq == 2:
                    return

        await asyncio.wait_for(follow(), 10)
    assert seqs == [1, 2]


@pytest.mark.parametrize("sent", [": keep-alive\n\n", "retry: 500\n\n"])
async def test_a_quiet_stream_does_not_give_up(canned: Canned, sent: str) -> None:
    """A stream quiet for longer than `timeout` (the client's timeout shorter than the server's
    heartbeat, or a proxy cutting idle streams after a keep-alive) is asked for again as often as
    it takes: only failing to reach the server counts against `retries`. (A stream that sends
    not even the `retry:` line a signoff server opens with does: test_client_stream_limits.)"""

    async def quiet(writer: asyncio.StreamWriter) -> None:
        writer.write(stream(sent))
        await writer.drain()
        await asyncio.sleep(0.4)  # longer than the client's timeout: it reconnects

    canned.on(EVENTS, quiet, quiet, quiet, stream(event(1)))
    async with AsyncClient(canned.base, timeout=0.2) as c:
        first = await asyncio.wait_for(anext(aiter(c.events("ses_x", retries=1))), 10)
    assert first.seq == 1


async def test_a_proxy_cutting_a_real_stream_mid_event_loses_and_repeats_nothing(
    tmp_path: Path,
) -> None:
    """A TCP proxy in front of a real server cuts each of the first streams after a few hundred
    bytes, mid-event: the client resumes each time from the last whole event, and reads the
    session's log exactly once, in order."""
    cuts = [700, 1500, 2600]  # bytes of response each cut stream gets through

    async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, budget: int) -> None:
        sent = 0
        while chunk := await src.read(64):
            if budget and sent + len(chunk) >= budget:
                dst.write(chunk[: budget - sent])
                await dst.drain()
                dst.transport.abort()  # the proxy drops the connection mid-event
                return
            sent += len(chunk)
            dst.write(chunk)
            await dst.drain()
        dst.close()

    with served(f"sqlite:///{tmp_path}/state.db") as upstream:
        host, port = upstream.removeprefix("http://").split(":")

        async def proxy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            up_reader, up_writer = await asyncio.open_connection(host, int(port))
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                budget = cuts.pop(0) if b"/events" in head.split(b"\r\n")[0] and cuts else 0
                up_writer.write(head)
                forth = asyncio.create_task(pipe(reader, up_writer, 0))
                try:
                    await pipe(up_reader, writer, budget)
                finally:
                    forth.cancel()
                    await asyncio.gather(forth, return_exceptions=True)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                up_writer.close()
                writer.close()

        server = await asyncio.start_server(proxy, "127.0.0.1", 0)
        base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        try:
            async with AsyncClient(upstream, token="alice-token") as direct:
                r = await direct.generate("batch", "refund both")
                for req in r.pending:
                    await direct.respond(
                        r.session_id, [{"request_id": req.id, "option_id": "approve"}]
                    )
                log = [e async for e in direct.events(r.session_id, follow=False)]
            async with AsyncClient(base, token="alice-token") as c:
                got = []
                async for e in c.events(r.session_id):
                    got.append(e)
                    if e.seq == log[-1].seq:
                        break
        finally:
            server.close()
    assert cuts == []  # every cut happened
    assert [(e.seq, e.type, e.data) for e in got] == [(e.seq, e.type, e.data) for e in log]


async def test_a_stream_refused_by_a_failed_store_is_raised_at_once(canned: Canned) -> None:
    """Only a store busy or down for a while (`store_busy`, `store_unavailable`) is worth asking
    again: a 503 the store's own failure sent (`store_error`, `schema_version`) is raised as its
    class at once, after one request."""
    for code, cls in (("store_error", so.StoreError), ("schema_version", so.SchemaVersionError)):
        canned.seen.clear()
        canned.on(EVENTS, error("503 Service Unavailable", code, extra="Retry-After: 0\r\n"))
        async with AsyncClient(canned.base) as c:
            with pytest.raises(cls):
                await asyncio.wait_for(anext(aiter(c.events("ses_x", retries=3))), 10)
        assert len(canned.seen) == 1, code


async def test_a_keep_alive_between_refusals_says_the_server_is_back(canned: Canned) -> None:
    """`retries` counts failures in a row: a stream that answered, even with only a keep-alive
    before it closed, ends the run of refusals before it, so refusals around it do not add up
    to giving up."""
    bad = http("502 Bad Gateway", "<html>bad gateway</html>", "text/html")
    canned.on(EVENTS, bad, bad, stream(": keep-alive\n\n"), bad, bad, stream(event(1)))
    async with AsyncClient(canned.base) as c:
        got = await asyncio.wait_for(anext(aiter(c.events("ses_x", retries=2))), 20)
    assert got.seq == 1 and len(canned.seen) == 6


async def test_a_reconnect_refused_while_the_servers_slots_are_full_is_asked_again(
    canned: Canned,
) -> None:
    """A follower whose connection died silently (a network cut, a proxy dropping it) reconnects
    while the server still counts the dead stream against the caller's `max_streams`: its 429
    `too_many_streams` was raised, and the follower stopped following. On a reconnect it is
    asked for again after its `Retry-After`, counting toward `retries`; a first connection
    refused so is still raised at once (the caller holds too many streams)."""
    full = error("429 Too Many Requests", "too_many_streams", extra="Retry-After: 1\r\n")
    canned.on(EVENTS, stream(event(1)), full, full, stream(event(2)))
    async with AsyncClient(canned.base) as c:
        seqs = []
        began = asyncio.get_running_loop().time()
        async for e in c.events("ses_x", retries=2):
            seqs.append(e.seq)
            if e.seq == 2:
                break
        waited = asyncio.get_running_loop().time() - began
    assert seqs == [1, 2]
    assert [h.get("last-event-id") for _, h in canned.seen] == ["0", "0", "0", "0"]
    assert waited >= 2.0  # the server's Retry-After, each time, not the 0.2 s backoff
    for reconnected in (False, True):  # one refusal past the retries is raised
        canned.seen.clear()
        canned.on(EVENTS, *([stream(event(1))] if reconnected else []), full)
        async with AsyncClient(canned.base) as c:
            with pytest.raises(so.RemoteError) as caught:
                async for _ in c.events("ses_x", retries=1):
                    pass
        assert (caught.value.code, caught.value.status) == ("too_many_streams", 429)
        assert len(canned.seen) == (3 if reconnected else 1)
