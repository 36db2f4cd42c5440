"""A session's event stream over HTTP while a live drive runs its turn past the session's TTL
(a tool slower than the TTL): the session is not idle, so the stream follows it to its end."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import httpx

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.testing import call, call_tools, reply, scripted_agent

from .test_server_common import ALICE, PLAIN, TOKENS, auth, running


def test_a_stream_of_a_turn_running_past_the_ttl_follows_it_to_the_end(tmp_path: Path) -> None:
    """The stream was refused (410 session_expired) once the last event, tool.started, was
    older than the TTL, though another process's drive held the turn and completed it: a
    dashboard or client following it stopped and never saw the end. It is served and follows
    the turn to turn.completed."""
    now = [1_000_000.0]
    started, go = threading.Event(), threading.Event()

    @so.tool()
    async def slow(x: str) -> str:
        """Take a while."""
        started.set()
        await asyncio.to_thread(go.wait, 30)
        return "done"

    agent = scripted_agent(
        "a",
        [call_tools(call("slow", x="1")), reply("ok")],
        tools=[slow],
        limits=so.Limits(ttl=60),
    )
    url = f"sqlite:///{tmp_path}/s.db"
    results: list[Any] = []

    def drive() -> None:  # another process's worker, holding the turn's lease
        async def main() -> None:
            async with so.Runtime([agent], store=url, clock=lambda: now[0], lease_ttl=600) as rt:
                results.append(await rt.generate("a", prompt="hi", auth=ALICE))

        asyncio.run(main())

    driving = threading.Thread(target=drive, daemon=True)
    driving.start()
    try:
        assert started.wait(10)
        runtime = so.Runtime([agent], store=url, clock=lambda: now[0])
        app = create_app(
            runtime, auth=TokenAuth(TOKENS), poll_interval=0.02, heartbeat=0.1, sweep_every=None
        )
        with (
            running(app) as base,
            httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
        ):
            [row] = c.get("/v1/sessions").json()["items"]
            head = c.get(f"/v1/sessions/{row['id']}").json()["seq"]
            now[0] += 61
            lines: list[str] = []
            beats = 0
            resume = {"Last-Event-ID": str(head)}
            with c.stream("GET", f"/v1/sessions/{row['id']}/events", headers=resume) as s:
                assert s.status_code == 200, s.read()
                deadline = time.monotonic() + 10
                for line in s.iter_lines():
                    lines.append(line)
                    if line == ": keep-alive":
                        beats += 1
                        if beats == 3:  # open for three heartbeats past the TTL: now it ends
                            go.set()
                    if line in ("event: turn.completed", "event: stream.end"):
                        break
                    assert time.monotonic() < deadline, lines[-5:]
            assert "event: stream.end" not in lines, lines[-5:]
            assert [x for x in lines if x.startswith("event:")][-2:] == [
                "event: model.completed",
                "event: turn.completed",
            ]
    finally:
        go.set()
        driving.join(10)
    assert results and results[0].status == "completed"


async def test_the_sessions_listing_shows_a_turn_running_past_the_ttl_running(
    store_url: str,
) -> None:
    """GET /v1/sessions listed the session `failed` (and counted it under `status=failed`)
    while the drive holding its turn ran it on past the TTL: it is listed `running`."""
    from signoff.testing import ManualClock

    clock = ManualClock()
    started, go = asyncio.Event(), asyncio.Event()

    @so.tool()
    async def slow(x: str) -> str:
        """Take a while."""
        started.set()
        await go.wait()
        return "done"

    agent = scripted_agent(
        "a", [call_tools(call("slow", x="1")), reply("ok")], tools=[slow], limits=so.Limits(ttl=60)
    )
    runtime = so.Runtime([agent], store=store_url, clock=clock, lease_ttl=600)
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None, close_runtime=True)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=auth("alice-token")
        ) as c,
    ):
        turn = asyncio.create_task(runtime.generate("a", prompt="hi", auth=ALICE))
        try:
            await started.wait()
            clock.advance(61)
            listed = (await c.get("/v1/sessions")).json()
            assert [r["status"] for r in listed["items"]] == ["running"], listed
            for status, total in (("running", 1), ("failed", 0)):
                listed = (await c.get("/v1/sessions", params={"status": status})).json()
                assert listed["total"] == total and len(listed["items"]) == total, (status, listed)
        finally:
            go.set()
            result = await turn
        assert result.status == "completed"
