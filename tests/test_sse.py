"""The live streams (`/v1/sessions/{id}/events`, `/_signoff/stream`) over real HTTP: headers for
proxies, resuming, and what happens to an open stream when the server stops."""

from __future__ import annotations

import json
import math
import signal
import sqlite3
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from .test_server_common import PLAIN, auth, read_sse, served, spawn_serve


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


def test_both_streams_tell_proxies_not_to_buffer_or_cache(store: str) -> None:
    """nginx buffers a proxied response unless told otherwise (`X-Accel-Buffering: no`): the
    dashboard's queue would then update only when the buffer fills."""
    with (
        served(store) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        sid = c.post("/v1/sessions", json={"agent": "support"}).json()["session_id"]
        for path in (f"/v1/sessions/{sid}/events", "/_signoff/stream"):
            with c.stream("GET", path) as s:
                assert s.status_code == 200, path
                assert s.headers["content-type"].startswith("text/event-stream"), path
                assert s.headers["cache-control"] == "no-store", path
                assert s.headers["x-accel-buffering"] == "no", path


def test_signoff_serve_stops_promptly_with_streams_open(tmp_path: Path) -> None:
    """SIGTERM (docker stop, systemd) with a dashboard open: uvicorn waits for open responses
    to finish, and a followed stream never does; the streams end at once instead."""
    store = f"sqlite:///{tmp_path}/state.db"
    with tempfile.TemporaryFile() as log:
        proc, base = spawn_serve(store, ["alice-token=alice"], log)
        try:
            c = httpx.Client(base_url=base, headers=auth("alice-token"), timeout=30, verify=PLAIN)
            sid = c.post("/v1/sessions", json={"agent": "support"}).json()["session_id"]
            ended: list[str] = []
            opened = threading.Semaphore(0)

            def hold(path: str) -> None:
                with c.stream("GET", path) as s:
                    opened.release()
                    for _ in s.iter_lines():
                        pass
                ended.append(path)

            paths = [f"/v1/sessions/{sid}/events", "/_signoff/stream"]
            threads = [threading.Thread(target=hold, args=(p,), daemon=True) for p in paths]
            for t in threads:
                t.start()
            for _ in paths:
                assert opened.acquire(timeout=10)
            time.sleep(0.3)  # both are past their first poll
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except Exception:
                log.seek(0)
                pytest.fail(f"the server did not stop:\n{log.read().decode(errors='replace')}")
            for t in threads:
                t.join(timeout=5)
            assert sorted(ended) == sorted(paths)  # each stream ended cleanly, not cut off
            c.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_last_event_id_is_plain_digits(store: str) -> None:
    """`int()` also reads `1_0` as 10 and `+2` as 2: an id the server never sent is refused,
    not taken to mean another one."""
    with (
        served(store) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        body = c.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"}).json()
        url = f"/v1/sessions/{body['session_id']}/events"
        for bad in ("1_0", "+2", "-0", "1e3", "0x1", "3.0", "abc"):
            r = c.get(url, params={"follow": "false"}, headers={"Last-Event-ID": bad})
            assert r.status_code == 422, (bad, r.text)
            assert r.json()["error"]["code"] == "invalid_request"
        with c.stream("GET", url, params={"follow": "false"}, headers={"Last-Event-ID": "2"}) as s:
            assert [e["id"] for e in read_sse(s)] == ["3", "4", "5"]


def test_last_event_id_takes_precedence_over_after(store: str) -> None:
    """A reconnecting EventSource asks its first URL again (`?after=` included) with the id of
    the last event it got: the header says where to resume, lower or higher than `after`."""
    with (
        served(store) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        body = c.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"}).json()
        url = f"/v1/sessions/{body['session_id']}/events"
        for after, last, ids in ((4, "2", ["3", "4", "5"]), (1, "4", ["5"])):
            params = {"follow": "false", "after": str(after)}
            with c.stream("GET", url, params=params, headers={"Last-Event-ID": last}) as s:
                assert [e["id"] for e in read_sse(s)] == ids, (after, last)


def test_an_idle_dashboard_stream_does_not_rescan_the_queue(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reviewer without `admin` sees the queue through the access rule, which means reading
    every open request and its session; each open dashboard did that at every poll (20 tabs
    over 200 open requests kept 40% of a core busy). It is redone only when the queue changed."""
    from signoff.server import TokenAuth, create_app
    from signoff.server._context import ServerContext

    from .test_server_common import TOKENS, make_runtime, running

    scans = [0]
    scan = ServerContext.visible_requests

    async def counted(self: ServerContext, *args: object, **kwargs: object) -> object:
        scans[0] += 1
        return await scan(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ServerContext, "visible_requests", counted)
    runtime = make_runtime(f"sqlite:///{tmp_path}/state.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.02, sweep_every=None)
    with (
        running(app) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        for _ in range(3):
            c.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"})
        with c.stream("GET", "/_signoff/stream") as s:
            lines = s.iter_lines()
            assert next(line for line in lines if line.startswith("data:"))
            before = scans[0]
            time.sleep(0.5)  # some 25 polls with nothing new
            idle = scans[0] - before
            c.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"})
            data = next(line for line in lines if line.startswith("data:"))
            assert '"total":4' in data
    assert idle <= 1, f"{idle} scans of an unchanged queue"


def _follow_until_closed(
    response: httpx.Response, when_seen: str, act: Callable[[], None], timeout: float = 10.0
) -> list[str]:
    """Every line of a followed stream until the server closes it; `act` runs once `when_seen`
    has arrived. Fails when the stream is still open after `timeout` (keep-alives only)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    for line in response.iter_lines():
        seen.append(line)
        if line == when_seen:
            act()
        if time.monotonic() > deadline:
            pytest.fail(f"the stream stayed open; last lines: {seen[-5:]}")
    return seen


def _end_event(lines: list[str]) -> dict[str, Any]:
    """The data of the stream's final `stream.end` event, which carries no id."""
    at = lines.index("event: stream.end")
    assert not lines[at - 1].startswith("id:"), lines[at - 3 : at + 2]
    assert all(not line.startswith(("id:", "data:")) for line in lines[at + 2 :]), lines[at:]
    data: dict[str, Any] = json.loads(lines[at + 1].removeprefix("data: "))
    return data


def _assert_not_alive(c: httpx.Client) -> None:
    """`/healthz` fails (`store_gone`) once a stream met the store gone, before any other
    request meets it: it stayed 200 after a stream's `stream.end` said so."""
    r = c.get("/healthz")
    assert r.status_code == 503 and r.json()["error"]["code"] == "store_gone", r.text


def test_a_stream_ends_when_its_sqlite_file_is_deleted(tmp_path: Path) -> None:
    """A store file deleted under the server never comes back: the stream used to wait for it
    with keep-alives for ever. It ends with a `stream.end` event naming why, `/healthz` fails
    from then on, and a reconnect is refused (503), which makes an EventSource stop."""
    from signoff.server import TokenAuth, create_app

    from .test_server_common import TOKENS, make_runtime, running

    path = tmp_path / "state.db"
    runtime = make_runtime(f"sqlite:///{path}")
    app = create_app(
        runtime, auth=TokenAuth(TOKENS), poll_interval=0.02, heartbeat=0.1, sweep_every=None
    )
    with (
        running(app) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        sid = c.post("/v1/sessions", json={"agent": "support"}).json()["session_id"]

        def delete() -> None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)

        with c.stream("GET", f"/v1/sessions/{sid}/events") as s:
            lines = _follow_until_closed(s, "id: 1", delete)
        end = _end_event(lines)
        assert end["status"] == 503 and end["error"]["code"] == "store_gone", end
        assert str(path) not in end["error"]["message"]  # the server's log names the file
        _assert_not_alive(c)
        r = c.get(f"/v1/sessions/{sid}/events")
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_gone", r.text


def test_the_dashboard_stream_ends_when_its_sqlite_file_is_deleted(tmp_path: Path) -> None:
    """The queue's stream waited with keep-alives for a deleted store file; it ends with
    `stream.end`, `/healthz` fails from then on, and the page's EventSource reconnecting gets a
    503, which stops it."""
    from signoff.server import TokenAuth, create_app

    from .test_server_common import TOKENS, make_runtime, running

    path = tmp_path / "state.db"
    runtime = make_runtime(f"sqlite:///{path}")
    app = create_app(
        runtime, auth=TokenAuth(TOKENS), poll_interval=0.02, heartbeat=0.1, sweep_every=None
    )
    with (
        running(app) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        c.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"})

        def delete() -> None:
            for suffix in ("", "-wal", "-shm"):
                Path(f"{path}{suffix}").unlink(missing_ok=True)

        with c.stream("GET", "/_signoff/stream") as s:
            lines = _follow_until_closed(s, "event: queue", delete)
        end = _end_event(lines)
        assert end["status"] == 503 and end["error"]["code"] == "store_gone", end
        _assert_not_alive(c)
        r = c.get("/_signoff/stream")
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_gone", r.text


class _Expired(NamedTuple):
    """A session whose stream ended as its TTL passed, and the client that followed it."""

    client: httpx.Client
    sid: str
    rid: str
    head: int  # the session's seq when its stream ended
    url: str  # its event stream
    lines: list[str]  # what the stream sent


@contextmanager
def _followed_past_its_ttl(tmp_path: Path) -> Iterator[_Expired]:
    """A session of a TTL app left waiting on a request, its stream followed while its TTL
    passes (the stream ends), on a running server."""
    from .test_server_common import running, ttl_app

    now = [1_000_000.0]
    _, app = ttl_app(tmp_path, now)
    with (
        running(app) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        body = c.post("/v1/sessions", json={"agent": "desk", "message": "reset"}).json()
        sid, rid = body["session_id"], body["pending"][0]["id"]
        head = c.get(f"/v1/sessions/{sid}").json()["seq"]
        url = f"/v1/sessions/{sid}/events"

        def expire() -> None:
            now[0] += 120

        with c.stream("GET", url) as s:
            lines = _follow_until_closed(s, f"id: {head}", expire)
        yield _Expired(c, sid, rid, head, url, lines)


def test_a_stream_of_a_session_that_expires_ends_and_a_reconnect_is_410(tmp_path: Path) -> None:
    """A session whose TTL passed takes no more events: its stream used to stay open with
    keep-alives for ever. It ends with `stream.end` (`session_expired`, naming the requests
    the expiry closes); an EventSource reconnecting with the last id gets 410 and stops, one
    that missed events first gets them and the end again; reading it without following works."""
    with _followed_past_its_ttl(tmp_path) as (c, sid, rid, head, url, lines):
        end = _end_event(lines)
        assert end["status"] == 410, end
        assert end["error"]["code"] == "session_expired" and end["error"]["session_id"] == sid
        assert end["error"]["request_ids"] == [rid]

        r = c.get(url, headers={"Last-Event-ID": str(head)})
        assert r.status_code == 410 and r.json()["error"]["code"] == "session_expired", r.text
        with c.stream("GET", url, headers={"Last-Event-ID": str(head - 2)}) as s:
            lines = _follow_until_closed(s, "", lambda: None)
        assert [x for x in lines if x.startswith("id:")] == [f"id: {head - 1}", f"id: {head}"]
        assert _end_event(lines)["error"]["code"] == "session_expired"
        history = c.get(url, params={"follow": "false"})
        assert history.status_code == 200 and f"id: {head}" in history.text
        assert "stream.end" not in history.text
        # from its last event too: nothing more, not the 410 a follower gets
        caught_up = c.get(url, params={"follow": "false"}, headers={"Last-Event-ID": str(head)})
        assert caught_up.status_code == 200, caught_up.text
        assert "id: " not in caught_up.text and "stream.end" not in caught_up.text


def test_the_expiry_of_a_waiting_turn_reaches_a_reconnect_once_a_read_records_it(
    tmp_path: Path,
) -> None:
    """docs/server.md: the stream ends at the TTL without writing the expiry's events; the
    session's next read records them (its requests expire, its turn fails), and a reconnect
    from the last id then gets `input.resolved` and `turn.failed` before `stream.end`."""
    with _followed_past_its_ttl(tmp_path) as (c, sid, rid, head, url, lines):
        assert "event: turn.failed" not in lines and _end_event(lines)["status"] == 410
        view = c.get(f"/v1/sessions/{sid}").json()
        assert view["status"] == "failed" and view["seq"] > head, view
        with c.stream("GET", url, headers={"Last-Event-ID": str(head)}) as s:
            lines = _follow_until_closed(s, "", lambda: None)
        types = [x.removeprefix("event: ") for x in lines if x.startswith("event: ")]
        assert types == ["input.resolved", "turn.failed", "stream.end"], types
        data = lines[lines.index("event: input.resolved") + 1].removeprefix("data: ")
        resolved = json.loads(data)
        assert resolved["data"]["request_id"] == rid, resolved


def test_a_stream_of_a_session_deleted_from_the_store_ends(tmp_path: Path) -> None:
    """An operator deleting a session's rows: its stream waited for ever; it ends with
    `stream.end` (`unknown_session`), and a reconnect is a 404."""
    from .test_server_common import running, ttl_app

    now = [1_000_000.0]
    _, app = ttl_app(tmp_path, now)
    with (
        running(app) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        sid = c.post("/v1/sessions", json={"agent": "desk"}).json()["session_id"]

        def delete() -> None:
            with sqlite3.connect(tmp_path / "ttl.db") as db:
                (sk,) = db.execute("SELECT sk FROM sessions WHERE id=?", (sid,)).fetchone()
                for table in ("events", "snapshots", "requests", "leases", "sessions"):
                    db.execute(f"DELETE FROM {table} WHERE sk=?", (sk,))
            db.close()

        with c.stream("GET", f"/v1/sessions/{sid}/events") as s:
            lines = _follow_until_closed(s, "id: 1", delete)
        end = _end_event(lines)
        assert end["status"] == 404 and end["error"]["code"] == "unknown_session", end
        r = c.get(f"/v1/sessions/{sid}/events")
        assert r.status_code == 404 and r.json()["error"]["code"] == "unknown_session"


def test_signoff_serve_stops_with_a_stream_whose_client_never_reads(tmp_path: Path) -> None:
    """A client that opens a stream and never reads fills the socket's buffers: the stream then
    waits to write (memory stays bounded) and never sees the server stopping, and uvicorn waited
    for it for ever. The server drops such a connection once it has begun to stop."""
    import socket
    import subprocess

    store = f"sqlite:///{tmp_path}/state.db"
    with tempfile.TemporaryFile() as log:
        proc, base = spawn_serve(store, ["alice-token=alice"], log)
        try:
            c = httpx.Client(base_url=base, headers=auth("alice-token"), timeout=60, verify=PLAIN)
            sid = c.post("/v1/sessions", json={"agent": "support"}).json()["session_id"]
            for _ in range(4):  # some 24 MB of events: more than any socket buffers
                r = c.post(f"/v1/sessions/{sid}/messages", json={"text": "x" * 3_000_000})
                assert r.status_code == 200, r.text[:200]
            port = int(base.rsplit(":", 1)[1])
            stalled = socket.socket()
            stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            stalled.connect(("127.0.0.1", port))
            stalled.sendall(
                f"GET /v1/sessions/{sid}/events HTTP/1.1\r\nHost: t\r\n"
                "Authorization: Bearer alice-token\r\n\r\n".encode()
            )
            time.sleep(1.5)  # the server has filled the buffers and waits to write
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                log.seek(0)
                pytest.fail(f"the server did not stop:\n{log.read().decode(errors='replace')}")
            stalled.close()
            c.close()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_a_last_event_id_past_the_session_is_refused(store: str) -> None:
    """An id this session never reached (a store restored from an older backup, a client mixing
    sessions) made a followed stream wait in silence until the session caught up, skipping every
    event before it. It is refused, as any id the server never sent; garbage too, whatever it is."""
    with (
        served(store) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        sid = c.post("/v1/sessions", json={"agent": "support"}).json()["session_id"]
        url = f"/v1/sessions/{sid}/events"
        ids = [b"2", b"999999", b"%d" % 2**53, b"-1", b"%d" % 2**64, b"9" * 5000, b"1 2"]
        for bad in [*ids, b"\xb3"]:  # "³" in latin-1: a digit to str.isdigit()
            r = c.get(url, params={"follow": "false"}, headers={b"Last-Event-ID": bad})
            assert r.status_code == 422, (bad, r.text)
            assert r.json()["error"]["code"] == "invalid_request"
        r = c.get(url, headers={"Last-Event-ID": "999999"})  # following: refused, not held
        assert r.status_code == 422, r.text
        r = c.get(url, params={"after": 5})
        assert r.status_code == 422 and "past" in r.json()["error"]["message"], r.text
        with c.stream("GET", url, params={"follow": "false"}, headers={"Last-Event-ID": "1"}) as s:
            assert read_sse(s) == []


def test_a_stream_read_in_small_bounded_reads_loses_no_event(
    store: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read of a stream holds at most `stores.READ_BYTES` of events, so a read may stop
    short of the log's end: the stream reads on from there, without and with following."""
    import signoff.stores

    monkeypatch.setattr(signoff.stores, "READ_BYTES", 1)  # one event per read
    with (
        served(store) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        body = c.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"}).json()
        url = f"/v1/sessions/{body['session_id']}/events"
        with c.stream("GET", url, params={"follow": "false"}) as s:
            ids = [int(e["id"]) for e in read_sse(s)]
        assert ids == list(range(1, ids[-1] + 1)) and len(ids) >= 4
        with c.stream("GET", url) as s:
            assert [int(e["id"]) for e in read_sse(s, count=len(ids))] == ids


def test_a_followed_stream_ends_exactly_when_the_session_ttl_passes(tmp_path: Path) -> None:
    """The boundary of a session's expiry, on the runtime's clock: one tick before its
    `expires_at` the stream stays open (keep-alives) and a reconnect is served; at it, the open
    stream ends with `stream.end` (410) and a reconnect is refused, as it is after it."""
    from .test_server_common import running, ttl_app

    now = [1_000_000.0]
    _, app = ttl_app(tmp_path, now)
    with (
        running(app) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        sid = c.post("/v1/sessions", json={"agent": "desk", "message": "reset"}).json()[
            "session_id"
        ]
        view = c.get(f"/v1/sessions/{sid}").json()
        head, expires = view["seq"], view["expires_at"]
        assert expires == now[0] + 60
        url, resume = f"/v1/sessions/{sid}/events", {"Last-Event-ID": str(view["seq"])}
        now[0] = math.nextafter(expires, -math.inf)
        beats: list[float] = []

        def tick() -> None:
            beats.append(now[0])
            if len(beats) == 3:  # open for three heartbeats one tick before: now it expires
                now[0] = expires

        with c.stream("GET", url, headers=resume) as s:
            assert s.status_code == 200
            lines = _follow_until_closed(s, ": keep-alive", tick, timeout=5)
        assert beats[:3] == [math.nextafter(expires, -math.inf)] * 3
        assert [x for x in lines if x.startswith("id:")] == []
        end = _end_event(lines)
        assert end["status"] == 410 and end["error"]["code"] == "session_expired", end
        for at in (expires, math.nextafter(expires, math.inf)):
            now[0] = at
            r = c.get(url, headers=resume)
            assert r.status_code == 410 and r.json()["error"]["code"] == "session_expired", at
        assert c.get(url, params={"follow": "false"}).text.count(f"id: {head}\n") == 1


async def test_a_stream_ends_only_once_it_has_sent_what_another_process_wrote(
    tmp_path: Path,
) -> None:
    """Between a followed stream's empty read and its read of the session's state, another
    process recorded the session's expiry (`input.resolved`, `turn.failed`): the stream ended
    with `stream.end` at once, and those events were never sent. The end waits until the
    stream has read up to the state it judged."""
    import signoff as so
    from signoff.server import create_app
    from signoff.server._sse import session_end
    from signoff.testing import ManualClock

    from ._ttl import ttl_agent

    clock = ManualClock()
    url = f"sqlite:///{tmp_path / 's.db'}"
    rt = so.Runtime([ttl_agent()], store=url, clock=clock)
    app = create_app(rt, dev=True, sweep_every=None)
    async with app.router.lifespan_context(app):
        r = await rt.generate("desk", prompt="reset")
        assert r.status == "waiting"
        sent = await rt.store.head(r.session_id)  # all the stream has sent
        assert sent is not None
        clock.advance(61)
        async with so.Runtime([ttl_agent()], store=url, clock=clock) as other:
            assert (await other.state(r.session_id)).status == "failed"  # recorded there
        ctx = app.state.signoff
        ended, _ = await session_end(ctx, r.session_id, sent)
        assert ended is None  # read on: the expiry's events first
        head = await rt.store.head(r.session_id)
        assert head is not None and head > sent
        ended, _ = await session_end(ctx, r.session_id, head)
        assert isinstance(ended, so.SessionExpired)


def test_a_stream_not_followed_sends_nothing_written_after_it_began(store: str) -> None:
    """`?follow=false` is a snapshot as of the request, but the stream sent each read's batch
    whole: one read after events were written (its first read stopped short) sent them too,
    past the head the request had read. It sends none past it."""
    from signoff.server import TokenAuth, create_app

    from .test_server_common import TOKENS, make_runtime, running

    runtime = make_runtime(store)
    reads: dict[str, int] = {}  # of the snapshot's session, once it is armed
    read = runtime.store.read_events

    async def first_read_short(session_id: str, **kw: Any) -> Any:
        n = reads.get(session_id)
        if n is not None:
            reads[session_id] = n + 1
            if n == 0:  # a read bounded by bytes, stopping after one event
                kw["limit"] = 1
            elif n == 1:  # more events, written while the snapshot is read
                await runtime.send(
                    session_id, "and order 1043 too", principal=TOKENS["alice-token"]
                )
        return await read(session_id, **kw)

    runtime.store.read_events = first_read_short  # type: ignore[method-assign,assignment]
    app = create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=0.05)
    with (
        running(app) as base,
        httpx.Client(base_url=base, headers=auth("alice-token"), verify=PLAIN) as c,
    ):
        body = c.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"}).json()
        sid = body["session_id"]
        url = f"/v1/sessions/{sid}/events"
        head = c.get(f"/v1/sessions/{sid}").json()["seq"]
        reads[sid] = 0
        with c.stream("GET", url, params={"follow": "false"}) as s:
            seen = [int(event["id"]) for event in read_sse(s)]
        assert reads[sid] >= 2 and c.get(f"/v1/sessions/{sid}").json()["seq"] > head
        assert seen == list(range(1, head + 1)), (seen, head)
