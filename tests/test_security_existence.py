"""Whether an id exists, as another tenant would probe for it: a foreign request and a missing
one are the same 404 at the same cost (the same store reads) on every route that takes a
request id, the API's and the dashboard's, so neither the answer nor its time tells them apart.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable
from typing import Any

import httpx
import pytest

import signoff as so

from ._spies import CallSpy
from .test_server_common import _echo, auth, in_process

_READS = (
    "read_events",
    "head",
    "get_request",
    "request_session",
    "load_session",
    "audit_heads",
    "pending",
)


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


BIG = 1_000_000  # characters of a request's tool input


def _uploader() -> so.Agent:
    """An agent whose one tool call, always to be approved, carries `BIG` characters of input."""

    @so.tool(approval=so.always())
    async def upload(blob: str) -> dict[str, Any]:
        """Upload a file."""
        return {"ok": True}

    call = so.ToolCall(name="upload", input={"blob": "x" * BIG})
    model = so.models.Scripted([so.ModelResponse(tool_calls=[call]), _echo], repeat_last=True)
    return so.Agent(name="uploader", model=model, tools=[upload])


class _Sizes:
    """Records, in order, each spied store read made during `during` and how large its answer
    is (the length of its repr: a request read whole holds its input)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: object) -> None:
        self.reads: list[tuple[str, int]] = []
        self.on = False
        names = (*_READS, "count_pending", "load")
        for name in names:
            if hasattr(store, name):
                monkeypatch.setattr(store, name, self._spied(getattr(store, name), name))

    def _spied(self, real: Any, name: str) -> Any:
        async def spied(*args: Any, **kwargs: Any) -> Any:
            result = await real(*args, **kwargs)
            if self.on:
                self.reads.append((name, len(repr(result))))
            return result

        return spied

    async def during(
        self, call: Awaitable[httpx.Response]
    ) -> tuple[httpx.Response, list[tuple[str, int]]]:
        self.reads.clear()
        self.on = True
        try:
            response = await call
        finally:
            self.on = False
        return response, list(self.reads)


async def test_a_foreign_requests_large_input_is_not_read_for_its_404(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mallory asking for Alice's request had it read whole, its megabyte of tool input decoded,
    before being told it does not exist: a 404 that took ~3 ms where a missing id's took 0.4.
    Now only the request's session id is read before the caller is refused, on every route that
    takes a request id; Alice's own read of it costs that one small read more, no other."""
    async with in_process(store_url, agents=[_uploader()]) as (runtime, c):
        r = await c.post(
            "/v1/sessions",
            json={"agent": "uploader", "message": "upload the report"},
            headers=auth("alice-token"),
        )
        assert r.status_code == 201, r.text
        request_id = r.json()["pending"][0]["id"]
        mallory = {**auth("mallory-token"), "Accept": "application/json"}
        page = await c.get("/_signoff/", headers=mallory)
        match = re.search(r'name="csrf" value="([^"]+)"', page.text)
        assert match, page.text[:300]
        csrf = match.group(1)
        sizes = _Sizes(monkeypatch, runtime.store)
        for attempt in range(2):  # the second time, the session's initiator is remembered
            for target in (request_id, "req_" + "0" * 20):
                base = f"/_signoff/requests/{target}"
                calls = {
                    "api": c.get(f"/v1/requests/{target}", headers=mallory),
                    "input": c.get(f"{base}/input", headers=mallory),
                    "payload": c.get(f"{base}/payload", headers=mallory),
                    "edited": c.get(f"{base}/edited", headers=mallory),
                    "reason": c.get(f"{base}/reason", headers=mallory),
                    "place": c.get(f"{base}/place", headers=mallory),
                    "respond": c.post(
                        f"{base}/respond",
                        data={"csrf": csrf, "option": "approve"},
                        headers=mallory,
                    ),
                }
                for route, call in calls.items():
                    response, reads = await sizes.during(call)
                    if route == "place":  # where a list shows it: nowhere, for her
                        assert response.json()["open"] is False, response.text
                    else:
                        assert response.status_code == 404, (route, response.text)
                    read = sum(size for _, size in reads)
                    assert read < 10_000, (attempt, target, route, reads)
        # Alice's own read: the request read whole once, after the one read of its session id.
        response, reads = await sizes.during(
            c.get(f"/v1/requests/{request_id}", headers=auth("alice-token"))
        )
        assert response.status_code == 200, response.text
        assert len(response.json()["request"]["action"]["input"]["blob"]) == BIG
        names = [name for name, _ in reads]
        assert names.count("request_session") == 1 and names.count("get_request") == 1, reads
        assert names.index("request_session") < names.index("get_request"), reads
        assert max(size for _, size in reads) > BIG, reads  # the spy sees a whole request read


async def test_an_answer_in_ones_own_session_naming_a_foreign_request_does_not_read_it(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mallory answering, in her own session (whose earlier turn had a request, so an id its
    state lacks is looked up), Alice's request had it read whole, its megabyte of input decoded,
    before `404 unknown_request`: ~7 ms against ~0.4 for a missing id. Now both make the same
    small reads, on `/responses` and `/approvals` alike, and nothing of Alice's is answered."""
    async with in_process(store_url, agents=[_uploader()]) as (runtime, c):
        r = await c.post(
            "/v1/sessions",
            json={"agent": "uploader", "message": "upload the report"},
            headers=auth("alice-token"),
        )
        assert r.status_code == 201, r.text
        request_id = r.json()["pending"][0]["id"]
        mallory = auth("mallory-token")
        m = await c.post("/v1/sessions", json={"agent": "helper", "message": "hi"}, headers=mallory)
        assert m.status_code == 201, m.text
        sid, (question,) = m.json()["session_id"], m.json()["pending"]
        pick = {"requestId": question["id"], "optionId": question["options"][0]["id"]}
        answered = await c.post(
            f"/v1/sessions/{sid}/responses", json={"inputResponses": [pick]}, headers=mallory
        )
        assert answered.status_code == 200, answered.text
        later = await c.post(
            f"/v1/sessions/{sid}/messages", json={"text": "again"}, headers=mallory
        )
        assert later.status_code == 200, later.text
        sizes = _Sizes(monkeypatch, runtime.store)
        for route, body in (
            (
                "responses",
                lambda rid: {"inputResponses": [{"requestId": rid, "optionId": "approve"}]},
            ),
            ("approvals", lambda rid: {"approvals": [{"id": rid, "approved": True}]}),
        ):
            made: dict[str, list[str]] = {}
            for name, target in (("foreign", request_id), ("missing", "req_" + "0" * 20)):
                response, reads = await sizes.during(
                    c.post(f"/v1/sessions/{sid}/{route}", json=body(target), headers=mallory)
                )
                assert response.status_code == 404, (route, name, response.text)
                assert response.json()["error"]["code"] == "unknown_request"
                assert sum(size for _, size in reads) < 10_000, (route, name, reads)
                made[name] = [read for read, _ in reads]
            assert made["foreign"] == made["missing"], (route, made)
        r = await c.get(f"/v1/requests/{request_id}", headers=auth("alice-token"))
        assert r.json()["status"] == "pending"  # nothing Mallory did answered it
