"""Event streams held open as a resource attack: each open stream polls the store for as long as
its client keeps the connection, so one caller opening thousands of them (a script's loop, a
slowloris-like client that never reads) made the store serve them all. A caller may hold
`create_app(max_streams=)` at once in a process; one more is 429 `too_many_streams`, and a
stream's slot comes back however it ended (closed, refused, a HEAD).
"""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app

from .test_server_common import PLAIN, TOKENS, auth, make_agents, running


def _refused(r: httpx.Response) -> None:
    assert r.status_code == 429, r.text[:300]
    assert r.json()["error"]["code"] == "too_many_streams", r.text[:300]
    assert r.headers["retry-after"].isdigit()


def test_a_caller_holds_at_most_max_streams_open(tmp_path: Path) -> None:
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db")
    app = create_app(
        runtime,
        auth=TokenAuth(TOKENS),
        poll_interval=0.02,
        heartbeat=0.2,
        sweep_every=None,
        max_streams=2,
    )
    alice = auth("alice-token")
    with running(app) as base, httpx.Client(base_url=base, timeout=10, verify=PLAIN) as c:
        r = c.post(
            "/v1/sessions", json={"agent": "support", "message": "Refund 1042"}, headers=alice
        )
        assert r.status_code == 201, r.text
        events = f"/v1/sessions/{r.json()['session_id']}/events"
        # Refused calls and HEADs hold nothing once answered.
        for _ in range(3):
            assert c.head(events, headers=alice).status_code == 200
            past = c.get(events, headers={**alice, "Last-Event-ID": "99"})
            assert past.status_code == 422
        with (
            httpx.Client(base_url=base, timeout=10, verify=PLAIN) as one,
            httpx.Client(base_url=base, timeout=10, verify=PLAIN) as two,
            one.stream("GET", events, headers=alice) as first,
            two.stream("GET", "/_signoff/stream", headers=alice) as second,
        ):
            assert first.status_code == second.status_code == 200
            _refused(c.get(events, headers=alice))  # the session's stream
            # the dashboard's (JSON for its script; a page for a browser)
            _refused(c.get("/_signoff/stream", headers={**alice, "Accept": "application/json"}))
            assert c.get("/_signoff/stream", headers=alice).status_code == 429
            # A cap per caller: another person (the same tenant) is served.
            with c.stream("GET", events, headers=auth("bob-token")) as bobs:
                assert bobs.status_code == 200
            # A stream that is not followed ends by itself, but holds a slot while it runs.
            _refused(c.get(events, params={"follow": "false"}, headers=alice))
        # Both closed: their slots come back once the server sees them gone (at its next poll).
        deadline = time.monotonic() + 10
        while True:
            r = c.get(events, params={"follow": "false"}, headers=alice)
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert r.status_code == 200, r.text[:300]
        with (
            httpx.Client(base_url=base, timeout=10, verify=PLAIN) as one,
            httpx.Client(base_url=base, timeout=10, verify=PLAIN) as two,
            one.stream("GET", events, headers=alice) as first,
            two.stream("GET", events, headers=alice) as second,
        ):
            assert first.status_code == second.status_code == 200


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "10"])
def test_max_streams_is_checked(tmp_path: Path, bad: object) -> None:
    runtime = so.Runtime(make_agents(), store=f"sqlite:///{tmp_path}/s.db")
    with pytest.raises(so.UsageError, match="max_streams"):
        create_app(runtime, auth=TokenAuth(TOKENS), max_streams=bad)  # type: ignore[arg-type]
