"""A request read for a caller (`signoff.server._request_reads`): its session's id read alone
where the store can, the whole request read once where it cannot."""

from __future__ import annotations

import pytest

from ._spies import CallSpy
from .test_server_common import auth, in_process


async def test_a_store_without_request_session_has_the_request_read_once(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store of the application's own, written before `request_session`, serves the request
    reads as before: the request read whole (once, for a caller who may see it), its session's
    id taken from it; a caller who may not see it is refused as for a missing one."""
    async with in_process(store_url) as (runtime, c):
        r = await c.post(
            "/v1/sessions",
            json={"agent": "support", "message": "Refund order 1042"},
            headers=auth("alice-token"),
        )
        assert r.status_code == 201, r.text
        request_id = r.json()["pending"][0]["id"]
        monkeypatch.setattr(runtime.store, "request_session", None)  # as if it had none
        spy = CallSpy(monkeypatch)
        spy.wrap(runtime.store, ("get_request", "read_events"))
        response, reads = await spy.during(
            c.get(f"/v1/requests/{request_id}", headers=auth("alice-token"))
        )
        assert response.status_code == 200, response.text
        assert response.json()["request"]["id"] == request_id
        assert reads.count("get_request") == 1, reads
        for target in (request_id, "req_" + "0" * 20):
            response = await c.get(f"/v1/requests/{target}", headers=auth("mallory-token"))
            assert response.status_code == 404, response.text
            assert response.json()["error"]["code"] == "unknown_request"
