"""Answering from the dashboard as a reviewer: who may, stale pages, answers given twice."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app

from .test_dashboard import signed_in, start
from .test_server_common import TOKENS, auth, running, served


@pytest.fixture
def base(tmp_path: Path) -> Iterator[str]:
    with served(f"sqlite:///{tmp_path}/state.db") as url:
        yield url


def test_a_request_the_viewer_may_not_answer_offers_no_buttons(base: str) -> None:
    """An admin sees every tenant's requests, but only the person whose turn asked may answer
    one: the card offered Approve and Deny that could only fail (403). It says why instead."""
    body = start(base)
    sid, rid = body["session_id"], body["pending"][0]["id"]
    with signed_in(base, "admin-token") as c:
        for path in ("/_signoff/", f"/_signoff/sessions/{sid}"):
            page = c.get(path).text
            card = page[page.index(f'data-request-id="{rid}"') :]
            assert 'value="approve"' not in card and "/respond" not in card, path
            assert "You may not answer this" in card and "asked by alice" in card, path
        pending = c.get(f"/_signoff/fragments/sessions/{sid}").json()["pending"]
        assert "data-not-allowed" in pending and 'value="approve"' not in pending
    page = httpx.get(f"{base}/_signoff/", headers=auth("alice-token")).text
    assert 'value="approve"' in page and "data-not-allowed" not in page


def test_the_requester_of_a_four_eyes_call_is_told_someone_else_must_approve(
    tmp_path: Path,
) -> None:
    @so.tool(approval=so.always(exclude_requester=True))
    async def deploy(ref: str) -> str:
        """Deploy a ref."""
        return "deployed"

    call = so.ToolCall(name="deploy", input={"ref": "v1"})
    script = [so.ModelResponse(tool_calls=[call]), so.ModelResponse(text="done")]
    agent = so.Agent(name="ops", model=so.models.Scripted(script, repeat_last=True), tools=[deploy])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/eyes.db")
    with running(create_app(runtime, auth=TokenAuth(TOKENS))) as base:
        start(base, "ops")
        mine = httpx.get(f"{base}/_signoff/", headers=auth("alice-token")).text
        assert 'value="approve"' not in mine
        assert "the requester may not approve their own call" in mine
        # another reviewer of the tenant may
        assert 'value="approve"' in httpx.get(f"{base}/_signoff/", headers=auth("admin-token")).text
