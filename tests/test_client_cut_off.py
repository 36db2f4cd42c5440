"""The clients' turn results, and the session's view of its turn, carry the server's `cut_off`,
as `GenerateResult` does in process: a reply the provider stopped short reads as partial over
HTTP too."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

import signoff as so
from signoff.server import AsyncClient, TokenAuth, create_app
from signoff.testing import scripted_agent

from ._client import Canned, canned, http
from .test_server_common import TOKENS

__all__ = ["canned"]  # the fixture, used by name


async def test_a_reply_cut_short_reads_cut_off_through_the_client(tmp_path: Path) -> None:
    """Before, `RemoteResult` dropped the field: `c.generate(...)` read a partial answer as a
    whole one, where `rt.generate(...)` said `cut_off="max_tokens"`."""
    half = so.ModelResponse(text="The refund policy is", cut_off="max_tokens")
    agent = scripted_agent("desk", [half, so.ModelResponse(text="Whole.")])
    runtime = so.Runtime([agent], store=f"sqlite:///{tmp_path}/state.db")
    app = create_app(runtime, auth=TokenAuth(TOKENS), sweep_every=None)
    transport = httpx.ASGITransport(app=app)
    async with app.router.lifespan_context(app):
        async with AsyncClient("http://t", token="alice-token", transport=transport) as c:
            cut = await c.generate("desk", "what is the refund policy?")
            seen = (await c.state(cut.session_id))["turn"]
            whole = await c.send(cut.session_id, "go on")
            again = (await c.state(cut.session_id))["turn"]
    await runtime.close()
    assert (cut.status, cut.text, cut.cut_off) == (
        "completed",
        "The refund policy is",
        "max_tokens",
    )
    assert (whole.text, whole.cut_off) == ("Whole.", None)
    # The session's view of its turn says so too (GET /v1/sessions/{id}), until the next reply.
    assert (seen["text"], seen["cut_off"]) == ("The refund policy is", "max_tokens")
    assert (again["text"], again["cut_off"]) == ("Whole.", None)


async def test_a_cut_off_that_is_not_text_reads_as_none(canned: Canned) -> None:
    """A server's answer is read as the in-process result is built: a `cut_off` of another
    type is not passed on as if it said why."""
    turn = {"session_id": "ses_x", "status": "completed", "text": "ok", "cut_off": 5}
    canned.on("/v1/sessions/ses_x/messages", http("200 OK", json.dumps(turn)))
    async with AsyncClient(canned.base) as c:
        result = await c.send("ses_x", "hello")
    assert result.cut_off is None
