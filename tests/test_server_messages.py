"""`POST /v1/sessions/{id}/messages` as the API documents it: the `turnPolicy` a caller sends
decides whether a message steers a turn waiting on a question or waits for it to end."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import signoff as so
from signoff.server import TokenAuth, create_app

from .test_messages import plan_agent
from .test_server_common import TOKENS, auth


async def test_a_queued_message_waits_for_a_turn_held_on_a_question(tmp_path: Path) -> None:
    """With `turnPolicy: queue` a message to a turn waiting on a question it does not answer
    (options only) is queued, and the question stays open; with `steer` (the default) it is
    delivered to the turn at once."""
    runtime = so.Runtime([plan_agent()], store=f"sqlite:///{tmp_path}/s.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=auth("alice-token")
        ) as c,
    ):
        for policy, queued in (("queue", True), ("steer", False)):
            r = await c.post("/v1/sessions", json={"agent": "sales", "message": "upgrade me"})
            started = r.json()
            sid, (question,) = started["session_id"], started["pending"]
            r = await c.post(
                f"/v1/sessions/{sid}/messages",
                json={"text": "is there a team plan?", "turnPolicy": policy},
            )
            assert r.status_code == 200, r.text
            assert r.json()["queued"] is queued, (policy, r.json())
            state = await runtime.state(sid)
            assert [m.get("message") for m in state.queued] == (
                ["is there a team plan?"] if queued else []
            ), (policy, state.queued)
            if queued:  # the question it did not answer stays open
                assert [r.id for r in state.pending_requests()] == [question["id"]]
    await runtime.close()


NOTHING = ["\u200b", "\x00", "\ufeff \u2060", "\u3164\U000e0020", "\x85\xad\n"]
"""Prompts and messages that say nothing, none of them whitespace alone."""


async def test_a_message_of_invisible_characters_starts_no_turn(tmp_path: Path) -> None:
    """A prompt or message made only of invisible characters or controls is refused as a
    free-text answer like it is: `UsageError` in Python, 422 over HTTP, and nothing stored."""
    runtime = so.Runtime([plan_agent()], store=f"sqlite:///{tmp_path}/s.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://t", headers=auth("alice-token")
        ) as c,
    ):
        r = await c.post("/v1/sessions", json={"agent": "sales"})
        sid = r.json()["session_id"]
        seq = (await runtime.state(sid)).seq
        for text in NOTHING:
            assert text.strip() and not text.isspace(), repr(text)
            with pytest.raises(so.UsageError, match="says nothing"):
                await runtime.generate("sales", text)
            with pytest.raises(so.UsageError, match="says nothing"):
                await runtime.generate(session_id=sid, prompt=text)
            with pytest.raises(so.UsageError, match="says nothing"):
                await runtime.send(sid, text)
            r = await c.post("/v1/sessions", json={"agent": "sales", "message": text})
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
            r = await c.post(f"/v1/sessions/{sid}/messages", json={"text": text})
            assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request", r.text
        assert (await runtime.state(sid)).seq == seq
        assert [s.id for s in await runtime.sessions()] == [sid]
    await runtime.close()
