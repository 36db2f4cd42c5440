"""The live streams (`/v1/sessions/{id}/events`, `/_signoff/stream`) over real HTTP: headers for
proxies, resuming, and what happens to an open stream when the server stops."""

from __future__ import annotations

import signal
import tempfile
import threading
import time
from pathlib import Path

import httpx
import pytest

from .test_server_common import auth, read_sse, served, spawn_serve


@pytest.fixture
def store(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/state.db"


def test_both_streams_tell_proxies_not_to_buffer_or_cache(store: str) -> None:
    """nginx buffers a proxied response unless told otherwise (`X-Accel-Buffering: no`): the
    dashboard's queue would then update only when the buffer fills."""
    with served(store) as base, httpx.Client(base_url=base, headers=auth("alice-token")) as c:
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
            c = httpx.Client(base_url=base, headers=auth("alice-token"), timeout=30)
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
    with served(store) as base, httpx.Client(base_url=base, headers=auth("alice-token")) as c:
        body = c.post("/v1/sessions", json={"agent": "support", "message": "Refund 1042"}).json()
        url = f"/v1/sessions/{body['session_id']}/events"
        for bad in ("1_0", "+2", "-0", "1e3", "0x1", "3.0", "abc"):
            r = c.get(url, params={"follow": "false"}, headers={"Last-Event-ID": bad})
            assert r.status_code == 422, (bad, r.text)
            assert r.json()["error"]["code"] == "invalid_request"
        with c.stream("GET", url, params={"follow": "false"}, headers={"Last-Event-ID": "2"}) as s:
            assert [e["id"] for e in read_sse(s)] == ["3", "4", "5"]


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
    with running(app) as base, httpx.Client(base_url=base, headers=auth("alice-token")) as c:
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
