"""The server's time as a client knows it: every response gives the runtime's clock in
`X-Signoff-Time`, and `AsyncClient.server_time` reckons the server's time from it (else from
`Date`), not from the client machine's clock."""

from __future__ import annotations

import json
import time
from email.utils import formatdate
from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff import _server_clock
from signoff._server_clock import TIME_HEADER, ServerClock
from signoff.server import AsyncClient, create_app
from signoff.testing import ManualClock

from ._server_api import in_process
from .test_server_common import make_agents


async def test_every_answer_gives_the_runtimes_time(store_url: str) -> None:
    """A call's answer, a refusal, an event stream's and a page's: each says the time of the
    runtime's clock as it was sent, to the millisecond."""
    clock = ManualClock(1_800_000_000.25)
    rt = so.Runtime(make_agents(), store=store_url, clock=clock)
    async with rt, in_process(rt) as c:
        listed = await c.get("/v1/sessions")
        assert listed.status_code == 200 and listed.headers[TIME_HEADER] == "1800000000.250"
        clock.advance(1.5)
        unknown = await c.get("/v1/sessions/ses_nope")
        assert unknown.status_code == 404 and unknown.headers[TIME_HEADER] == "1800000001.750"
        refused = await c.get("/v1/sessions", headers={"Authorization": "Bearer wrong"})
        assert refused.status_code == 401 and TIME_HEADER in refused.headers
        created = await c.post("/v1/sessions", json={"agent": "support"})
        sid = created.json()["session_id"]
        async with c.stream("GET", f"/v1/sessions/{sid}/events?follow=false") as stream:
            assert stream.headers[TIME_HEADER] == "1800000001.750"
        page = await c.get("/_signoff")
        assert TIME_HEADER in page.headers


def _failing_auth(request: object) -> None:
    raise RuntimeError("the authenticator broke")


async def test_a_server_failure_gives_the_time_too(tmp_path: Path) -> None:
    """A 500 is sent from outside the app's middleware: its handler adds the time."""
    clock = ManualClock(1_800_000_000.0)
    async with so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db", clock=clock) as rt:
        app = create_app(rt, auth=_failing_auth, sweep_every=None)
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            r = await c.get("/v1/requests")
        assert r.status_code == 500 and r.headers[TIME_HEADER] == "1800000000.000"


async def test_the_time_given_is_the_runtimes_on_each_store(store_url: str) -> None:
    """On its default clock too (on PostgreSQL the database's, as the runtime reckons it)."""
    async with so.Runtime(make_agents(), store=store_url) as rt, in_process(rt) as c:
        before = rt.now()
        given = float((await c.get("/v1/sessions")).headers[TIME_HEADER])
        assert before <= given <= rt.now()


def test_a_server_clock_reckons_from_the_header_not_this_machines_clock(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From the header, the wall clock 90 s off plays no part; a later `Date` (a proxy's, whole
    seconds) does not overrule it; a header that is no time is passed over."""
    monkeypatch.setattr(_server_clock, "_wall", lambda: time.time() + 90)
    clock = ServerClock()
    assert abs(clock.now() - (time.time() + 90)) < 1  # nothing measured yet: the machine's
    clock.seen({TIME_HEADER: "1000.5"})
    assert 1000.5 <= clock.now() < 1001.5
    clock.seen({"Date": formatdate(2000.0, usegmt=True)})
    assert clock.now() < 1001.5
    for bad in ("soon", "nan", "inf", "1e400", "-5", ""):
        clock.seen({TIME_HEADER: bad})
        assert 1000.5 <= clock.now() < 1001.5


def test_a_server_clock_reckons_from_date_when_not_given_the_time() -> None:
    """A server that does not give the time (another version): its `Date`, whole seconds, is
    the next best; one unreadable is passed over."""
    clock = ServerClock()
    stamp = time.time() - 90
    clock.seen({"Date": formatdate(stamp, usegmt=True)})
    assert stamp - 1 <= clock.now() < stamp + 1
    clock.seen({"Date": "not a date"})
    assert stamp - 1 <= clock.now() < stamp + 1
    clock.seen({"Date": "Mon, 20 Jan 2025 10:00:00 -0000"})  # no zone given: UTC
    assert 1737367200.0 <= clock.now() < 1737367201.0


async def test_an_async_client_gives_the_servers_time_its_answers_say() -> None:
    """Any answer measures it, an error's too; before any, it is this machine's clock."""
    ahead = time.time() + 3600

    def serve(request: httpx.Request) -> httpx.Response:
        error = {"error": {"code": "unknown_session", "message": "m"}}
        return httpx.Response(404, json=error, headers={TIME_HEADER: f"{ahead:.3f}"})

    async with AsyncClient("http://signoff.test", transport=httpx.MockTransport(serve)) as c:
        assert abs(c.server_time() - time.time()) < 5
        with pytest.raises(so.UnknownSession):
            await c.state("ses_nope")
        assert ahead - 1 < c.server_time() < ahead + 5


async def test_a_live_session_takes_the_clients_reckoning_of_the_servers_time() -> None:
    """A `LiveSession` made over an `AsyncClient` (`session()`, or by hand) goes by
    `server_time`: a request whose deadline is past by this machine's clock, not the server's,
    shows open."""
    from signoff._live_session import LiveSession

    server_now = time.time() - 90
    asked = {
        "kind": "question",
        "id": "r1",
        "session_id": "s1",
        "turn_id": "t1",
        "agent": "support",
        "question": "which order?",
        "allow_text": True,
        "created_at": server_now,
        "expires_at": server_now + 60,
    }
    event = {"session_id": "s1", "seq": 1, "type": "input.requested", "at": server_now}
    data = json.dumps({**event, "data": {"requests": [asked]}})
    body = f"id: 1\nevent: input.requested\ndata: {data}\n\n"

    def serve(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream", TIME_HEADER: f"{server_now:.3f}"}
        return httpx.Response(200, text=body, headers=headers)

    async with AsyncClient("http://signoff.test", transport=httpx.MockTransport(serve)) as c:
        live = await c.session("s1")
        assert [q.id for q in live.open_requests()] == ["r1"]
        by_hand = LiveSession(c, "s1")
        await by_hand.sync()
        assert [q.id for q in by_hand.open_requests()] == ["r1"]
        mine = LiveSession(c, "s1", clock=time.time)  # a clock given is used as it is
        await mine.sync()
        assert mine.open_requests() == []
