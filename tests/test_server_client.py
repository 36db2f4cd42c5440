"""`signoff.server.AsyncClient` / `Client` against a real server, and the client-side reducer."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff.server import AsyncClient, Client

from ._ttl import ttl_agent
from .test_server_common import served, tool_output


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


async def test_the_runtime_methods_over_http(base: str) -> None:
    async with AsyncClient(base, token="alice-token") as c:
        r = await c.generate("support", "Refund order 1042")
        assert r.status == "waiting"
        (req,) = r.pending
        assert isinstance(req, so.InputRequest) and req.tool_name == "issue_refund"
        items, total = await c.pending(tool_name="issue_refund")
        assert total == 1 and [i.id for i in items] == [req.id]
        state = await c.state(r.session_id)
        assert state["status"] == "waiting"
        done = await c.respond(
            r.session_id, [so.InputResponse(request_id=req.id, option_id="approve")]
        )
        assert done.status == "completed"
        assert tool_output(done.text) == {"order_id": "1042", "refunded": 180.0}
        events = [e async for e in c.events(r.session_id, follow=False)]
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        assert isinstance(events[0], so.Event) and events[-1].type == "session.waiting"
        # helix style and errors come back as the same exception classes
        batch = await c.generate("batch", "refund both")
        with pytest.raises(so.PartialAnswer) as partial:
            await c.generate(
                session_id=batch.session_id,
                approvals=[so.Decision(id=batch.pending[0].id, approved=True)],
            )
        assert partial.value.request_ids == [batch.pending[1].id]
        with pytest.raises(so.UnknownSession):
            await c.state("ses_nope")
        with pytest.raises(so.ConflictingAnswer):
            await c.respond(r.session_id, [{"request_id": req.id, "option_id": "cancel"}])
        with pytest.raises(so.UnknownAgent, match="unknown agent"):
            await c.generate("nobody", "hi")
    async with AsyncClient(base, token="wrong") as anonymous:
        with pytest.raises(so.SignoffError) as denied:
            await anonymous.pending()
        assert getattr(denied.value, "code", "") == "unauthenticated"


async def test_live_session_marks_answers_until_the_stream_confirms(base: str) -> None:
    calls: list[str] = []

    async def count(request: httpx.Request) -> None:
        calls.append(f"{request.method} {request.url.path}")

    async with AsyncClient(base, token="alice-token") as c:
        c.http.event_hooks["request"].append(count)
        r = await c.generate("batch", "refund both")
        live = await c.session(r.session_id)
        first, second = (v.request.id for v in live.requests.values())
        assert [q.id for q in live.open_requests()] == [first, second]

        result = await live.respond([{"request_id": first, "option_id": "approve"}])
        assert result.status == "waiting"
        assert live.requests[first].status == "responded"  # sent, not yet seen in the stream
        await live.sync()
        assert live.requests[first].status == "settled"
        assert live.requests[first].outcome == "approved"

        before = len(calls)
        with pytest.raises(so.RequestClosed):
            await live.respond([{"request_id": first, "option_id": "cancel"}])
        assert len(calls) == before  # failed locally, no server call
        with pytest.raises(so.UnknownRequest):
            await live.respond([{"request_id": "req_typo", "option_id": "cancel"}])
        # asked since the last read, it would be open: the stream is read, the answer not sent
        assert calls[before:] == [f"GET /v1/sessions/{r.session_id}/events"]

        done = await live.respond([{"request_id": second, "option_id": "cancel"}])
        assert done.status == "completed"
        seen = []
        async for event in live.follow():
            seen.append(event.type)
            if event.type == "turn.completed":
                break
        assert live.requests[second].status == "settled"
        assert live.requests[second].outcome == "cancelled"
        assert live.open_requests() == []


def test_leaving_a_followed_live_session_leaves_nothing_to_close_at_exit(base: str) -> None:
    """A script that breaks out of `live.follow()` and ends: the stream closes with the loop
    it was followed in, without asyncio's `aclose(): ... already running` error at exit."""
    script = f"""
import asyncio
from signoff.server import AsyncClient

async def main():
    async with AsyncClient({base!r}, token="alice-token") as c:
        r = await c.generate("support", "Refund order 1042")
        live = await c.session(r.session_id)
        await live.respond([{{"request_id": r.pending[0].id, "option_id": "approve"}}])
        async for event in live.follow():
            if event.type == "turn.completed":
                break

asyncio.run(main())
print("done")
"""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", script], capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "done\n", "")


async def test_a_refused_answer_stays_open_locally(base: str) -> None:
    async with AsyncClient(base, token="alice-token") as c:
        r = await c.generate("finance", "pay INV-7")
        live = await c.session(r.session_id)
        (rid,) = live.requests
        result = await live.respond([{"request_id": rid, "option_id": "approve"}])
        (outcome,) = result.outcomes
        assert isinstance(outcome, so.Outcome)  # the same type as the runtime's, not a dict
        assert (outcome.request_id, outcome.outcome, outcome.applied) == (rid, "rejected", False)
        assert live.requests[rid].status == "pending"  # someone else may still answer
    async with AsyncClient(base, token="bob-token") as manager:
        done = await manager.respond(r.session_id, [{"request_id": rid, "option_id": "approve"}])
        assert done.status == "completed"


async def test_an_expired_session_comes_back_whole(tmp_path: Path) -> None:
    """`SessionExpired` from the server is the in-process one: its session and the requests the
    expiry closed (`.pending`), not an object missing the attributes callers read."""
    from signoff.server import TokenAuth, create_app
    from signoff.testing import ManualClock

    from .test_server_common import TOKENS

    agent = ttl_agent()
    clock = ManualClock()
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/ttl.db", clock=clock)
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            r = await c.generate("desk", "reset")
            rid = r.pending[0].id
            clock.advance(120)
            with pytest.raises(so.SessionExpired) as remote:
                await c.respond(r.session_id, [{"request_id": rid, "option_id": "approve"}])
    await runtime.close()
    assert remote.value.session_id == r.session_id
    assert remote.value.pending == [rid]  # what the expiry closed, as the runtime raised it
    assert rid in str(remote.value)


async def test_a_server_that_is_not_signoff_is_a_named_error() -> None:
    """A base URL pointing at some other web server (a 200 HTML page for every path) gives a
    `RemoteError`, not a JSON decoding error, and a followed stream does not reconnect forever."""
    import asyncio

    calls = []

    def html(request: httpx.Request) -> httpx.Response:
        calls.append(request.url.path)
        return httpx.Response(200, text="<html><body>Welcome!</body></html>")

    transport = httpx.MockTransport(html)
    async with AsyncClient("http://portal.example", transport=transport) as c:
        with pytest.raises(so.RemoteError) as caught:
            await c.state("ses_x")
        assert (caught.value.code, caught.value.status) == ("http_error", 200)
        with pytest.raises(so.RemoteError):
            await c.generate("support", "hi")

        async def follow() -> list[so.Event]:
            return [e async for e in c.events("ses_x")]

        with pytest.raises(so.RemoteError, match="event-stream"):
            await asyncio.wait_for(follow(), 5)
        assert len(calls) == 3


def test_the_sync_client(base: str) -> None:
    with Client(base, token="alice-token") as c:
        r = c.generate("support", "Refund order 1042")
        rid = r.pending[0].id
        done = c.respond(r.session_id, [{"request_id": rid, "option_id": "cancel", "text": "no"}])
        assert done.status == "completed"
        assert tool_output(done.text)["reason"] == "no"
        events = c.events(r.session_id)  # docs/server.md: the events so far, like events_sync
        assert isinstance(events, list) and events[-1].type == "session.waiting"
        assert [e.seq for e in c.events(r.session_id, after=events[-3].seq)] == [
            e.seq for e in events[-2:]
        ]
        with pytest.raises(so.UnknownSession):
            c.events("ses_nobody")  # raised by the call itself, not on iteration
        assert c.pending(status="settled")[1] == 1
        rows, total = c.sessions()
        assert total == 1 and [s.id for s in rows] == [r.session_id]
        assert c.sessions(status=rows[0].status, limit=1) == (rows, 1)
        assert isinstance(rows[0], so.stores.SessionSummary) and rows[0].agent == "support"


async def test_sessions_over_http_are_the_callers_own(base: str) -> None:
    """`sessions()` pages what `GET /v1/sessions` lists: another tenant's are not there."""
    async with (
        AsyncClient(base, token="alice-token") as alice,
        AsyncClient(base, token="mallory-token") as mallory,
    ):
        first = await alice.generate("support", "Refund order 1042")
        second = await alice.generate("batch", "refund both")
        theirs = await mallory.generate("support", "Refund order 7")
        rows, total = await alice.sessions()
        assert total == 2 and [s.id for s in rows] == [second.session_id, first.session_id]
        assert rows[0].status == "waiting" and rows[0].head > 1 and rows[0].expires_at is None
        rows, total = await alice.sessions(agent="batch", limit=1)
        assert (total, [s.id for s in rows]) == (1, [second.session_id])
        rows, total = await alice.sessions(limit=1, offset=1)
        assert (total, [s.id for s in rows]) == (2, [first.session_id])
        assert await alice.sessions(status="idle") == ([], 0)
        rows, total = await mallory.sessions()
        assert (total, [s.id for s in rows]) == (1, [theirs.session_id])
        with pytest.raises(so.UsageError, match="status"):
            await alice.sessions(status="open")  # type: ignore[arg-type]
        with pytest.raises(so.UsageError, match="limit"):
            await alice.sessions(limit=0)


def test_the_sync_client_takes_what_the_async_client_takes() -> None:
    """Its calls were `*args, **kwargs`: a misspelt argument passed the type checker."""
    import inspect

    for name in ("generate", "send", "respond", "cancel", "state", "pending"):
        sync, method = getattr(Client, name), getattr(AsyncClient, name)
        assert inspect.signature(sync) == inspect.signature(method), name
        assert inspect.getdoc(sync) == inspect.getdoc(method), name


def test_the_sync_clients_events_fail_at_the_call(base: str) -> None:
    """Not later, when the result is first iterated (maybe after the client was closed)."""
    with Client(base, token="alice-token") as c:
        with pytest.raises(so.UnknownSession):
            c.events("ses_nope")
        r = c.generate("support", "Refund order 1042")
        events = c.events(r.session_id)
    seqs = [e.seq for e in events]  # read while the client was open
    assert seqs and seqs == list(range(1, len(seqs) + 1))


async def test_events_survive_a_server_restart(tmp_path: Path) -> None:
    """The stream is cut when its server dies; the client reconnects with Last-Event-ID to the
    next process on that address and misses nothing."""
    import asyncio

    from .test_server_common import spawn_serve

    store = f"sqlite:///{tmp_path}/state.db"
    log = open(tmp_path / "servers.log", "w+b")
    tokens = ["alice-token=alice"]
    first, base = await asyncio.to_thread(spawn_serve, store, tokens, log)
    port = int(base.rsplit(":", 1)[1])
    second = None
    try:
        async with AsyncClient(base, token="alice-token") as c:
            r = await c.generate("support", "Refund order 1042")
            received: list[so.Event] = []

            async def follow() -> None:
                async for event in c.events(r.session_id, retries=60):
                    received.append(event)
                    if event.type == "turn.completed":
                        return

            task = asyncio.create_task(follow())
            while len(received) < 5:
                await asyncio.sleep(0.05)
            first.kill()
            first.wait()
            second, _ = await asyncio.to_thread(spawn_serve, store, tokens, log, port)
            rid = r.pending[0].id
            done = await c.respond(r.session_id, [{"request_id": rid, "option_id": "approve"}])
            assert done.status == "completed"
            await asyncio.wait_for(task, 30)
        seqs = [e.seq for e in received]
        assert seqs == list(range(1, len(seqs) + 1))  # nothing lost, nothing twice
        assert received[-1].type == "turn.completed"
    except BaseException:
        print((tmp_path / "servers.log").read_text(errors="replace")[-5000:])
        raise
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(timeout=10)
        log.close()


async def test_following_a_session_that_expires_raises_session_expired(tmp_path: Path) -> None:
    """The server ends the stream of an expired session with `stream.end`: the client yields
    every event, then raises `SessionExpired` instead of reconnecting (or parsing the end as an
    event); following it again raises at once."""
    import asyncio

    from .test_server_common import running, ttl_app

    now = [1_000_000.0]
    _, app = ttl_app(tmp_path, now)
    with running(app) as base:
        async with AsyncClient(base, token="alice-token") as c:
            r = await c.generate("desk", "reset")
            received: list[so.Event] = []

            async def follow() -> None:
                async for event in c.events(r.session_id):
                    received.append(event)
                    if event.type == "turn.waiting":
                        now[0] += 120

            with pytest.raises(so.SessionExpired) as expired:
                await asyncio.wait_for(follow(), 10)
            assert expired.value.session_id == r.session_id
            assert expired.value.pending == [r.pending[0].id]
            assert [e.seq for e in received] == list(range(1, len(received) + 1))
            head = received[-1].seq
            with pytest.raises(so.SessionExpired):  # a 410: nothing more will come
                await asyncio.wait_for(anext(aiter(c.events(r.session_id, head))), 10)


async def test_a_live_session_learns_a_request_closed_elsewhere_from_its_refusal(
    base: str,
) -> None:
    """Someone else settled the request since the live session last read: the server refuses
    its answer (`ConflictingAnswer`), and the request no longer shows as open."""
    async with AsyncClient(base, token="alice-token") as c:
        r = await c.generate("support", "Refund order 1042")
        live = await c.session(r.session_id)
        (rid,) = live.requests
        await c.respond(r.session_id, [{"request_id": rid, "option_id": "cancel"}])
        with pytest.raises(so.ConflictingAnswer):
            await live.respond([{"request_id": rid, "option_id": "approve"}])
        assert (live.requests[rid].status, live.requests[rid].outcome) == ("settled", "cancelled")
        assert live.open_requests() == []
        with pytest.raises(so.RequestClosed):  # now refused locally
            await live.respond([{"request_id": rid, "option_id": "approve"}])
