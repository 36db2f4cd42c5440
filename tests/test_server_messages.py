"""`POST /v1/sessions/{id}/messages` as the API documents it: the `turnPolicy` a caller sends
decides whether a message steers a turn waiting on a question or waits for it to end."""

from __future__ import annotations

from pathlib import Path

import httpx

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
