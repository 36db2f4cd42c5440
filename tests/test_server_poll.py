"""`poll_interval` and `heartbeat` are bounded when the app is built: a `poll_interval` near
1e306 overflowed the `retry:` line every event stream starts with, a 500 for each stream
instead of a `UsageError` at start; a `heartbeat` of days let a stream go silent (and unchecked
for its sign-in) that long."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.server._app import MAX_HEARTBEAT, MAX_POLL_INTERVAL

from .test_server_common import TOKENS, auth, make_runtime


def test_poll_interval_is_at_most_an_hour(tmp_path: Path) -> None:
    runtime = make_runtime(f"sqlite:///{tmp_path / 'state.db'}")
    for bad in (1e306, 1.7e308, MAX_POLL_INTERVAL + 0.5):
        with pytest.raises(so.UsageError, match="poll_interval must be at most 3600 seconds"):
            create_app(runtime, auth=TokenAuth(TOKENS), poll_interval=bad)
    app = create_app(
        runtime, auth=TokenAuth(TOKENS), poll_interval=MAX_POLL_INTERVAL, sweep_every=None
    )
    with TestClient(app) as client:
        sid = client.post("/v1/sessions", json={"agent": "support"}, headers=auth("alice-token"))
        path = f"/v1/sessions/{sid.json()['session_id']}/events"
        r = client.get(path, params={"follow": "false"}, headers=auth("alice-token"))
        assert r.status_code == 200, r.text
        assert r.text.startswith(f"retry: {int(MAX_POLL_INTERVAL * 1000)}\n"), r.text[:80]


def test_heartbeat_is_at_most_an_hour(tmp_path: Path) -> None:
    """It is how long a quiet stream sends nothing (a proxy cuts it off sooner), how often a
    cookie's stream checks its sign-in, and the `Retry-After` of a 429 `too_many_streams`."""
    runtime = make_runtime(f"sqlite:///{tmp_path / 'state.db'}")
    assert MAX_HEARTBEAT == 3600
    for bad in (1e306, 1.7e308, 86400, MAX_HEARTBEAT + 0.5):
        with pytest.raises(so.UsageError, match="heartbeat must be at most 3600 seconds"):
            create_app(runtime, auth=TokenAuth(TOKENS), heartbeat=bad)
    for bad in (0, -1, float("inf"), float("nan")):
        with pytest.raises(so.UsageError, match="heartbeat must be positive"):
            create_app(runtime, auth=TokenAuth(TOKENS), heartbeat=bad)
    app = create_app(
        runtime, auth=TokenAuth(TOKENS), heartbeat=MAX_HEARTBEAT, max_streams=1, sweep_every=None
    )
    with TestClient(app) as client:
        sid = client.post("/v1/sessions", json={"agent": "support"}, headers=auth("alice-token"))
        path = f"/v1/sessions/{sid.json()['session_id']}/events"
        with client.stream("GET", path, headers=auth("alice-token")) as held:
            assert held.status_code == 200
            r = client.get(path, params={"follow": "false"}, headers=auth("alice-token"))
            assert r.status_code == 429, r.text
            assert r.headers["Retry-After"] == "3600"
