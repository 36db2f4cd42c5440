"""The clients' connections: lost before the answer, timed out, a server not there, a server
stopping mid-turn, out of connections, a second event loop, odd tokens."""

from __future__ import annotations

import asyncio
import gc
import warnings
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import AsyncClient, Client

from ._client import CANCEL, EVENTS, Canned, canned, http, stream
from .test_server_common import served

__all__ = ["canned"]  # the fixture, used by name


async def test_a_connection_lost_before_the_answer_is_a_named_error(canned: Canned) -> None:
    """The server dies while it runs the turn (or a proxy drops the call): the call may or may
    not have been applied, and the error says so, not a bare httpx exception."""

    async def dropped(writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()

    canned.on("/v1/sessions/ses_x/responses", dropped)
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.RemoteError, match="may or may not") as caught:
            await c.respond("ses_x", [{"request_id": "req_1", "option_id": "approve"}])
    assert (caught.value.code, caught.value.status) == ("connection_lost", 0)
    assert isinstance(caught.value.__cause__, httpx.TransportError)


async def test_no_answer_within_the_timeout_is_a_named_error(canned: Canned) -> None:
    async def hung(writer: asyncio.StreamWriter) -> None:
        await canned.done.wait()

    canned.on(CANCEL, hung)
    async with AsyncClient(canned.base, timeout=0.3) as c:
        with pytest.raises(so.RemoteError, match="may or may not") as caught:
            await c.cancel("ses_x")
    assert (caught.value.code, caught.value.status) == ("timeout", 0)


async def test_an_answer_trickled_past_the_timeout_is_a_named_error(canned: Canned) -> None:
    """A server (or a proxy) sending its answer a byte at a time, each well within `timeout`,
    was waited on for as long as it went on: a whole call gives up after twice `timeout`."""

    async def trickled(writer: asyncio.StreamWriter) -> None:
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\nConnection: close\r\n\r\n"
        )
        while not canned.done.is_set():
            writer.write(b" ")
            await writer.drain()
            await asyncio.sleep(0.05)

    canned.on(CANCEL, trickled)
    async with AsyncClient(canned.base, timeout=0.5) as c:
        with pytest.raises(so.RemoteError, match="may or may not") as caught:
            await asyncio.wait_for(c.cancel("ses_x"), 10)
    assert (caught.value.code, caught.value.status) == ("timeout", 0)


async def test_a_server_not_there_is_a_named_error() -> None:
    from .test_server_common import free_port

    base = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    async with AsyncClient(base) as c:
        with pytest.raises(so.RemoteError, match="not sent") as caught:
            await c.state("ses_x")
        assert (caught.value.code, caught.value.status) == ("unreachable", 0)
        with pytest.raises(so.RemoteError) as gave_up:
            await asyncio.wait_for(anext(aiter(c.events("ses_x", retries=1))), 10)
        assert gave_up.value.code == "unreachable"
    with Client(base) as sync:
        with pytest.raises(so.RemoteError):
            sync.pending()


@pytest.mark.parametrize(
    "base", ["localhost:8000", "ftp://example.com", "", "//host", "http://[::1"]
)
def test_a_base_url_that_is_not_http_is_refused_at_once(base: str) -> None:
    with pytest.raises(so.UsageError, match="base URL"):
        AsyncClient(base)


@pytest.mark.parametrize(
    "base",
    ["http://h:1?key=s3cret", "http://h:1/api?key=s3cret", "http://h/#s3cret", "http://h:1/?"],
)
def test_a_base_url_with_a_query_or_fragment_is_refused_without_showing_it(base: str) -> None:
    """httpx put each call's path after the query (`http://h:1/?key=…/v1/sessions`), so every
    call failed, naming the dashboard's redirect: refused at once, the query (a key) unshown."""
    with pytest.raises(so.UsageError, match="no query or fragment") as refused:
        AsyncClient(base)
    assert (
        "s3cret" not in str(refused.value) and "?" not in str(refused.value).partition(" with ")[0]
    )


@pytest.mark.parametrize(
    ("transport", "said"),
    [("x", "not str"), (httpx.HTTPTransport(), "a sync transport cannot serve")],
    ids=["text", "sync"],
)
def test_a_transport_that_cannot_serve_the_client_is_refused_at_once(
    transport: Any, said: str
) -> None:
    """Taken as it was, every call and the close raised a bare AttributeError; a sync
    transport (an easy mistake) too."""
    for make in (AsyncClient, Client):
        with pytest.raises(so.UsageError, match=said):
            make("http://localhost:8000", transport=transport)


async def test_a_server_stopping_mid_turn_then_the_answer_repeated_on_the_next(
    tmp_path: Path,
) -> None:
    """The client waits for the turn its answer resumed; the server stops meanwhile (the tool
    still running): a `RemoteError`. The same answer sent to the next server on the store
    is safe, as docs/server.md says: it is recorded once, and the turn completes."""
    import threading

    from signoff.server import TokenAuth, create_app

    from .test_server_common import TOKENS, running

    running_tool = threading.Event()
    first_time = [True]

    @so.tool(approval=True)
    async def wire(amount: float) -> dict[str, Any]:
        """Wire money."""
        if first_time[0]:
            first_time[0] = False
            running_tool.set()
            await asyncio.sleep(60)  # cut off by the server's stop
        return {"wired": amount}

    def runtime() -> so.Runtime:
        call = so.ModelResponse(tool_calls=[so.ToolCall(name="wire", input={"amount": 5})])
        agent = so.Agent(
            name="wirer",
            model=so.models.Scripted([call, so.ModelResponse(text="done")], repeat_last=True),
            tools=[wire],
        )
        return so.Runtime([agent], store=f"sqlite:///{tmp_path}/state.db")

    answer = [{"request_id": "", "option_id": "approve"}]
    with running(create_app(runtime(), auth=TokenAuth(TOKENS), poll_interval=0.05)) as base:
        first = AsyncClient(base, token="alice-token")
        r = await first.generate("wirer", "pay")
        answer[0]["request_id"] = r.pending[0].id
        waiting = asyncio.create_task(first.respond(r.session_id, answer))
        await asyncio.to_thread(running_tool.wait, 10)
    with pytest.raises(so.RemoteError) as lost:  # the server stopped, not the client
        await waiting
    await first.aclose()
    # uvicorn cancels the call at its graceful-shutdown timeout and answers a bare 500 of its
    # own (no signoff body) when it still can, or the connection is just lost: both say
    # nothing of whether the answer was recorded.
    assert (lost.value.code, lost.value.status) in (("connection_lost", 0), ("http_error", 500))
    with running(create_app(runtime(), auth=TokenAuth(TOKENS), poll_interval=0.05)) as base:
        async with AsyncClient(base, token="alice-token") as c:
            again = await c.respond(r.session_id, answer)
            assert [(o.outcome, o.applied) for o in again.outcomes] == [("approved", False)]
            for _ in range(100):
                if (await c.state(r.session_id))["status"] != "running":
                    break
                await asyncio.sleep(0.1)
            events = [e.type async for e in c.events(r.session_id, follow=False)]
    assert events.count("approval.settled") == 1
    assert events[-2:] == ["turn.completed", "session.waiting"]


async def test_a_client_out_of_connections_says_so() -> None:
    """Each followed stream holds one of the client's 100 connections: a call that finds none
    free within `timeout` is told why, not that the server is unreachable."""
    canned_streams = 100

    async with Canned() as canned:

        async def held(writer: asyncio.StreamWriter) -> None:
            writer.write(stream(""))
            await canned.done.wait()

        canned.on(EVENTS, held)
        # The streams read with a timeout no stall reaches, the call waits 1 s for a connection:
        # this loop serves all 100 streams and the client, and on a loaded machine it stalled
        # for up to 5 s, past a shared 3 s timeout (with keep-alives every 0.2 s): a stream
        # reconnected, its connection free for a moment, and the call got its 404 (4 in 20).
        async with AsyncClient(canned.base, timeout=60.0) as c:
            c.http.timeout = httpx.Timeout(60.0, pool=1.0)

            async def follow() -> None:
                async for _ in c.events("ses_x"):
                    pass

            followers = [asyncio.create_task(follow()) for _ in range(canned_streams)]
            while len(canned.seen) < canned_streams:
                await asyncio.sleep(0.05)
            with pytest.raises(so.RemoteError, match="stayed in use") as caught:
                await c.state("ses_x")
            assert caught.value.code == "unreachable"
            for task in followers:
                task.cancel()
            await asyncio.gather(*followers, return_exceptions=True)


def test_an_async_client_used_on_a_second_event_loop_says_so(tmp_path: Path) -> None:
    """A client made once and used in two `asyncio.run`s: its connections belong to the first,
    closed loop; httpx would raise a bare `RuntimeError: Event loop is closed`."""
    with served(f"sqlite:///{tmp_path}/state.db") as base:
        c = AsyncClient(base, token="alice-token")
        assert asyncio.run(c.pending())[1] == 0
        with pytest.raises(so.UsageError, match="event loop"):
            asyncio.run(c.pending())

        async def first_event(client: AsyncClient = c) -> so.Event:
            return await anext(aiter(client.events("ses_x")))

        with pytest.raises(so.UsageError, match="event loop"):
            asyncio.run(first_event())
        # Closing it there closes what it can, not a bare `Event loop is closed`; it is closed.
        asyncio.run(c.aclose())
        with pytest.raises(so.UsageError, match="the client is closed"):
            asyncio.run(c.pending())
        # Its pooled connection is the first loop's, which closed without closing it: the
        # misuse leaks it, which is not what this test is about.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            del c, first_event
            gc.collect()


def test_a_token_of_odd_printable_characters_authenticates(tmp_path: Path) -> None:
    """Any token a server can be configured with (printable ASCII, inner spaces and quotes
    included) is carried as it is, by both clients."""
    from signoff.server import TokenAuth, create_app

    from .test_server_common import make_runtime, running

    odd = "a b=\"c\";%20\\d,'e'~^`{|}"
    auth = TokenAuth({odd: so.Principal(authenticator="token", principal_id="odd")})
    with running(create_app(make_runtime(f"sqlite:///{tmp_path}/s.db"), auth=auth)) as base:
        with Client(base, token=odd) as c:
            assert c.pending() == ([], 0)
        with Client(base, token=odd + "x") as wrong, pytest.raises(so.RemoteError) as denied:
            wrong.pending()
    assert (denied.value.code, denied.value.status) == ("unauthenticated", 401)


@pytest.mark.parametrize("status", ["301 Moved Permanently", "308 Permanent Redirect"])
async def test_a_redirect_is_an_error_naming_where_to(canned: Canned, status: str) -> None:
    """A proxy that sends http:// to https:// (or a moved server) answers a redirect, which the
    client does not follow (a POST sent again elsewhere): it was `HTTP 301: ` and the proxy's
    page, naming neither the URL called nor where the server is now."""
    moved = "https://signoff.example.com/v1/sessions/ses_x/cancel"
    page = "<html><body>301 Moved Permanently</body></html>"
    reply = http(status, page, "text/html", extra=f"Location: {moved}\r\n")
    canned.on(CANCEL, reply)
    canned.on(EVENTS, reply)
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.RemoteError) as caught:
            await c.cancel("ses_x")
        with pytest.raises(so.RemoteError) as streamed:
            _ = [e async for e in c.events("ses_x", follow=False)]
    for exc in (caught.value, streamed.value):
        assert (exc.code, exc.status) == ("http_error", int(status[:3]))
        assert f"redirects to {moved}" in str(exc) and canned.base in str(exc), str(exc)
    assert len(canned.seen) == 2  # neither followed nor sent again


async def test_a_blocking_call_timed_out_in_an_event_loop_says_it_blocked_it(
    canned: Canned,
) -> None:
    """A `Client` call made from async code blocks that code's event loop until it returns; a
    server served on that loop (in-process, a test's) cannot answer meanwhile, and the call
    timed out saying only that the server did not answer, then again when called again."""
    with Client(canned.base, timeout=0.3) as c:
        with pytest.raises(so.RemoteError) as caught:
            c.state("ses_x")
    assert caught.value.code == "timeout"
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert "blocked the running event loop" in notes and "AsyncClient" in notes


def test_a_blocking_call_timed_out_outside_an_event_loop_has_no_such_note() -> None:
    import socket

    with socket.socket() as silent:  # listens, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        port = silent.getsockname()[1]
        with Client(f"http://127.0.0.1:{port}", timeout=0.3) as c:
            with pytest.raises(so.RemoteError) as caught:
                c.state("ses_x")
    assert caught.value.code == "timeout" and not getattr(caught.value, "__notes__", [])
