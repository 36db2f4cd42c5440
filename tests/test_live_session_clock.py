"""`LiveSession` on a client machine whose clock is off the server's: deadlines and TTLs are
judged by the server's time, which each answer gives (`X-Signoff-Time`), and an answer to a
request that only the client's reckoning shows closed is sent, for the server to judge."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

import signoff as so
from signoff._live_session import LiveSession
from signoff._payloads import RemoteResult
from signoff.server import AsyncClient, TokenAuth, create_app
from signoff.testing import ManualClock

from ._delegation import refund_desk
from .test_live_session_expiry import _expiring
from .test_live_session_mirrors import Streams, _event
from .test_live_session_mirrors import _desk as _mirrored
from .test_server_common import TOKENS, running


def _desk(what: str, ran: list[str]) -> list[so.Agent]:
    """`billing` asking to refund with a 60 s deadline, or in a session of a 60 s TTL."""
    if what == "deadline":
        return refund_desk(so.always(expires_in=60), ran)
    return _expiring(ran, "billing")


@contextlib.contextmanager
def _served(tmp_path: Path, what: str, ran: list[str], clock: ManualClock) -> Iterator[str]:
    """`_desk` on a runtime of the server's `clock`, served by uvicorn: its base URL."""
    rt = so.Runtime(_desk(what, ran), store=f"sqlite:///{tmp_path}/state.db", clock=clock)
    app = create_app(rt, auth=TokenAuth(TOKENS), poll_interval=0.05, close_runtime=True)
    with running(app) as base:
        yield base


@pytest.mark.parametrize("what", ["deadline", "ttl"])
async def test_a_client_clock_90_s_fast_shows_and_answers_what_the_server_keeps_open(
    tmp_path: Path, what: str
) -> None:
    """Served by uvicorn; the client machine's clock runs about 90 s ahead of the server's, 55 s
    left by the server's: the live session showed no open request, and refused the answer
    locally (`is expired; it takes no answers`, or `SessionExpired`) that the server took."""
    clock = ManualClock(time.time() - 90)  # the server's: the client's is 90 s ahead of it
    ran: list[str] = []
    with _served(tmp_path, what, ran, clock) as base:
        async with AsyncClient(base, token="alice-token") as c:
            r = await c.generate("billing", "refund 9")
            (asked,) = r.pending
            clock.advance(5)  # 55 s left
            live = await c.session(r.session_id)
            assert [q.id for q in live.open_requests()] == [asked.id]
            assert live.requests[asked.id].status == "pending"
            done = await live.respond([{"request_id": asked.id, "option_id": "approve"}])
            assert [o.outcome for o in done.outcomes] == ["approved"]
            assert done.status == "completed" and ran == ["9"]


@pytest.mark.parametrize("what", ["deadline", "ttl"])
async def test_a_client_clock_90_s_slow_shows_closed_what_the_server_closed(
    tmp_path: Path, what: str
) -> None:
    """Served by uvicorn; the client machine's clock runs 90 s behind the server's, whose
    deadline (or TTL) has passed: the live session still showed the request open, 29 s left
    by its own clock. It shows it closed, and the answer meets the server's refusal."""
    clock = ManualClock(time.time() + 90)  # the server's: the client's is 90 s behind it
    ran: list[str] = []
    with _served(tmp_path, what, ran, clock) as base:
        async with AsyncClient(base, token="alice-token") as c:
            r = await c.generate("billing", "refund 9")
            (asked,) = r.pending
            live = await c.session(r.session_id)
            assert [q.id for q in live.open_requests()] == [asked.id]
            clock.advance(61)
            await live.sync()  # nothing recorded yet: the server's time says it closed
            assert live.open_requests() == []
            view = live.requests[asked.id]
            assert (view.status, view.outcome) == ("expired", "expired")
            refused = so.RequestClosed if what == "deadline" else so.SessionExpired
            with pytest.raises(refused):
                await live.respond([{"request_id": asked.id, "option_id": "approve"}])
            assert live.requests[asked.id].status == "expired"  # as the stream now records it
            assert ran == []


class _Proxy(httpx.AsyncBaseTransport):
    """The app, behind a proxy that drops `X-Signoff-Time` (no `Date` either, as ASGI gives
    none): the client cannot know the server's time. It counts the answers posted."""

    def __init__(self, app: object) -> None:
        self.inner = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        self.posted = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/responses"):
            self.posted += 1
        response = await self.inner.handle_async_request(request)
        if "x-signoff-time" in response.headers:
            del response.headers["x-signoff-time"]
        return response


async def test_an_answer_only_the_clients_clock_shows_closed_is_sent(tmp_path: Path) -> None:
    """The server's time unknown, the client's clock about 90 s fast: the request shows
    expired by that clock (it cannot know better), but the answer is sent, and the server, 55 s
    left by its clock, takes it; it was refused locally, never sent."""
    clock = ManualClock(time.time() - 90)  # the server's
    ran: list[str] = []
    agents = refund_desk(so.always(expires_in=60), ran)
    async with so.Runtime(agents, store=f"sqlite:///{tmp_path}/state.db", clock=clock) as rt:
        app = create_app(rt, auth=TokenAuth(TOKENS), sweep_every=None)
        async with app.router.lifespan_context(app):
            proxy = _Proxy(app)
            async with AsyncClient("http://t", token="alice-token", transport=proxy) as c:
                r = await c.generate("billing", "refund 9")
                (asked,) = r.pending
                clock.advance(5)
                live = await c.session(r.session_id)
                assert live.requests[asked.id].status == "expired"  # by this machine's clock
                done = await live.respond([{"request_id": asked.id, "option_id": "approve"}])
                assert proxy.posted == 1
                assert [o.outcome for o in done.outcomes] == ["approved"] and ran == ["9"]


class _Refusing(Streams):
    """`_mirrored`'s sessions, whose server refuses every answer as its request closed."""

    def __init__(self, logs: dict[str, list[so.Event]]) -> None:
        super().__init__(logs)
        self.sent: list[str] = []

    async def respond(
        self, session_id: str, responses: Sequence[so.InputResponse | Mapping[str, Any]]
    ) -> RemoteResult:
        self.sent.append(session_id)
        raise so.RequestClosed("request m1 is expired; it takes no answers", ["m1"])


async def test_a_mirror_closed_by_its_subagents_record_is_refused_here_by_time_sent() -> None:
    """With the server's time reckoned (no `clock` given), a mirror shown closed only by its
    subagent's deadline passing is sent for the server to judge; one whose subagent's stream
    recorded its request closed is refused here, as before."""
    remote = _Refusing(_mirrored().logs)
    live = LiveSession(remote, "p")  # by this machine's clock: past the subagent's deadline, 50
    await live.sync()
    assert live.requests["m1"].status == "expired"
    answer = {"request_id": "m1", "option_id": "approve"}
    with pytest.raises(so.RequestClosed):
        await live.respond([answer])
    assert remote.sent == ["p"]  # the server's refusal
    resolved = {"request_id": "r1", "status": "settled", "outcome": "cancelled"}
    remote.logs["c"].append(_event("c", 2, "input.resolved", resolved))
    await live.sync()
    assert live.requests["m1"].status == "settled"
    with pytest.raises(so.RequestClosed, match="m1 is settled"):
        await live.respond([answer])
    assert remote.sent == ["p"]  # recorded closed: refused here
