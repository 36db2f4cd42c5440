"""`poll_interval` is bounded when the app is built: near 1e306 it overflowed the `retry:` line
every event stream starts with, a 500 for each stream instead of a `UsageError` at start."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient

import signoff as so
from signoff.server import TokenAuth, create_app
from signoff.server._app import MAX_POLL_INTERVAL

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
