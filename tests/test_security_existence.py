"""Whether an id exists, as another tenant would probe for it: a foreign request and a missing
one are the same 404 at the same cost (the same store reads) on every route that takes a
request id, the API's and the dashboard's, so neither the answer nor its time tells them apart.
"""

from __future__ import annotations

import re

import pytest

from ._spies import CallSpy
from .test_server_common import auth, in_process

_READS = ("read_events", "head", "get_request", "load_session", "audit_heads", "pending")


async def test_a_foreign_request_costs_what_a_missing_one_does(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mallory (another tenant) asking for Alice's request got its 404 after one more read (its
    session's first event) than for an id that does not exist: the time each took told which
    ids exist. Now both make the same reads, whether the initiator is remembered or not."""
    async with in_process(store_url) as (runtime, c):
        r = await c.post(
            "/v1/sessions",
            json={"agent": "support", "message": "Refund order 1042"},
            headers=auth("alice-token"),
        )
        assert r.status_code == 201, r.text
        request_id = r.json()["pending"][0]["id"]
        mallory = {**auth("mallory-token"), "Accept": "application/json"}
        page = await c.get("/_signoff/", headers=mallory)
        match = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert match, page.text[:300]
        csrf = match.group(1)
        reads = CallSpy(monkeypatch)
        reads.wrap(runtime.store, _READS)
        for attempt in range(2):  # the second time, the session's initiator is remembered
            made: dict[tuple[str, str], list[str]] = {}
            for name, target in (("foreign", request_id), ("missing", "req_" + "0" * 20)):
                calls = {
                    "api": c.get(f"/v1/requests/{target}", headers=mallory),
                    "input": c.get(f"/_signoff/requests/{target}/input", headers=mallory),
                    "payload": c.get(f"/_signoff/requests/{target}/payload", headers=mallory),
                    "respond": c.post(
                        f"/_signoff/requests/{target}/respond",
                        data={"csrf": csrf, "option": "approve"},
                        headers=mallory,
                    ),
                }
                for route, call in calls.items():
                    response, seen = await reads.during(call)
                    assert response.status_code == 404, (attempt, name, route, response.text)
                    assert response.json()["error"]["code"] == "unknown_request"
                    made[name, route] = seen
            for route in ("api", "input", "payload", "respond"):
                assert made["foreign", route] == made["missing", route], (attempt, route, made)
        r = await c.get(f"/v1/requests/{request_id}", headers=auth("alice-token"))
        assert r.json()["status"] == "pending"  # nothing Mallory did answered it
