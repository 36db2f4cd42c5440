"""The turns of `test_mixed_requests` (an approval and a question open at once) answered over
HTTP and its event stream, the command line and the dashboard, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import signoff as so
from signoff.cli import app as cli
from signoff.server import TokenAuth, create_app
from signoff.testing import store_contents

from ._dashboard import csrf_of, signed_in
from .test_mixed_requests import (
    AGENTS,
    AT_ONCE,
    EXPECTED,
    GATED_TOOL,
    QUESTION,
    answer,
    assert_whole,
    park,
)
from .test_server_common import PLAIN, TOKENS, auth, read_sse, running

# -- HTTP and its stream ------------------------------------------------------------------


@contextmanager
def served(store_url: str) -> Iterator[tuple[str, so.Runtime]]:
    runtime = so.Runtime(AGENTS, store=store_url)
    with running(create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)) as base:
        yield base, runtime


def start(base: str, agent: str) -> dict[str, Any]:
    r = httpx.post(
        f"{base}/v1/sessions",
        json={"agent": agent, "message": "order 7 arrived broken"},
        headers=auth("alice-token"),
        timeout=30,
        verify=PLAIN,
    )
    assert r.status_code == 201, r.text
    body: dict[str, Any] = r.json()
    return body


def wire_answer(request: dict[str, Any]) -> dict[str, Any]:
    if request["kind"] == "tool-approval":
        return {"requestId": request["id"], "optionId": "approve"}
    express = next(o["id"] for o in request["options"] if o["label"] == "Express")
    return {"requestId": request["id"], "optionId": express}


def stored(store_url: str, sid: str) -> Any:
    async def read() -> Any:
        async with so.Runtime([], store=store_url) as rt:
            return await store_contents(rt.store, sid)

    return asyncio.run(read())


def whole(store_url: str, sid: str, tool: str) -> list[so.Event]:
    async def check() -> list[so.Event]:
        async with so.Runtime([], store=store_url) as rt:
            return await assert_whole(rt, sid, ran={tool: 1})

    return asyncio.run(check())


@pytest.mark.parametrize("agent", AT_ONCE)
def test_http_approvals_refused_then_both_responses_and_the_stream(
    store_url: str, agent: str
) -> None:
    with served(store_url) as (base, _):
        body = start(base, agent)
        sid = body["session_id"]
        approval, question = body["pending"]
        assert (approval["kind"], question["kind"]) == ("tool-approval", "question")
        before = stored(store_url, sid)
        h = auth("alice-token")
        url = f"{base}/v1/sessions/{sid}"
        r = httpx.post(
            f"{url}/approvals",
            json={"approvals": [{"id": approval["id"], "approved": True}]},
            headers=h,
            verify=PLAIN,
        )
        assert r.status_code == 422, r.text
        error = r.json()["error"]
        assert error["code"] == "partial_answer" and question["id"] in error["message"]
        assert f"POST /v1/sessions/{sid}/responses" in error["message"]  # where it is answered
        both = [{"id": approval["id"], "approved": True}, {"id": question["id"], "approved": True}]
        r = httpx.post(f"{url}/approvals", json={"approvals": both}, headers=h, verify=PLAIN)
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_answer", r.text
        assert stored(store_url, sid) == before
        assert httpx.get(url, headers=h, verify=PLAIN).json()["status"] == "waiting"
        r = httpx.post(
            f"{url}/responses",
            json={"inputResponses": [wire_answer(approval), wire_answer(question)]},
            headers=h,
            timeout=30,
            verify=PLAIN,
        )
        assert r.status_code == 200, r.text
        assert (r.json()["status"], r.json()["text"]) == ("completed", EXPECTED[agent])
        log = whole(store_url, sid, GATED_TOOL[agent])
        with httpx.stream("GET", f"{url}/events", headers=h, timeout=30, verify=PLAIN) as s:
            sse = read_sse(s, count=len(log))
        assert [int(m["id"]) for m in sse] == list(range(1, len(log) + 1))
        assert [m["event"] for m in sse] == [e.type for e in log]
        ids = [m["data"]["data"].get("request_id") for m in sse]
        asked = [
            r["id"]
            for m in sse
            if m["event"] == "input.requested"
            for r in m["data"]["data"]["requests"]
        ]
        assert asked == [approval["id"], question["id"]]
        settled = [i for m, i in zip(sse, ids, strict=True) if m["event"] == "input.resolved"]
        assert sorted(settled) == sorted(asked)
        assert [m["event"] for m in sse][-2:] == ["turn.completed", "session.waiting"]


def test_http_approvals_with_only_a_question_open_are_invalid(store_url: str) -> None:
    """The deferred approval is not asked yet: the question alone is open, and a decision is no
    answer to it (422 `invalid_answer`, nothing stored); `/responses` answers it, then
    `/approvals` settles the approval asked next."""
    with served(store_url) as (base, _):
        body = start(base, "deferred")
        sid = body["session_id"]
        [question] = body["pending"]
        h = auth("alice-token")
        url = f"{base}/v1/sessions/{sid}"
        before = stored(store_url, sid)
        r = httpx.post(
            f"{url}/approvals",
            json={"approvals": [{"id": question["id"], "approved": True}]},
            headers=h,
            verify=PLAIN,
        )
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_answer", r.text
        assert f"POST /v1/sessions/{sid}/responses" in r.json()["error"]["message"]
        assert stored(store_url, sid) == before
        r = httpx.post(
            f"{url}/responses",
            json={"inputResponses": [wire_answer(question)]},
            headers=h,
            timeout=30,
            verify=PLAIN,
        )
        assert r.status_code == 200, r.text
        [approval] = r.json()["pending"]
        assert approval["kind"] == "tool-approval"
        decision = {"id": approval["id"], "approved": True}
        r = httpx.post(
            f"{url}/approvals", json={"approvals": [decision]}, headers=h, timeout=30, verify=PLAIN
        )
        assert r.status_code == 200, r.text
        assert r.json()["text"] == EXPECTED["deferred"]
        whole(store_url, sid, "refund_plain")


# -- the command line -----------------------------------------------------------------------


def invoke(*args: str) -> Any:
    result = CliRunner().invoke(cli, list(args))
    return result


@pytest.mark.parametrize("first", ["tool-approval", "question"])
def test_cli_lists_both_and_answers_each(store_url: str, first: str) -> None:
    async def park_here() -> tuple[str, list[so.InputRequest]]:
        async with so.Runtime(AGENTS, store=store_url) as rt:
            return await park(rt, "gated")

    sid, pending = asyncio.run(park_here())
    listed = invoke("pending", "--store", store_url, "--json")
    assert listed.exit_code == 0, listed.output
    rows = [row for row in json.loads(listed.stdout) if row["session_id"] == sid]
    assert [(row["id"], row["kind"]) for row in rows] == [(p.id, p.kind) for p in pending]
    one = next(p for p in pending if p.kind == first)
    other = next(p for p in pending if p.kind != first)

    def command(request: so.InputRequest, *target: str) -> list[str]:
        who = ["--store", store_url, "--as", "test:alice"]
        if request.kind == "tool-approval":
            return ["approve", request.id, *target, *who]
        return ["answer", request.id, *target, *who, "--option", answer(request).option_id or ""]

    recorded = invoke(*command(one))  # only records: no runtime given
    assert recorded.exit_code == 0, recorded.output
    left = json.loads(invoke("pending", "--store", store_url, "--json").stdout)
    assert [row["id"] for row in left if row["session_id"] == sid] == [other.id]
    again = invoke(*command(one))
    assert again.exit_code == 0 and "nothing changed" in again.output
    done = invoke(*command(other, "tests.test_mixed_requests:gated"))
    assert done.exit_code == 0, done.output
    assert EXPECTED["gated"] in done.output.replace("\n", "")
    assert whole(store_url, sid, "refund")
    conflict = invoke("deny", pending[0].id, "--store", store_url, "--as", "test:alice")
    assert conflict.exit_code == 1 and "ConflictingAnswer" in conflict.stderr


# -- the dashboard ---------------------------------------------------------------------------


@pytest.mark.parametrize("first", ["tool-approval", "question"])
def test_dashboard_queue_shows_both_and_answers_each(store_url: str, first: str) -> None:
    with served(store_url) as (base, _):
        body = start(base, "gated")
        sid = body["session_id"]
        one = next(p for p in body["pending"] if p["kind"] == first)
        other = next(p for p in body["pending"] if p["kind"] != first)
        with signed_in(base) as c:
            page = c.get("/_signoff/")
            assert one["id"] in page.text and other["id"] in page.text
            assert QUESTION in page.text and "refund" in page.text
            for request, left in ((one, [other["id"]]), (other, [])):
                form = {"option": wire_answer(request)["optionId"], "csrf": csrf_of(page.text)}
                r = c.post(
                    f"/_signoff/requests/{request['id']}/respond",
                    data=form,
                    headers={"Accept": "application/json"},
                )
                assert r.status_code == 200, r.text
                page = c.get("/_signoff/")
                assert request["id"] not in page.text
                assert all(i in page.text for i in left)
            assert "All caught up" in page.text
        state = httpx.get(
            f"{base}/v1/sessions/{sid}", headers=auth("alice-token"), verify=PLAIN
        ).json()
        assert (state["status"], state["turn"]["status"]) == ("idle", "completed")
        log = whole(store_url, sid, "refund")
        done = next(e for e in reversed(log) if e.type == "model.completed")
        assert done.data["text"] == EXPECTED["gated"]
