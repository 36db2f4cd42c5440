"""`AsyncClient` / `Client` against servers that misbehave: error bodies of every code, bodies
that are not what a signoff server sends, streams cut mid-event, bad arguments, closed clients.

A tiny raw HTTP server on loopback (`Canned`) sends exactly the bytes a test gives it, as a
proxy or a broken server would; the real server is used where its own answers matter.
"""

from __future__ import annotations

import asyncio
import gc
import inspect
import json
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff.server import AsyncClient, Client

from .test_server_common import served

Reply = bytes | Callable[[asyncio.StreamWriter], Awaitable[None]]


def http(status: str, body: str | bytes, kind: str = "application/json", extra: str = "") -> bytes:
    """A whole HTTP/1.1 response, closing the connection."""
    raw = body.encode() if isinstance(body, str) else body
    head = (
        f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {len(raw)}\r\n"
        f"Connection: close\r\n{extra}\r\n"
    )
    return head.encode() + raw


def error(status: str, code: str, extra: str = "", **detail: Any) -> bytes:
    return http(
        status, json.dumps({"error": {"code": code, "message": "m", **detail}}), extra=extra
    )


def event(seq: int, sid: str = "ses_x") -> str:
    data = {"session_id": sid, "seq": seq, "type": "turn.started", "at": 1.0, "data": {}}
    return f"id: {seq}\nevent: turn.started\ndata: {json.dumps(data)}\n\n"


def stream(body: str) -> bytes:
    """An event stream the server ends by closing the connection (no Content-Length)."""
    head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    return (head + body).encode()


class Canned:
    """A loopback HTTP server that answers each request to a path with the next canned reply
    queued for it (the last one repeats), and records the requests' heads."""

    def __init__(self) -> None:
        self.replies: dict[str, list[Reply]] = {}
        self.seen: list[tuple[str, dict[str, str]]] = []
        self.base = ""
        self.done = asyncio.Event()  # set when the test is over: replies that hang may end
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    def on(self, path: str, *replies: Reply) -> None:
        self.replies[path] = list(replies)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._handlers.add(task)
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
            target = head[0].split()[1]
            path = target.split("?")[0]
            headers = {
                k.strip().lower(): v.strip()
                for k, _, v in (h.partition(":") for h in head[1:] if h)
            }
            size = int(headers.get("content-length", "0"))
            if size:
                await reader.readexactly(size)
            self.seen.append((target, headers))
            queue = self.replies.get(path) or [http("404 Not Found", "")]
            reply = queue.pop(0) if len(queue) > 1 else queue[0]
            if isinstance(reply, bytes):
                writer.write(reply)
            else:
                await reply(writer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self._handlers.discard(task)

    async def __aenter__(self) -> Canned:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.base = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self.done.set()
        self._server.close()
        await asyncio.wait_for(asyncio.gather(*self._handlers, return_exceptions=True), 10)


@pytest.fixture
async def canned() -> AsyncIterator[Canned]:
    async with Canned() as server:
        yield server


CANCEL = "/v1/sessions/ses_x/cancel"
EVENTS = "/v1/sessions/ses_x/events"

# Every error body the server sends for a signoff error, and the class the client raises.
MAPPED: dict[str, tuple[bytes, type[so.SignoffError]]] = {
    "payload_too_large": (error("413 Payload Too Large", "payload_too_large"), so.TooLarge),
    "schema_version": (error("503 Service Unavailable", "schema_version"), so.SchemaVersionError),
    "store_gone": (error("503 Service Unavailable", "store_gone"), so.StoreGone),
    "store_error": (error("503 Service Unavailable", "store_error"), so.StoreError),
    "model_error": (error("502 Bad Gateway", "model_error"), so.ModelError),
    "unknown_agent": (error("422 Unprocessable Entity", "unknown_agent"), so.UnknownAgent),
    "invalid_request": (error("422 Unprocessable Entity", "invalid_request"), so.UsageError),
    "session_busy": (error("409 Conflict", "session_busy", session_id="ses_x"), so.SessionBusy),
}


@pytest.mark.parametrize("code", sorted(MAPPED))
async def test_each_error_code_is_its_named_class(canned: Canned, code: str) -> None:
    body, cls = MAPPED[code]
    canned.on(CANCEL, body)
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.SignoffError) as caught:
            await c.cancel("ses_x")
    assert type(caught.value) is cls, type(caught.value).__name__


def test_every_error_class_the_server_can_name_comes_back_as_itself() -> None:
    """A class added to the hierarchy with a code must not come back as a bare `RemoteError`."""
    from signoff import _exceptions
    from signoff._wire import error as _error

    for name in _exceptions.__all__:
        cls = getattr(_exceptions, name)
        if cls in (so.RemoteError, so.StepFailed) or "code" not in vars(cls):
            continue  # no code of its own to send, or never sent by a server
        got = _error({"code": cls.code, "message": "m"}, 400)
        assert type(got) is cls, name


async def test_an_invalid_request_on_an_answer_is_an_invalid_answer(canned: Canned) -> None:
    canned.on("/v1/sessions/ses_x/responses", error("422 Unprocessable Entity", "invalid_request"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.InvalidAnswer):
            await c.respond("ses_x", [{"request_id": "req_1", "option_id": "approve"}])


async def test_retry_after_is_the_servers(canned: Canned) -> None:
    canned.on(CANCEL, error("503 Service Unavailable", "store_busy", extra="Retry-After: 7\r\n"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.StoreBusy) as busy:
            await c.cancel("ses_x")
        assert busy.value.retry_after == 7
        canned.on(
            CANCEL,
            error("503 Service Unavailable", "store_unavailable", extra="Retry-After: x\r\n"),
        )
        with pytest.raises(so.StoreUnavailable) as down:
            await c.cancel("ses_x")
        assert down.value.retry_after == so.StoreUnavailable.retry_after  # unreadable: the hint


async def test_request_ids_that_are_not_a_list_are_not_split_into_characters(
    canned: Canned,
) -> None:
    canned.on(CANCEL, error("409 Conflict", "conflicting_answer", request_ids="req_1"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.ConflictingAnswer) as caught:
            await c.cancel("ses_x")
    assert caught.value.request_ids == []


BAD_BODIES = {
    "empty-object": "{}",
    "array": "[1]",
    "null": "null",
    "pending-not-requests": '{"session_id": "a", "status": "waiting", "pending": [{"id": 1}]}',
    "outcomes-not-a-list": '{"session_id": "a", "status": "waiting", "outcomes": 5}',
    "outcome-not-an-object": '{"session_id": "a", "status": "waiting", "outcomes": [5]}',
    "outcome-without-applied": (
        '{"session_id": "a", "status": "waiting", '
        '"outcomes": [{"request_id": "req_1", "outcome": "approved"}]}'
    ),
}


@pytest.mark.parametrize("name", sorted(BAD_BODIES))
async def test_a_json_body_of_the_wrong_shape_is_a_remote_error(canned: Canned, name: str) -> None:
    canned.on(CANCEL, http("200 OK", BAD_BODIES[name]))
    canned.on("/v1/sessions/ses_x", http("200 OK", "[]"))
    canned.on("/v1/requests", http("200 OK", BAD_BODIES[name]))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.RemoteError, match="not a turn's result"):
            await c.cancel("ses_x")
        with pytest.raises(so.RemoteError, match="not a session"):
            await c.state("ses_x")
        with pytest.raises(so.RemoteError, match="not a page of requests"):
            await c.pending()


BAD_STREAMS = {
    "not-json": "id: 1\nevent: x\ndata: {not json\n\n",
    "no-session": 'data: {"seq": 1}\n\n',
    "seq-not-a-number": 'data: {"session_id": "s", "seq": "abc", "type": "t", "at": 1}\n\n',
    "an-array": "data: [1]\n\n",
    "end-without-error": 'event: stream.end\ndata: {"nope": 1}\n\n',
    "end-of-an-array": "event: stream.end\ndata: []\n\n",
}


@pytest.mark.parametrize("name", sorted(BAD_STREAMS))
async def test_an_event_stream_that_is_not_signoffs_is_a_remote_error(
    canned: Canned, name: str
) -> None:
    canned.on(EVENTS, stream(event(1) + BAD_STREAMS[name]))
    async with AsyncClient(canned.base) as c:
        seen: list[int] = []
        with pytest.raises(so.RemoteError, match="event"):
            async for e in c.events("ses_x", follow=False):
                seen.append(e.seq)
    assert seen == [1]


@pytest.mark.parametrize("token", ["tök", "a\nb", "trailing ", " leading", "nul\x00", ""])
def test_a_token_no_header_can_carry_is_refused_at_once(token: str) -> None:
    """Not later, as a `UnicodeEncodeError` or an httpx protocol error from the first call."""
    if token == "":
        AsyncClient("http://127.0.0.1:9", token=token)  # no token: anonymous, as before
        return
    with pytest.raises(so.UsageError, match="token"):
        AsyncClient("http://127.0.0.1:9", token=token)
    with pytest.raises(so.UsageError, match="token"):
        Client("http://127.0.0.1:9", token=token)


async def test_a_closed_async_client_says_so(canned: Canned) -> None:
    canned.on(CANCEL, http("200 OK", '{"session_id": "ses_x", "status": "idle"}'))
    c = AsyncClient(canned.base)
    await c.aclose()
    with pytest.raises(so.UsageError, match="closed"):
        await c.cancel("ses_x")
    with pytest.raises(so.UsageError, match="closed"):
        await anext(aiter(c.events("ses_x")))
    await c.aclose()  # twice is fine
    assert canned.seen == []


def test_a_closed_sync_client_says_so() -> None:
    import threading

    c = Client("http://127.0.0.1:9")
    c.close()
    threads = threading.active_count()
    with pytest.raises(so.UsageError, match="closed"):
        c.state("ses_x")
    with pytest.raises(so.UsageError, match="closed"):
        c.events("ses_x")
    c.close()
    assert threading.active_count() == threads  # no new loop thread started for nothing


MALFORMED_ANSWERS: dict[str, Callable[[AsyncClient], Awaitable[Any]]] = {
    "responses-a-mapping": lambda c: c.respond(
        "ses_x",
        {"request_id": "req_1", "option_id": "approve"},  # type: ignore[arg-type]
    ),
    "response-id-not-text": lambda c: c.respond("ses_x", [{"request_id": 5}]),
    "responses-empty": lambda c: c.respond("ses_x", []),
    "decision-without-id": lambda c: c.generate(session_id="ses_x", approvals=[{"idx": 1}]),
    "decisions-a-string": lambda c: c.generate(session_id="ses_x", approvals="yes"),  # type: ignore[arg-type]
    "decisions-empty": lambda c: c.generate(session_id="ses_x", approvals=[]),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_ANSWERS))
async def test_a_malformed_answer_is_an_invalid_answer_without_a_call(
    canned: Canned, name: str
) -> None:
    """As `Runtime.respond` / `generate(approvals=...)` raise in process, not a pydantic error."""
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.InvalidAnswer):
            await MALFORMED_ANSWERS[name](c)
    assert canned.seen == []


def test_every_call_of_the_async_client_has_its_blocking_twin() -> None:
    """Same name, parameters and docstring; the documented exceptions are listed here."""
    only_async = {"session", "aclose"}  # LiveSession is async only; `close` is the twin
    differ = {"events"}  # the blocking one returns the events so far, without following
    calls = inspect.getmembers(
        AsyncClient, lambda m: inspect.iscoroutinefunction(m) or inspect.isasyncgenfunction(m)
    )
    for name, method in calls:
        if name.startswith("_") or name in only_async:
            continue
        assert hasattr(Client, name), name
        if name not in differ:
            sync = getattr(Client, name)
            assert inspect.signature(sync) == inspect.signature(method), name
            assert inspect.getdoc(sync) == inspect.getdoc(method), name
    assert set(inspect.signature(Client.__init__).parameters) == set(
        inspect.signature(AsyncClient.__init__).parameters
    )


async def test_a_real_servers_too_large_prompt_is_too_large(tmp_path: Path) -> None:
    with served(f"sqlite:///{tmp_path}/state.db") as base:
        async with AsyncClient(base, token="alice-token") as c:
            with pytest.raises(so.TooLarge):
                await c.generate("support", "x" * (5 << 20))
            with pytest.raises(so.UsageError, match="turnPolicy"):
                r = await c.generate("support", "Refund order 1042")
                await c.send(r.session_id, "hi", turn_policy="bogus")


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
    assert [h.get("last-event-id") for _, h in canned.seen] == ["0", "1", "1", "1", "1", "1"]


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


@pytest.mark.parametrize("sent", [": keep-alive\n\n", ""])
async def test_a_quiet_stream_does_not_give_up(canned: Canned, sent: str) -> None:
    """A stream quiet for longer than `timeout` (the client's timeout shorter than the server's
    heartbeat, or a proxy cutting idle streams after a keep-alive) is asked for again as often as
    it takes: only failing to reach the server counts against `retries`."""

    async def quiet(writer: asyncio.StreamWriter) -> None:
        writer.write(stream(sent))
        await writer.drain()
        await asyncio.sleep(0.4)  # longer than the client's timeout: it reconnects

    canned.on(EVENTS, quiet, quiet, quiet, stream(event(1)))
    async with AsyncClient(canned.base, timeout=0.2) as c:
        first = await asyncio.wait_for(anext(aiter(c.events("ses_x", retries=1))), 10)
    assert first.seq == 1


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


async def test_a_bad_call_raises_the_same_class_over_http_as_in_process(tmp_path: Path) -> None:
    """docs/server.md: server errors come back as the in-process exception classes. Each bad
    call is made on the runtime and, through the client, on a server of that same runtime."""
    import httpx

    from signoff.server import TokenAuth, create_app

    from .test_server_common import ALICE, TOKENS, make_runtime

    rt = make_runtime(f"sqlite:///{tmp_path}/state.db")
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            one = await c.generate("support", "Refund order 1042")
            two = await c.generate("batch", "refund both")
            settled = await c.generate("support", "Refund order 1042")
            rid = settled.pending[0].id
            await c.respond(settled.session_id, [{"request_id": rid, "option_id": "approve"}])
            sid, first = two.session_id, two.pending[0].id
            approve = [{"request_id": one.pending[0].id, "option_id": "approve"}]
            calls: dict[str, tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[Any]]]] = {
                "unknown-session": (lambda: rt.state("ses_nope"), lambda: c.state("ses_nope")),
                "unknown-request": (
                    lambda: rt.respond(sid, [{"request_id": "req_nope", "option_id": "approve"}]),
                    lambda: c.respond(sid, [{"request_id": "req_nope", "option_id": "approve"}]),
                ),
                "conflicting": (
                    lambda: rt.respond(
                        settled.session_id,
                        [{"request_id": rid, "option_id": "cancel"}],
                        principal=ALICE,
                    ),
                    lambda: c.respond(
                        settled.session_id, [{"request_id": rid, "option_id": "cancel"}]
                    ),
                ),
                "partial": (
                    lambda: rt.generate(
                        session_id=sid,
                        approvals=[so.Decision(id=first, approved=True)],
                        auth=ALICE,
                    ),
                    lambda: c.generate(
                        session_id=sid, approvals=[so.Decision(id=first, approved=True)]
                    ),
                ),
                "approvals-and-a-prompt": (
                    lambda: rt.generate(
                        prompt="hi",
                        session_id=sid,
                        approvals=[so.Decision(id=first, approved=True)],
                    ),
                    lambda: c.generate(
                        prompt="hi",
                        session_id=sid,
                        approvals=[so.Decision(id=first, approved=True)],
                    ),
                ),
                "approvals-empty": (
                    lambda: rt.generate(session_id=sid, approvals=[]),
                    lambda: c.generate(session_id=sid, approvals=[]),
                ),
                "responses-empty": (lambda: rt.respond(sid, []), lambda: c.respond(sid, [])),
                "response-malformed": (
                    lambda: rt.respond(sid, [{"request_id": 5}]),
                    lambda: c.respond(sid, [{"request_id": 5}]),
                ),
                "answer-of-the-wrong-kind": (
                    lambda: rt.respond(one.session_id, [{**approve[0], "option_id": "maybe"}]),
                    lambda: c.respond(one.session_id, [{**approve[0], "option_id": "maybe"}]),
                ),
                "unknown-agent": (
                    lambda: rt.generate("nobody", prompt="hi"),
                    lambda: c.generate("nobody", "hi"),
                ),
                "prompt-too-large": (
                    lambda: rt.generate("support", prompt="x" * (5 << 20)),
                    lambda: c.generate("support", "x" * (5 << 20)),
                ),
                "turn-policy": (
                    lambda: rt.send(sid, "hi", turn_policy="bogus"),  # type: ignore[arg-type]
                    lambda: c.send(sid, "hi", turn_policy="bogus"),
                ),
            }
            got = {}
            for name, (local, remote) in calls.items():
                kinds = []
                for call in (local, remote):
                    try:
                        await call()
                        kinds.append("no error")
                    except so.SignoffError as exc:
                        kinds.append(type(exc).__name__)
                got[name] = tuple(kinds)
    await rt.close()
    assert {k: v for k, v in got.items() if v[0] != v[1]} == {}
    assert all(v[0] != "no error" for v in got.values()), got


async def test_a_client_out_of_connections_says_so() -> None:
    """Each followed stream holds one of the client's 100 connections: a call that finds none
    free within `timeout` is told why, not that the server is unreachable."""
    canned_streams = 100

    async with Canned() as canned:

        async def held(writer: asyncio.StreamWriter) -> None:
            writer.write(stream(""))
            while not canned.done.is_set():
                writer.write(b": keep-alive\n\n")
                await writer.drain()
                await asyncio.sleep(0.2)

        canned.on(EVENTS, held)
        async with AsyncClient(canned.base, timeout=1.0) as c:

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


# -- idempotency keys --------------------------------------------------------------------------

MESSAGES = "/v1/sessions/ses_x/messages"
TURN = json.dumps(
    {
        "session_id": "ses_x",
        "status": "completed",
        "turn_id": "trn_1",
        "text": "ok",
        "pending": [],
        "outcomes": [],
        "error": None,
        "retryable": False,
        "replayed": True,
    }
)


async def dropped(writer: asyncio.StreamWriter) -> None:
    writer.transport.abort()


async def test_a_message_left_in_the_queue_reads_queued(canned: Canned) -> None:
    """The server's `queued` (a message that waits for the turn's end) reaches the result."""
    canned.on(MESSAGES, http("200 OK", json.dumps({**json.loads(TURN), "queued": True})))
    async with AsyncClient(canned.base) as c:
        result = await c.send("ses_x", "hello")
    assert result.queued


async def test_a_message_that_got_no_answer_is_sent_once_more_with_its_key(
    canned: Canned,
) -> None:
    canned.on(MESSAGES, dropped, http("200 OK", TURN))
    async with AsyncClient(canned.base) as c:
        result = await c.send("ses_x", "hello")
    assert result.replayed and result.text == "ok" and not result.queued
    keys = [h.get("idempotency-key") for _, h in canned.seen]
    assert len(keys) == 2 and keys[0] == keys[1] and keys[0]
    # each call has a key of its own
    canned.on(MESSAGES, http("200 OK", TURN))
    async with AsyncClient(canned.base) as c:
        await c.send("ses_x", "hello")
        await c.send("ses_x", "hello", idempotency_key="mine-1")
    assert canned.seen[2][1]["idempotency-key"] not in keys
    assert canned.seen[3][1]["idempotency-key"] == "mine-1"


async def test_a_message_that_got_no_answer_twice_names_its_key(canned: Canned) -> None:
    canned.on("/v1/sessions", dropped)
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.RemoteError, match="call again with it") as caught:
            await c.generate("support", "hello", idempotency_key="k-7")
    assert (caught.value.code, caught.value.status) == ("connection_lost", 0)
    assert caught.value.idempotency_key == "k-7"
    assert [h["idempotency-key"] for _, h in canned.seen] == ["k-7", "k-7"]


async def test_a_refused_message_is_not_sent_again(canned: Canned) -> None:
    canned.on(MESSAGES, error("409 Conflict", "session_busy", session_id="ses_x"))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.SessionBusy):
            await c.send("ses_x", "hello")
        for bad in ("", "é", "x" * 201, " k", "k "):  # no header carries spaces around a value
            with pytest.raises(so.UsageError, match="idempotency_key"):
                await c.send("ses_x", "hello", idempotency_key=bad)
        with pytest.raises(so.UsageError, match="goes with a prompt"):
            await c.generate(session_id="ses_x", approvals=[], idempotency_key="k")
    assert len(canned.seen) == 1


async def test_a_key_repeated_against_a_real_server_acts_once(tmp_path: Path) -> None:
    from signoff.server import TokenAuth, create_app

    from .test_server_common import TOKENS, make_runtime

    rt = make_runtime(f"sqlite:///{tmp_path}/state.db")
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            one = await c.generate("support", "Refund order 1042", idempotency_key="k-1")
            two = await c.generate("support", "Refund order 1042", idempotency_key="k-1")
            assert not one.replayed and two.replayed and two.session_id == one.session_id
            with pytest.raises(so.IdempotencyKeyReused) as caught:
                await c.generate("support", "Refund order 9", idempotency_key="k-1")
            assert caught.value.session_id == one.session_id
            sent = await c.send(one.session_id, "never mind", idempotency_key="m-1")
            again = await c.send(one.session_id, "never mind", idempotency_key="m-1")
            assert not sent.replayed and again.replayed
        assert len(await rt.sessions()) == 1
        messages = [
            e.data["message"]
            async for e in rt.events(one.session_id, follow=False)
            if e.type in ("turn.started", "turn.message")
        ]
        assert messages == ["Refund order 1042", "never mind"]


async def test_a_key_repeated_after_a_later_message_answers_with_its_own_turn(
    tmp_path: Path,
) -> None:
    from signoff.server import TokenAuth, create_app

    from .test_server_common import TOKENS, make_runtime

    rt = make_runtime(f"sqlite:///{tmp_path}/state.db")
    app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            one = await c.generate("support", "Refund order 1042", idempotency_key="k-1")
            assert one.status == "waiting"
            await c.respond(
                one.session_id,
                [{"request_id": one.pending[0].id, "option_id": "approve"}],
            )
            later = await c.send(one.session_id, "and order 7?", idempotency_key="m-1")
            assert later.turn_id != one.turn_id
            again = await c.generate("support", "Refund order 1042", idempotency_key="k-1")
            assert again.replayed and again.turn_id == one.turn_id
            assert again.status == "completed" and again.text.startswith("tool ok: ")
            assert again.pending == []


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf"), True, "5"])
def test_a_client_refuses_a_timeout_that_is_not_positive_finite_seconds(timeout: Any) -> None:
    """httpx took each of these, and every call then failed: 0 as if the server were down, the
    others with a bare ValueError, OverflowError or TypeError."""
    for make in (AsyncClient, Client):
        with pytest.raises(so.UsageError, match="^timeout must be a positive, finite number"):
            make("http://127.0.0.1:8000", token="t", timeout=timeout)


@pytest.mark.parametrize("retries", [-1, 2.5, "5", None, True])
async def test_events_refuse_retries_that_are_not_a_count_before_asking(
    canned: Canned, retries: Any
) -> None:
    """`retries="5"` was taken, and the first refusal of the stream then raised a bare
    TypeError (`-1` gave up on a stream that had not failed yet)."""
    canned.on(EVENTS, stream(event(1)))
    async with AsyncClient(canned.base) as c:
        with pytest.raises(so.UsageError, match="^retries must be a whole number from 0, not "):
            _ = [e async for e in c.events("ses_x", follow=False, retries=retries)]
        with pytest.raises(so.UsageError, match="^follow must be True or False, not 'no'$"):
            _ = [e async for e in c.events("ses_x", follow="no")]  # type: ignore[arg-type]
    with Client(canned.base) as blocking:
        with pytest.raises(so.UsageError, match="^retries must be a whole number from 0"):
            await asyncio.to_thread(blocking.events, "ses_x", retries=retries)
    assert canned.seen == []
